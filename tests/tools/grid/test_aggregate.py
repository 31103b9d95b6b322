"""tools/grid/aggregate.py on synthetic run records with known answers: normalisation, the tables, the primary
measure and ablations, the verdict, the post-hoc deciles, the curves at logged points and the figures it writes; and
the committed evidence grid's deciles against its final-score window. Nothing here reads or writes the checkout's
runs/ or results/ (apart from reading committed files).
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from tools.grid import aggregate, measures, run_records

REF = {"TaskA-v0": (0.0, 100.0), "TaskB-v0": (-100.0, 100.0)}  # random, reference
T = 1000
SEEDS = (1, 2, 3, 4)
# Normalised final score of each run: BASE[algo, lag] + task offset + 0.01 * seed (the seed term cancels in
# every difference of means, so the differences below are exact).
BASE = {
    ("ppo", 0): 0.6,
    ("ppo", 4): 0.4,
    ("ppo", 8): 0.2,
    ("vaco", 0): 0.6,
    ("vaco", 4): 0.5,
    ("vaco", 8): 0.4,
    ("vaco-nofilter", 8): 0.3,
    ("vaco-norealign", 8): 0.35,
    ("spo", 0): 0.5,
    ("spo", 8): 0.1,
    ("impala", 0): 0.3,
    ("impala", 8): 0.0,
}
OFFSET = {"TaskA-v0": 0.0, "TaskB-v0": 0.1}
TV = {0: 0.03, 4: 0.09, 8: 0.11}  # VACO's final TV at each lag; delta/2 = 0.1


def score(algo, lag, task, seed):
    extra = 0.1 if (algo, lag, task) == ("vaco", 8, "TaskB-v0") else 0.0  # VACO gains more on TaskB at lag 8
    return BASE[algo, lag] + OFFSET[task] + 0.01 * seed + extra


def synthetic_record(algo, task, lag, seed, norm_score, finished=True, steps=None):
    """A record whose training return is -500 until 90% of training, then final +- 10 (mean: final)."""
    lo, hi = REF[task]
    final = lo + norm_score * (hi - lo)
    steps = steps or [100, 200, 300, 400, 500, 600, 700, 800, 900, 960, 1000]
    ret = {s: (-500.0 if s <= 900 else final + (10.0 if s < 1000 else -10.0)) for s in steps}
    tv = {s: 5.0 if s <= 900 else (TV[lag] if algo == "vaco" else 0.05) for s in steps}
    args = {"exp_name": f"{algo.split('-')[0]}_mujoco", "env_id": task, "lag": lag, "lag_mode": "uniform", "seed": seed}
    args["total_timesteps"] = T
    if algo.startswith("vaco"):
        args.update(tv_threshold=0.2, rho_bar=1.0, realign=algo != "vaco-norealign", filter=algo != "vaco-nofilter")
    summary = {"global_step": T, "final_return": final} if finished else None
    scalars = {"episodic_return": ret, "final_tv": tv, "backward_tv": {s: 0.02 * lag for s in steps}}
    return run_records.make_record(f"{task}__{algo}__lag{lag}__s{seed}", args, summary, scalars, [1.0, 2.0, 6.0])


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    for algo, lag in BASE:
        for task in REF:
            for seed in SEEDS:
                run_records.write_record(
                    synthetic_record(algo, task, lag, seed, score(algo, lag, task, seed)),
                    root / "g" / f"{task}__{algo}__lag{lag}__s{seed}.json.gz",
                )
    run_records.write_record(synthetic_record("ppo", "TaskA-v0", 0, 7, 9.0, finished=False), root / "g" / "unfinished.json.gz")
    ref = root / "reference.csv"
    ref.write_text(
        "# test table\nenv_id,random_return,reference_return\n" + "".join(f"{k},{lo},{hi}\n" for k, (lo, hi) in REF.items())
    )
    out = root / "out"
    res = aggregate.aggregate([root / "g"], out, reference=ref, reps=300, curve_reps=50, seed=0, log=lambda m: None)
    return root, out, res, ref


def test_normalise():
    ref = pd.DataFrame(
        {"random_return": [0.0, -100.0], "reference_return": [100.0, 100.0]},
        index=pd.Index(["TaskA-v0", "TaskB-v0"], name="env_id"),
    )
    assert np.allclose(aggregate.normalise([50.0, 0.0, 300.0], ["TaskA-v0", "TaskB-v0", "TaskB-v0"], ref), [0.5, 0.5, 2.0])


def test_difference_interval_against_exact_bootstrap():
    """D's interval (rliable's stratified independent bootstrap) against the exact bootstrap distribution: every
    resample of the four 3-run cells enumerated (27^4 equally likely combinations)."""
    cells = {("x", 8): [0.1, 0.5, 0.9], ("x", 0): [0.6, 0.8, 1.3], ("ppo", 8): [0.0, 0.2, 0.7], ("ppo", 0): [0.9, 1.0, 1.6]}
    final = pd.DataFrame(
        [
            {"algo": a, "lag": k, "task": "T", "seed": i, "normalized_score": v}
            for (a, k), vs in cells.items()
            for i, v in enumerate(vs)
        ]
    )
    terms = [(1, "x", 8), (-1, "x", 0), (-1, "ppo", 8), (1, "ppo", 0)]
    task, pooled = aggregate.difference_table(final, terms, "d", reps=4000, seed=0)
    resampled = [np.array(list(itertools.product(cells[a, k], repeat=3))).mean(axis=1) for _, a, k in terms]  # 27 each
    grids = np.meshgrid(*resampled, indexing="ij")
    exact = sum(sign * g for (sign, _, _), g in zip(terms, grids)).ravel()
    lo, hi = np.percentile(exact, [2.5, 97.5])
    assert task["estimate"] == pooled["estimate"] == pytest.approx(0.5 - 0.9 - 0.3 + 3.5 / 3)
    assert (task["ci_low"], task["ci_high"]) == pytest.approx((lo, hi), abs=0.03 * (hi - lo))
    assert (pooled["ci_low"], pooled["ci_high"]) == (task["ci_low"], task["ci_high"])  # one task: pooled = the task
    const = aggregate.difference_table(final.assign(normalized_score=0.3), terms[:2], "d", reps=50, seed=0)[0]
    assert (const["estimate"], const["ci_low"], const["ci_high"]) == pytest.approx((0.0, 0.0, 0.0))


def test_probability_of_improvement_by_pairs(synthetic):
    """P(X > PPO) at each lag against counting pairs: mean over tasks of P(x > y) + P(x = y) / 2."""
    res = synthetic[2]
    poi, final = res["improvement"].set_index(["x", "y"]), res["final"]
    for algo, lag in (("vaco", 8), ("spo", 0), ("impala", 8)):
        per_task = []
        for task in REF:
            cell = lambda a: final[
                (final.algo == a) & (final.lag == lag) & (final.task == task)
            ].normalized_score  # noqa: E731
            x, y = cell(algo).to_numpy(), cell("ppo").to_numpy()
            per_task.append(np.mean([(a > b) + 0.5 * (a == b) for a in x for b in y]))
        r = poi.loc[(f"{algo} lag {lag}", f"ppo lag {lag}")]
        assert r.estimate == pytest.approx(np.mean(per_task)) and r.ci_low <= r.estimate <= r.ci_high


def test_final_scores_and_tables(synthetic):
    _, out, res, _ = synthetic
    final = pd.read_csv(out / "final.csv", comment="#")
    assert (out / "final.csv").read_text().startswith("# final score = mean training episodic return over the last 10%")
    assert len(final) == len(BASE) * 2 * len(SEEDS) and 7 not in set(final.seed)  # unfinished left out
    row = final[(final.algo == "ppo") & (final.task == "TaskB-v0") & (final.lag == 0) & (final.seed == 2)].iloc[0]
    assert row.normalized_score == pytest.approx(0.6 + 0.1 + 0.02)  # mean of the two points after 90% of training
    assert row.final_tv == pytest.approx(0.05) and row.eval_return == pytest.approx(3.0)
    assert set(final.algo) == {"ppo", "vaco", "vaco-nofilter", "vaco-norealign", "spo", "impala"}
    per_task = pd.read_csv(out / "per_task.csv", comment="#")
    p = per_task[(per_task.algo == "vaco") & (per_task.task == "TaskA-v0") & (per_task.lag == 4)].iloc[0]
    seeds = np.array(SEEDS) * 0.01
    assert p.runs == 4 and p.normalized_score_mean == pytest.approx(0.5 + seeds.mean())
    assert p.normalized_score_ci95 == pytest.approx(3.182446 * seeds.std(ddof=1) / 2, rel=1e-5)  # t(0.975, 3)
    assert p.final_tv_mean == pytest.approx(0.09)
    agg = pd.read_csv(out / "aggregate.csv", comment="#")
    get = lambda algo, lag, m: agg[(agg.algo == algo) & (agg.lag == lag) & (agg.metric == m)].iloc[0]  # noqa: E731
    values = np.sort([score("ppo", 0, t, s) for t in REF for s in SEEDS])
    assert get("ppo", 0, "iqm").estimate == pytest.approx(values[2:6].mean())
    assert get("ppo", 0, "mean").estimate == pytest.approx(values.mean())
    for r in agg.itertuples():
        assert r.ci_low <= r.estimate + 1e-12 <= r.ci_high + 2e-12 and r.n_tasks == 2 and r.runs_per_task == 4
    again = aggregate.aggregate_table(res["final"], reps=300, seed=0, log=lambda m: None)
    assert np.allclose(again.ci_low, res["aggregate"].ci_low)  # a fixed seed: reproducible intervals


def test_primary_measure_and_ablations(synthetic):
    _, out, res, _ = synthetic
    deg = pd.read_csv(out / "degradation.csv", comment="#")
    d = deg[(deg.measure == "degradation_difference") & (deg.algo == "vaco")].set_index("task")
    # (VACO 8 - VACO 0) - (PPO 8 - PPO 0): TaskA (0.4 - 0.6) - (0.2 - 0.6) = 0.2; TaskB adds VACO's 0.1 there
    assert d.loc["TaskA-v0", "estimate"] == pytest.approx(0.2) and d.loc["TaskB-v0", "estimate"] == pytest.approx(0.3)
    assert d.loc["pooled", "estimate"] == pytest.approx(0.25) and (d.vs == "ppo").all()
    assert (d.ci_low < d.estimate).all() and (d.estimate < d.ci_high).all() and (d.ci_low > 0).all()
    own = deg[(deg.measure == "degradation") & (deg.task == "pooled")].set_index("algo").estimate
    assert own["ppo"] == pytest.approx(-0.4) and own["impala"] == pytest.approx(-0.3) and "vaco-nofilter" not in own
    assert set(deg[deg.measure == "degradation_difference"].algo) == {"vaco", "spo", "impala"}
    abl = pd.read_csv(out / "ablation.csv", comment="#").set_index(["algo", "task"])
    assert abl.loc[("vaco-nofilter", "TaskA-v0"), "estimate"] == pytest.approx(0.3 - 0.4)
    assert abl.loc[("vaco-norealign", "pooled"), "estimate"] == pytest.approx(((0.35 - 0.4) + (0.35 - 0.5)) / 2)
    assert (abl["lag"] == 8).all()


def test_verdict(synthetic, tmp_path, monkeypatch):
    root, out, res, ref = synthetic
    table = res["verdict_table"].set_index("criterion")
    assert res["verdict"] == "supported" and table.holds.tolist() == [True, True, True, True, False, False]
    assert (
        "| supporting | pooled (VACO 8 - VACO 0) - (PPO 8 - PPO 0): 95% interval above 0 | +0.250 ["
        in (out / "verdict.md").read_text()
    )
    assert "**supported (provisional: 4 of the 10" in res["verdict_md"]  # 4 seeds, not the pre-registered 10
    monkeypatch.setattr(aggregate, "PREREGISTERED_SEEDS", 4)
    assert "**supported**" in aggregate.verdict_markdown(res["verdict_table"], res["verdict"], res["final"])
    md = (out / "verdict.md").read_text()  # with the tables a reading needs
    assert "| vaco | +0.200 [" in md and "| vaco-nofilter | -0.100 [" in md and "| vaco | TaskA-v0 | 0.030 ± 0.000 |" in md
    # Flip the grid: VACO loses more than PPO and ends below it -> refuted
    g = tmp_path / "g"
    for f in (root / "g").glob("*.json.gz"):
        rec = run_records.read_record(f)
        if rec["algo"] == "vaco" and rec["lag"] == 8:
            rec["scalars"]["episodic_return"] = [
                -500.0 if v == -500.0 else v - 60.0 for v in rec["scalars"]["episodic_return"]
            ]
        run_records.write_record(rec, g / f.name)
    flipped = aggregate.aggregate([g], tmp_path / "o", reference=ref, reps=100, curve_reps=10, plots=False, log=lambda m: None)
    holds = flipped["verdict_table"].set_index("kind").holds
    assert flipped["verdict"] == "refuted" and holds["refuting"].tolist() == [True, True]
    # Without lag-8 runs nothing can be judged
    only0 = aggregate.aggregate(
        [r for r in g.glob("*lag0*")], tmp_path / "o0", reference=ref, reps=50, curve_reps=10, plots=False, log=lambda m: None
    )
    assert only0["verdict"] == "inconclusive" and only0["verdict_table"].holds.isna().all()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.grid.aggregate",
            str(g),
            "--reference",
            str(ref),
            "--out",
            str(tmp_path / "cli"),
            "--verdict",
            "--no-plots",
            "--reps",
            "50",
            "--curve-reps",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert (
        proc.returncode == 0
        and "pre-registered criteria: **refuted (provisional: 4 of the 10 pre-registered seeds" in proc.stdout
    ), proc.stderr


def test_deciles_post_hoc(tmp_path):
    """Per-decile means against a loop over the steps with the boundaries written out; 1-9 and the whole run too."""
    steps = list(range(50, 1001, 50))  # 20 iterations, 2 per decile
    rs = np.random.RandomState(3)
    values = {seed: {c: rs.rand(len(steps)) for c in measures.DECILE_COLUMNS} for seed in (1, 2, 3)}
    g = tmp_path / "g"
    for seed, cols in values.items():
        rec = synthetic_record("vaco", "TaskA-v0", 8, seed, 0.5, steps=steps)
        for c, v in cols.items():
            rec["scalars"][c] = [float(x) for x in v]
        run_records.write_record(rec, g / f"{seed}.json.gz")
    ref = tmp_path / "ref.csv"
    ref.write_text("env_id,random_return,reference_return\nTaskA-v0,0,100\n")
    res = aggregate.aggregate([g], tmp_path / "o", reference=ref, reps=20, curve_reps=5, log=lambda m: None)
    dec = pd.read_csv(tmp_path / "o" / "deciles.csv", comment="#", dtype={"decile": str}).set_index("decile")
    assert dec.index.tolist() == [*map(str, range(1, 11)), "1-9", "all"] and (dec.runs == 3).all()
    for c in measures.DECILE_COLUMNS:
        for d in range(1, 11):
            per_run = [
                np.mean([v for s, v in zip(steps, values[k][c]) if (d - 1) * T / 10 < s <= d * T / 10]) for k in (1, 2, 3)
            ]
            assert dec.loc[str(d), f"{c}_mean"] == pytest.approx(np.mean(per_run), rel=1e-5)
            assert dec.loc[str(d), f"{c}_ci95"] == pytest.approx(4.302653 * np.std(per_run, ddof=1) / np.sqrt(3), rel=1e-4)
        early = [np.mean([v for s, v in zip(steps, values[k][c]) if s <= 0.9 * T]) for k in (1, 2, 3)]
        assert dec.loc["1-9", f"{c}_mean"] == pytest.approx(np.mean(early), rel=1e-5)
        assert dec.loc["all", f"{c}_mean"] == pytest.approx(np.mean([values[k][c].mean() for k in (1, 2, 3)]), rel=1e-5)
    assert "Post hoc, not pre-registered" in res["verdict_md"] and "deciles.png" in res["written"]


def test_not_learned_is_marked(synthetic):
    agg = pd.DataFrame(
        {
            "algo": ["a", "b", "c", "a"],
            "lag": [0, 0, 0, 8],
            "metric": "iqm",
            "estimate": [0.0, 0.5, -0.01, 0.0],
            "ci_low": [-0.01, 0.4, -0.02, 0.1],
            "ci_high": [0.02, 0.6, 0.0, 0.2],
        }
    )
    assert aggregate.not_learned(agg) == {"a", "c"} and aggregate.not_learned(agg, lag=8) == set()
    res = synthetic[2]  # every synthetic algorithm learns: nothing marked
    assert "†" not in res["verdict_md"]
    md = aggregate.results_markdown(res["aggregate"], res["degradation"], res["ablation"], res["per_task"], marked={"impala"})
    assert "| impala † | " in md and "† did not learn" in md


def test_curves_at_logged_points_only(tmp_path):
    ref = tmp_path / "ref.csv"
    ref.write_text("env_id,random_return,reference_return\nTaskA-v0,0,100\nTaskB-v0,-100,100\n")
    g = tmp_path / "g"
    steps = {1: [100, 300, 500, 1000], 2: [100, 200, 500, 1000], 3: [100, 500, 700, 1000]}  # common: 100, 500, 1000
    for seed, st in steps.items():
        rec = synthetic_record("ppo", "TaskA-v0", 0, seed, 0.5, steps=st)
        run_records.write_record(rec, g / f"{seed}.json.gz")
    res = aggregate.aggregate([g], tmp_path / "o", reference=ref, reps=20, curve_reps=20, log=lambda m: None)
    c = res["curves"]
    assert c.step.tolist() == [100, 500, 1000] and c.iqm.tolist() == pytest.approx([-5.0, -5.0, 0.4])
    assert measures.curve_steps([pd.DataFrame({"step": np.arange(1, 101), "episodic_return": 1.0})], 5).tolist() == [
        1,
        26,
        51,
        75,
        100,
    ]


def test_figures(synthetic):
    _, out, res, _ = synthetic
    for name in (
        "score_vs_lag.png",
        "intervals.png",
        "degradation.png",
        "ablation.png",
        "iqm_curves.png",
        "performance_profiles.png",
        "probability_of_improvement.png",
        "task_curves.png",
        "final_tv.png",
    ):
        assert name in res["written"] and (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_cli_defaults_stay_out_of_tracked_folders():
    assert aggregate.DEFAULT_OUT == "runs/aggregate" and "runs/" in (ROOT / ".gitignore").read_text().split()
    assert [p.relative_to(ROOT).as_posix() for p in aggregate.DEFAULT_SOURCES] == [
        f"results/records/tier{i}" for i in (1, 2, 3)
    ]


def test_decile_10_is_the_final_window():
    folder = ROOT / "results" / "evidence_grid_500k"
    by_decile = pd.read_csv(folder / "deciles_d.csv", comment="#")
    final = pd.read_csv(folder / "degradation.csv", comment="#")
    final = final[(final.measure == "degradation_difference") & (final.algo == "vaco")].set_index("task")
    last = by_decile[by_decile.decile == 10].set_index("task")
    assert len(last) == 3
    for column in ("estimate", "ci_low", "ci_high", "t_low", "t_high"):
        assert np.allclose(last[column], final.loc[last.index, column], rtol=0, atol=1e-9), column
