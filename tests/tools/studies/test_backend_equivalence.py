"""tools/studies/backend_equivalence.py on tiny budgets, in tmp_path (nothing of the checkout's runs/ or results/).

.venv/bin/python -m pytest tests/tools/studies/test_backend_equivalence.py -x -q
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import torch

from tools.stats import welch_interval
from tools.studies import backend_equivalence as be

torch.set_num_threads(1)


def test_intervals():
    mean, lo, hi, n = be.t_bounds([1.0, 2.0, 3.0])
    assert (mean, n) == (2.0, 3) and math.isclose(hi - mean, 4.302652729911275 / math.sqrt(3), rel_tol=1e-9)
    assert math.isnan(be.t_bounds([5.0])[1])
    d, dlo, dhi = welch_interval([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert d == 0.0 and dlo < 0 < dhi
    assert be.overlap(0, 1, 1, 2) and not be.overlap(0, 1, 1.5, 2)


def synthetic_record(backend, seed, offset):
    steps = [2048 * (i + 1) for i in range(20)]
    returns = [100.0 * i + offset + seed for i in range(20)]
    returns[3] = None  # an iteration in which no episode ended: not a common step
    return {"name": f"r{backend}{seed}", "algo": f"ppo-{backend}", "seed": seed, "summary": {"sps": 1000},
            "scalars": {"step": steps, "episodic_return": returns}}  # fmt: skip


def test_curve_tables_overlap_and_separation():
    same = [synthetic_record(b, s, 0.0) for b in be.BACKENDS for s in (1, 2, 3)]
    per_step, binned, final = be.curve_tables(same, bin_iterations=5)
    assert len(per_step) == 19 and all(r["overlap"] for r in per_step)
    assert len(binned) == 4 and all(r["overlap"] for r in binned) and len(final) == 6
    apart = [synthetic_record("gymnasium", s, 0.0) for s in (1, 2, 3)]
    apart += [synthetic_record("envpool", s, 500.0) for s in (1, 2, 3)]
    per_step, binned, _ = be.curve_tables(apart, bin_iterations=5)
    assert not any(r["overlap"] for r in per_step) and not any(r["overlap"] for r in binned)


def test_matched_stepping_agrees_at_machine_precision():
    probe = be.matched_stepping("Hopper-v5", 2, seed=3, steps=5)
    assert probe["max_obs_diff_first_step"] < 1e-12  # uniform actions: no joint limit is reached this early
    assert probe["termination_disagreements"] == 0 and max(probe["episode_lengths"]) <= 5


def test_end_to_end_tiny_and_resumes(tmp_path):
    argv = ["--seeds", "1", "--total-timesteps", "2048", "--eval-episodes", "2", "--probe-envs", "2"]
    argv += ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    argv += ["--", "--num-minibatches", "4", "--update-epochs", "1"]
    be.main(argv)
    out = tmp_path / "out"
    for name in ("probe.json", "eval.csv", "eval_episodes.csv", "curves.csv", "final.csv", "results.json"):
        assert (out / name).exists(), name
    assert sorted(p.name for p in (out / "records").iterdir()) == [
        "Hopper-v5__ppo-envpool__s1.json.gz",
        "Hopper-v5__ppo-gymnasium__s1.json.gz",
    ]
    with open(out / "eval_episodes.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 2  # trained on x evaluated on x episodes
    results = json.loads((out / "results.json").read_text())
    assert len(results["eval"]["rows"]) == 2 and "matched_policy" in results["probe"]
    assert set(results["probe"]["construction_differences"]) >= {"mujoco"}
    # A second call trains and evaluates nothing again.
    lines = []
    opts = be.parse_args(argv)
    be.train(opts, log=lines.append)
    assert lines and all("record exists, skipped" in line for line in lines)
    assert be.evaluate_all(opts, log=lines.append) == rows
    # Evaluation on both backends follows the same loop: an untrained policy scores alike.
    table = be.eval_table(rows)
    assert all(np.isfinite(r["gymnasium_mean"]) and np.isfinite(r["envpool_mean"]) for r in table)


def test_gymnasium_evaluation_matches_the_scripts_evaluate():
    """The tool's gymnasium loop (returns and lengths in one pass) gives ppo_mujoco.evaluate's returns."""
    import ppo_mujoco

    torch.manual_seed(0)
    agent = ppo_mujoco.Agent(11, 3)
    episodes = be.evaluate_gymnasium(agent, "Hopper-v5", 2, seed=5)
    assert [r for r, _ in episodes] == ppo_mujoco.evaluate(agent, "Hopper-v5", 2, 5)
    assert all(length > 0 for _, length in episodes)
