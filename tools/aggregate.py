#!/usr/bin/env python
"""Aggregate MuJoCo runs (committed run records, or run folders) into tables, figures and a verdict.

    python tools/aggregate.py --verdict --out results/evidence_grid_500k   # regenerate the evidence grid's results
    python tools/aggregate.py results/records/tier1 runs/grid   # records and/or run folders (default: tier1..3)
    python tools/aggregate.py runs/grid --export-records results/records/mygrid   # run folders -> records
    python tools/aggregate.py --measure-random [ENV ...] [--episodes 20] [--write]  # random-policy returns

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
  not pre-registered: return, final TV, minibatches over δ/2 and samples masked per training decile.
* Learning curves: at the steps every run of the curve logged (at most --curve-points), never interpolated.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from rliable import library as rly
from rliable import metrics

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCE = REPO / "results" / "reference_scores.csv"
DEFAULT_SOURCES = [REPO / "results" / "records" / f"tier{i}" for i in (1, 2, 3)]
DEFAULT_OUT = "runs/aggregate"
SCRIPT_STEMS = {"ppo_mujoco": "ppo", "vaco_mujoco": "vaco", "spo_mujoco": "spo", "impala_mujoco": "impala"}
VACO_DEFAULTS = {"tv_threshold": 0.2, "rho_bar": 1.0}
FINAL_FRACTION = 0.1  # final score = mean over the last 10% of training
LAG_LO, LAG_HI = 0, 8  # the primary measure's lags
TV_TOLERANCE = 0.25  # "near delta/2": within +-25% of delta/2 (pre-registered)
TV_LAGS = (4, 8)
PREREGISTERED_SEEDS = 10  # Tier 1's seeds per (algorithm, task, lag): fewer makes the verdict provisional
DECILE_COLUMNS = {  # post hoc, not pre-registered
    "episodic_return": "training episodic return (raw)",
    "final_tv": "final TV",
    "vaco_over_budget_frac": "fraction of minibatches over δ/2",
    "vaco_filter_frac": "fraction of samples masked",
}
AGG_METRICS = {"iqm": "IQM", "mean": "Mean", "median": "Median of task means", "optimality_gap": "Optimality gap"}
AGG_FUNCS = (metrics.aggregate_iqm, metrics.aggregate_mean, metrics.aggregate_median, metrics.aggregate_optimality_gap)
COLORS = {  # one colour per algorithm label in every figure (matplotlib's tab10)
    "ppo": "#1f77b4",
    "vaco": "#d62728",
    "spo": "#2ca02c",
    "impala": "#ff7f0e",
    "vaco-norealign": "#9467bd",
    "vaco-nofilter": "#8c564b",
    "vaco-norealign-nofilter": "#e377c2",
}
EXTRA_COLORS = ["#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#843c39", "#7b4173", "#3182bd"]
MAIN_ALGOS = ("ppo", "vaco", "spo", "impala")
SCORE_DEF = "final score = mean training episodic return over the last 10% of steps"
NORM_DEF = "normalised: 0 = uniform-random actions, 1 = CleanRL PPO at 8M steps"
WINDOW_DEF = "averaging window: logged steps > 0.9 x final step"
NOT_LEARNED_NOTE = (
    f"did not learn (IQM at lag {LAG_LO} indistinguishable from the random policy's 0): its difference "
    "in degradation says it had nothing to lose, not that it is robust to lag"
)
RECORD_FORMAT = "vaco-run-record/1"
RECORD_TAGS = {  # TensorBoard tag -> record column
    "charts/episodic_return": "episodic_return",
    "lag/staleness_mean": "staleness_mean",
    "lag/backward_tv": "backward_tv",
    "lag/final_tv": "final_tv",
    "vaco/tv": "vaco_tv",
    "vaco/over_budget_frac": "vaco_over_budget_frac",
    "vaco/filter_frac": "vaco_filter_frac",
}
RECORD_COLUMNS = tuple(RECORD_TAGS.values())
ARGS_DROPPED = ("run_dir", "wandb_project_name", "wandb_entity")  # machine- or account-specific
# CleanRL ppo_continuous_action_8M (tag v1.0.0-13-gcbd83f6), 8M steps, 10 seeds, MuJoCo v4: the mean of the
# per-run final returns. Source: vwxyzjn/cleanrl docs/rl-algorithms/rpo.md ("MuJoCo v4" tab; Pusher-v4 is the
# v4 task, which does not run on mujoco>=3 here, so it only serves Pusher-v5).
CLEANRL_PPO_8M = {
    "Ant": 1824.17,
    "HalfCheetah": 2637.19,
    "Hopper": 2741.42,
    "Walker2d": 2872.92,
    "Humanoid": 583.17,
    "HumanoidStandup": 109325.87,
    "InvertedPendulum": 888.83,
    "InvertedDoublePendulum": 5626.22,
    "Reacher": -4.65,
    "Swimmer": 124.88,
    "Pusher": -30.35,
}
REFERENCE_ENVS = [f"{name}-{v}" for name in CLEANRL_PPO_8M for v in ("v4", "v5") if f"{name}-{v}" != "Pusher-v4"]
REFERENCE_HEADER = """\
# Reference returns for score normalisation: normalized = (return - random_return) / (reference_return - random_return).
# random_return: mean undiscounted return of uniformly random actions (env.action_space.sample()), measured on this
#   machine with gymnasium 1.4.0 + mujoco 4.0.0 by `python tools/aggregate.py --measure-random --write`
#   (random_episodes episodes, reset seeds seed..seed+episodes-1, action-space seed `seed`).
# reference_return: CleanRL ppo_continuous_action (tag v1.0.0-13-gcbd83f6) after 8M steps, mean over 10 seeds,
#   MuJoCo v4, from vwxyzjn/cleanrl docs/rl-algorithms/rpo.md ("MuJoCo v4" tab). The same v4 number is used for
#   the v5 task (v5 changed some tasks, e.g. Ant's observation, so for v5 it is an approximate anchor), and
#   Pusher-v5 uses the Pusher-v4 number. 1.0 = CleanRL PPO at 8M steps, not an optimum: scores above 1 are possible.
"""


# ----------------------------------------------------------------------------------------------- records


def fmt_num(x) -> str:
    return f"{float(x):g}"


def algo_label(args: dict) -> str:
    exp = str(args.get("exp_name", ""))
    label = SCRIPT_STEMS.get(exp, exp or "unknown")
    if label == "vaco" and exp in SCRIPT_STEMS:
        parts = [name for key, name in (("realign", "norealign"), ("filter", "nofilter")) if args.get(key) is False]
        for key, tag in (("tv_threshold", "delta"), ("rho_bar", "rhobar")):
            if args.get(key) is not None and not math.isclose(float(args[key]), VACO_DEFAULTS[key]):
                parts.append(f"{tag}{fmt_num(args[key])}")
        label = "-".join([label, *parts])
    mode = args.get("lag_mode", "uniform")
    return label + (f"[{mode}]" if mode and mode != "uniform" else "")


def is_finished(run_dir: Path) -> bool:
    """A run is finished iff its summary.json exists and does not mark it as interrupted."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and not summary.get("interrupted", False)


def _clean(v):
    """JSON-safe scalar: 6 significant digits for floats, None for NaN/inf."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    return float(f"{float(v):.6g}") if math.isfinite(float(v)) else None


def make_record(name, args, summary, scalars: dict[str, dict[int, float]], eval_returns, algo=None) -> dict:
    """A run record: what the tables and figures need, nothing machine-specific. `scalars`: column -> {step: value}."""
    steps = sorted({s for col in scalars.values() for s in col})
    columns = {"step": [int(s) for s in steps]}
    columns.update({c: [_clean(scalars[c].get(s)) for s in steps] for c in RECORD_COLUMNS if scalars.get(c)})
    args = {k: _clean(v) if not isinstance(v, (list, dict)) else v for k, v in args.items() if k not in ARGS_DROPPED}
    return {
        "format": RECORD_FORMAT,
        "name": name,
        "algo": algo or algo_label(args),
        "task": args.get("env_id"),
        "lag": int(args.get("lag", 0)),
        "lag_mode": args.get("lag_mode") or "uniform",
        "seed": int(args.get("seed", 0)),
        "finished": summary is not None and not summary.get("interrupted", False),
        "summary": {k: _clean(v) for k, v in (summary or {}).items()},
        "args": args,
        "eval_returns": [_clean(r) for r in eval_returns],
        "scalars": columns,
    }


def record_from_run_dir(run_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = Path(run_dir)
    args = json.loads((run_dir / "args.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else None
    events = {}
    if any(run_dir.glob("events.out.tfevents*")):
        ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        ea.Reload()
        events = {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags().get("scalars", [])}
    scalars = {col: dict(events[tag]) for tag, col in RECORD_TAGS.items() if tag in events}  # a repeated step keeps its last
    return make_record(run_dir.name, args, summary, scalars, [v for _, v in events.get("eval/episodic_return", [])])


def write_record(record: dict, path) -> Path:
    """gzip'd JSON, byte-reproducible (no timestamp in the gzip header); written to a temp file, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(json.dumps(record, separators=(",", ":")).encode())
    tmp.replace(path)
    return path


def read_record(path) -> dict:
    with gzip.open(path, "rt") as f:
        record = json.load(f)
    if record.get("format") != RECORD_FORMAT:
        raise ValueError(f"{path}: not a run record (format {record.get('format')!r})")
    return record


def records_from_legacy(folder: Path) -> list[dict]:
    """Records from a folder written by the earlier aggregate (runs.csv: per step, final.csv: per run)."""
    final, runs, out = pd.read_csv(folder / "final.csv"), pd.read_csv(folder / "runs.csv"), []
    arg_cols = ["total_timesteps", "num_envs", "num_steps", "tv_threshold", "rho_bar", "c_bar", "realign", "filter"]
    for _, row in final.iterrows():
        args = {"exp_name": row["exp_name"], "env_id": row["task"], "lag": int(row["lag"]), "seed": int(row["seed"])}
        args["lag_mode"] = row["lag_mode"]
        args.update(
            {c: row[c].item() if hasattr(row[c], "item") else row[c] for c in arg_cols if c in row and pd.notna(row[c])}
        )
        summary = {"global_step": int(row["last_step"])}
        keys = ("final_return", "final_tv", "sps", "eval_return", "rollout_seconds", "update_seconds")
        summary.update({k: float(row[f"summary_{k}"]) for k in keys if pd.notna(row.get(f"summary_{k}"))})
        r = runs[runs["run_dir"] == row["run_dir"]]
        scalars = {c: {int(s): v for s, v in zip(r["step"], r[c]) if pd.notna(v)} for c in RECORD_COLUMNS if c in r}
        rec = make_record(Path(row["run_dir"]).name, args, summary if row["finished"] else None, scalars, [], row["algo"])
        if rec["finished"] and pd.notna(row.get("eval_return")):
            rec["summary"].setdefault("eval_return", _clean(row["eval_return"]))
        out.append(rec)
    return out


def collect_records(sources, include_unfinished=False, log=print) -> list[dict]:
    """Every run record found under `sources` (record files, folders of them, run folders, legacy folders)."""
    records = []
    for src in map(Path, sources):
        if not src.exists():
            log(f"warning: {src} does not exist; skipped")
            continue
        for f in [src] if src.is_file() else sorted(src.rglob("*.json.gz")):
            try:
                records.append(read_record(f))
            except (OSError, ValueError) as e:
                log(f"warning: cannot read {f}: {e}")
        if src.is_dir():
            for legacy in sorted({p.parent for p in src.rglob("final.csv") if (p.parent / "runs.csv").exists()}):
                head = pd.read_csv(legacy / "final.csv", comment="#", nrows=0).columns
                if {"run_dir", "exp_name", "last_step", "finished"} <= set(head):  # this tool's own output is not a source
                    records += records_from_legacy(legacy)
            for run_dir in sorted({p.parent for p in src.rglob("args.json")}):
                try:
                    records.append(record_from_run_dir(run_dir))
                except Exception as e:  # a broken folder should not stop the aggregation
                    log(f"warning: cannot read {run_dir}: {type(e).__name__}: {e}")
    kept = [r for r in records if include_unfinished or r["finished"]]
    if len(kept) < len(records):
        log(
            f"note: {len(records) - len(kept)} unfinished run(s) left out, e.g. {next(r for r in records if not r['finished'])['name']}"
        )
    # Runs older than the EnvPool default ran on gymnasium and may not name a backend.
    backends = sorted({(r.get("args") or {}).get("env_backend", "gymnasium") for r in kept})
    if len(backends) > 1:
        log(f"warning: the runs used different env backends ({', '.join(backends)}); compare algorithms within one")
    return kept


def export_records(records, folder, log=print) -> list[Path]:
    """Write each record as `{folder}/{record name}.json.gz` (an existing identical file is left untouched)."""
    paths = [Path(folder) / f"{rec['name']}.json.gz" for rec in records]
    written = [write_record(rec, p) for rec, p in zip(records, paths) if not (p.exists() and read_record(p) == rec)]
    log(f"wrote {len(written)} record(s) to {folder}/ ({len(records) - len(written)} unchanged)")
    return written


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
                log(
                    f"warning: two different runs of {tuple(r[key])}: final scores {first.loc[tuple(r[key])]:g} and {r['final_return']:g}; kept the first"
                )
        keep = set(final.loc[~dup, "source"])
        final, tidies = final[~dup], [t for t in tidies if len(t) == 0 or t["source"].iloc[0] in keep]
    runs = pd.concat(tidies, ignore_index=True).drop_duplicates(key + ["step"]).sort_values(key + ["step"])
    return final.sort_values(key).reset_index(drop=True), runs.reset_index(drop=True)


def load_reference(path) -> pd.DataFrame:
    return pd.read_csv(path, comment="#").set_index("env_id")


def normalise(scores, tasks, ref: pd.DataFrame | None):
    """(score - random) / (reference - random), elementwise; `ref=None` leaves scores unchanged."""
    scores = np.asarray(scores, dtype=float)
    if ref is None:
        return scores
    lo, hi = (ref.loc[list(tasks), c].to_numpy(float) for c in ("random_return", "reference_return"))
    return (scores - lo) / (hi - lo)


# ----------------------------------------------------------------------------------------------- statistics


def t_interval(values, confidence=0.95) -> tuple[float, float, int]:
    """(mean, half-width of the Student-t interval, n) of the finite values; half-width NaN for n < 2."""
    from scipy import stats

    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return (float(v[0]) if len(v) else float("nan")), float("nan"), len(v)
    return float(v.mean()), float(stats.t.ppf(0.5 + confidence / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))), len(v)


def bootstrap(score_dict, func, reps, seed):
    """rliable's stratified bootstrap (percentile intervals, 95%): {key: point}, {key: (2, ...) low/high}. An array
    value is resampled as one (runs x tasks [x points]) matrix, a list value as independent matrices. rliable draws
    from numpy's global generator: seeded here, so a fixed seed gives fixed intervals."""
    np.random.seed(seed)
    return rly.get_interval_estimates(score_dict, func, reps=reps)


def score_matrix(df: pd.DataFrame, column="normalized_score", warn=None, tasks=None):
    """(runs x tasks) matrix of `column` for one (algo, lag) slice, equal runs per task (lowest seeds kept)."""
    tasks = tasks or sorted(df["task"].unique())
    per_task = [df[df["task"] == t].sort_values("seed")[column].dropna().to_numpy(float) for t in tasks]
    n = min(len(x) for x in per_task)
    if warn and any(len(x) != n for x in per_task):
        warn(f"unequal runs per task ({dict(zip(tasks, map(len, per_task)))}); using the {n} lowest seeds per task")
    return np.stack([x[:n] for x in per_task], axis=1), tasks


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
    return [
        {"measure": name, **(extra or {}), "task": t, "estimate": point[name][i], "ci_low": ci[name][0, i],
         "ci_high": ci[name][1, i], "min_runs_per_cell": runs}
        for i, t in enumerate([*tasks, "pooled"])
    ]  # fmt: skip


def degradation_table(final, reps, seed, base="ppo", lo=LAG_LO, hi=LAG_HI) -> pd.DataFrame:
    """Each algorithm's degradation (X[hi] - X[lo]) and its difference from the base's: (X[hi]-X[lo]) - (B[hi]-B[lo])."""
    rows = []
    algos = [a for a in sorted(final["algo"].unique()) if {lo, hi} <= set(final[final.algo == a]["lag"])]
    for a in algos:
        rows += difference_table(final, [(1, a, hi), (-1, a, lo)], "degradation", reps, seed, {"algo": a, "vs": ""})
        b = base + (a[a.index("[") :] if "[" in a else "")  # compared with the base run in the same lag mode
        if a != b and b in algos:
            terms = [(1, a, hi), (-1, a, lo), (-1, b, hi), (1, b, lo)]
            rows += difference_table(final, terms, "degradation_difference", reps, seed, {"algo": a, "vs": b})
    return pd.DataFrame(rows)


def is_ablation(label: str) -> bool:
    return label.startswith("vaco-")


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
    """rliable's probability of improvement P(X > base) at each lag (X's and the base's runs resampled on their own)."""
    pairs = {}
    for (a, k), df in final.groupby(["algo", "lag"], sort=True):
        b = final[(final.algo == base) & (final.lag == k)]
        if a != base and len(b) and set(df.task) == set(b.task):
            pairs[f"{a} lag {k},{base} lag {k}"] = [score_matrix(df)[0], score_matrix(b)[0]]
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


def curve_steps(runs_of_group: list[pd.DataFrame], max_points: int) -> np.ndarray:
    """The steps at which every run of the group logged a return, thinned evenly to at most max_points."""
    common = None
    for d in runs_of_group:
        s = set(d.loc[d["episodic_return"].notna(), "step"].astype(int)) if "episodic_return" in d else set()
        common = s if common is None else common & s
    steps = np.array(sorted(common or []))
    if len(steps) > max_points:
        steps = steps[np.unique(np.round(np.linspace(0, len(steps) - 1, max_points)).astype(int))]
    return steps


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


def delta_of(final: pd.DataFrame, label: str) -> float:
    d = final[final["algo"] == label]
    if "tv_threshold" in d and d["tv_threshold"].notna().any():
        return float(d["tv_threshold"].dropna().iloc[0])
    return VACO_DEFAULTS["tv_threshold"] if label.startswith("vaco") else float("nan")


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
    name, missing = f"(VACO {hi} - VACO {lo}) - (PPO {hi} - PPO {lo})", ("missing runs", None)
    lags = ", ".join(map(str, TV_LAGS))
    rows = [
        ("supporting", f"pooled {name}: 95% interval above 0", *((_ci(pooled), bool(pooled.ci_low > 0)) if pooled is not None else missing)),
        ("supporting", "same sign on every task (in VACO's favour)",
         *((", ".join(f"{r.task} {_ci(r)}" for r in tasks.itertuples()), bool((tasks.estimate > 0).all())) if len(tasks) >= 2 else ("fewer than 2 tasks", None))),
        ("supporting", f"VACO's lag-{hi} IQM above PPO's",
         *((f"VACO {_ci(v, '')} vs PPO {_ci(p, '')}", bool(v.estimate > p.estimate)) if v is not None else missing)),
        ("supporting", f"VACO's final TV within ±{TV_TOLERANCE:.0%} of δ/2 = {half:g} at lags {lags} (every task)",
         *((", ".join(f"{r.task} lag {r.lag}: {r.final_tv_mean:.3f}" for r in tv.itertuples()),
            bool(((tv.final_tv_mean - half).abs() <= TV_TOLERANCE * half).all())) if len(tv) and set(tv.lag) == set(TV_LAGS) else missing)),
        ("refuting", f"pooled {name} ≤ 0", *((f"{pooled.estimate:+.3f}", bool(pooled.estimate <= 0)) if pooled is not None else missing)),
        ("refuting", f"VACO below PPO at lag {hi} (IQM)",
         *((f"{v.estimate:.3f} vs {p.estimate:.3f}", bool(v.estimate < p.estimate)) if v is not None else missing)),
    ]  # fmt: skip
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
            f"Difference in degradation vs PPO, (X lag {LAG_HI} − X lag {LAG_LO}) − (PPO lag {LAG_HI} − PPO lag {LAG_LO}):",
            "",
        ]
        lines += _task_table(dd, "algorithm", order_labels(dd.algo.unique()), marked)
    if len(abl):
        lines += [f"Ablations at lag {LAG_HI}, ablation − VACO:", ""] + _task_table(abl, "ablation", sorted(abl.algo.unique()))
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
        lines += ["", f"Note: {n.min()} runs in the smallest cell; percentile-bootstrap intervals are too narrow with few seeds "
                  "(about 80% coverage for a nominal 95% at 3 runs per task): read them as indicative only."]  # fmt: skip
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- plots


def colors_for(labels) -> dict[str, str]:
    """A fixed colour per known label (its lag mode ignored); others get the extra colours in sorted order."""
    out, extra = {}, iter(EXTRA_COLORS * (1 + len(labels) // len(EXTRA_COLORS)))
    for label in sorted(labels):
        out[label] = COLORS.get(label.split("[")[0]) or next(extra)
    return out


def order_labels(labels):
    return sorted(labels, key=lambda s: (MAIN_ALGOS.index(s.split("[")[0]) if s.split("[")[0] in MAIN_ALGOS else 99, s))


_FIGURE_LABEL = {"text": ""}  # set by aggregate(label=...): prefixed to every figure title


def _figure(nrows, ncols, width, height, **kw):
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)


def _save(fig, path, title, tight=True):
    """Title (after the aggregation's label) wrapped to the figure's width, then saved and closed."""
    import matplotlib.pyplot as plt

    text = textwrap.fill(
        f"{_FIGURE_LABEL['text']}: {title}" if _FIGURE_LABEL["text"] else title, max(40, int(14 * fig.get_figwidth()))
    )
    # A figure laid out by rliable keeps its layout: the title goes above it (the saved box grows to hold it).
    fig.suptitle(text, fontsize=9, y=1.0 if tight else 1 + 0.2 * (text.count("\n") + 1.5) / fig.get_figheight())
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _lag_axis(ax, lags):
    ax.set_xticks(range(len(lags)), [str(k) for k in lags])
    ax.set_xlabel("lag K")
    ax.grid(alpha=0.3)


def _step_axis(ax):
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(4))
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda x, _: f"{x / 1e6:g}M" if abs(x) >= 1e6 else f"{x / 1e3:g}k" if x else "0")
    )
    ax.set_xlabel("environment steps")
    ax.grid(alpha=0.3)


def _lag_points(ax, run_lags, lags, offset, est, yerr, color, label):
    """Points with error bars at the lags a label ran, joined only between neighbouring lags of the axis, so that
    no line crosses a lag it never ran (the legend says which lags it ran)."""
    pos = np.array([lags.index(k) for k in run_lags])
    x, name = pos + offset * 0.06, label if len(pos) == len(lags) else f"{label} (lags {', '.join(map(str, run_lags))} only)"
    ax.errorbar(x, est, yerr=yerr, fmt="o", color=color, label=name, capsize=2, ms=4)
    for i in np.flatnonzero(np.diff(pos) == 1):
        ax.plot(x[i : i + 2], est[i : i + 2], "-", color=color, lw=1.5)


def meaningful_metrics(final, n_tasks):
    """IQM and mean always; the median of task means only with 3+ tasks (with 2 it equals the mean); the
    optimality gap only when some run reaches the reference (otherwise it is 1 - mean)."""
    return ["iqm", "mean"] + ["median"] * (n_tasks >= 3) + ["optimality_gap"] * bool((final["normalized_score"] >= 1).any())


def plot_score_vs_lag(agg, labels, lags, colors, metrics_shown, path, title, ylabel):
    fig, axes = _figure(1, len(metrics_shown), 4.2, 3.6)
    for ax, metric in zip(axes[0], metrics_shown):
        for j, label in enumerate(labels):
            d = agg[(agg.algo == label) & (agg.metric == metric)].set_index("lag").sort_index()
            est, lo, hi = (d[c].to_numpy(float) for c in ("estimate", "ci_low", "ci_high"))
            _lag_points(ax, d.index, lags, j - (len(labels) - 1) / 2, est, [est - lo, hi - est], colors[label], label)
        ax.axhline(0, color="k", lw=0.8, ls=":", label="random policy")
        _lag_axis(ax, lags)
        ax.set_title(AGG_METRICS[metric] + " (lower is better)" * (metric == "optimality_gap"), fontsize=9)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7)
    _save(fig, path, title)


def plot_forest(table, colors, path, title, xlabel, marked=()):
    """One row per (algorithm, task or pooled): point and 95% interval; a line at 0. The `marked` algorithms (did
    not learn) are drawn grey and dashed on a hatched band, with the reason above the plot."""
    rows = list(table.itertuples())
    fig, axes = _figure(1, 1, 7, 0.35 * len(rows) + 2.0 + 0.3 * bool(marked))
    ax = axes[0][0]
    for i, r in enumerate(rows):
        y, c = len(rows) - 1 - i, "#999999" if r.algo in marked else colors.get(r.algo, "k")
        if r.algo in marked:
            ax.axhspan(y - 0.45, y + 0.45, facecolor="none", edgecolor="#bbbbbb", hatch="///", lw=0)
        xerr = [[r.estimate - r.ci_low], [r.ci_high - r.estimate]]
        ax.errorbar(r.estimate, y, xerr=xerr, fmt="o", color=c, capsize=3, ms=5, mfc=c if r.task == "pooled" else "white",
                    ls="--" if r.algo in marked else "-")  # fmt: skip
    ax.set_yticks(range(len(rows)), [f"{r.algo}{' †' * (r.algo in marked)} — {r.task}" for r in reversed(rows)], fontsize=8)
    if any(r.algo in marked for r in rows):
        ax.set_title(textwrap.fill(f"† grey, hatched: {NOT_LEARNED_NOTE}", 100), fontsize=8, color="#555555")
    ax.axvline(0, color="k", lw=0.9, ls="--")
    ax.set_xlabel(xlabel, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path, title)


def plot_intervals(agg, labels, lags, colors, metrics_shown, path, title):
    """rliable's interval plot: one row per (algorithm, lag), one panel per metric, one x-range for every panel."""
    from rliable import plot_utils

    keys = [(a, k) for k in reversed(lags) for a in reversed(labels) if ((agg.algo == a) & (agg.lag == k)).any()]  # bottom up
    rows = {f"{a} · lag {k}": agg[(agg.algo == a) & (agg.lag == k)].set_index("metric").loc[metrics_shown] for a, k in keys}
    fig, axes = plot_utils.plot_interval_estimates(
        {n: r.estimate.to_numpy() for n, r in rows.items()}, {n: r[["ci_low", "ci_high"]].to_numpy().T for n, r in rows.items()},
        [AGG_METRICS[m] for m in metrics_shown], algorithms=list(rows), colors={n: colors[a] for n, (a, _) in zip(rows, keys)},
        xlabel="", subfigure_width=4.0, row_height=0.32,
    )  # fmt: skip
    axes = np.atleast_1d(axes)
    lo, hi = min(ax.get_xlim()[0] for ax in axes), max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:
        ax.set(xlim=(lo, hi), xlabel="normalised score")
        ax.title.set_fontsize(10)
        ax.tick_params(labelsize=8)
    _save(fig, path, title, tight=False)


def plot_iqm_curves(curves, labels, lags, colors, path, title):
    """rliable's sample-efficiency curves: the IQM at logged steps with its interval band, one panel per lag."""
    from rliable import plot_utils

    fig, axes = _figure(1, len(lags), 3.8, 3.4, sharey=True)
    for ax, lag in zip(axes[0], lags):
        for label in labels:
            d = curves[(curves.algo == label) & (curves.lag == lag)] if len(curves) else curves
            if len(d):
                plot_utils.plot_sample_efficiency_curve(
                    d.step.to_numpy(), {label: d.iqm.to_numpy()}, {label: d[["ci_low", "ci_high"]].to_numpy().T}, [label],
                    colors=colors, ax=ax, xlabel="", ylabel="", labelsize="small", ticklabelsize="small", marker=".", linewidth=1.4,
                )  # fmt: skip
        ax.axhline(0, color="k", lw=0.8, ls=":")
        ax.set_title(f"lag {lag}", fontsize=9)
        _step_axis(ax)
    axes[0][0].set_ylabel("IQM normalised return")
    axes[0][-1].legend(fontsize=7)
    _save(fig, path, title)


def plot_profiles(final, labels, lags, colors, reps, seed, path, title):
    """rliable's performance profiles (fraction of runs with normalised final score > τ), one panel per lag."""
    from rliable import plot_utils

    taus = np.linspace(min(0.0, final.normalized_score.min()), max(1.0, final.normalized_score.max()), 81)
    fig, axes = _figure(1, len(lags), 3.8, 3.4, sharey=True)
    for ax, lag in zip(axes[0], lags):
        d = final[final.lag == lag]
        scores = {a: score_matrix(d[d.algo == a])[0] for a in labels if (d.algo == a).any()}
        np.random.seed(seed)  # rliable's bootstrap draws from numpy's global generator
        profiles, cis = rly.create_performance_profile(scores, taus, reps=reps)
        plot_utils.plot_performance_profiles(profiles, taus, cis, ax=ax, colors=colors, xlabel="normalised score τ", ylabel="",
                                             labelsize="small", ticklabelsize="small")  # fmt: skip
        ax.set_title(f"lag {lag}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of runs with score > τ")
    axes[0][-1].legend(fontsize=7)
    _save(fig, path, title)


def plot_improvement(poi, colors, path, title):
    """rliable's probability-of-improvement plot: P(X > PPO) per algorithm and lag, with its interval."""
    from rliable import plot_utils

    fig, axes = _figure(1, 1, 6, 0.35 * len(poi) + 1.5)
    keys = [f"{r.x},{r.y}" for r in poi.itertuples()]
    plot_utils.plot_probability_of_improvement(
        dict(zip(keys, poi.estimate)), dict(zip(keys, poi[["ci_low", "ci_high"]].to_numpy())), ax=axes[0][0],
        colors=[colors[r.x.split(" lag ")[0]] for r in poi.itertuples()], labelsize="small", ticklabelsize="small",
    )  # fmt: skip
    _save(fig, path, title)


def plot_task_curves(final, runs, labels, lags, colors, max_points, path, ref_lines):
    """Training return per task (rows) and lag (columns): mean over seeds ± one standard error, at logged steps."""
    tasks = sorted(final["task"].unique())
    fig, axes = _figure(len(tasks), len(lags), 3.6, 2.8, sharey="row")
    for (r, task), (c, lag) in ((rt, cl) for rt in enumerate(tasks) for cl in enumerate(lags)):
        ax = axes[r][c]
        for label in labels:
            group = [g for _, g in runs[(runs.algo == label) & (runs.task == task) & (runs.lag == lag)].groupby("seed")]
            steps = curve_steps(group, max_points) if group else []
            if len(steps):
                y = np.stack([g.set_index("step")["episodic_return"].reindex(steps).to_numpy(float) for g in group])
                m, se = y.mean(0), (y.std(0, ddof=1) / np.sqrt(len(y)) if len(y) > 1 else np.zeros(len(steps)))
                ax.plot(steps, m, ".-", color=colors[label], label=label, lw=1.3, ms=3)
                ax.fill_between(steps, m - se, m + se, color=colors[label], alpha=0.15, lw=0)
        if task in ref_lines:
            ax.axhline(ref_lines[task], color="k", lw=0.8, ls=":")
        ax.set_title(f"lag {lag}" if r == 0 else "", fontsize=9)
        ax.set_ylabel(f"{task}\nepisodic return" if c == 0 else "", fontsize=8)
        _step_axis(ax)
    handles = {h.get_label(): h for ax in axes.flat for h in ax.get_lines() if not h.get_label().startswith("_")}
    n = final.groupby(["algo", "task", "lag"]).size()
    names = [f"{k} ({'–'.join(map(str, sorted({n[k].min(), n[k].max()})))} runs per cell)" for k in handles]
    fig.tight_layout(rect=(0, 0.035 * ((len(handles) + 2) // 3) / max(1, len(tasks) / 2), 1, 0.95))
    fig.legend(handles.values(), names, loc="lower center", ncol=min(len(handles), 3), fontsize=9, frameon=False)
    note = " (dotted: random policy)" if ref_lines else ""
    _save(
        fig, path, f"Training episodic return per task: mean over seeds ± 1 standard error, at logged steps{note}", tight=False
    )


def _band(ax, delta):
    ax.axhline(delta / 2, ls="--", color="k", lw=0.9)
    ax.axhspan(delta / 2 * (1 - TV_TOLERANCE), delta / 2 * (1 + TV_TOLERANCE), color="k", alpha=0.08, lw=0)


def plot_tv(per_task, labels, lags, colors, delta, path, title):
    """Final TV vs lag per task, mean ± 95% t-interval, with δ/2 and the ±25% band. The runs without a trust region
    (IMPALA, VACO without its filter) get their own row and scale, so that they do not squash the others."""
    if "final_tv_mean" not in per_task or per_task["final_tv_mean"].isna().all():
        return False
    tasks = sorted(per_task["task"].unique())
    unbounded = [lab for lab in labels if lab.startswith("impala") or "nofilter" in lab]
    groups = [g for g in ([lab for lab in labels if lab not in unbounded], unbounded) if g]
    fig, axes = _figure(len(groups), len(tasks), 4, 3.1)
    for (r, group), (c, task) in ((rg, ct) for rg in enumerate(groups) for ct in enumerate(tasks)):
        ax = axes[r][c]
        for j, label in enumerate(group):
            d = per_task[(per_task.algo == label) & (per_task.task == task)].set_index("lag").sort_index()
            est, err = d.final_tv_mean.to_numpy(float), d.final_tv_ci95.fillna(0).to_numpy(float)
            _lag_points(ax, d.index, lags, j - (len(group) - 1) / 2, est, err, colors[label], label)
        if group is not unbounded and any(lab.startswith("vaco") for lab in group) and np.isfinite(delta):
            _band(ax, delta)
            ax.text(len(lags) - 1, delta / 2, f" δ/2={delta / 2:g} ± {TV_TOLERANCE:.0%}", va="bottom", ha="right", fontsize=7)
            ax.set_ylim(top=max(ax.get_ylim()[1], 0.6 * delta))  # room for the δ/2 label
        ax.set_ylim(bottom=0)
        _lag_axis(ax, lags)
        ax.set_title(task + (" (no trust region, own scale)" if group is unbounded else ""), fontsize=9)
        ax.set_ylabel("final TV ½·mean|π/β − 1|" if c == 0 else "", fontsize=8)
        if c == len(tasks) - 1:
            ax.legend(fontsize=7)
    _save(fig, path, title)
    return True


def plot_deciles(dec, colors, delta, path, title, algo="vaco"):
    """Post hoc: `algo`'s TV and filter statistics against the training decile, one line per (task, lag), mean ±
    95% t-interval over runs (darker: larger lag); the TV panel shows δ/2 and the ±25% band."""
    from matplotlib.colors import to_rgb

    d = dec[(dec.algo == algo) & dec.decile.str.isdigit()] if len(dec) else dec
    cols = [c for c in DECILE_COLUMNS if c != "episodic_return" and f"{c}_mean" in d and d[f"{c}_mean"].notna().any()]
    if not len(d) or not cols:
        return False
    fig, axes = _figure(1, len(cols), 4.4, 3.6)
    lags, tasks = sorted(d.lag.unique()), sorted(d.task.unique())
    for ax, col in zip(axes[0], cols):
        for (task, lag), g in d.groupby(["task", "lag"], sort=True):
            shade = 0.35 + 0.65 * (lags.index(lag) + 1) / len(lags)
            color = tuple(1 - shade * (1 - v) for v in to_rgb(colors.get(algo, "k")))
            ax.errorbar(g.decile.astype(int), g[f"{col}_mean"], yerr=g[f"{col}_ci95"].fillna(0), fmt="o" + ["-", "--", ":", "-."][tasks.index(task) % 4],
                        color=color, ms=3, capsize=2, label=f"{task} lag {lag}")  # fmt: skip
        if col == "final_tv" and np.isfinite(delta):
            _band(ax, delta)
        ax.set_xticks(range(1, 11))
        ax.set_xlabel("training decile (10: the final-score window)", fontsize=8)
        ax.set_title(DECILE_COLUMNS[col], fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    _save(fig, path, title)
    return True


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
    out, _FIGURE_LABEL["text"] = Path(out), label
    records = collect_records(sources, include_unfinished, log)
    final, runs = build_tables(records, log)
    ref, norm = None, "not normalised: raw returns"
    if normalization == "reference":
        ref, norm = load_reference(reference), NORM_DEF
        missing = sorted(set(final["task"]) - set(ref.index))
        if missing:
            raise SystemExit(f"error: no reference scores for {missing} in {reference}; add them with "
                             f"`tools/aggregate.py --measure-random {' '.join(missing)} --write` or use --normalization none")  # fmt: skip
    else:
        log("note: --normalization none: 'normalised' scores are raw returns (only meaningful for one task)")
    final["normalized_score"] = normalise(final["final_return"], final["task"], ref)
    out.mkdir(parents=True, exist_ok=True)
    per_task, agg = per_task_table(final), aggregate_table(final, reps, seed, log)
    deg, abl, dec = degradation_table(final, reps, seed), ablation_table(final, reps, seed), decile_table(final, runs)
    poi = probability_of_improvement_table(final, curve_reps, seed)
    curves = curve_table(final, runs, ref, curve_points, curve_reps, seed, log)
    table, verdict = verdict_table(final, agg, deg, per_task)
    marked = not_learned(agg) if ref is not None else set()  # 0 is the random policy only after normalisation
    boot = f"95% stratified-bootstrap percentile intervals over seeds (rliable, {reps} resamples, seed {seed})"
    base = [SCORE_DEF, norm, WINDOW_DEF]
    tables = {
        "final.csv": (final, base + ["one row per run; final_tv, backward_tv, ...: means over the same window"]),
        "runs.csv": (runs, ["one row per run and logged step (training iteration)"]),
        "per_task.csv": (per_task, base + ["per (algo, task, lag): mean and 95% Student-t half-width (t with n-1 dof) over runs"]),
        "aggregate.csv": (agg, base + [f"per (algo, lag): aggregates over tasks and runs; {boot}"]),
        "degradation.csv": (deg, base + [f"degradation = mean(X at lag {LAG_HI}) - mean(X at lag {LAG_LO}); degradation_difference = "
                                         "X's minus PPO's (> 0: X loses less)", f"pooled = mean over tasks; {boot}, each (algo, lag) cell resampled on its own"]),
        "ablation.csv": (abl, base + [f"ablation_effect = mean(ablation) - mean(VACO) at lag {LAG_HI}; pooled = mean over tasks; {boot}"]),
        "deciles.csv": (dec, ["POST HOC, not pre-registered: per (algo, task, lag) and training decile (d: logged steps in ((d-1)/10, "
                              "d/10] of the run; 10 = the final-score window; 1-9: all steps before it; all: the whole run)",
                              "each run's mean of the logged charts/episodic_return, lag/final_tv, vaco/over_budget_frac, "
                              "vaco/filter_frac; mean and 95% Student-t half-width over runs"]),
        "iqm_curves.csv": (curves, [f"IQM of the normalised training return at logged steps ({norm}); rliable, {curve_reps} resamples"]),
        "probability_of_improvement.csv": (poi, base + [f"P(X > Y) (rliable: Mann-Whitney per task, mean over tasks); {curve_reps} resamples"]),
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
        written += make_figures(
            out,
            final,
            runs,
            ref,
            norm,
            boot,
            per_task,
            agg,
            deg,
            abl,
            dec,
            curves,
            poi,
            marked,
            curve_reps,
            curve_points,
            seed,
        )
    log(f"{len(final)} runs ({', '.join(f'{a}: {n}' for a, n in final['algo'].value_counts().sort_index().items())})")
    log(f"wrote {', '.join(written)} to {out}/")
    return {"final": final, "runs": runs, "per_task": per_task, "aggregate": agg, "degradation": deg, "ablation": abl,
            "deciles": dec, "curves": curves, "improvement": poi, "verdict": verdict, "verdict_table": table, "verdict_md": md,
            "written": written, "records": records}  # fmt: skip


def make_figures(
    out, final, runs, ref, norm, boot, per_task, agg, deg, abl, dec, curves, poi, marked, curve_reps, curve_points, seed
):
    import matplotlib

    matplotlib.use("Agg")
    labels = order_labels(final["algo"].unique())
    colors, main = colors_for(labels), [lab for lab in labels if not is_ablation(lab)] or labels
    lags, n_tasks, delta = sorted(int(k) for k in final["lag"].unique()), final["task"].nunique(), delta_of(final, "vaco")
    shown = meaningful_metrics(final, n_tasks)
    caption = f"{SCORE_DEF} ({norm}); {n_tasks} task(s); {boot}"
    plot_score_vs_lag(agg, main, lags, colors, shown, out / "score_vs_lag.png", "Final score vs lag — " + caption,
                      "normalised score" if ref is not None else "return")  # fmt: skip
    plot_intervals(agg, labels, lags, colors, shown, out / "intervals.png", "Aggregates of the final score — " + caption)
    plot_profiles(final, labels, lags, colors, curve_reps, seed, out / "performance_profiles.png",
                  f"Performance profiles of the final score ({norm}); rliable, {curve_reps}-resample bootstrap bands")  # fmt: skip
    written = ["score_vs_lag.png", "intervals.png", "performance_profiles.png"]
    dd = deg[deg.measure == "degradation_difference"] if len(deg) else deg
    if len(dd):
        plot_forest(dd, colors, out / "degradation.png", f"Difference in degradation vs PPO, (X lag {LAG_HI} − X lag {LAG_LO}) − "
                    f"(PPO lag {LAG_HI} − PPO lag {LAG_LO}); > 0: X loses less. Filled: pooled over tasks. {SCORE_DEF}; {boot}",
                    "difference in degradation (normalised score)", marked)  # fmt: skip
        written.append("degradation.png")
    if len(abl):
        plot_forest(abl, colors, out / "ablation.png", f"Ablation effect at lag {LAG_HI}: ablation − VACO (< 0: the removed part "
                    f"helps). Filled: pooled. {SCORE_DEF}; {boot}", "difference (normalised score)")  # fmt: skip
        written.append("ablation.png")
    if len(poi):
        plot_improvement(poi, colors, out / "probability_of_improvement.png",
                         f"Probability of improvement over PPO at the same lag (rliable; {curve_reps} resamples)")  # fmt: skip
        written.append("probability_of_improvement.png")
    if len(curves):
        plot_iqm_curves(curves, main, lags, colors, out / "iqm_curves.png",
                        f"IQM normalised training return at logged steps ({norm}); rliable, {curve_reps}-resample intervals")  # fmt: skip
        written.append("iqm_curves.png")
    random_lines = {t: ref.loc[t, "random_return"] for t in final["task"].unique()} if ref is not None else {}
    plot_task_curves(final, runs, main, lags, colors, curve_points, out / "task_curves.png", random_lines)
    written.append("task_curves.png")
    if plot_tv(per_task, labels, lags, colors, delta, out / "final_tv.png", "Final TV after the update, mean over the last 10% of "
               f"steps, ± 95% t-interval over seeds (dashed: VACO's δ/2; shaded: ±{TV_TOLERANCE:.0%}, the pre-registered band)"):  # fmt: skip
        written.append("final_tv.png")
    if plot_deciles(dec, colors, delta, out / "deciles.png", "POST HOC (not pre-registered): VACO per training decile, mean ± 95% "
                    f"t-interval over runs (dashed: δ/2, shaded: ±{TV_TOLERANCE:.0%}); decile 10 is the final-score window"):  # fmt: skip
        written.append("deciles.png")
    return written


# ----------------------------------------------------------------------------------------------- reference scores


def measure_random(env_ids, episodes=20, seed=0) -> pd.DataFrame:
    """Mean undiscounted return of uniformly random actions per env (reset seeds seed..seed+episodes-1)."""
    import gymnasium as gym

    try:
        import mujoco

        mujoco.set_mju_user_warning(lambda msg: None)  # HalfCheetah's settotalmass deprecation warning
    except Exception:
        pass
    rows = []
    for env_id in env_ids:
        env, returns = gym.make(env_id), []
        env.action_space.seed(seed)
        for ep in range(episodes):
            env.reset(seed=seed + ep)
            total, done = 0.0, False
            while not done:
                _, r, terminated, truncated, _ = env.step(env.action_space.sample())
                total, done = total + float(r), terminated or truncated
            returns.append(total)
        env.close()
        m, s = float(np.mean(returns)), float(np.std(returns))
        rows.append(
            {
                "env_id": env_id,
                "random_return": round(m, 3),
                "random_std": round(s, 3),
                "random_episodes": episodes,
                "seed": seed,
            }
        )
        print(f"{env_id:28s} random return {m:10.2f} ± {s:.2f} ({episodes} episodes)", flush=True)
    return pd.DataFrame(rows)


def write_reference(measured: pd.DataFrame, path) -> pd.DataFrame:
    path = Path(path)
    table = load_reference(path).reset_index() if path.exists() else pd.DataFrame(columns=["env_id"])
    new = measured.copy()
    new["reference_return"] = [CLEANRL_PPO_8M.get(e.rsplit("-", 1)[0], np.nan) for e in new["env_id"]]
    new["reference_source"] = [
        "cleanrl ppo_continuous_action_8M v4" if np.isfinite(v) else "" for v in new["reference_return"]
    ]
    table = table[~table["env_id"].isin(measured["env_id"])]
    table = (pd.concat([table, new], ignore_index=True) if len(table) else new).sort_values("env_id").reset_index(drop=True)
    table = table[["env_id", "random_return", "random_std", "random_episodes", "seed", "reference_return", "reference_source"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(REFERENCE_HEADER)
        table.to_csv(f, index=False)
    return table


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
    res = aggregate(sources, opts.out, opts.reference, opts.normalization, opts.reps, opts.curve_reps, opts.curve_points, opts.seed,
                    opts.include_unfinished, not opts.no_plots, label=opts.label)  # fmt: skip
    if opts.export_records:
        export_records(res["records"], opts.export_records)
    if opts.verdict:
        print(res["verdict_md"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
