"""Unit tests of ppo_mujoco.py's estimators, losses and building blocks against independent computations."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import ppo_mujoco as ppo
from reference import brute_force_gae, random_batch


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_gae_matches_brute_force_with_truncation(lam):
    batch = random_batch()
    assert batch[3].sum() > 0 and (batch[4] - batch[3]).sum() > 0, "fixture needs both kinds of episode end"
    adv, returns = ppo.compute_gae(*batch, gamma=0.99, gae_lambda=lam)
    expected = brute_force_gae(*batch, gamma=0.99, lam=lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns.numpy(), expected + batch[1].numpy(), rtol=1e-5, atol=1e-5)


def test_gae_hand_worked():
    # One env, 3 steps, truncation after step 1 (bootstrap 2.0 from the final obs), termination after step 2.
    rewards = torch.tensor([[1.0], [1.0], [1.0]])
    values = torch.tensor([[0.5], [0.5], [0.5]])
    next_values = torch.tensor([[0.5], [2.0], [9.0]])
    terminations = torch.tensor([[0.0], [0.0], [1.0]])
    dones = torch.tensor([[0.0], [1.0], [1.0]])
    adv, _ = ppo.compute_gae(rewards, values, next_values, terminations, dones, gamma=0.5, gae_lambda=0.5)
    d0, d1, d2 = 1 + 0.5 * 0.5 - 0.5, 1 + 0.5 * 2.0 - 0.5, 1 - 0.5
    np.testing.assert_allclose(adv[:, 0].numpy(), [d0 + 0.25 * d1, d1, d2])


def test_ppo_clip_loss_hand_worked():
    ratio = torch.tensor([0.5, 1.0, 1.5, 1.5, 0.5])
    adv = torch.tensor([1.0, 2.0, 1.0, -1.0, -1.0])
    # per sample -min(r*A, clip(r)*A): -0.5, -2, -1.2, +1.5, +0.8
    assert ppo.policy_loss(ratio, adv, 0.2).item() == pytest.approx((-0.5 - 2 - 1.2 + 1.5 + 0.8) / 5)


def test_value_loss_clipped_and_unclipped():
    new, old, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([2.0, -1.0])
    assert ppo.value_loss(new, old, ret).item() == pytest.approx(0.5 * (1 + 1) / 2)
    # sample 0: clipped value 0.2 -> (0.2-2)^2 = 3.24 > 1; sample 1: no change -> 1
    assert ppo.value_loss(new, old, ret, 0.2).item() == pytest.approx(0.5 * (3.24 + 1) / 2)


def test_total_variation_estimate():
    logratio = torch.log(torch.tensor([1.0, 1.5, 0.5, 2.0]))
    assert ppo.total_variation(logratio).item() == pytest.approx(0.5 * (0 + 0.5 + 0.5 + 1.0) / 4)


def test_running_mean_std_matches_numpy():
    rms = ppo.RunningMeanStd((3,))
    data = [torch.randn(n, 3) * 4 + 2 for n in (5, 17, 1, 40)]
    for x in data:
        rms.update(x)
    everything = torch.cat(data).double().numpy()
    # The prior (mean 0, var 1, count 1e-4) has negligible weight.
    np.testing.assert_allclose(rms.mean.numpy(), everything.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var.numpy(), everything.var(0), rtol=1e-4)


@pytest.mark.parametrize("num_policies", [1, 3, 9])
def test_draw_staleness(num_policies):
    rng = np.random.default_rng(0)
    k = ppo.draw_staleness(num_policies, 5000, "uniform", rng)
    assert k.min() >= 0 and k.max() <= num_policies - 1
    assert set(k.tolist()) == set(range(num_policies))  # every entry is drawn
    counts = np.bincount(k) / len(k)
    np.testing.assert_allclose(counts, 1 / num_policies, atol=0.03)
    assert (ppo.draw_staleness(num_policies, 7, "fixed", rng) == num_policies - 1).all()


def episode_lengths(envs, steps, act_dim, seed=0):
    """Step envs with random actions; return the finished episodes' lengths and the (obs, final_obs) pairs at ends."""
    rng = np.random.default_rng(seed)
    obs = envs.reset()
    length = np.zeros(len(obs), dtype=int)
    lengths, ends = [], []
    for _ in range(steps):
        next_obs, reward, terminated, truncated, final_obs = envs.step(rng.uniform(-1, 1, (len(obs), act_dim)))
        length += 1
        done = terminated | truncated
        for e in np.flatnonzero(done):
            lengths.append((length[e], bool(truncated[e])))
            ends.append((next_obs[e], final_obs[e]))
        assert np.array_equal(final_obs[~done], next_obs[~done])
        length[done] = 0
    return lengths, ends


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_env_backends_truncate_exactly_and_never_return_reset_only_steps(backend):
    # HalfCheetah never terminates: with a 25-step limit every episode must be exactly 25 steps long. A
    # reset-only transition in the stream would make episodes 26 long.
    if backend == "envpool":
        envs = ppo.EnvPoolEnvs("HalfCheetah-v5", 3, seed=1, num_threads=1, max_episode_steps=25)
    else:
        envs = ppo.GymnasiumEnvs("HalfCheetah-v5", 3, seed=1, max_episode_steps=25)
    lengths, ends = episode_lengths(envs, 80, 6)
    envs.close()
    assert lengths == [(25, True)] * 9
    for next_obs, final_obs in ends:  # the bootstrap observation is the true final one, not the reset one
        assert not np.allclose(next_obs, final_obs)


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_env_backends_terminations(backend):
    # Hopper falls within ~20-60 steps under random actions: terminations, each followed by a fresh episode.
    if backend == "envpool":
        envs = ppo.EnvPoolEnvs("Hopper-v5", 2, seed=3, num_threads=1, max_episode_steps=1000)
    else:
        envs = ppo.GymnasiumEnvs("Hopper-v5", 2, seed=3)
    lengths, ends = episode_lengths(envs, 150, 3)
    envs.close()
    assert len(lengths) >= 2 and all(not truncated for _, truncated in lengths)
    for next_obs, _ in ends:  # a fresh Hopper episode starts near the initial pose (height 1.25)
        assert abs(next_obs[0] - 1.25) < 0.02


def test_envpool_results_do_not_depend_on_its_thread_count():
    # --env-threads may change on --resume because of this.
    pytest.importorskip("envpool")
    actions = np.random.default_rng(0).uniform(-1, 1, (120, 4, 3)).astype(np.float32)
    streams = []
    for threads in (1, 3):
        envs = ppo.EnvPoolEnvs("Hopper-v5", 4, seed=5, num_threads=threads)
        streams.append([envs.reset()] + [x for a in actions for x in envs.step(a)])
        envs.close()
    assert len(streams[0]) == len(streams[1])
    for x, y in zip(*streams):
        np.testing.assert_array_equal(x, y)


V5_TASKS = ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5", "HumanoidStandup-v5"]
V5_TASKS += ["Swimmer-v5", "Reacher-v5", "Pusher-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5"]


@pytest.mark.parametrize("env_id", V5_TASKS)
def test_envpool_default_has_gymnasiums_spaces_time_limit_and_frame_skip(env_id):
    # EnvPool is the default backend because it is gymnasium's task in C++: what the agent sees and how long
    # an episode and a step are must match on every -v5 task (the dynamics are compared on Hopper-v5 in
    # tools/studies/backend_equivalence.py).
    envpool = pytest.importorskip("envpool")
    spec, env = envpool.make_spec(env_id), gym.make(env_id)
    assert spec.observation_space.shape == env.observation_space.shape
    assert spec.action_space.shape == env.action_space.shape
    np.testing.assert_allclose(spec.action_space.low, env.action_space.low, rtol=1e-6)  # float64 vs float32
    np.testing.assert_allclose(spec.action_space.high, env.action_space.high, rtol=1e-6)
    assert spec.config.max_episode_steps == env.spec.max_episode_steps
    assert spec.config.frame_skip == env.unwrapped.frame_skip
    env.close()
