"""tools/bench/benchmark.py: a tiny run prints one table with every row it promises, the baseline revision's included,
and writes it as JSON that --render prints again."""

import re
import subprocess
import sys

from conftest import ROOT, SUBPROCESS_ENV, import_script


def test_benchmark_prints_the_table(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.bench.benchmark",
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
            "--args=--torch-threads 1",
            "--out",
            str(tmp_path / "table.json"),
        ],
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    # Without --backend each revision trains on its own default backend, which the row names.
    names = [re.sub(r"\((gymnasium|envpool)\)", "(B)", row.split("|")[1].strip()) for row in rows]
    assert names == [
        "physics limit (mujoco.rollout, 1 threads)",
        "env only: gymnasium",
        "env only: envpool",
        "train ppo_mujoco lag 0 (B) --torch-threads 1",  # --args: the current tree's runs only
        "train ppo_mujoco lag 0 (B) at HEAD",
        "train vaco_mujoco lag 0 (B) --torch-threads 1",
        "train vaco_mujoco lag 0 (B) at HEAD",
    ]
    # The current revision's default (auto) resolves to a backend for this shape; the row names the one it ran on.
    shape = ["--env-id", "Hopper-v5", "--num-envs", "2", "--num-steps", "64", "--total-timesteps", "128"]
    assert f"({import_script('ppo_mujoco').parse_args(shape).env_backend})" in rows[3]
    for row in rows:
        assert float(row.split("|")[2].replace(",", "")) > 0
    assert "1.00x PPO" in rows[3] and "x PPO" in rows[5] and "rollout" in rows[5]
    assert "current is" in rows[4] and "current is" in rows[6]
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "baseline" not in worktrees  # the temporary worktree is gone
    for row in rows[3:]:  # training rows: the load average at the start
        assert float(row.split("|")[6]) >= 0
    rendered = subprocess.run(
        [sys.executable, "-m", "tools.bench.benchmark", "--render", str(tmp_path / "table.json")],
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rendered.returncode == 0 and rendered.stdout.strip() in proc.stdout
