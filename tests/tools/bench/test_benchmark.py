"""tools/bench/benchmark.py: a tiny run prints one table with every row it promises, the baseline revision's included,
and writes it as JSON that --render prints again; the throughput page shows the committed tables as --render prints
them."""

import json
import os
import re
import subprocess
import sys

import pytest

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
            "1",
            "--lag-mode",
            "fixed",
            "--baseline-rev",
            "HEAD",
            "--args=--overlap",
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
    assert "2 envs x 64 steps, " in proc.stdout and " cores, --lag-mode fixed: `python -m tools.bench.benchmark" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    # Without --backend each revision trains on its own default backend, which the row names.
    names = [re.sub(r"\((gymnasium|envpool)\)", "(B)", row.split("|")[1].strip()) for row in rows]
    assert names == [
        "physics limit (mujoco.rollout, 1 threads)",
        "env only: gymnasium",
        "env only: envpool",
        "train ppo_mujoco lag 1 (B) --overlap",  # --args: the current tree's runs only; --lag-mode: both revisions'
        "train ppo_mujoco lag 1 (B) at HEAD",
        "train vaco_mujoco lag 1 (B) --overlap",
        "train vaco_mujoco lag 1 (B) at HEAD",
    ]
    # The physics limit: the median of one measurement at the start and one before each of the 4 training runs.
    limits = json.loads((tmp_path / "table.json").read_text())["physics_limits"]
    assert len(limits) == 5 and len(set(limits)) == 5
    assert f"| {sorted(limits)[2]:,.0f} | 1.00 |" in rows[0]
    assert (
        f"median of 5, one at the start and one before each training run: {min(limits):,.0f} to {max(limits):,.0f}" in rows[0]
    )
    # The current revision's default (auto) resolves to a backend for this shape; the row names the one it ran on.
    shape = ["--env-id", "Hopper-v5", "--num-envs", "2", "--num-steps", "64", "--total-timesteps", "128"]
    assert f"({import_script('ppo_mujoco').parse_args(shape).env_backend})" in rows[3]
    for row in rows:
        assert float(row.split("|")[2].replace(",", "")) > 0
    assert "1.00x PPO" in rows[3] and "x PPO" in rows[5] and "rollout" in rows[5]
    assert "current is" in rows[4] and "current is" in rows[6]
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "baseline" not in worktrees  # the temporary worktree is gone
    for row in rows[3:]:  # training rows: the load average at the start, the cores kept busy (CPU time / wall time)
        assert float(row.split("|")[6]) >= 0
        assert 0.1 < float(re.search(r"cores busy (\d+\.\d\d)", row)[1]) <= 1.05 * os.cpu_count()
    rendered = subprocess.run(
        [sys.executable, "-m", "tools.bench.benchmark", "--render", str(tmp_path / "table.json")],
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rendered.returncode == 0 and rendered.stdout.strip() in proc.stdout


def test_steady_sps_is_the_pace_between_the_first_and_the_last_iteration(tmp_path):
    """From the logged cumulative times: iterations 2 and 3 of a 4-iteration run took (4 + 7) - (2 + 3) = 6 s for
    2 batches of 100 steps (the 4th, 5 + 9, is not counted); below 3 iterations there is nothing between; the
    table's note gives it per row."""
    from torch.utils.tensorboard import SummaryWriter

    from tools.bench.benchmark import render, steady_sps

    with SummaryWriter(tmp_path / "run") as writer:
        for step, (rollout, update) in enumerate([(2, 3), (3, 5), (4, 7), (5, 9)], start=1):
            writer.add_scalar("perf/rollout_seconds", rollout, step * 100)
            writer.add_scalar("perf/update_seconds", update, step * 100)
    assert steady_sps(str(tmp_path / "run"), 100) == pytest.approx(200 / 6)
    with SummaryWriter(tmp_path / "short") as writer:
        for step in (1, 2):
            writer.add_scalar("perf/rollout_seconds", step, step)
            writer.add_scalar("perf/update_seconds", step, step)
    assert steady_sps(str(tmp_path / "short"), 100) is None
    limit = {"what": "physics limit (mujoco.rollout, 1 thread)", "sps": 100.0, "note": ""}
    trained = {"what": "train", "sps": 20.0, "note": "", "rollout_seconds": 1, "update_seconds": 1, "load": 1}
    table = render({"title": "t", "command": "c", "rows": [limit, {**trained, "steady_sps": 25.0}, trained]})
    assert table.count("iterations 2 to n-1: 25/s, 0.25 of the limit") == 1


def test_the_throughput_page_shows_the_committed_tables():
    """Every table of docs/throughput.md marked as rendered is what --render prints from its file under results/."""
    from tools.bench.benchmark import render

    page = (ROOT / "docs" / "throughput.md").read_text()
    blocks = re.findall(r"<!-- rendered from (\S+) -->\n(.*?)\n<!-- end -->", page, re.S)
    assert len(blocks) >= 4
    for path, shown in blocks:
        assert shown.strip() == render(json.loads((ROOT / path).read_text())), path
