#!/usr/bin/env python
"""Aggregate MuJoCo runs (committed run records, or run folders) into tables, figures and a verdict.

    python -m tools.grid.aggregate --verdict --out results/evidence_grid_500k   # regenerate the evidence grid's results
    python -m tools.grid.aggregate results/records/tier1 runs/grid   # records and/or run folders (default: tier1..3)
    python -m tools.grid.aggregate runs/grid --export-records results/records/mygrid   # run folders -> records
    python -m tools.grid.aggregate --measure-random [ENV ...] [--episodes 20] [--write]  # random-policy returns

Definitions (every table and figure states the ones it uses):
* Final score: the mean logged training return over the last 10% of steps (steps > 0.9 x the final step; the last
  point if none), normalised (score - random) / (reference - random) with results/reference_scores.csv: 0 = uniform-
  random actions, 1 = CleanRL PPO at 8M steps. Final TV, backward TV, ...: means over the same window.
* rliable computes the aggregates (IQM, mean, median, optimality gap), the IQM curves, the performance profiles and
  the probability of improvement, with 95% percentile intervals of its stratified bootstrap (runs resampled within
  tasks). Per-task means: 95% Student-t intervals (n - 1 degrees of freedom: 2.26 at 10 seeds, 4.30 at 3).
* Ours, on top: the difference in degradation D = (X[8] - X[0]) - (PPO[8] - PPO[0]) of the mean normalised score,
  per task and pooled (the mean over tasks), its interval from rliable's stratified independent bootstrap (each
  (algorithm, lag) cell resampled on its own); > 0: X loses less. An algorithm whose lag-0 IQM interval includes 0
  did not learn: its D is marked (†). Ablations: (ablation - VACO) at lag 8. The pre-registered verdict. Post hoc,
  not pre-registered: return, final TV, minibatches over δ/2 and samples masked per training decile; the primary
  measure D(VACO, PPO) per training decile (each run's normalised mean return in that decile in place of its final
  score); the change of the return from decile 9 to 10. Beside every bootstrap interval of a difference, its
  Welch t interval (t_low, t_high).
* Learning curves: at the steps every run of the curve logged (at most --curve-points), never interpolated.

Outputs: final.csv, runs.csv, per_task.csv, aggregate.csv, degradation.csv, ablation.csv, deciles.csv, deciles_d.csv,
rise_9_to_10.csv, iqm_curves.csv, probability_of_improvement.csv, verdict.md and the figures (tools/grid/aggregate_figures.py). The run-record format is
tools/grid/run_records.py; the normalisation table, tools/grid/reference_scores.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from rliable import metrics

from tools.grid import aggregate_figures
from tools.grid.measures import (
    AGG_METRICS,
    DECILE_COLUMNS,
    LAG_HI,
    LAG_LO,
    TV_TOLERANCE,
    curve_steps,
    delta_of,
    is_ablation,
    order_labels,
    score_matrix,
)
from tools.grid.reference_scores import DEFAULT_REFERENCE, REFERENCE_ENVS, load_reference, measure_random, write_reference
from tools.grid.run_records import RECORD_COLUMNS, NotARecord, collect_records, export_records
from tools.stats import bootstrap, t_interval, welch_contrast_interval

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SOURCES = [REPO / "results" / "records" / f"tier{i}" for i in (1, 2, 3)]
DEFAULT_OUT = "runs/aggregate"
FINAL_FRACTION = 0.1  # final score = mean over the last 10% of training
TV_LAGS = (4, 8)
PREREGISTERED_SEEDS = 10  # Tier 1's seeds per (algorithm, task, lag): fewer makes the verdict provisional
AGG_FUNCS = (metrics.aggregate_iqm, metrics.aggregate_mean, metrics.aggregate_median, metrics.aggregate_optimality_gap)
SCORE_DEF = "final score = mean training episodic return over the last 10% of steps"
NORM_DEF = "normalised: 0 = uniform-random actions, 1 = CleanRL PPO at 8M steps"
WINDOW_DEF = "averaging window: logged steps > 0.9 x final step"
NOT_LEARNED_NOTE = (
    f"did not learn (IQM at lag {LAG_LO} indistinguishable from the random policy's 0): its difference "
    "in degradation says it had nothing to lose, not that it is robust to lag"
)


# ----------------------------------------------------------------------------------------------- tables of runs


def window_mean(steps: np.ndarray, values: np.ndarray, last_step: float) -> float:
    ok = np.isfinite(values)
    steps, values = steps[ok], values[ok]
    if len(values) == 0:
        return float("nan")
    w = values[steps > (1 - FINAL_FRACTION) * last_step]
    return float(w.mean()) if len(w) else float(values[-1])


def record_frames(rec: dict) -> tuple[dict, pd.DataFrame]:
    """(one final.csv row without normalisation, the run's tidy per-step rows)."""
    tidy = pd.DataFrame(
        {k: np.asarray([np.nan if v is None else v for v in vals], float) for k, vals in rec["scalars"].items()}
    )
    steps = tidy["step"].to_numpy(float) if len(tidy) else np.zeros(0)
    summary = rec.get("summary") or {}
    last_step = float(summary.get("global_step") or (steps.max() if len(steps) else np.nan))
    row = {key: rec[key] for key in ("algo", "task", "lag", "lag_mode", "seed")}
    ret = tidy["episodic_return"].to_numpy(float) if "episodic_return" in tidy else np.zeros(0)
    row.update(source=rec["name"], last_step=last_step, n_returns=int(np.isfinite(ret).sum()))
    row["final_return"] = window_mean(steps, ret, last_step)
    row.update({c: window_mean(steps, tidy[c].to_numpy(float), last_step) for c in RECORD_COLUMNS[1:] if c in tidy})
    evals = [v for v in rec.get("eval_returns") or [] if v is not None]
    row["eval_return"] = float(np.mean(evals)) if evals else float(summary.get("eval_return") or np.nan)
    row.update(sps=float(summary.get("sps") or np.nan), finished=rec["finished"])
    keys = ("total_timesteps", "num_envs", "num_steps", "tv_threshold", "rho_bar")
    row.update({k: rec["args"][k] for k in keys if k in rec["args"]})
    for key in ("seed", "lag", "task", "algo"):
        tidy.insert(0, key, row[key])
    tidy.insert(0, "source", rec["name"])
    return row, tidy


def build_tables(records, log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    if not records:
        raise SystemExit("error: no finished runs found")
    rows, tidies = zip(*(record_frames(r) for r in records))
    final, key = pd.DataFrame(list(rows)), ["algo", "task", "lag", "seed"]
    dup = final.duplicated(key, keep="first")
    if dup.any():  # the same run as a record and as a run folder, or run twice
        first = final[~dup].set_index(key)["final_return"]
        for _, r in final[dup].iterrows():
            if not np.isclose(first.loc[tuple(r[key])], r["final_return"], rtol=1e-5, equal_nan=True):
                scores = f"{first.loc[tuple(r[key])]:g} and {r['final_return']:g}"
                log(f"warning: two different runs of {tuple(r[key])}: final scores {scores}; kept the first")
        keep = set(final.loc[~dup, "source"])
        final, tidies = final[~dup], [t for t in tidies if len(t) == 0 or t["source"].iloc[0] in keep]
    runs = pd.concat(tidies, ignore_index=True).drop_duplicates(key + ["step"]).sort_values(key + ["step"])
    return final.sort_values(key).reset_index(drop=True), runs.reset_index(drop=True)


def normalise(scores, tasks, ref: pd.DataFrame | None):
    """(score - random) / (reference - random), elementwise; `ref=None` leaves scores unchanged."""
    scores = np.asarray(scores, dtype=float)
    if ref is None:
        return scores
    lo, hi = (ref.loc[list(tasks), c].to_numpy(float) for c in ("random_return", "reference_return"))
    return (scores - lo) / (hi - lo)


# ----------------------------------------------------------------------------------------------- statistics


def aggregate_table(final: pd.DataFrame, reps: int, seed: int, log=print) -> pd.DataFrame:
    """Per (algo, lag): IQM / mean / median / optimality gap of the normalised final score over tasks and runs."""
    mats = {}
    for (algo, lag), df in final[np.isfinite(final["normalized_score"])].groupby(["algo", "lag"], sort=True):
        mats[algo, lag] = score_matrix(df, warn=lambda m, a=algo, k=lag: log(f"warning: {a} lag {k}: {m}"))
    point, ci = bootstrap({k: x for k, (x, _) in mats.items()}, lambda x: np.array([f(x) for f in AGG_FUNCS]), reps, seed)
    rows = [
        {"algo": a, "lag": k, "metric": m, "estimate": point[a, k][i], "ci_low": ci[a, k][0, i], "ci_high": ci[a, k][1, i],
         "n_tasks": x.shape[1], "runs_per_task": x.shape[0], "tasks": " ".join(t)}
        for (a, k), (x, t) in mats.items() for i, m in enumerate(AGG_METRICS)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def per_task_table(final: pd.DataFrame) -> pd.DataFrame:
    """Per (algo, task, lag): runs, mean return, normalised score, final TV, eval return, each mean ± t half-width."""
    rows = []
    for (algo, task, lag), df in final.groupby(["algo", "task", "lag"], sort=True):
        row = {"algo": algo, "task": task, "lag": lag, "runs": len(df)}
        for col in ("final_return", "normalized_score", "final_tv", "backward_tv", "eval_return", "sps"):
            if col in df:
                row[f"{col}_mean"], row[f"{col}_ci95"], _ = t_interval(df[col])
        rows.append(row)
    return pd.DataFrame(rows)


def difference_table(final, terms, name, reps, seed, extra=None) -> list[dict]:
    """Per task and pooled (the mean over tasks): the sum of sign x mean(cell) over `terms` [(sign, algo, lag), ...],
    the interval from rliable's stratified independent bootstrap (each (algo, lag) cell's runs x tasks matrix
    resampled on its own, within tasks). Tasks missing any cell are left out."""
    cell = lambda a, k: final[(final.algo == a) & (final.lag == k)].dropna(subset=["normalized_score"])  # noqa: E731
    tasks = sorted(set.intersection(*(set(cell(a, k).task) for _, a, k in terms)))
    if not tasks:
        return []
    mats = [score_matrix(cell(a, k), tasks=tasks)[0] for _, a, k in terms]
    signs = np.array([s for s, _, _ in terms], float)

    def stat(*xs):  # per task, then pooled
        per_task = sum(s * x.mean(axis=0) for s, x in zip(signs, xs))
        return np.append(per_task, per_task.mean())

    point, ci = bootstrap({name: mats}, stat, reps, seed)
    runs = min(x.shape[0] for x in mats)
    t_lo, t_hi = welch_contrast_interval(mats, signs)
    return [
        {"measure": name, **(extra or {}), "task": t, "estimate": point[name][i], "ci_low": ci[name][0, i],
         "ci_high": ci[name][1, i], "t_low": t_lo[i], "t_high": t_hi[i], "min_runs_per_cell": runs}
        for i, t in enumerate([*tasks, "pooled"])
    ]  # fmt: skip


def in_mode_of(label: str, base: str) -> str:
    """The base algorithm's label in `label`'s lag mode (`ppo[fixed]` for `vaco[fixed]`): compared within one mode."""
    return base + (label[label.index("[") :] if "[" in label else "")


def degradation_table(final, reps, seed, base="ppo", lo=LAG_LO, hi=LAG_HI) -> pd.DataFrame:
    """Each algorithm's degradation (X[hi] - X[lo]) and its difference from the base's: (X[hi]-X[lo]) - (B[hi]-B[lo])."""
    rows = []
    algos = [a for a in sorted(final["algo"].unique()) if {lo, hi} <= set(final[final.algo == a]["lag"])]
    for a in algos:
        rows += difference_table(final, [(1, a, hi), (-1, a, lo)], "degradation", reps, seed, {"algo": a, "vs": ""})
        b = in_mode_of(a, base)
        if a != b and b in algos:
            terms = [(1, a, hi), (-1, a, lo), (-1, b, hi), (1, b, lo)]
            rows += difference_table(final, terms, "degradation_difference", reps, seed, {"algo": a, "vs": b})
    return pd.DataFrame(rows)


def ablation_table(final, reps, seed, lag=LAG_HI) -> pd.DataFrame:
    """Each VACO ablation's effect at `lag`: ablation - VACO (normalised final score), per task and pooled."""
    rows = []
    for a in sorted(final["algo"].unique()):
        if is_ablation(a) and lag in set(final[final.algo == a]["lag"]):
            rows += difference_table(
                final, [(1, a, lag), (-1, "vaco", lag)], "ablation_effect", reps, seed, {"algo": a, "lag": lag}
            )
    return pd.DataFrame(rows)


def not_learned(agg, lag=LAG_LO) -> set:
    """The algorithms whose IQM at `lag` has a 95% interval that includes 0, the uniform-random policy's score."""
    iq = agg[(agg.metric == "iqm") & (agg.lag == lag)] if len(agg) else agg
    return set(iq[(iq.ci_low <= 0) & (iq.ci_high >= 0)].algo) if len(iq) else set()


def probability_of_improvement_table(final, reps, seed, base="ppo") -> pd.DataFrame:
    """rliable's probability of improvement P(X > base) at each lag and lag mode (X's and the base's runs resampled
    on their own)."""
    pairs = {}
    for (a, k), df in final.groupby(["algo", "lag"], sort=True):
        name = in_mode_of(a, base)
        b = final[(final.algo == name) & (final.lag == k)]
        if a != name and len(b) and set(df.task) == set(b.task):
            pairs[f"{a} lag {k},{name} lag {k}"] = [score_matrix(df)[0], score_matrix(b)[0]]
    if not pairs:
        return pd.DataFrame()
    point, ci = bootstrap(pairs, lambda x, y: np.array([metrics.probability_of_improvement(x, y)]), reps, seed)
    rows = [dict(zip(("x", "y"), p.split(",")), estimate=point[p][0], ci_low=ci[p][0, 0], ci_high=ci[p][1, 0]) for p in pairs]
    return pd.DataFrame(rows)


def decile_table(final: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Post hoc: per (algo, task, lag) and training decile (decile d holds the logged steps in ((d-1)/10, d/10] of
    the run's final step; 10 is the final-score window), each run's mean of every DECILE_COLUMNS column, then mean
    ± 95% t half-width over runs. Decile "1-9": every step before the window; "all": the whole run."""
    cols = [c for c in DECILE_COLUMNS if c in runs]
    if not cols or not len(runs):
        return pd.DataFrame()
    r = runs.merge(final[["source", "last_step"]], on="source")
    r["decile"] = np.clip(np.ceil(10 * r["step"] / r["last_step"]), 1, 10).astype(int)
    spans = [(str(d), r[r.decile == d]) for d in range(1, 11)] + [("1-9", r[r.decile <= 9]), ("all", r)]
    rows = []
    for order, (span, part) in enumerate(spans):
        per_run = part.groupby(["algo", "task", "lag", "seed"])[cols].mean().reset_index()
        for (algo, task, lag), df in per_run.groupby(["algo", "task", "lag"], sort=True):
            row = {"algo": algo, "task": task, "lag": lag, "decile": span, "runs": len(df), "order": order}
            for c in cols:
                row[f"{c}_mean"], row[f"{c}_ci95"], _ = t_interval(df[c])
            rows.append(row)
    return pd.DataFrame(rows).sort_values(["algo", "task", "lag", "order"]).drop(columns="order").reset_index(drop=True)


def decile_scores(final: pd.DataFrame, runs: pd.DataFrame, ref) -> pd.DataFrame:
    """Post hoc: one row per run and training decile d (as decile_table's), `normalized_score` replaced by the run's
    normalised mean training return in that decile; decile 10 is the final-score window, so its score is the final
    score. Any measure of the final score applied to one decile's rows gives that measure's trajectory."""
    r = runs.merge(final[["source", "last_step"]], on="source")
    r["decile"] = np.clip(np.ceil(10 * r["step"] / r["last_step"]), 1, 10).astype(int)
    per_run = r.groupby(["source", "decile"])["episodic_return"].mean().rename("decile_return").reset_index()
    out = final.drop(columns="normalized_score").merge(per_run, on="source")
    out["normalized_score"] = normalise(out["decile_return"], out["task"], ref)
    return out


def decile_degradation_table(scores: pd.DataFrame, reps, seed, algo="vaco", base="ppo") -> pd.DataFrame:
    """Post hoc: the primary measure D(algo, base) per training decile, per task and pooled, with the same bootstrap
    and Welch t interval as at the final window (decile 10)."""
    terms = [(1, algo, LAG_HI), (-1, algo, LAG_LO), (-1, base, LAG_HI), (1, base, LAG_LO)]
    rows = []
    for d in range(1, 11):
        part = scores[scores.decile == d]
        rows += difference_table(part, terms, f"D({algo}, {base})", reps, seed, {"decile": d})
    return pd.DataFrame(rows)


def rise_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Post hoc: per (algo, task, lag), each run's normalised mean training return in decile 10 minus decile 9
    (`scores`: decile_scores), mean and 95% t interval over runs: > 0, the return still rises at the end."""
    rows = []
    piv = scores[scores.decile.isin([9, 10])].pivot_table(
        index=["algo", "task", "lag", "seed"], columns="decile", values="normalized_score"
    )
    if not {9, 10} <= set(piv.columns):
        return pd.DataFrame()
    for (algo, task, lag), g in (piv[10] - piv[9]).groupby(level=["algo", "task", "lag"]):
        mean, half, n = t_interval(g)
        rows.append({"algo": algo, "task": task, "lag": lag, "runs": n, "rise": mean, "t_low": mean - half,
                     "t_high": mean + half})  # fmt: skip
    return pd.DataFrame(rows)


def curve_table(final, runs, ref, max_points, reps, seed, log=print) -> pd.DataFrame:
    """rliable's IQM curve of the normalised training return at logged steps, per (algo, lag)."""
    from scipy.stats import trim_mean

    scores, group_steps = {}, {}
    for (algo, lag), df in final.groupby(["algo", "lag"], sort=True):
        tasks = sorted(df["task"].unique())
        n = min((df.task == t).sum() for t in tasks)
        seeds = {t: sorted(df[df.task == t].seed)[:n] for t in tasks}
        sel = runs[(runs.algo == algo) & (runs.lag == lag)]
        group = {
            (t, s): g.set_index("step")["episodic_return"]
            for (t, s), g in sel.groupby(["task", "seed"])
            if s in seeds.get(t, [])
        }
        steps = curve_steps([g.reset_index() for g in group.values()], max_points)
        if not len(steps):
            log(f"note: {algo} lag {lag}: no step at which every run logged a return; no curve")
            continue
        x = np.stack(
            [
                np.stack([normalise(group[t, seeds[t][i]].reindex(steps), [t] * len(steps), ref) for t in tasks])
                for i in range(n)
            ]
        )
        scores[algo, lag], group_steps[algo, lag] = x, steps  # runs x tasks x points
    if not scores:
        return pd.DataFrame()
    # rliable's aggregate_iqm (scipy's trim_mean(x, 0.25) over runs and tasks) at every point at once
    point, ci = bootstrap(scores, lambda x: trim_mean(x.reshape(-1, x.shape[-1]), 0.25, axis=0), reps, seed)
    return pd.DataFrame(
        [{"algo": a, "lag": k, "step": int(s), "iqm": point[a, k][j], "ci_low": ci[a, k][0, j], "ci_high": ci[a, k][1, j],
          "runs": x.shape[0] * x.shape[1]} for (a, k), x in scores.items() for j, s in enumerate(group_steps[a, k])]
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------- verdict


def _ci(r, sign="+") -> str:
    return f"{r.estimate:{sign}.3f} [{r.ci_low:{sign}.3f}, {r.ci_high:{sign}.3f}]"


def verdict_table(final, agg, deg, per_task, lo=LAG_LO, hi=LAG_HI) -> tuple[pd.DataFrame, str]:
    """The pre-registered criteria (supporting / refuting) evaluated on the results, and the overall verdict:
    'supported' if every supporting criterion holds and no refuting one, 'refuted' if any refuting one holds,
    'inconclusive' otherwise (also when a criterion cannot be evaluated)."""
    d = deg[(deg.measure == "degradation_difference") & (deg.algo == "vaco") & (deg.vs == "ppo")] if len(deg) else deg
    pooled = d[d.task == "pooled"].iloc[0] if len(d) and (d.task == "pooled").any() else None
    tasks = d[d.task != "pooled"] if len(d) else d
    iq = agg[(agg.metric == "iqm") & (agg.lag == hi)].set_index("algo") if len(agg) else pd.DataFrame()
    v, p = (iq.loc["vaco"], iq.loc["ppo"]) if {"vaco", "ppo"} <= set(iq.index) else (None, None)
    half = delta_of(final, "vaco") / 2
    tv = per_task[(per_task.algo == "vaco") & per_task.lag.isin(TV_LAGS)] if "final_tv_mean" in per_task else per_task[:0]
    name, lags, rows = f"(VACO {hi} - VACO {lo}) - (PPO {hi} - PPO {lo})", ", ".join(map(str, TV_LAGS)), []

    def add(kind, criterion, ok, value, holds, missing="missing runs"):  # value, holds: evaluated only when ok
        rows.append((kind, criterion, value() if ok else missing, bool(holds()) if ok else None))

    add("supporting", f"pooled {name}: 95% interval above 0", pooled is not None, lambda: _ci(pooled),
        lambda: pooled.ci_low > 0)  # fmt: skip
    per_task_text = lambda: ", ".join(f"{r.task} {_ci(r)}" for r in tasks.itertuples())  # noqa: E731
    add("supporting", "same sign on every task (in VACO's favour)", len(tasks) >= 2, per_task_text,
        lambda: (tasks.estimate > 0).all(), "fewer than 2 tasks")  # fmt: skip
    add("supporting", f"VACO's lag-{hi} IQM above PPO's", v is not None, lambda: f"VACO {_ci(v, '')} vs PPO {_ci(p, '')}",
        lambda: v.estimate > p.estimate)  # fmt: skip
    tv_text = lambda: ", ".join(f"{r.task} lag {r.lag}: {r.final_tv_mean:.3f}" for r in tv.itertuples())  # noqa: E731
    add("supporting", f"VACO's final TV within ±{TV_TOLERANCE:.0%} of δ/2 = {half:g} at lags {lags} (every task)",
        len(tv) and set(tv.lag) == set(TV_LAGS), tv_text,
        lambda: ((tv.final_tv_mean - half).abs() <= TV_TOLERANCE * half).all())  # fmt: skip
    add("refuting", f"pooled {name} ≤ 0", pooled is not None, lambda: f"{pooled.estimate:+.3f}",
        lambda: pooled.estimate <= 0)  # fmt: skip
    add("refuting", f"VACO below PPO at lag {hi} (IQM)", v is not None, lambda: f"{v.estimate:.3f} vs {p.estimate:.3f}",
        lambda: v.estimate < p.estimate)  # fmt: skip
    table = pd.DataFrame(rows, columns=["kind", "criterion", "value", "holds"])
    sup, ref = table[table.kind == "supporting"].holds, table[table.kind == "refuting"].holds
    if any(h is True for h in ref):
        return table, "refuted"
    return table, "supported" if all(h is True for h in sup) and all(h is False for h in ref) else "inconclusive"


def _task_table(frame, first_col, algos, marked=()):
    """Markdown rows: one per algorithm, one interval per task, then the pooled one; `marked` algorithms get a †."""
    tasks = [t for t in frame.task.unique() if t != "pooled"] + ["pooled"]
    lines = [f"| {first_col} | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for algo in algos:
        d = frame[frame.algo == algo].set_index("task")
        cells = " | ".join(_ci(d.loc[t]) if t in d.index else "" for t in tasks)
        lines.append(f"| {algo}{' †' * (algo in marked)} | {cells} |")
    return lines + (["", f"† {NOT_LEARNED_NOTE}."] if any(a in marked for a in algos) else []) + [""]


def _lag_rows(frame, lags, cell):
    """Markdown table rows `| a | b | cell(row at lag) ... |` for each group of `frame` (keyed by its first columns)."""
    return [f"| {' | '.join(map(str, key))} | " + " | ".join(cell(g, k) for k in lags) + " |" for key, g in frame]


def results_markdown(agg, deg, abl, per_task, norm=NORM_DEF, marked=()) -> str:
    """The tables a reading of the grid needs: IQM per lag, the degradation differences, the ablations, final TV."""
    lines = []
    if len(agg):
        iq = agg[agg.metric == "iqm"].set_index("lag")
        lags = sorted(iq.index.unique())
        lines += [f"IQM of the final score ({norm}), 95% stratified-bootstrap interval (runs per task in brackets):", ""]
        lines += ["| algorithm | " + " | ".join(f"lag {k}" for k in lags) + " |", "|---|" + "---|" * len(lags)]
        groups = [((a,), iq[iq.algo == a]) for a in order_labels(iq.algo.unique())]
        lines += _lag_rows(groups, lags, lambda g, k: f"{_ci(g.loc[k])} ({g.loc[k].runs_per_task})" if k in g.index else "")
        lines.append("")
    dd = deg[deg.measure == "degradation_difference"] if len(deg) else deg
    if len(dd):
        lines += [
            f"Difference in degradation vs PPO, (X lag {LAG_HI} − X lag {LAG_LO}) − "
            f"(PPO lag {LAG_HI} − PPO lag {LAG_LO}):",
            "",
        ]
        lines += _task_table(dd, "algorithm", order_labels(dd.algo.unique()), marked)
    if len(abl):
        lines += [f"Ablations at lag {LAG_HI}, ablation − VACO:", ""]
        lines += _task_table(abl, "ablation", sorted(abl.algo.unique()))
    if "final_tv_mean" in per_task and per_task.final_tv_mean.notna().any():
        lags = sorted(per_task.lag.unique())
        lines += ["Final TV (mean over the last 10% of steps), mean ± 95% t half-width over runs:", ""]
        lines += ["| algorithm | task | " + " | ".join(f"lag {k}" for k in lags) + " |", "|---|---|" + "---|" * len(lags)]
        pt = per_task.set_index("lag")
        groups = [
            ((a, t), pt[(pt.algo == a) & (pt.task == t)])
            for a in order_labels(pt.algo.unique())
            for t in sorted(pt.task.unique())
        ]
        cell = lambda g, k: (
            f"{g.loc[k].final_tv_mean:.3f} ± {g.loc[k].final_tv_ci95:.3f}" if k in g.index else ""
        )  # noqa: E731
        lines += _lag_rows([(key, g) for key, g in groups if len(g)], lags, cell) + [""]
    return "\n".join(lines)


def deciles_markdown(dec: pd.DataFrame, delta: float, algos=("ppo", "vaco")) -> str:
    """Post hoc tables: the mean over runs of each DECILE_COLUMNS statistic per training decile, for `algos`."""
    d = dec[dec.algo.isin(algos)] if len(dec) else dec
    if not len(d):
        return ""
    half, spans = delta / 2, list(dict.fromkeys(d.decile))
    lines = [
        f"Post hoc, not pre-registered: {' and '.join(a.upper() for a in algos)} per training decile (decile d: steps in "
        "((d−1)/10, d/10] of the run; 10 is the final-score window, where the annealed learning rate is ≤ 10% of its "
        "start; 1–9: every step before it; all: the whole run). Means over runs; `deciles.csv` holds the 95% t "
        "half-widths and the other algorithms.",
        "",
    ]
    for col, name in DECILE_COLUMNS.items():
        if f"{col}_mean" not in d or d[f"{col}_mean"].isna().all():
            continue
        band = f" (δ/2 = {half:g}; ±{TV_TOLERANCE:.0%}: {half * (1 - TV_TOLERANCE):g}–{half * (1 + TV_TOLERANCE):g})"
        lines += [f"{name[0].upper()}{name[1:]}{band if col == 'final_tv' else ''}:", ""]
        lines += ["| algo | task | lag | " + " | ".join(spans) + " |", "|---|---|---|" + "---|" * len(spans)]
        for (algo, task, lag), g in d.groupby(["algo", "task", "lag"], sort=True):
            if g[f"{col}_mean"].notna().any():
                cells = (f"{v:.0f}" if col == "episodic_return" else f"{v:.3f}" for v in g[f"{col}_mean"])
                lines.append(f"| {algo} | {task} | {lag} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def verdict_markdown(table: pd.DataFrame, verdict: str, final: pd.DataFrame, norm=NORM_DEF) -> str:
    n = final.groupby(["algo", "task", "lag"]).size()
    core = final[final.algo.isin(["ppo", "vaco"])].groupby(["algo", "task", "lag"]).size()
    if len(core) and core.min() < PREREGISTERED_SEEDS:
        verdict += f" (provisional: {core.min()} of the {PREREGISTERED_SEEDS} pre-registered seeds in some PPO/VACO cell)"
    lines = [
        f"Verdict against the pre-registered criteria: **{verdict}**",
        "",
        f"({SCORE_DEF}; {norm}; intervals: 95% stratified bootstrap over seeds; "
        f"runs per (algorithm, task, lag): {n.min() if n.min() == n.max() else f'{n.min()}–{n.max()}'})",
        "",
        "| kind | criterion | value | holds |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r.kind} | {r.criterion} | {r.value} | {'n/a' if r.holds is None else 'yes' if r.holds else 'no'} |"
        for r in table.itertuples()
    ]
    if len(n) and n.min() < 10:
        lines += ["", f"Note: {n.min()} runs in the smallest cell; percentile-bootstrap intervals are too narrow with few "
                  "seeds "
                  "(about 80% coverage for a nominal 95% at 3 runs per task): read them as indicative only."]  # fmt: skip
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- driver


def write_csv(df: pd.DataFrame, path: Path, header: list[str]):
    """CSV with '# ' comment lines on top stating the definitions (read back with pd.read_csv(comment='#'))."""
    with open(path, "w") as f:
        f.writelines(f"# {line}\n" for line in header)
        df.to_csv(f, index=False)


def aggregate(sources, out, reference=DEFAULT_REFERENCE, normalization="reference", reps=5000, curve_reps=500, curve_points=50,
              seed=0, include_unfinished=False, plots=True, log=print, label="") -> dict:  # fmt: skip
    """Read the sources, write every table, figure and verdict.md into `out`; `label` (e.g. "SMOKE TEST, 40k
    steps") heads every figure title and verdict.md."""
    out = Path(out)
    records = collect_records(sources, include_unfinished, log)
    final, runs = build_tables(records, log)
    ref, norm = None, "not normalised: raw returns"
    if normalization == "reference":
        ref, norm = load_reference(reference), NORM_DEF
        missing = sorted(set(final["task"]) - set(ref.index))
        if missing:
            add = f"`python -m tools.grid.aggregate --measure-random {' '.join(missing)} --write`"
            raise SystemExit(
                f"error: no reference scores for {missing} in {reference}; add them with {add} or use --normalization none"
            )
    else:
        log("note: --normalization none: 'normalised' scores are raw returns (only meaningful for one task)")
    final["normalized_score"] = normalise(final["final_return"], final["task"], ref)
    out.mkdir(parents=True, exist_ok=True)
    per_task, agg = per_task_table(final), aggregate_table(final, reps, seed, log)
    deg, abl, dec = degradation_table(final, reps, seed), ablation_table(final, reps, seed), decile_table(final, runs)
    poi = probability_of_improvement_table(final, curve_reps, seed)
    dec_scores = decile_scores(final, runs, ref) if "episodic_return" in runs else final[:0]
    dec_d = decile_degradation_table(dec_scores, reps, seed) if {"vaco", "ppo"} <= set(final.algo) else pd.DataFrame()
    rises = rise_table(dec_scores) if len(dec_scores) else pd.DataFrame()
    curves = curve_table(final, runs, ref, curve_points, curve_reps, seed, log)
    table, verdict = verdict_table(final, agg, deg, per_task)
    marked = not_learned(agg) if ref is not None else set()  # 0 is the random policy only after normalisation
    boot = f"95% stratified-bootstrap percentile intervals over seeds (rliable, {reps} resamples, seed {seed})"
    base = [SCORE_DEF, norm, WINDOW_DEF]
    welch = "t_low, t_high: 95% Welch t interval (for readings that rest on one end of the bootstrap interval)"
    deg_def = f"degradation = mean(X at lag {LAG_HI}) - mean(X at lag {LAG_LO}); degradation_difference = X's minus PPO's"
    tables = {
        "final.csv": (final, base + ["one row per run; final_tv, backward_tv, ...: means over the same window"]),
        "runs.csv": (runs, ["one row per run and logged step (training iteration)"]),
        "per_task.csv": (per_task, base + ["per (algo, task, lag): mean and 95% Student-t half-width over runs"]),
        "aggregate.csv": (agg, base + [f"per (algo, lag): aggregates over tasks and runs; {boot}"]),
        "degradation.csv": (deg, base + [f"{deg_def} (> 0: X loses less)", f"pooled = mean over tasks; {boot}", welch]),
        "ablation.csv": (abl, base + [f"ablation_effect = mean(ablation) - mean(VACO) at lag {LAG_HI}",
                                      f"pooled = mean over tasks; {boot}", welch]),
        "deciles.csv": (dec, [
            "POST HOC, not pre-registered: per (algo, task, lag) and training decile (d: logged steps in ((d-1)/10, d/10] of",
            "the run; 10 = the final-score window; 1-9: all steps before it; all: the whole run): each run's mean of",
            "charts/episodic_return, lag/final_tv, vaco/over_budget_frac, vaco/filter_frac; mean and 95% t half-width",
            "over runs"]),
        "deciles_d.csv": (dec_d, [
            "POST HOC, not pre-registered: the primary measure D = (VACO lag 8 - VACO lag 0) - (PPO lag 8 - PPO lag 0)",
            "of each run's normalised mean training return in training decile d (10 = the final-score window)",
            f"per task and pooled; {boot}; t_low, t_high: Welch t interval"]),
        "rise_9_to_10.csv": (rises, [
            "POST HOC: per (algo, task, lag), each run's normalised mean training return in training decile 10 minus",
            "decile 9; mean and 95% t interval over runs (> 0: the return still rises at the end of the run)"]),
        "iqm_curves.csv": (curves, [f"IQM of the normalised training return at logged steps ({norm})",
                                    f"rliable, {curve_reps} resamples"]),
        "probability_of_improvement.csv": (poi, base + ["P(X > Y): rliable's, Mann-Whitney per task, mean over tasks",
                                                         f"{curve_reps} resamples"]),
    }  # fmt: skip
    written = []
    for name, (df, header) in tables.items():
        if len(df):
            write_csv(df, out / name, header)
            written.append(name)
    md = verdict_markdown(table, verdict, final, norm) + "\n" + results_markdown(agg, deg, abl, per_task, norm, marked)
    md = (f"**{label}**\n\n" if label else "") + md + deciles_markdown(dec, delta_of(final, "vaco"))
    (out / "verdict.md").write_text(md)
    written.append("verdict.md")
    if plots:
        # Aggregates over tasks are drawn over the tasks every algorithm ran, so that like is compared with like.
        common = sorted(set.intersection(*(set(g.task) for _, g in final.groupby("algo"))))
        fc, f_agg, f_deg, f_abl, f_curves, f_poi, note = final, agg, deg, abl, curves, poi, ""
        if len(common) < final["task"].nunique():
            fc, note = final[final.task.isin(common)], ", ".join(common)
            f_agg, f_deg, f_abl = (
                aggregate_table(fc, reps, seed, log),
                degradation_table(fc, reps, seed),
                ablation_table(fc, reps, seed),
            )
            f_poi = probability_of_improvement_table(fc, curve_reps, seed)
            f_curves = curve_table(fc, runs[runs.task.isin(common)], ref, curve_points, curve_reps, seed, log)
        drawn = aggregate_figures.Aggregation(
            label=label, final=final, runs=runs, ref=ref, per_task=per_task, agg=f_agg, deg=f_deg, abl=f_abl, dec=dec,
            curves=f_curves, poi=f_poi, marked=marked, curve_reps=curve_reps, curve_points=curve_points, seed=seed,
            final_common=fc, tasks_note=note,
        )  # fmt: skip
        written += aggregate_figures.make_figures(drawn, out)
    log(f"{len(final)} runs ({', '.join(f'{a}: {n}' for a, n in final['algo'].value_counts().sort_index().items())})")
    log(f"wrote {', '.join(written)} to {out}/")
    return {"final": final, "runs": runs, "per_task": per_task, "aggregate": agg, "degradation": deg, "ablation": abl,
            "deciles": dec, "decile_scores": dec_scores, "deciles_d": dec_d, "rises": rises, "curves": curves, "improvement": poi, "verdict": verdict, "verdict_table": table, "verdict_md": md,
            "written": written, "records": records}  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for the definitions.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument(
        "sources", nargs="*", help="record files, folders of records or of run folders (default: results/records/tier1..3)"
    )
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder for CSVs, figures and verdict.md")
    p.add_argument("--verdict", action="store_true", help="print the verdict table (pre-registered criteria)")
    p.add_argument("--export-records", metavar="DIR", help="also write every finished run found as a record into DIR")
    p.add_argument("--reference", default=str(DEFAULT_REFERENCE), help="reference table (CSV)")
    p.add_argument("--normalization", choices=["reference", "none"], default="reference")
    p.add_argument("--reps", type=int, default=5000, help="bootstrap resamples for the tables")
    p.add_argument("--curve-reps", type=int, default=500, help="bootstrap resamples for the curves, profiles and P(X > Y)")
    p.add_argument("--curve-points", type=int, default=50, help="at most this many logged points per learning curve")
    p.add_argument("--seed", type=int, default=0, help="bootstrap random seed")
    p.add_argument("--include-unfinished", action="store_true", help="also use runs without a (complete) summary.json")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--label", default="", help='heads every figure title and verdict.md, e.g. "SMOKE TEST (40k steps)"')
    p.add_argument("--measure-random", nargs="*", metavar="ENV", default=None,
                   help="measure random-policy returns instead (no ENV: every env of the reference table)")  # fmt: skip
    p.add_argument("--episodes", type=int, default=20, help="episodes per env for --measure-random")
    p.add_argument("--write", action="store_true", help="with --measure-random: update --reference with the results")
    opts = p.parse_args(argv)
    for name in ("reps", "curve_reps", "curve_points"):
        if getattr(opts, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if opts.measure_random is not None:
        measured = measure_random(opts.measure_random or REFERENCE_ENVS, opts.episodes, opts.seed)
        if opts.write:
            write_reference(measured, opts.reference)
        print(f"updated {opts.reference}" if opts.write else measured.to_csv(index=False))
        return 0
    sources = opts.sources or [s for s in DEFAULT_SOURCES if s.exists()]
    if not sources:
        p.error("no sources given and no committed records under results/records/tier1..3")
    try:
        res = aggregate(sources, opts.out, opts.reference, opts.normalization, opts.reps, opts.curve_reps, opts.curve_points,
                        opts.seed, opts.include_unfinished, not opts.no_plots, label=opts.label)  # fmt: skip
    except NotARecord as e:  # a run would be missing from every table
        print(f"error: {e}", file=sys.stderr)
        return 2
    if opts.export_records:
        export_records(res["records"], opts.export_records)
    if opts.verdict:
        print(res["verdict_md"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
