#!/usr/bin/env python
"""Aggregate MuJoCo runs (committed run records, or run folders) into tables, figures and a verdict.

    python tools/aggregate.py                                   # every committed record of the evidence grid
    python tools/aggregate.py results/records/tier1 runs/grid   # records and/or run folders
    python tools/aggregate.py --verdict                         # also print the pre-registered verdict table
    python tools/aggregate.py runs/grid --export-records results/records/mygrid   # run folders -> records

Sources (positional, any mix): record files (`*.json.gz`), folders of records (searched recursively), run
folders (a folder holding `args.json`: TensorBoard events + summary.json, searched recursively), and the
older result folders that hold a `runs.csv` + `final.csv` written by an earlier version of this tool. Without
sources: the evidence grid's committed records, `results/records/tier{1,2,3}`. Output goes to `--out`
(default `runs/aggregate`, outside the tracked folders; give `--out results/...` to update committed files).

Definitions (every table and figure states the ones it uses)
------------------------------------------------------------
* Final score of a run: the mean of the logged training episodic return (`charts/episodic_return`) over the
  last 10% of training (logged steps > 0.9 x the run's final global step; the last logged point if none),
  the scripts' summary.json definition. Normalised: (score - random) / (reference - random) with the
  reference table (`results/reference_scores.csv`): 0 = uniform-random actions, 1 = CleanRL PPO at 8M steps.
* Final TV, backward TV, SPS...: means over the same last-10% window.
* Algorithm label: the run's `exp_name`, or for a script's default name the algorithm plus VACO's
  non-default settings (`vaco-norealign`, `vaco-nofilter`, `vaco-delta0.1`, ...), `[mode]` appended for a
  non-uniform `lag_mode`: the labels `tools/run_grid.py` gives.
* Intervals. Aggregates over tasks (IQM, mean, and the median / optimality gap where they mean something):
  95% percentile intervals of a stratified bootstrap (runs resampled with replacement within each task).
  Per-task means: 95% Student-t intervals (t with n-1 degrees of freedom, e.g. 2.26 at 10 seeds, 4.30 at 3).
* Primary measure: the difference in degradation, (VACO[hi] - VACO[lo]) - (PPO[hi] - PPO[lo]) of the mean
  normalised final score (lags lo = 0, hi = 8), per task and pooled (the mean over tasks), with a 95%
  stratified-bootstrap interval: each (algorithm, lag, task) cell's runs are resampled independently. > 0:
  VACO loses less than PPO. The same difference is reported for every algorithm run at both lags.
* Ablations: (ablation at hi) - (VACO at hi), per task and pooled, the same bootstrap.
* Learning curves: at the logged steps only (the steps every run of a curve logged a return; at most
  `--curve-points` of them, chosen evenly among the logged ones), never interpolated.

* Post hoc, not pre-registered: the training return, the final TV, the fraction of minibatches over δ/2 and the
  fraction of samples masked (`charts/episodic_return`, `lag/final_tv`, `vaco/over_budget_frac`,
  `vaco/filter_frac`) per training decile (deciles.csv):
  the final-score window is the last decile, where the annealed learning rate barely moves the policy.
* An algorithm whose lag-0 IQM interval includes 0 (the random policy) did not learn: its difference in
  degradation is marked (†, grey and hatched), since it had nothing to lose.

Outputs: final.csv (one row per run), per_task.csv, aggregate.csv, degradation.csv, ablation.csv, deciles.csv,
iqm_curves.csv, runs.csv (one row per run and logged step), verdict.md, and the figures score_vs_lag.png,
degradation.png, intervals.png, iqm_curves.png, task_curves.png, final_tv.png, deciles.png, ablation.png (when
present).

    python tools/aggregate.py --measure-random [ENV ...] [--episodes 20] [--write]

measures the random-policy returns and (with --write) rewrites the reference table.
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
# Post hoc (not pre-registered): the TV and filter statistics per training decile, whose last decile is the
# final-score window; the learning rate is annealed, so in that window the policy barely moves.
DECILE_COLUMNS = {
    "episodic_return": "training episodic return (raw)",
    "final_tv": "final TV",
    "vaco_over_budget_frac": "fraction of minibatches over δ/2",
    "vaco_filter_frac": "fraction of samples masked",
}
PREREGISTERED_SEEDS = 10  # Tier 1's seeds per (algorithm, task, lag): fewer makes the verdict provisional

# One colour per algorithm label, the same in every figure (matplotlib's tab10 hex codes).
COLORS = {
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

# Records: the per-iteration scalars kept (TensorBoard tag -> column) and the format tag.
RECORD_FORMAT = "vaco-run-record/1"
RECORD_TAGS = {
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
    if exp in SCRIPT_STEMS:
        label = SCRIPT_STEMS[exp]
        if label == "vaco":
            parts = []
            if args.get("realign") is False:
                parts.append("norealign")
            if args.get("filter") is False:
                parts.append("nofilter")
            for key, tag in (("tv_threshold", "delta"), ("rho_bar", "rhobar")):
                if key in args and args[key] is not None and not math.isclose(float(args[key]), VACO_DEFAULTS[key]):
                    parts.append(f"{tag}{fmt_num(args[key])}")
            label = "-".join([label, *parts])
    else:
        label = exp or "unknown"
    mode = args.get("lag_mode", "uniform")
    if mode and mode != "uniform":
        label += f"[{mode}]"
    return label


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
    v = float(v)
    return float(f"{v:.6g}") if math.isfinite(v) else None


def read_event_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of the TensorBoard event files in the run folder, in logged order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not any(Path(run_dir).glob("events.out.tfevents*")):
        return {}
    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags().get("scalars", [])}


def make_record(name, args, summary, scalars: dict[str, dict[int, float]], eval_returns, algo=None) -> dict:
    """A run record: what the tables and figures need, nothing machine-specific. `scalars`: column -> {step: value}."""
    steps = sorted({s for col in scalars.values() for s in col})
    columns = {"step": [int(s) for s in steps]}
    for col in RECORD_COLUMNS:
        if col in scalars and scalars[col]:
            columns[col] = [_clean(scalars[col].get(s)) for s in steps]
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
    run_dir = Path(run_dir)
    args = json.loads((run_dir / "args.json").read_text())
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    events = read_event_scalars(run_dir)
    scalars = {}
    for tag, col in RECORD_TAGS.items():
        if tag in events:
            scalars[col] = dict(events[tag])  # a repeated step keeps its last value
    evals = [v for _, v in events.get("eval/episodic_return", [])]
    return make_record(run_dir.name, args, summary, scalars, evals)


def write_record(record: dict, path) -> Path:
    """gzip'd JSON, byte-reproducible (no timestamp in the gzip header); written to a temp file, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(record, separators=(",", ":"), sort_keys=False).encode()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(data)
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
    final = pd.read_csv(folder / "final.csv")
    runs = pd.read_csv(folder / "runs.csv")
    arg_cols = ["total_timesteps", "num_envs", "num_steps", "tv_threshold", "rho_bar", "c_bar", "realign", "filter"]
    out = []
    for _, row in final.iterrows():
        args = {"exp_name": row["exp_name"], "env_id": row["task"], "lag": int(row["lag"]), "seed": int(row["seed"])}
        args["lag_mode"] = row["lag_mode"]
        args.update(
            {c: row[c].item() if hasattr(row[c], "item") else row[c] for c in arg_cols if c in row and pd.notna(row[c])}
        )
        summary = {"global_step": int(row["last_step"])}
        for key in ("final_return", "final_tv", "sps", "eval_return", "rollout_seconds", "update_seconds"):
            if f"summary_{key}" in row and pd.notna(row[f"summary_{key}"]):
                summary[key] = float(row[f"summary_{key}"])
        r = runs[runs["run_dir"] == row["run_dir"]]
        scalars = {c: dict(zip(r["step"].astype(int), r[c])) for c in RECORD_COLUMNS if c in r and r[c].notna().any()}
        scalars = {c: {s: v for s, v in d.items() if pd.notna(v)} for c, d in scalars.items()}
        rec = make_record(Path(row["run_dir"]).name, args, summary if row["finished"] else None, scalars, [], row["algo"])
        if rec["finished"] and pd.notna(row.get("eval_return")):
            rec["summary"].setdefault("eval_return", _clean(row["eval_return"]))
        out.append(rec)
    return out


def collect_records(sources, include_unfinished=False, log=print) -> list[dict]:
    """Every run record found under `sources` (record files, folders of them, run folders, legacy folders)."""
    records, unfinished = [], []
    for src in map(Path, sources):
        if not src.exists():
            log(f"warning: {src} does not exist; skipped")
            continue
        files = [src] if src.is_file() else sorted(src.rglob("*.json.gz"))
        for f in files:
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
    kept = []
    for r in records:
        (kept if include_unfinished or r["finished"] else unfinished).append(r)
    if unfinished:
        log(f"note: {len(unfinished)} unfinished run(s) left out, e.g. {unfinished[0]['name']}")
    # Runs older than the EnvPool default ran on gymnasium and may not name a backend.
    backends = sorted({(r.get("args") or {}).get("env_backend", "gymnasium") for r in kept})
    if len(backends) > 1:
        log(f"warning: the runs used different env backends ({', '.join(backends)}); compare algorithms within one")
    return kept


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
    cols = rec["scalars"]
    tidy = pd.DataFrame({k: np.asarray([np.nan if v is None else v for v in vals], float) for k, vals in cols.items()})
    steps = tidy["step"].to_numpy(float) if len(tidy) else np.zeros(0)
    summary = rec.get("summary") or {}
    last_step = float(summary.get("global_step") or (steps.max() if len(steps) else np.nan))
    row = {key: rec[key] for key in ("algo", "task", "lag", "lag_mode", "seed")}
    row["source"] = rec["name"]
    row["last_step"] = last_step
    ret = tidy["episodic_return"].to_numpy(float) if "episodic_return" in tidy else np.zeros(0)
    row["n_returns"] = int(np.isfinite(ret).sum())
    row["final_return"] = window_mean(steps, ret, last_step)
    for col in RECORD_COLUMNS[1:]:
        if col in tidy:
            row[col] = window_mean(steps, tidy[col].to_numpy(float), last_step)
    evals = [v for v in rec.get("eval_returns") or [] if v is not None]
    row["eval_return"] = float(np.mean(evals)) if evals else float(summary.get("eval_return") or np.nan)
    row["sps"] = float(summary.get("sps") or np.nan)
    row["finished"] = rec["finished"]
    for key in ("total_timesteps", "num_envs", "num_steps", "tv_threshold", "rho_bar"):
        if key in rec["args"]:
            row[key] = rec["args"][key]
    for key, value in (("algo", row["algo"]), ("task", row["task"]), ("lag", row["lag"]), ("seed", row["seed"])):
        tidy.insert(0, key, value)
    tidy.insert(0, "source", rec["name"])
    return row, tidy


def build_tables(records, log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    if not records:
        raise SystemExit("error: no finished runs found")
    rows, tidies = zip(*(record_frames(r) for r in records))
    final = pd.DataFrame(list(rows))
    key = ["algo", "task", "lag", "seed"]
    dup = final.duplicated(key, keep="first")
    if dup.any():  # the same run as a record and as a run folder, or run twice
        first = final[~dup].set_index(key)["final_return"]
        for _, r in final[dup].iterrows():
            other = first.loc[tuple(r[key])]
            if not np.isclose(other, r["final_return"], rtol=1e-5, equal_nan=True):
                log(
                    f"warning: two different runs of {tuple(r[key])}: final scores {other:g} and {r['final_return']:g}; kept the first"
                )
        keep_sources = set(final.loc[~dup, "source"])
        final = final[~dup]
        tidies = [t for t in tidies if len(t) == 0 or t["source"].iloc[0] in keep_sources]
    final = final.sort_values(key).reset_index(drop=True)
    runs = pd.concat(tidies, ignore_index=True) if tidies else pd.DataFrame()
    runs = runs.drop_duplicates(["algo", "task", "lag", "seed", "step"]).sort_values(["algo", "task", "lag", "seed", "step"])
    return final, runs.reset_index(drop=True)


def load_reference(path) -> pd.DataFrame:
    return pd.read_csv(path, comment="#").set_index("env_id")


def normalise(scores, tasks, ref: pd.DataFrame | None):
    """(score - random) / (reference - random), elementwise; `ref=None` leaves scores unchanged."""
    scores = np.asarray(scores, dtype=float)
    if ref is None:
        return scores
    lo = ref.loc[list(tasks), "random_return"].to_numpy(float)
    hi = ref.loc[list(tasks), "reference_return"].to_numpy(float)
    return (scores - lo) / (hi - lo)


# ----------------------------------------------------------------------------------------------- statistics


def t_interval(values, confidence=0.95) -> tuple[float, float, int]:
    """(mean, half-width of the Student-t interval, n) of the finite values; half-width NaN for n < 2."""
    from scipy import stats

    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return float("nan"), float("nan"), 0
    if n == 1:
        return float(v[0]), float("nan"), 1
    t = stats.t.ppf(0.5 + confidence / 2, n - 1)
    return float(v.mean()), float(t * v.std(ddof=1) / np.sqrt(n)), n


def iqm(x, axis=-1):
    """Interquartile mean along `axis`: drop int(n/4) values at each end of the sorted values, average the rest
    (scipy.stats.trim_mean(x, 0.25), rliable's aggregate_iqm)."""
    a = np.sort(np.asarray(x, float), axis=axis)
    n = a.shape[axis]
    k = int(0.25 * n)
    return np.take(a, range(k, n - k), axis=axis).mean(axis=axis)


def stratified_bootstrap(cells, stat, reps=5000, seed=0, confidence=0.95):
    """Point estimate and percentile interval of `stat` under a stratified bootstrap.

    cells: list of 1-D arrays (the strata: the runs of one task, or of one (algorithm, lag, task) cell); each
    replicate resamples every cell with replacement, independently, keeping its size. stat: a function of a list
    of (reps, n_i) arrays returning an array of shape (reps,) or (reps, k). Returns (point, low, high)."""
    cells = [np.asarray(c, float) for c in cells]
    point = np.asarray(stat([c[None, :] for c in cells]))[0]
    rng = np.random.default_rng(seed)
    samples = [c[rng.integers(0, len(c), size=(reps, len(c)))] for c in cells]
    dist = np.asarray(stat(samples))
    alpha = (1 - confidence) / 2 * 100
    low, high = np.percentile(dist, [alpha, 100 - alpha], axis=0)
    return point, low, high


def score_matrix(df: pd.DataFrame, column: str, warn=None):
    """(runs x tasks) matrix of `column` for one (algo, lag) slice, equal runs per task (lowest seeds kept)."""
    tasks = sorted(df["task"].unique())
    per_task = [df[df["task"] == t].sort_values("seed")[column].to_numpy(float) for t in tasks]
    n = min(len(x) for x in per_task)
    if warn and any(len(x) != n for x in per_task):
        warn(f"unequal runs per task ({dict(zip(tasks, map(len, per_task)))}); using the {n} lowest seeds per task")
    return np.stack([x[:n] for x in per_task], axis=1), tasks


def _aggregates(cells):
    """[IQM, mean, median, optimality gap] over the runs of all tasks; cells: one (reps, n) array per task."""
    x = np.concatenate(cells, axis=1)  # reps x (runs of all tasks)
    task_means = np.stack([c.mean(axis=1) for c in cells], axis=1)
    return np.stack(
        [iqm(x), task_means.mean(axis=1), np.median(task_means, axis=1), 1.0 - np.minimum(x, 1.0).mean(axis=1)], axis=1
    )


AGG_METRICS = ("iqm", "mean", "median", "optimality_gap")


def aggregate_table(final: pd.DataFrame, reps: int, seed: int, log=print) -> pd.DataFrame:
    """Per (algo, lag): IQM / mean / median / optimality gap of the normalised final score, stratified bootstrap."""
    rows = []
    for (algo, lag), df in final.groupby(["algo", "lag"], sort=True):
        df = df[np.isfinite(df["normalized_score"])]
        if df.empty:
            continue
        x, tasks = score_matrix(df, "normalized_score", lambda m: log(f"warning: {algo} lag {lag}: {m}"))
        point, low, high = stratified_bootstrap(list(x.T), _aggregates, reps, seed)
        for i, metric in enumerate(AGG_METRICS):
            rows.append(
                {
                    "algo": algo,
                    "lag": lag,
                    "metric": metric,
                    "estimate": point[i],
                    "ci_low": low[i],
                    "ci_high": high[i],
                    "n_tasks": x.shape[1],
                    "runs_per_task": x.shape[0],
                    "tasks": " ".join(tasks),
                }
            )
    return pd.DataFrame(rows)


def per_task_table(final: pd.DataFrame) -> pd.DataFrame:
    """Per (algo, task, lag): runs, mean return, normalised score, final TV, eval return, each mean ± t half-width."""
    rows = []
    for (algo, task, lag), df in final.groupby(["algo", "task", "lag"], sort=True):
        row = {"algo": algo, "task": task, "lag": lag, "runs": len(df)}
        for col in ("final_return", "normalized_score", "final_tv", "backward_tv", "eval_return", "sps"):
            if col in df:
                m, h, n = t_interval(df[col])
                row[f"{col}_mean"], row[f"{col}_ci95"] = m, h
        rows.append(row)
    return pd.DataFrame(rows)


def decile_table(final: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Post hoc: per (algo, task, lag) and training decile (decile d holds the logged steps in ((d-1)/10, d/10]
    of the run's final step; 10 is the final-score window), each run's mean of every DECILE_COLUMNS column, then
    mean ± 95% t half-width over runs. Decile "1-9": every step before the window; "all": the whole run."""
    cols = [c for c in DECILE_COLUMNS if c in runs]
    if not cols or not len(runs):
        return pd.DataFrame()
    r = runs.merge(final[["source", "last_step"]], on="source")
    r["decile"] = np.clip(np.ceil(10 * r["step"] / r["last_step"]), 1, 10).astype(int)
    spans = [(str(d), r[r.decile == d]) for d in range(1, 11)] + [("1-9", r[r.decile <= 9]), ("all", r)]
    rows = []
    for span, part in spans:
        per_run = part.groupby(["algo", "task", "lag", "seed"])[cols].mean().reset_index()
        for (algo, task, lag), df in per_run.groupby(["algo", "task", "lag"], sort=True):
            row = {"algo": algo, "task": task, "lag": lag, "decile": span, "runs": len(df)}
            for c in cols:
                row[f"{c}_mean"], row[f"{c}_ci95"], _ = t_interval(df[c])
            rows.append(row)
    out = pd.DataFrame(rows)
    out["order"] = out["decile"].map({s: i for i, (s, _) in enumerate(spans)})
    return out.sort_values(["algo", "task", "lag", "order"]).drop(columns="order").reset_index(drop=True)


def _cells(final, algo, lag, tasks, column="normalized_score"):
    return [
        final[(final.algo == algo) & (final.lag == lag) & (final.task == t)][column].dropna().to_numpy(float) for t in tasks
    ]


def difference_table(final, terms, name, reps, seed, extra=None) -> list[dict]:
    """Per task and pooled (mean over tasks): sum of sign x mean(cell) over `terms` [(sign, algo, lag), ...],
    with a stratified-bootstrap interval (each (algo, lag, task) cell resampled on its own). Tasks missing any
    cell are left out."""
    tasks = [t for t in sorted(final["task"].unique()) if all(len(_cells(final, a, k, [t])[0]) for _, a, k in terms)]
    if not tasks:
        return []
    cells, signs = [], []
    for t in tasks:
        for sign, algo, lag in terms:
            cells += _cells(final, algo, lag, [t])
            signs.append(sign)
    nt = len(terms)

    def stat(samples):
        means = np.stack([s.mean(axis=1) for s in samples], axis=1) * np.asarray(signs)
        per_task = means.reshape(means.shape[0], len(tasks), nt).sum(axis=2)
        return np.concatenate([per_task, per_task.mean(axis=1, keepdims=True)], axis=1)

    point, low, high = stratified_bootstrap(cells, stat, reps, seed)
    runs = [len(c) for c in cells]
    rows = []
    for i, task in enumerate([*tasks, "pooled"]):
        n = runs[i * nt : (i + 1) * nt] if task != "pooled" else runs
        rows.append(
            {
                "measure": name,
                **(extra or {}),
                "task": task,
                "estimate": point[i],
                "ci_low": low[i],
                "ci_high": high[i],
                "min_runs_per_cell": min(n),
            }
        )
    return rows


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


# ----------------------------------------------------------------------------------------------- curves


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
    """IQM of the normalised training return at logged steps, per (algo, lag), stratified-bootstrap CI."""
    rows = []
    for (algo, lag), df in final.groupby(["algo", "lag"], sort=True):
        tasks = sorted(df["task"].unique())
        per_task = [df[df.task == t].sort_values("seed") for t in tasks]
        n = min(len(p) for p in per_task)
        group = [
            runs[(runs.algo == algo) & (runs.lag == lag) & (runs.task == t) & (runs.seed == s)]
            for p in per_task
            for t, s in zip(p.task[:n], p.seed[:n])
        ]
        steps = curve_steps(group, max_points)
        if not len(steps):
            log(f"note: {algo} lag {lag}: no step at which every run logged a return; no curve")
            continue
        cells = []
        for i, t in enumerate(tasks):
            vals = [g.set_index("step")["episodic_return"].reindex(steps).to_numpy(float) for g in group[i * n : (i + 1) * n]]
            cells.append(normalise(np.stack(vals), [t] * len(steps), ref) if ref is not None else np.stack(vals))
        point, low, high = stratified_bootstrap_curves(cells, reps, seed)
        rows += [
            {"algo": algo, "lag": lag, "step": int(s), "iqm": p, "ci_low": a, "ci_high": b, "runs": n * len(tasks)}
            for s, p, a, b in zip(steps, point, low, high)
        ]
    return pd.DataFrame(rows)


def stratified_bootstrap_curves(cells, reps, seed):
    """cells: one (runs, points) array per task; IQM over all runs at each point, runs resampled within tasks."""
    rng = np.random.default_rng(seed)
    point = iqm(np.concatenate(cells, axis=0), axis=0)
    draws = np.concatenate([c[rng.integers(0, len(c), size=(reps, len(c)))] for c in cells], axis=1)  # reps x runs x points
    dist = iqm(draws, axis=1)
    low, high = np.percentile(dist, [2.5, 97.5], axis=0)
    return point, low, high


# ----------------------------------------------------------------------------------------------- verdict


def delta_of(final: pd.DataFrame, label: str) -> float:
    d = final[final["algo"] == label]
    if "tv_threshold" in d and d["tv_threshold"].notna().any():
        return float(d["tv_threshold"].dropna().iloc[0])
    return VACO_DEFAULTS["tv_threshold"] if label.startswith("vaco") else float("nan")


def verdict_table(final, agg, deg, per_task, lo=LAG_LO, hi=LAG_HI) -> tuple[pd.DataFrame, str]:
    """The pre-registered criteria (supporting / refuting) evaluated on the results, and the overall verdict:
    'supported' if every supporting criterion holds and no refuting one, 'refuted' if any refuting one holds,
    'inconclusive' otherwise (also when a criterion cannot be evaluated)."""
    rows = []

    def add(kind, criterion, value, holds):
        rows.append({"kind": kind, "criterion": criterion, "value": value, "holds": holds})

    d = deg[(deg.measure == "degradation_difference") & (deg.algo == "vaco") & (deg.vs == "ppo")] if len(deg) else deg
    pooled = d[d.task == "pooled"].iloc[0] if len(d) and (d.task == "pooled").any() else None
    tasks = d[d.task != "pooled"] if len(d) else d
    name = f"(VACO {hi} - VACO {lo}) - (PPO {hi} - PPO {lo})"
    if pooled is not None:
        add(
            "supporting",
            f"pooled {name}: 95% interval above 0",
            f"{pooled.estimate:+.3f} [{pooled.ci_low:+.3f}, {pooled.ci_high:+.3f}]",
            bool(pooled.ci_low > 0),
        )
    else:
        add("supporting", f"pooled {name}: 95% interval above 0", "missing runs", None)
    if len(tasks) >= 2:
        signs = np.sign(tasks.estimate.to_numpy())
        text = ", ".join(f"{r.task} {r.estimate:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]" for r in tasks.itertuples())
        add("supporting", "same sign on every task (in VACO's favour)", text, bool((signs > 0).all()))
    else:
        add("supporting", "same sign on every task (in VACO's favour)", "fewer than 2 tasks", None)
    iq = agg[(agg.metric == "iqm") & (agg.lag == hi)].set_index("algo") if len(agg) else None
    if iq is not None and {"vaco", "ppo"} <= set(iq.index):
        v, p = iq.loc["vaco"], iq.loc["ppo"]
        text = f"VACO {v.estimate:.3f} [{v.ci_low:.3f}, {v.ci_high:.3f}] vs PPO {p.estimate:.3f} [{p.ci_low:.3f}, {p.ci_high:.3f}]"
        add("supporting", f"VACO's lag-{hi} IQM above PPO's", text, bool(v.estimate > p.estimate))
    else:
        v = p = None
        add("supporting", f"VACO's lag-{hi} IQM above PPO's", "missing runs", None)
    delta = delta_of(final, "vaco")
    half = delta / 2
    tv = (
        per_task[(per_task.algo == "vaco") & (per_task.lag.isin(TV_LAGS))]
        if "final_tv_mean" in per_task
        else per_task.iloc[:0]
    )
    crit = f"VACO's final TV within ±{TV_TOLERANCE:.0%} of δ/2 = {half:g} at lags {', '.join(map(str, TV_LAGS))} (every task)"
    if len(tv) and set(tv.lag) == set(TV_LAGS):
        near = (tv.final_tv_mean - half).abs() <= TV_TOLERANCE * half
        text = ", ".join(f"{r.task} lag {r.lag}: {r.final_tv_mean:.3f}" for r in tv.itertuples())
        add("supporting", crit, text, bool(near.all()))
    else:
        add("supporting", crit, "missing runs", None)
    if pooled is not None:
        add("refuting", f"pooled {name} ≤ 0", f"{pooled.estimate:+.3f}", bool(pooled.estimate <= 0))
    else:
        add("refuting", f"pooled {name} ≤ 0", "missing runs", None)
    if v is not None:
        add(
            "refuting",
            f"VACO below PPO at lag {hi} (IQM)",
            f"{v.estimate:.3f} vs {p.estimate:.3f}",
            bool(v.estimate < p.estimate),
        )
    else:
        add("refuting", f"VACO below PPO at lag {hi} (IQM)", "missing runs", None)
    table = pd.DataFrame(rows)
    sup, ref = table[table.kind == "supporting"].holds, table[table.kind == "refuting"].holds
    if any(h is True for h in ref):
        verdict = "refuted"
    elif all(h is True for h in sup) and all(h is False for h in ref):
        verdict = "supported"
    else:
        verdict = "inconclusive"
    return table, verdict


def not_learned(agg, lag=LAG_LO) -> set:
    """The algorithms whose IQM at `lag` has a 95% interval that includes 0, the uniform-random policy's score:
    they did not learn, so their degradation measures that they had nothing to lose, not robustness to lag."""
    iq = agg[(agg.metric == "iqm") & (agg.lag == lag)] if len(agg) else agg
    return set(iq[(iq.ci_low <= 0) & (iq.ci_high >= 0)].algo) if len(iq) else set()


NOT_LEARNED_NOTE = (
    f"did not learn (IQM at lag {LAG_LO} indistinguishable from the random policy's 0): its difference "
    "in degradation says it had nothing to lose, not that it is robust to lag"
)


def _task_table(frame, first_col, algos, marked=()):
    """Markdown rows: one per algorithm, one interval per task, then the pooled one; `marked` algorithms get a †."""
    tasks = [t for t in frame.task.unique() if t != "pooled"] + ["pooled"]
    lines = [f"| {first_col} | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for algo in algos:
        d = frame[frame.algo == algo].set_index("task")
        name = f"{algo} †" if algo in marked else algo
        lines.append(f"| {name} | " + " | ".join(_ci(d.loc[t]) if t in d.index else "" for t in tasks) + " |")
    if any(a in marked for a in algos):
        lines += ["", f"† {NOT_LEARNED_NOTE}."]
    return lines + [""]


def _ci(r) -> str:
    return f"{r.estimate:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"


def results_markdown(agg, deg, abl, per_task, norm=NORM_DEF, marked=()) -> str:
    """The tables a reading of the grid needs: IQM per lag, the degradation differences, the ablations, final TV."""
    lines = []
    if len(agg):
        iq = agg[agg.metric == "iqm"]
        lags = sorted(iq.lag.unique())
        lines += [f"IQM of the final score ({norm}), 95% stratified-bootstrap interval (runs per task in brackets):", ""]
        lines += ["| algorithm | " + " | ".join(f"lag {k}" for k in lags) + " |", "|---|" + "---|" * len(lags)]
        for algo in order_labels(iq.algo.unique()):
            cells = []
            for k in lags:
                r = iq[(iq.algo == algo) & (iq.lag == k)]
                cells.append(f"{_ci(r.iloc[0])} ({r.iloc[0].runs_per_task})" if len(r) else "")
            lines.append(f"| {algo} | " + " | ".join(cells) + " |")
        lines.append("")
    dd = deg[deg.measure == "degradation_difference"] if len(deg) else deg
    if len(dd):
        lines += [
            f"Difference in degradation vs PPO, (X lag {LAG_HI} − X lag {LAG_LO}) − (PPO lag {LAG_HI} − PPO lag {LAG_LO}):",
            "",
        ]
        lines += _task_table(dd, "algorithm", order_labels(dd.algo.unique()), marked)
    if len(abl):
        lines += [f"Ablations at lag {LAG_HI}, ablation − VACO:", ""]
        lines += _task_table(abl, "ablation", sorted(abl.algo.unique()))
    if "final_tv_mean" in per_task and per_task.final_tv_mean.notna().any():
        lines += ["Final TV (mean over the last 10% of steps), mean ± 95% t half-width over runs:", ""]
        lags = sorted(per_task.lag.unique())
        lines += ["| algorithm | task | " + " | ".join(f"lag {k}" for k in lags) + " |", "|---|---|" + "---|" * len(lags)]
        for algo in order_labels(per_task.algo.unique()):
            for task in sorted(per_task.task.unique()):
                d = per_task[(per_task.algo == algo) & (per_task.task == task)].set_index("lag")
                if d.empty:
                    continue
                cells = [f"{d.loc[k].final_tv_mean:.3f} ± {d.loc[k].final_tv_ci95:.3f}" if k in d.index else "" for k in lags]
                lines.append(f"| {algo} | {task} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def deciles_markdown(dec: pd.DataFrame, delta: float, algos=("ppo", "vaco")) -> str:
    """Post hoc tables: the mean over runs of each DECILE_COLUMNS statistic per training decile, for `algos`."""
    d = dec[dec.algo.isin(algos)] if len(dec) else dec
    if not len(d):
        return ""
    half = delta / 2
    lines = [
        f"Post hoc, not pre-registered: {' and '.join(a.upper() for a in algos)} per training decile (decile d: steps in ((d−1)/10, d/10] of the "
        "run; 10 is the final-score window, where the annealed learning rate is ≤ 10% of its start; 1–9: every step "
        "before it; all: the whole run). Means over runs; `deciles.csv` holds the 95% t half-widths and the other "
        "algorithms.",
        "",
    ]
    spans = list(dict.fromkeys(d.decile))
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
    for r in table.itertuples():
        holds = "n/a" if r.holds is None else ("yes" if r.holds else "no")
        lines.append(f"| {r.kind} | {r.criterion} | {r.value} | {holds} |")
    if len(n) and n.min() < 10:
        lines += [
            "",
            f"Note: {n.min()} runs in the smallest cell; percentile-bootstrap intervals are too narrow with few seeds",
        ]
        lines[-1] += " (about 80% coverage for a nominal 95% at 3 runs per task): read them as indicative only."
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- plots


def colors_for(labels) -> dict[str, str]:
    """A fixed colour per known label; others get the extra colours in sorted order. Call once per aggregation
    with every label present and pass the result to every figure."""
    out, i = {}, 0
    for label in sorted(labels):
        base = label.split("[")[0]
        if base in COLORS:
            out[label] = COLORS[base]
        else:
            out[label] = EXTRA_COLORS[i % len(EXTRA_COLORS)]
            i += 1
    return out


def order_labels(labels):
    return sorted(labels, key=lambda s: (MAIN_ALGOS.index(s.split("[")[0]) if s.split("[")[0] in MAIN_ALGOS else 99, s))


_FIGURE_LABEL = {"text": ""}  # set by aggregate(label=...): prefixed to every figure title


def _suptitle(fig, text):
    """A figure title wrapped to the figure's width (narrow figures would clip it), after the aggregation's label."""
    if _FIGURE_LABEL["text"]:
        text = f"{_FIGURE_LABEL['text']}: {text}"
    fig.suptitle(textwrap.fill(text, width=max(40, int(14 * fig.get_figwidth()))), fontsize=9)


def _lag_axis(ax, lags):
    ax.set_xticks(range(len(lags)))
    ax.set_xticklabels([str(k) for k in lags])
    ax.set_xlabel("lag K")


def _step_axis(ax):
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(4))
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda x, _: "0" if x == 0 else f"{x / 1e6:g}M" if abs(x) >= 1e6 else f"{x / 1e3:g}k")
    )
    ax.set_xlabel("environment steps")


def _save(fig, path, layout=True):
    import matplotlib.pyplot as plt

    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def meaningful_metrics(final, n_tasks):
    """IQM and mean always; the median of task means only with 3+ tasks (with 2 it equals the mean); the
    optimality gap only when some run reaches the reference (otherwise it is 1 - mean)."""
    metrics = ["iqm", "mean"]
    if n_tasks >= 3:
        metrics.append("median")
    if (final["normalized_score"] >= 1).any():
        metrics.append("optimality_gap")
    return metrics


def _lag_points(ax, run_lags, lags, offset, est, yerr, color, label):
    """Points with error bars at the lags a label ran, joined only between neighbouring lags of the axis, so that
    no line crosses a lag it never ran (the legend says which lags it ran)."""
    pos = np.array([lags.index(k) for k in run_lags])
    x = pos + offset * 0.06
    name = label if len(pos) == len(lags) else f"{label} (lags {', '.join(map(str, run_lags))} only)"
    ax.errorbar(x, est, yerr=yerr, fmt="o", color=color, label=name, capsize=2, ms=4)
    for i in np.flatnonzero(np.diff(pos) == 1):
        ax.plot(x[i : i + 2], est[i : i + 2], "-", color=color, lw=1.5)


def plot_score_vs_lag(agg, labels, lags, colors, metrics, path, title, ylabel):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for j, label in enumerate(labels):
            d = agg[(agg.algo == label) & (agg.metric == metric)].set_index("lag").sort_index()
            est, lo, hi = (d[c].to_numpy(float) for c in ("estimate", "ci_low", "ci_high"))
            _lag_points(ax, d.index, lags, j - (len(labels) - 1) / 2, est, [est - lo, hi - est], colors[label], label)
        ax.axhline(0, color="k", lw=0.8, ls=":", label="random policy")
        _lag_axis(ax, lags)
        names = {"iqm": "IQM", "mean": "Mean", "median": "Median of task means", "optimality_gap": "Optimality gap"}
        ax.set_title(names[metric] + (" (lower is better)" if metric == "optimality_gap" else ""), fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7)
    _suptitle(fig, title)
    _save(fig, path)


def plot_forest(table, colors, path, title, xlabel, marked=()):
    """One row per (algorithm, task or pooled): point and 95% interval; a line at 0. The `marked` algorithms (did
    not learn) are drawn grey and dashed on a hatched band, with the reason under the plot."""
    import matplotlib.pyplot as plt

    rows = list(table.itertuples())
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 2.0 + 0.3 * bool(marked)))
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i
        c = "#999999" if r.algo in marked else colors.get(r.algo, "k")
        if r.algo in marked:
            ax.axhspan(y - 0.45, y + 0.45, facecolor="none", edgecolor="#bbbbbb", hatch="///", lw=0)
        ax.errorbar(
            r.estimate,
            y,
            xerr=[[r.estimate - r.ci_low], [r.ci_high - r.estimate]],
            fmt="o",
            color=c,
            capsize=3,
            ms=5,
            mfc="white" if r.task != "pooled" else c,
            ls="--" if r.algo in marked else "-",
        )
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r.algo}{' †' if r.algo in marked else ''} — {r.task}" for r in reversed(rows)], fontsize=8)
    if any(r.algo in marked for r in rows):
        ax.set_title(textwrap.fill(f"† grey, hatched: {NOT_LEARNED_NOTE}", 100), fontsize=8, color="#555555")
    ax.axvline(0, color="k", lw=0.9, ls="--")
    ax.set_xlabel(xlabel, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    _suptitle(fig, title)
    _save(fig, path)


def plot_deciles(dec, colors, delta, path, title, algo="vaco"):
    """Post hoc: `algo`'s DECILE_COLUMNS statistics against the training decile, one line per (task, lag), mean
    ± 95% t-interval over runs; the TV panel shows δ/2 and the ±25% band."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    d = dec[(dec.algo == algo) & dec.decile.str.isdigit()] if len(dec) else dec
    cols = [c for c in DECILE_COLUMNS if c != "episodic_return" and f"{c}_mean" in d and d[f"{c}_mean"].notna().any()]
    if not len(d) or not cols:
        return False
    fig, axes = plt.subplots(1, len(cols), figsize=(4.4 * len(cols), 3.6), squeeze=False)
    groups = list(d.groupby(["task", "lag"], sort=True))
    lags = sorted(d.lag.unique())
    for ax, col in zip(axes[0], cols):
        for (task, lag), g in groups:
            shade = 0.35 + 0.65 * (lags.index(lag) + 1) / len(lags)  # darker at larger lags, the algorithm's hue
            c = tuple(1 - shade * (1 - v) for v in to_rgb(colors.get(algo, "k")))
            ls = ["-", "--", ":", "-."][sorted(d.task.unique()).index(task) % 4]
            x = g.decile.astype(int).to_numpy()
            ax.errorbar(x, g[f"{col}_mean"], yerr=g[f"{col}_ci95"].fillna(0), fmt="o" + ls, color=c, ms=3, capsize=2,
                        label=f"{task} lag {lag}")  # fmt: skip
        if col == "final_tv" and np.isfinite(delta):
            ax.axhline(delta / 2, ls="--", color="k", lw=0.9)
            ax.axhspan(delta / 2 * (1 - TV_TOLERANCE), delta / 2 * (1 + TV_TOLERANCE), color="k", alpha=0.08, lw=0)
        ax.set_xticks(range(1, 11))
        ax.set_xlabel("training decile (10: the final-score window)", fontsize=8)
        ax.set_title(DECILE_COLUMNS[col], fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    _suptitle(fig, title)
    _save(fig, path)
    return True


def plot_intervals(agg, labels, lags, colors, path, title):
    """IQM per lag: one bar (95% interval) and a tick (estimate) per algorithm."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(lags), figsize=(3.4 * len(lags), 0.4 * len(labels) + 2.2), squeeze=False, sharey=True, sharex=True
    )
    for ax, lag in zip(axes[0], lags):
        for i, label in enumerate(labels):
            d = agg[(agg.algo == label) & (agg.metric == "iqm") & (agg.lag == lag)]
            if d.empty:
                continue
            d = d.iloc[0]
            y = len(labels) - 1 - i
            ax.barh(y, d.ci_high - d.ci_low, left=d.ci_low, height=0.6, color=colors[label], alpha=0.75)
            ax.vlines(d.estimate, y - 0.3, y + 0.3, color="k", lw=1.5)
        ax.axvline(0, color="k", lw=0.8, ls=":")
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(list(reversed(labels)), fontsize=8)
        ax.set_title(f"lag {lag}", fontsize=9)
        ax.set_xlabel("IQM normalised score", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    _suptitle(fig, title)
    _save(fig, path)


def plot_iqm_curves(curves, labels, lags, colors, path, title):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(lags), figsize=(3.8 * len(lags), 3.4), squeeze=False, sharey=True)
    for ax, lag in zip(axes[0], lags):
        for label in labels:
            d = curves[(curves.algo == label) & (curves.lag == lag)] if len(curves) else curves
            if d.empty:
                continue
            ax.plot(d.step, d.iqm, ".-", color=colors[label], label=label, lw=1.4, ms=3)
            ax.fill_between(d.step, d.ci_low, d.ci_high, color=colors[label], alpha=0.15, lw=0)
        ax.axhline(0, color="k", lw=0.8, ls=":")
        ax.set_title(f"lag {lag}", fontsize=9)
        _step_axis(ax)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("IQM normalised return")
    axes[0][-1].legend(fontsize=7)
    _suptitle(fig, title)
    _save(fig, path)


def plot_task_curves(final, runs, labels, lags, colors, max_points, path, ref_lines):
    """Training return per task (rows) and lag (columns): mean over seeds ± one standard error, at logged steps."""
    import matplotlib.pyplot as plt

    tasks = sorted(final["task"].unique())
    fig, axes = plt.subplots(len(tasks), len(lags), figsize=(3.6 * len(lags), 2.8 * len(tasks)), squeeze=False, sharey="row")
    for r, task in enumerate(tasks):
        for c, lag in enumerate(lags):
            ax = axes[r][c]
            for label in labels:
                group = [g for _, g in runs[(runs.algo == label) & (runs.task == task) & (runs.lag == lag)].groupby("seed")]
                steps = curve_steps(group, max_points) if group else []
                if not len(steps):
                    continue
                y = np.stack([g.set_index("step")["episodic_return"].reindex(steps).to_numpy(float) for g in group])
                m = y.mean(0)
                se = y.std(0, ddof=1) / np.sqrt(len(y)) if len(y) > 1 else np.zeros_like(m)
                ax.plot(steps, m, ".-", color=colors[label], label=label, lw=1.3, ms=3)
                ax.fill_between(steps, m - se, m + se, color=colors[label], alpha=0.15, lw=0)
            if task in ref_lines:
                ax.axhline(ref_lines[task], color="k", lw=0.8, ls=":")
            if r == 0:
                ax.set_title(f"lag {lag}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{task}\nepisodic return", fontsize=8)
            _step_axis(ax)
            ax.grid(alpha=0.3)
    handles = {h.get_label(): h for ax in axes.flat for h in ax.get_lines() if not h.get_label().startswith("_")}
    runs_of = final.groupby(["algo", "task", "lag"]).size()
    names = [f"{k} ({'–'.join(map(str, sorted({runs_of[k].min(), runs_of[k].max()})))} runs per cell)" for k in handles]
    fig.legend(handles.values(), names, loc="lower center", ncol=min(len(handles), 3), fontsize=9, frameon=False)
    note = " (dotted: random policy)" if ref_lines else ""
    _suptitle(fig, f"Training episodic return per task: mean over seeds ± 1 standard error, at logged steps{note}")
    fig.tight_layout(rect=(0, 0.035 * ((len(handles) + 2) // 3) / max(1, len(tasks) / 2), 1, 1))
    _save(fig, path, layout=False)


def plot_tv(per_task, labels, lags, colors, delta, path, title):
    """Final TV vs lag per task, mean ± 95% t-interval. The runs without a trust region (IMPALA, VACO without its
    filter: TV far above the others) get their own row with its own y-axis, so that they do not squash the
    comparison with δ/2."""
    import matplotlib.pyplot as plt

    if "final_tv_mean" not in per_task or per_task["final_tv_mean"].isna().all():
        return False
    tasks = sorted(per_task["task"].unique())
    unbounded = [lab for lab in labels if lab.startswith("impala") or "nofilter" in lab]
    groups = [[lab for lab in labels if lab not in unbounded], unbounded]
    groups = [g for g in groups if g]
    fig, axes = plt.subplots(len(groups), len(tasks), figsize=(4 * len(tasks), 3.1 * len(groups)), squeeze=False)
    for r, group in enumerate(groups):
        for c, task in enumerate(tasks):
            ax = axes[r][c]
            for j, label in enumerate(group):
                d = per_task[(per_task.algo == label) & (per_task.task == task)].set_index("lag").sort_index()
                est, err = d.final_tv_mean.to_numpy(float), d.final_tv_ci95.fillna(0).to_numpy(float)
                _lag_points(ax, d.index, lags, j - (len(group) - 1) / 2, est, err, colors[label], label)
            if group is not unbounded and any(lab.startswith("vaco") for lab in group) and np.isfinite(delta):
                ax.axhline(delta / 2, ls="--", color="k", lw=0.9)
                ax.axhspan(delta / 2 * (1 - TV_TOLERANCE), delta / 2 * (1 + TV_TOLERANCE), color="k", alpha=0.08, lw=0)
                ax.text(
                    len(lags) - 1, delta / 2, f" δ/2={delta / 2:g} ± {TV_TOLERANCE:.0%}", va="bottom", ha="right", fontsize=7
                )
                ax.set_ylim(top=max(ax.get_ylim()[1], 0.6 * delta))  # room for the δ/2 label
            ax.set_ylim(bottom=0)
            _lag_axis(ax, lags)
            ax.set_title(task + (" (no trust region, own scale)" if group is unbounded else ""), fontsize=9)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel("final TV ½·mean|π/β − 1|", fontsize=8)
            if c == len(tasks) - 1:
                ax.legend(fontsize=7)
    _suptitle(fig, title)
    _save(fig, path)
    return True


# ----------------------------------------------------------------------------------------------- driver


def write_csv(df: pd.DataFrame, path: Path, header: list[str]):
    """CSV with '# ' comment lines on top stating the definitions (read back with pd.read_csv(comment='#'))."""
    with open(path, "w") as f:
        for line in header:
            f.write(f"# {line}\n")
        df.to_csv(f, index=False)


def aggregate(
    sources,
    out,
    reference=DEFAULT_REFERENCE,
    normalization="reference",
    reps=5000,
    curve_reps=500,
    curve_points=50,
    seed=0,
    include_unfinished=False,
    plots=True,
    log=print,
    label="",
) -> dict:
    """Read the sources, write every table, figure and verdict.md into `out`; `label` (e.g. "SMOKE TEST, 40k
    steps") heads every figure title and verdict.md."""
    out = Path(out)
    _FIGURE_LABEL["text"] = label
    records = collect_records(sources, include_unfinished, log)
    final, runs = build_tables(records, log)
    ref = None
    if normalization == "reference":
        ref = load_reference(reference)
        missing = sorted(set(final["task"]) - set(ref.index))
        if missing:
            raise SystemExit(
                f"error: no reference scores for {missing} in {reference}; add them with "
                f"`tools/aggregate.py --measure-random {' '.join(missing)} --write` or use --normalization none"
            )
        norm = NORM_DEF
    else:
        log("note: --normalization none: 'normalised' scores are raw returns (only meaningful for one task)")
        norm = "not normalised: raw returns"
    final["normalized_score"] = normalise(final["final_return"], final["task"], ref)
    out.mkdir(parents=True, exist_ok=True)

    per_task = per_task_table(final)
    agg = aggregate_table(final, reps, seed, log)
    deg = degradation_table(final, reps, seed)
    abl = ablation_table(final, reps, seed)
    curves = curve_table(final, runs, ref, curve_points, curve_reps, seed, log)
    table, verdict = verdict_table(final, agg, deg, per_task)
    dec = decile_table(final, runs)
    marked = not_learned(agg) if ref is not None else set()  # 0 is the random policy only after normalisation
    boot = f"95% stratified-bootstrap percentile intervals over seeds ({reps} resamples, seed {seed})"
    base = [SCORE_DEF, norm, WINDOW_DEF]
    write_csv(final, out / "final.csv", base + ["one row per run; final_tv, backward_tv, ...: means over the same window"])
    write_csv(runs, out / "runs.csv", ["one row per run and logged step (training iteration)"])
    write_csv(
        per_task,
        out / "per_task.csv",
        base + ["per (algo, task, lag): mean and 95% Student-t half-width (t with n-1 dof) over runs"],
    )
    write_csv(agg, out / "aggregate.csv", base + [f"per (algo, lag): aggregates over tasks and runs; {boot}"])
    write_csv(
        deg,
        out / "degradation.csv",
        base
        + [
            f"degradation = mean(X at lag {LAG_HI}) - mean(X at lag {LAG_LO}); degradation_difference = X's minus PPO's (> 0: X loses less)",
            "pooled = mean over tasks; " + boot + ", each (algo, lag, task) cell resampled independently",
        ],
    )
    write_csv(
        abl,
        out / "ablation.csv",
        base + [f"ablation_effect = mean(ablation) - mean(VACO) at lag {LAG_HI}; pooled = mean over tasks; {boot}"],
    )
    if len(dec):
        write_csv(
            dec,
            out / "deciles.csv",
            [
                "POST HOC, not pre-registered: per (algo, task, lag) and training decile (d: logged steps in ((d-1)/10, d/10] "
                "of the run; 10 = the final-score window; 1-9: all steps before it; all: the whole run)",
                "each run's mean of the logged charts/episodic_return, lag/final_tv, vaco/over_budget_frac, vaco/filter_frac; "
                "mean and 95% Student-t half-width over runs",
            ],
        )
    write_csv(
        curves,
        out / "iqm_curves.csv",
        [f"IQM of the normalised training return at logged steps ({norm}); {curve_reps} resamples"],
    )
    md = verdict_markdown(table, verdict, final, norm) + "\n" + results_markdown(agg, deg, abl, per_task, norm, marked)
    md += deciles_markdown(dec, delta_of(final, "vaco"))
    if label:
        md = f"**{label}**\n\n{md}"
    (out / "verdict.md").write_text(md)
    written = [
        "final.csv",
        "runs.csv",
        "per_task.csv",
        "aggregate.csv",
        "degradation.csv",
        "ablation.csv",
        "iqm_curves.csv",
        "verdict.md",
    ] + ["deciles.csv"] * bool(len(dec))

    if plots:
        import matplotlib

        matplotlib.use("Agg")
        labels = order_labels(final["algo"].unique())
        colors = colors_for(labels)
        main = [lab for lab in labels if not is_ablation(lab)] or labels
        lags = sorted(int(k) for k in final["lag"].unique())
        n_tasks = final["task"].nunique()
        ylabel = "normalised score" if ref is not None else "return"
        metrics = meaningful_metrics(final, n_tasks)
        caption = f"{SCORE_DEF} ({norm}); {n_tasks} task(s); {boot}"
        plot_score_vs_lag(
            agg, main, lags, colors, metrics, out / "score_vs_lag.png", "Final score vs lag — " + caption, ylabel
        )
        plot_intervals(agg, labels, lags, colors, out / "intervals.png", "IQM of the final score — " + caption)
        written += ["score_vs_lag.png", "intervals.png"]
        dd = deg[deg.measure == "degradation_difference"] if len(deg) else deg
        if len(dd):
            plot_forest(
                dd,
                colors,
                out / "degradation.png",
                f"Difference in degradation vs PPO, (X lag {LAG_HI} − X lag {LAG_LO}) − (PPO lag {LAG_HI} − PPO lag {LAG_LO}); "
                f"> 0: X loses less. Filled: pooled over tasks. {SCORE_DEF}; {boot}",
                "difference in degradation (normalised score)",
                marked,
            )
            written.append("degradation.png")
        if len(abl):
            plot_forest(
                abl,
                colors,
                out / "ablation.png",
                f"Ablation effect at lag {LAG_HI}: ablation − VACO (< 0: the removed part helps). Filled: pooled. {SCORE_DEF}; {boot}",
                "difference (normalised score)",
            )
            written.append("ablation.png")
        if len(curves):
            plot_iqm_curves(
                curves,
                main,
                lags,
                colors,
                out / "iqm_curves.png",
                f"IQM normalised training return at logged steps ({norm}); {curve_reps}-resample bootstrap intervals",
            )
            written.append("iqm_curves.png")
        random_lines = {t: ref.loc[t, "random_return"] for t in final["task"].unique()} if ref is not None else {}
        plot_task_curves(final, runs, main, lags, colors, curve_points, out / "task_curves.png", random_lines)
        written.append("task_curves.png")
        if plot_tv(
            per_task,
            labels,
            lags,
            colors,
            delta_of(final, "vaco"),
            out / "final_tv.png",
            "Final TV after the update, mean over the last 10% of steps, ± 95% t-interval over seeds (dashed: VACO's "
            f"δ/2; shaded: ±{TV_TOLERANCE:.0%}, the pre-registered band)",
        ):
            written.append("final_tv.png")
        if plot_deciles(
            dec,
            colors,
            delta_of(final, "vaco"),
            out / "deciles.png",
            "POST HOC (not pre-registered): VACO per training decile, mean ± 95% t-interval over runs "
            f"(dashed: δ/2, shaded: ±{TV_TOLERANCE:.0%}); decile 10 is the final-score window",
        ):
            written.append("deciles.png")
    log(f"{len(final)} runs ({', '.join(f'{a}: {n}' for a, n in final['algo'].value_counts().sort_index().items())})")
    log(f"wrote {', '.join(written)} to {out}/")
    return {
        "final": final,
        "runs": runs,
        "per_task": per_task,
        "aggregate": agg,
        "degradation": deg,
        "ablation": abl,
        "curves": curves,
        "verdict": verdict,
        "verdict_table": table,
        "deciles": dec,
        "verdict_md": md,
        "records": records,
        "written": written,
    }


def export_records(records, folder, log=print) -> list[Path]:
    """Write each record as `{folder}/{record name}.json.gz` (an existing identical file is left untouched)."""
    paths = []
    for rec in records:
        path = Path(folder) / f"{rec['name']}.json.gz"
        if path.exists() and read_record(path) == rec:
            continue
        paths.append(write_record(rec, path))
    log(f"wrote {len(paths)} record(s) to {folder}/ ({len(records) - len(paths)} unchanged)")
    return paths


def measure_random(env_ids, episodes=20, seed=0) -> pd.DataFrame:
    import gymnasium as gym

    try:
        import mujoco

        mujoco.set_mju_user_warning(lambda msg: None)  # HalfCheetah's settotalmass deprecation warning
    except Exception:
        pass
    rows = []
    for env_id in env_ids:
        env = gym.make(env_id)
        env.action_space.seed(seed)
        returns = []
        for ep in range(episodes):
            env.reset(seed=seed + ep)
            total, done = 0.0, False
            while not done:
                _, r, terminated, truncated, _ = env.step(env.action_space.sample())
                total += float(r)
                done = terminated or truncated
            returns.append(total)
        env.close()
        rows.append(
            {
                "env_id": env_id,
                "random_return": round(float(np.mean(returns)), 3),
                "random_std": round(float(np.std(returns)), 3),
                "random_episodes": episodes,
                "seed": seed,
            }
        )
        print(f"{env_id:28s} random return {np.mean(returns):10.2f} ± {np.std(returns):.2f} ({episodes} episodes)", flush=True)
    return pd.DataFrame(rows)


def write_reference(measured: pd.DataFrame, path) -> pd.DataFrame:
    path = Path(path)
    table = load_reference(path).reset_index() if path.exists() else pd.DataFrame(columns=["env_id"])
    table = table[~table["env_id"].isin(measured["env_id"])]
    new = measured.copy()
    new["reference_return"] = [CLEANRL_PPO_8M.get(e.rsplit("-", 1)[0], np.nan) for e in new["env_id"]]
    new["reference_source"] = [
        "cleanrl ppo_continuous_action_8M v4" if np.isfinite(v) else "" for v in new["reference_return"]
    ]
    table = pd.concat([table, new], ignore_index=True) if len(table) else new
    table = table.sort_values("env_id").reset_index(drop=True)
    cols = ["env_id", "random_return", "random_std", "random_episodes", "seed", "reference_return", "reference_source"]
    table = table[cols]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(REFERENCE_HEADER)
        table.to_csv(f, index=False)
    return table


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring for the definitions.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "sources", nargs="*", help="record files, folders of records or of run folders (default: results/records/tier1..3)"
    )
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder for CSVs, figures and verdict.md")
    p.add_argument("--verdict", action="store_true", help="print the verdict table (pre-registered criteria)")
    p.add_argument("--export-records", metavar="DIR", help="also write every finished run found as a record into DIR")
    p.add_argument("--reference", default=str(DEFAULT_REFERENCE), help="reference table (CSV)")
    p.add_argument("--normalization", choices=["reference", "none"], default="reference")
    p.add_argument("--reps", type=int, default=5000, help="bootstrap resamples for the tables")
    p.add_argument("--curve-reps", type=int, default=500, help="bootstrap resamples for the IQM curves")
    p.add_argument("--curve-points", type=int, default=50, help="at most this many logged points per learning curve")
    p.add_argument("--seed", type=int, default=0, help="bootstrap random seed")
    p.add_argument("--include-unfinished", action="store_true", help="also use runs without a (complete) summary.json")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--label", default="", help='heads every figure title and verdict.md, e.g. "SMOKE TEST (40k steps)"')
    p.add_argument(
        "--measure-random",
        nargs="*",
        metavar="ENV",
        default=None,
        help="measure random-policy returns instead (no ENV: every env of the reference table)",
    )
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
            print(f"updated {opts.reference}")
        else:
            print(measured.to_csv(index=False))
        return 0
    sources = opts.sources or [s for s in DEFAULT_SOURCES if s.exists()]
    if not sources:
        p.error("no sources given and no committed records under results/records/tier1..3")
    res = aggregate(
        sources,
        opts.out,
        opts.reference,
        opts.normalization,
        opts.reps,
        opts.curve_reps,
        opts.curve_points,
        opts.seed,
        opts.include_unfinished,
        not opts.no_plots,
        label=opts.label,
    )
    if opts.export_records:
        export_records(res["records"], opts.export_records)
    if opts.verdict:
        print(res["verdict_md"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
