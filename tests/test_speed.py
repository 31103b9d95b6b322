"""The speed work keeps the arithmetic (pinned tiny runs, reward scaling per rollout) and its SB3 comparison runs."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, SUBPROCESS_ENV, TINY, existing_scripts, read_scalars, run_in_process, run_script

# Logged by each script (TINY, --lag 1, seed 1) before the rollout and update were made faster; every change since
# kept the arithmetic. Recorded on one CPU type: another one (its SIMD width changes the order of float sums) logs
# values that differ by up to 5e-7 relative (losses) or 1.3e-7 absolute (policy losses near 0), measured with
# ATEN_CPU_CAPABILITY=default against AVX2/AVX-512. PIN_TOLERANCE admits ~10x that. Changes of the arithmetic, planted
# in ppo_mujoco.py, move the second value loss by 1.2e-4 (the biased advantage std), 2.3e-4 (observation eps 1e-6
# for 1e-8), 1.1e-3 (Adam eps 1e-6) and 1.9e-3 (a learning rate 0.1% higher) relative: each fails. (A 0.1% higher
# --max-grad-norm does not: the gradient is rarely clipped in two iterations.)
PIN_TOLERANCE = {"rel": 1e-5, "abs": 1e-6}
PINNED = {
    "ppo_mujoco": {
        "charts/episodic_return": [14.278326034545898, 21.73508644104004],
        "losses/value_loss": [4.506672382354736, 0.27058231830596924],
        "losses/policy_loss": [-0.007953165099024773, 0.0020011086016893387],
    },
    "vaco_mujoco": {
        "charts/episodic_return": [14.278326034545898, 21.73508644104004],
        "losses/value_loss": [4.506672382354736, 0.2620490789413452],
        "losses/policy_loss": [-0.007953159511089325, 0.001793455332517624],
    },
    "spo_mujoco": {
        "charts/episodic_return": [14.278326034545898, 21.730436325073242],
        "losses/value_loss": [4.50659704208374, 0.27106475830078125],
        "losses/policy_loss": [-0.005930224433541298, 0.002589806914329529],
    },
    "impala_mujoco": {
        "charts/episodic_return": [14.278326034545898, 21.744638442993164],
        "losses/value_loss": [7.355711460113525, 0.4594293534755707],
        "losses/policy_loss": [0.0804489478468895, -0.28501245379447937],
    },
}


def matches_pins(logged, pinned):
    return all(logged[tag] == pytest.approx(values, **PIN_TOLERANCE) for tag, values in pinned.items())


@pytest.mark.parametrize("script", existing_scripts())
def test_tiny_run_logs_the_pinned_numbers(script, tmp_path):
    run_script(script, *TINY, "--lag", "1", "--run-dir", tmp_path)
    scalars = read_scalars(tmp_path)
    assert matches_pins({tag: [v for _, v in scalars[tag]] for tag in PINNED[script]}, PINNED[script])


@pytest.mark.parametrize("script", existing_scripts())
def test_pin_tolerance_admits_another_cpu_but_not_a_changed_arithmetic(script):
    """The tolerance against perturbations of the pins of the sizes measured above."""
    pinned = PINNED[script]
    other_cpu = {tag: [v * (1 + 5e-7) + 1.3e-7 for v in values] for tag, values in pinned.items()}
    assert matches_pins(other_cpu, pinned)
    planted = {**pinned, "losses/value_loss": [v * (1 + 1.2e-4) for v in pinned["losses/value_loss"]]}
    assert not matches_pins(planted, pinned)
    planted = {**pinned, "losses/policy_loss": [v + 1.4e-6 for v in pinned["losses/policy_loss"]]}
    assert not matches_pins(planted, pinned)


@pytest.mark.parametrize("script", existing_scripts())
def test_the_rollout_takes_one_torch_thread_and_the_update_torch_threads(script, tmp_path, monkeypatch):
    """--torch-threads is the update's: the policy acts on one thread, so that it leaves the cores to the envs."""
    import torch

    calls, set_num_threads = [], torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n) or set_num_threads(n))
    run_in_process(script, *TINY, "--torch-threads", "2", "--run-dir", tmp_path)
    # main's seeding, then per iteration the rollout's and the update's (2 iterations); run_in_process resets it to 1
    assert calls == [2] + [1, 2] * 2 + [1]


@pytest.mark.parametrize("num_envs", [1, 8, 500])
def test_scale_rewards_is_the_step_by_step_arithmetic(num_envs):
    import numpy as np
    import torch

    import ppo_mujoco as ppo

    rng = np.random.default_rng(num_envs)
    rewards = rng.normal(1.0, 3.0, (50, num_envs)).astype(np.float32)
    dones = (rng.random((50, num_envs)) < 0.1).astype(np.float32)
    # The reference: CleanRL's NormalizeReward as the scripts did it before, one return_rms.update per step.
    rms, ret, expected = ppo.RunningMeanStd(), torch.full((num_envs,), 0.5), []
    for t in range(50):
        ret = ret * 0.99 + torch.from_numpy(rewards[t])
        rms.update(ret)
        expected.append((torch.from_numpy(rewards[t]) / torch.sqrt(rms.var.float() + 1e-8)).clamp(-10.0, 10.0))
        ret = ret * (1.0 - torch.from_numpy(dones[t]))
    got_rms, start = ppo.RunningMeanStd(), np.full(num_envs, 0.5, dtype=np.float32)
    scaled, carried = ppo.scale_rewards(rewards, dones, start, got_rms, 0.99)
    assert torch.equal(scaled, torch.stack(expected))
    assert np.array_equal(carried, ret.numpy())
    for name in ("mean", "var", "count"):
        assert torch.equal(getattr(got_rms, name), getattr(rms, name)), name


def test_compare_sb3_scores_sb3_episodes_like_our_logs():
    """SB3's episodes are grouped into 2048-step rollouts, each rollout's mean logged at its last step (as
    ppo_mujoco.py logs charts/episodic_return), then tools/grid/aggregate.py's last-10% window. Hand-worked: the
    episodes end at steps 1000, 2000, 2100, 5100, 7100, 8192, in rollouts 0, 0, 1, 2, 3, 3; of the rollout ends
    2048, 4096, 6144, 8192 only 8192 is past 0.9 x 8192, so the score is the mean of rollout 3's episodes."""
    from tools.studies.compare_sb3 import final_score_of_episodes

    lengths, returns = [1000, 1000, 100, 3000, 2000, 1092], [1.0, 2.0, 3.0, 4.0, 5.0, 7.0]
    assert final_score_of_episodes(returns, lengths, 8192) == pytest.approx(6.0)
    # 20 rollouts: the window (> 36,864) holds the rollouts ending at 38,912 and 40,960; the last episodes end
    # in rollouts 18 (step 38,000) and 19 (40,000 and 40,960).
    lengths, returns = [38_000, 2_000, 960], [10.0, 20.0, 40.0]
    assert final_score_of_episodes(returns, lengths, 40_960) == pytest.approx((10.0 + 30.0) / 2)
    assert final_score_of_episodes([], [], 2048) is None


@pytest.mark.skipif(not os.environ.get("SB3_PYTHON"), reason="set SB3_PYTHON to a Python with stable_baselines3")
def test_compare_sb3_prints_the_ratio():
    proc = subprocess.run(
        [sys.executable, "-m", "tools.studies.compare_sb3", "--sb3-python", os.environ["SB3_PYTHON"]]
        + ["--total-timesteps", "2048", "--repeats", "1"],
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    for name in ("ppo_mujoco.py", "Stable-Baselines3 PPO"):
        assert float(rows[name].split("|")[2].replace(",", "")) > 0
        assert rows[name].split("|")[5].strip() != "n/a"  # both score the returns of finished episodes
    assert "ppo_mujoco.py / SB3:" in proc.stdout


def test_compare_sb3_needs_a_python_with_sb3():
    proc = subprocess.run(
        [sys.executable, "-m", "tools.studies.compare_sb3", "--sb3-python", sys.executable, "--total-timesteps", "2048"],
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "cannot import stable_baselines3" in proc.stderr
