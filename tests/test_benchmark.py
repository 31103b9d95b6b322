"""tools/benchmark.py: a tiny run prints one table with every row it promises, the baseline revision's included."""

import subprocess
import sys

from conftest import ROOT, SUBPROCESS_ENV


def test_benchmark_prints_the_table():
    proc = subprocess.run(
        [
            sys.executable,
            "tools/benchmark.py",
            "--env-id",
            "Hopper-v5",
            "--num-envs",
            "2",
            "--num-steps",
            "64",
            "--iterations",
            "1",
            "--env-steps",
            "50",
            "--threads",
            "1",
            "--scripts",
            "ppo_mujoco",
            "vaco_mujoco",
            "--lags",
            "0",
            "--baseline-rev",
            "HEAD",
        ],
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    names = [row.split("|")[1].strip() for row in rows]
    assert names == [
        "physics limit (mujoco.rollout, 1 threads)",
        "env only: gymnasium",
        "env only: envpool",
        "train ppo_mujoco lag 0 (gymnasium)",
        "train ppo_mujoco lag 0 (gymnasium) at HEAD",
        "train vaco_mujoco lag 0 (gymnasium)",
        "train vaco_mujoco lag 0 (gymnasium) at HEAD",
    ]
    for row in rows:
        assert float(row.split("|")[2].replace(",", "")) > 0
    assert "1.00x PPO" in rows[3] and "x PPO" in rows[5] and "rollout" in rows[5]
    assert "current is" in rows[4] and "current is" in rows[6]
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "baseline" not in worktrees  # the temporary worktree is gone
