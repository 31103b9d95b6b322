"""Independent reference computations (explicit loops and sums from the definitions) for the estimator tests."""

import numpy as np
import torch


def random_batch(T=12, E=3, seed=0, p_end=0.25):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, E, generator=g)
    values = torch.randn(T, E, generator=g)
    next_values = torch.randn(T, E, generator=g)
    dones = (torch.rand(T, E, generator=g) < p_end).float()
    # Half of the episode ends are terminations, half truncations.
    terminations = dones * (torch.rand(T, E, generator=g) < 0.5).float()
    # Where no episode ended, s'_t is s_{t+1}, so V(s'_t) = V(s_{t+1}).
    for t in range(T - 1):
        next_values[t] = torch.where(dones[t] > 0, next_values[t], values[t + 1])
    return rewards, values, next_values, terminations, dones


def brute_force_gae(rewards, values, next_values, terminations, dones, gamma, lam):
    """A_t = sum_l (gamma*lam)^l delta_{t+l}, summed until the end of the episode or of the batch."""
    T, E = rewards.shape
    adv = np.zeros((T, E))
    for e in range(E):
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                delta = rewards[k, e] + gamma * (1 - terminations[k, e]) * next_values[k, e] - values[k, e]
                total += weight * float(delta)
                if dones[k, e]:
                    break
                weight *= gamma * lam
            adv[t, e] = total
    return adv


def brute_force_vtrace(rewards, values, next_values, terminations, dones, log_rhos, gamma, lam, rho_bar, c_bar):
    """From the definition: v_s = V(s_s) + sum_t gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t, the sum running to the
    end of the episode (or of the batch). Returns v, v_next (v_{s+1} within the episode, else V(s'_s)) and rho."""
    T, E = rewards.shape
    ratio = np.exp(log_rhos.numpy().astype(np.float64))
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio)
    r, v, nv = rewards.numpy(), values.numpy(), next_values.numpy()
    term, done = terminations.numpy(), dones.numpy()
    delta = rho * (r + gamma * (1 - term) * nv - v)
    vs = np.zeros((T, E))
    for e in range(E):
        for s in range(T):
            end = s
            while end < T - 1 and not done[end, e]:
                end += 1
            total = 0.0
            for t in range(s, end + 1):
                total += gamma ** (t - s) * np.prod(c[s:t, e]) * delta[t, e]
            vs[s, e] = v[s, e] + total
    v_next = np.array([[vs[s + 1, e] if s + 1 < T and not done[s, e] else nv[s, e] for e in range(E)] for s in range(T)])
    return vs, v_next, rho
