"""IMPALA's V-trace: against a brute-force computation, n-step returns on-policy, and a split at a truncation."""

import copy

import numpy as np
import pytest
import torch

import impala_mujoco as impala
from conftest import TINY, read_scalars, run_in_process
from reference import brute_force_vtrace, random_batch


@pytest.mark.parametrize("rho_bar,c_bar,lam", [(1.0, 1.0, 1.0), (0.5, 1.0, 1.0), (2.0, 1.5, 0.9)])
def test_vtrace_matches_brute_force(rho_bar, c_bar, lam):
    batch = random_batch(T=10, E=3, seed=3)
    log_rhos = 0.6 * torch.randn(10, 3, generator=torch.Generator().manual_seed(7))
    adv, vs = impala.vtrace(*batch, log_rhos, gamma=0.97, gae_lambda=lam, rho_bar=rho_bar, c_bar=c_bar)
    exp_vs, v_next, rho = brute_force_vtrace(*batch, log_rhos, 0.97, lam, rho_bar, c_bar)
    r, v, _, term = (x.numpy() for x in batch[:4])
    np.testing.assert_allclose(vs.numpy(), exp_vs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv.numpy(), rho * (r + 0.97 * (1 - term) * v_next - v), rtol=1e-4, atol=1e-4)


def test_on_policy_lambda_one_targets_are_discounted_n_step_returns():
    rewards, values, next_values, terminations, dones = random_batch(T=9, E=2, seed=4)
    _, vs = impala.vtrace(rewards, values, next_values, terminations, dones, torch.zeros(9, 2), 0.9, 1.0, 1.0, 1.0)
    for e in range(2):
        for s in range(9):
            ret, discount, t = 0.0, 1.0, s
            while True:  # rewards to the end of the episode (or batch), then the bootstrap unless terminated
                ret += discount * rewards[t, e].item()
                discount *= 0.9
                if dones[t, e] or t == 8:
                    ret += discount * (1 - terminations[t, e].item()) * next_values[t, e].item()
                    break
                t += 1
            assert vs[s, e].item() == pytest.approx(ret, rel=1e-5, abs=1e-5)


def test_split_at_a_truncation_leaves_targets_unchanged():
    rewards, values, next_values, terminations, dones = random_batch(T=12, E=1, seed=6, p_end=0.0)
    dones[5, 0] = 1.0  # a truncation: the episode ends, but not in a terminal state
    log_rhos = 0.3 * torch.randn(12, 1, generator=torch.Generator().manual_seed(1))
    batch = (rewards, values, next_values, terminations, dones, log_rhos)
    whole = impala.vtrace(*batch, 0.99, 1.0, 1.0, 1.0)
    first = impala.vtrace(*(x[:6] for x in batch), 0.99, 1.0, 1.0, 1.0)
    second = impala.vtrace(*(x[6:] for x in batch), 0.99, 1.0, 1.0, 1.0)
    for i in range(2):
        torch.testing.assert_close(whole[i], torch.cat([first[i], second[i]]))


def test_targets_are_recomputed_with_the_current_policy(tmp_path, monkeypatch):
    # Record the learner's weights at every gradient step: the last minibatch's targets must be V-trace with
    # exactly the policy and critic the learner had then (after all earlier steps), computed independently.
    weights = []

    def recording_clip(parameters, max_norm):
        parameters = list(parameters)
        weights.append([p.detach().clone() for p in parameters])
        return clip_grad_norm(parameters, max_norm)

    clip_grad_norm = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    g = run_in_process("impala_mujoco", *TINY, "--total-timesteps", "512", "--lag", "1", "--run-dir", tmp_path)
    assert "losses/clipfrac" not in read_scalars(tmp_path)
    assert len(weights) == 2 * 2 * 4  # 2 iterations x 2 epochs x 4 minibatches
    learner = copy.deepcopy(g["policy_buffer"][-1])  # observation statistics as during the update
    for p, w in zip(learner.parameters(), weights[-1]):
        p.data.copy_(w)
    with torch.no_grad():
        values, next_values = learner.get_value(g["obs"]), learner.get_value(g["next_obs_buf"])
        log_rhos = learner.get_dist(g["obs"]).log_prob(g["actions"]).sum(-1) - g["logprobs"]
    exp_vs, v_next, rho = brute_force_vtrace(
        g["rewards"], values, next_values, g["terminations"], g["dones"], log_rhos, 0.99, 1.0, 1.0, 1.0
    )
    r, term, v = g["rewards"].numpy(), g["terminations"].numpy(), values.numpy()
    np.testing.assert_allclose(g["returns"].numpy(), exp_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g["advantages"].numpy(), rho * (r + 0.99 * (1 - term) * v_next - v), rtol=1e-5, atol=1e-5)
    assert not torch.equal(weights[-1][0], g["policy_buffer"][-1].critic[0].weight)  # the learner had moved
