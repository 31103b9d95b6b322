"""tools/studies/aggregate_round2.py: each question's measures against independent computations, and its answer against
the criteria of docs/evidence_round2.md on synthetic cells built to satisfy, break or miss each criterion."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import trim_mean

from tools.grid import aggregate, calibration, run_records
from tools.studies import aggregate_round2 as r2

TASKS = list(r2.TASKS2)
REPS = 400


def cells(spec: dict, seeds=10, noise=0.01, tv=None) -> pd.DataFrame:
    """One row per run: spec[(algo, lag)] = mean normalised score (or {task: score}); the seeds' scores are the
    mean + noise * (a fixed zero-mean pattern), so every cell's mean is exactly its spec."""
    pattern = np.linspace(-1, 1, seeds)
    rows = []
    for (algo, lag), score in spec.items():
        for task in sorted(score) if isinstance(score, dict) else TASKS:
            mean = score[task] if isinstance(score, dict) else score
            window = (tv or {}).get((algo, lag), 0.09)
            rows += [
                {"algo": algo, "task": task, "lag": lag, "seed": s + 1, "normalized_score": mean + noise * pattern[s],
                 "window_tv": window, "source": f"{task}__{algo}__lag{lag}__s{s + 1}"}
                for s in range(seeds)
            ]  # fmt: skip
    return pd.DataFrame(rows)


def q1_spec(vaco8=0.8, matched8=0.5):
    return {("vaco", 0): 0.9, ("vaco", 4): 0.85, ("vaco", 8): vaco8, ("ppo", 0): 0.7, ("ppo", 4): 0.5, ("ppo", 8): 0.4,
            ("ppo-clip0.3", 0): 0.9, ("ppo-clip0.3", 4): 0.7, ("ppo-clip0.3", 8): matched8}  # fmt: skip


def test_window_tv_matches_the_runners_calibration():
    """The per-run window TV of the aggregation is the calibration's (the one that chose ε), on the same record."""
    steps = list(range(100, 1001, 100))
    tv = {s: 0.01 * i for i, s in enumerate(steps)}
    args = {"exp_name": "ppo_mujoco", "env_id": "Hopper-v5", "lag": 0, "seed": 1, "total_timesteps": 1000}
    rec = run_records.make_record("r", args, {"global_step": 1000}, {"final_tv": tv, "episodic_return": {1000: 1.0}}, [])
    final, runs = aggregate.build_tables([rec], log=lambda m: None)
    got = r2.window_tv_table(final, runs).window_tv.iloc[0]
    # steps in (200, 800]: 300..800 -> 0.02..0.07, mean 0.045
    assert got == pytest.approx(calibration.window_tv(rec)) and got == pytest.approx(0.045)


def test_iqm_difference_against_scipy():
    final = cells(q1_spec(), noise=0.2)
    r = r2.iqm_difference(final, "vaco", "ppo-clip0.3", 8, TASKS, REPS, 0)
    x, y = (final[(final.algo == a) & (final.lag == 8)].normalized_score for a in ("vaco", "ppo-clip0.3"))
    assert r["estimate"] == pytest.approx(trim_mean(x, 0.25) - trim_mean(y, 0.25))
    assert r["ci_low"] < r["estimate"] < r["ci_high"] and r["runs"] == 10
    assert r2.iqm_difference(final, "vaco", "missing", 8, TASKS, REPS, 0) is None


def test_is_vacos_gain_a_larger_step_supports_when_vaco_keeps_more_of_its_score_than_the_matched_ppo():
    q, answer = r2.is_vacos_gain_a_larger_step(cells(q1_spec()), REPS, 0, "0.3")
    assert answer == "supports" and not q.provisional
    d = {row["task"]: row for row in q.rows if row["measure"].startswith("D(")}
    # D = (0.8 - 0.9) - (0.5 - 0.9) = 0.3 on each task; the mean of each cell is exact by construction
    assert d["pooled"]["estimate"] == pytest.approx(0.3) and d["Hopper-v5"]["ci_low"] > 0.25


def test_is_vacos_gain_a_larger_step_refutes_when_the_matched_ppo_scores_as_high_at_lag_8():
    assert r2.is_vacos_gain_a_larger_step(cells(q1_spec(vaco8=0.8, matched8=0.85)), REPS, 0, "0.3")[1] == "refutes"


def test_is_vacos_gain_a_larger_step_inconclusive_provisional_and_tv_not_matched():
    noisy = cells(q1_spec(vaco8=0.8, matched8=0.76), noise=0.3)
    assert r2.is_vacos_gain_a_larger_step(noisy, REPS, 0, "0.3")[1] == "inconclusive"  # ΔIQM_8 > 0 but its interval spans 0
    q, answer = r2.is_vacos_gain_a_larger_step(cells(q1_spec(), seeds=3), REPS, 0, "0.3")
    assert q.provisional and "provisional: 3 of the 10" in "\n".join(q.markdown(answer))
    far = cells(q1_spec(), tv={("ppo-clip0.3", 0): 0.05})  # 0.05 vs VACO's 0.09: outside ±25%
    assert r2.is_vacos_gain_a_larger_step(far, REPS, 0, "0.3")[1] == "supports (TV not matched)"
    assert r2.is_vacos_gain_a_larger_step(cells(q1_spec()), REPS, 0, None)[1].startswith("not answerable")


def test_does_vaco_beat_impala_as_used_needs_impala_to_learn():
    spec = {("vaco", 0): 0.9, ("vaco", 8): 0.8, ("ppo", 0): 0.7, ("ppo", 8): 0.4}
    flat = cells({**spec, ("impala-1pass", 0): 0.05, ("impala-1pass", 8): 0.0})
    assert r2.does_vaco_beat_impala_as_used(flat, REPS, 0)[1].startswith("L fails")
    learns = cells({**spec, ("impala-1pass", 0): 0.6, ("impala-1pass", 8): 0.2})
    assert r2.does_vaco_beat_impala_as_used(learns, REPS, 0)[1] == "supports"  # ΔIQM_8 = 0.6, D = 0.3
    beats = cells({**spec, ("impala-1pass", 0): 0.95, ("impala-1pass", 8): 0.9})
    assert r2.does_vaco_beat_impala_as_used(beats, REPS, 0)[1] == "refutes"


def test_does_vaco_hold_on_halfcheetah_three_tasks_and_the_learned_check():
    cheetah = r2.CHEETAH
    three = {**{t: 0.0 for t in TASKS}, cheetah: 0.0}

    def spec(v0, v8, p0, p8, hc_learned=True):
        out = {}
        for (a, k), v in {("vaco", 0): v0, ("vaco", 8): v8, ("ppo", 0): p0, ("ppo", 8): p8}.items():
            out[a, k] = {t: v if (t != cheetah or hc_learned) else 0.0 for t in three}
        out["vaco", 4], out["ppo", 4] = out["vaco", 0], out["ppo", 0]
        return out

    tv = {("vaco", 4): 0.1, ("vaco", 8): 0.1}
    q, answer = r2.does_vaco_hold_on_halfcheetah(cells(spec(0.9, 0.8, 0.7, 0.4), tv=tv), REPS, 0)
    assert answer == "supports" and any(r["measure"] == "D(vaco, ppo), 3 tasks" for r in q.rows)
    assert (
        r2.does_vaco_hold_on_halfcheetah(cells(spec(0.9, 0.8, 0.7, 0.4), tv={("vaco", 4): 0.2}), REPS, 0)[1] == "inconclusive"
    )
    assert r2.does_vaco_hold_on_halfcheetah(cells(spec(0.9, 0.5, 0.7, 0.6), tv=tv), REPS, 0)[1] == "refutes"
    assert r2.does_vaco_hold_on_halfcheetah(cells(spec(0.9, 0.8, 0.7, 0.4, hc_learned=False), tv=tv), REPS, 0)[1].startswith(
        "L3 fails"
    )


def test_does_delta_need_tuning_margin():
    def final(e01, e04, noise=0.01):
        spec = {("vaco", 8): 0.5, ("vaco-delta0.1", 8): 0.5 + e01, ("vaco-delta0.4", 8): 0.5 + e04}
        tv = {("vaco", 8): 0.1, ("vaco-delta0.1", 8): 0.05, ("vaco-delta0.4", 8): 0.2}
        return cells(spec, seeds=5, noise=noise, tv=tv)

    q, answer = r2.does_delta_need_tuning(final(0.03, -0.05), REPS, 0)
    assert answer == "supports" and all(h for k, _, _, h in q.criteria if k == "mechanism")
    assert r2.does_delta_need_tuning(final(0.03, -0.3), REPS, 0)[1] == "refutes"  # δ = 0.4 worse by more than the margin
    assert r2.does_delta_need_tuning(final(0.08, 0.0, noise=0.2), REPS, 0)[1] == "inconclusive"  # may or may not exceed it
