#!/usr/bin/env python
"""Aggregate MuJoCo runs (TensorBoard logs + args.json) into tables and figures.

    python tools/aggregate.py runs/grid [more folders ...] --out results/

Finds every run folder (a folder holding `args.json`) under the given folders, reads its TensorBoard
scalars with TensorBoard's `EventAccumulator`, and writes into `--out`:

  runs.csv          tidy, one row per (run, logged step): algo, task, lag, lag_mode, seed, step,
                    episodic_return, final_tv, backward_tv, staleness_mean, sps, ... (every scalar tag,
                    `charts/`, `losses/`, `lag/`, `perf/` prefixes dropped, others joined with `_`)
  final.csv         one row per run: final_return, normalized_score, final_tv, backward_tv, auc, eval_return, ...
  per_task.csv      per (algo, task, lag): runs, mean / std / median of final_return and final_tv
  aggregate.csv     per (algo, lag): median, IQM, mean, optimality gap (and IQM of the normalised AUC) of
                    normalised scores, with 95% stratified-bootstrap CIs (rliable `get_interval_estimates`,
                    percentile method, `--reps` resamples; NumPy's global RNG seeded with `--seed` for every
                    cell, because rliable 1.2 resamples with it and ignores `random_state`)
  iqm_curves.csv    IQM of normalised return on a common step grid, with 95% CIs, per (algo, lag)
  *.png             aggregate_vs_lag, aggregate_intervals, iqm_curves, task_curves, final_tv and, when
                    VACO ablation labels are present, ablation_<family>.png

Definitions
-----------
* Algorithm label: a run's `exp_name`. When `exp_name` is a script's default (e.g. `vaco_mujoco`, as in the
  wandb sweeps) the label is the algorithm (`vaco`), and for VACO the non-default ablation settings are
  appended: `-norealign`, `-nofilter`, `-delta<X>` (tv_threshold != 0.2), `-rhobar<X>` (rho_bar != 1),
  the same labels `tools/run_grid.py` gives. A non-default `lag_mode` appends `[mode]`, e.g. `ppo[fixed]`.
* Final score of a run: the mean of `charts/episodic_return` over the points logged in the last 10% of
  training (step > 0.9 x the run's last logged step; the last point if none), as the scripts' summary.json.
  `final_tv`, `backward_tv`, ... in final.csv are means over the same window.
* Normalised score: `(score - random) / (reference - random)` with `random` and `reference` from the
  reference table (`--reference`, default results/reference_scores.csv; its header says how it is built:
  `random` = uniform-random-action return measured by `--measure-random`, `reference` = CleanRL PPO at
  8M steps). 0 = random policy, 1 = CleanRL's PPO after 8M steps; the optimality gap uses gamma = 1.
* Learning curves: each run's episodic returns are linearly interpolated onto `--curve-points` evenly
  spaced steps up to the shortest run's last step (a common grid); `auc` is the mean of a run's normalised
  curve on that grid (normalised area under the curve).
* rliable needs the same number of runs for every task of an algorithm: when seeds are missing for some
  task, the extra runs of the other tasks are dropped (lowest seeds kept) and a warning is printed.

Unfinished runs (no summary.json) are left out unless `--include-unfinished`. If two finished runs share
(algo, task, lag, seed), the newer one is kept.

    python tools/aggregate.py --measure-random [ENV ...] [--episodes 20] [--write]

measures the random-policy returns and (with --write) rewrites the reference table.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCE = REPO / "results" / "reference_scores.csv"
SCRIPT_STEMS = {"ppo_mujoco": "ppo", "vaco_mujoco": "vaco", "spo_mujoco": "spo", "impala_mujoco": "impala"}
VACO_DEFAULTS = {"tv_threshold": 0.2, "rho_bar": 1.0}
MAIN_COLORS = {"ppo": "tab:blue", "vaco": "tab:red", "spo": "tab:green", "impala": "tab:orange"}
METRICS = ("median", "iqm", "mean", "optimality_gap")
METRIC_TITLES = {"median": "Median", "iqm": "IQM", "mean": "Mean", "optimality_gap": "Optimality gap"}
FINAL_FRACTION = 0.1  # final score = mean over the last 10% of training

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


# ----------------------------------------------------------------------------------------------- loading


def short_name(tag: str) -> str:
    prefix, _, name = tag.partition("/")
    name = name.lower() if name else prefix.lower()
    return name if prefix in ("charts", "losses", "lag", "perf") else f"{prefix.lower()}_{name}"


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


def find_run_dirs(roots) -> list[Path]:
    dirs = set()
    for root in roots:
        root = Path(root)
        if (root / "args.json").exists():
            dirs.add(root)
        dirs.update(p.parent for p in root.rglob("args.json"))
    return sorted(dirs)


def read_scalars(run_dir: Path) -> dict[str, pd.Series]:
    """All scalar tags of the run's TensorBoard event files (in the run folder itself), as step-indexed series."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    if not any(run_dir.glob("events.out.tfevents*")):
        return out
    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    for tag in ea.Tags().get("scalars", []):
        events = ea.Scalars(tag)
        s = pd.Series([e.value for e in events], index=[e.step for e in events], dtype=float)
        out[tag] = s[~s.index.duplicated(keep="last")].sort_index()
    return out


def window_mean(s: pd.Series, last_step: float) -> float:
    s = s.dropna()
    if s.empty:
        return float("nan")
    w = s[s.index > (1 - FINAL_FRACTION) * last_step]
    return float(w.mean()) if len(w) else float(s.iloc[-1])


def load_run(run_dir: Path) -> tuple[dict, pd.DataFrame]:
    """(one final.csv row without normalisation, the run's tidy rows)."""
    args = json.loads((run_dir / "args.json").read_text())
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    scalars = read_scalars(run_dir)
    evals = scalars.pop("eval/episodic_return", None)
    series = {short_name(t): s for t, s in scalars.items() if not t.startswith("eval/")}
    wide = pd.DataFrame(series)
    wide.index.name = "step"
    last_step = float(wide.index.max()) if len(wide) else float("nan")
    row = {
        "algo": algo_label(args),
        "task": args.get("env_id"),
        "lag": int(args.get("lag", 0)),
        "lag_mode": args.get("lag_mode", "uniform"),
        "seed": int(args.get("seed", 0)),
        "finished": summary is not None,
        "run_dir": str(run_dir),
        "last_step": last_step,
        "n_returns": int(series["episodic_return"].notna().sum()) if "episodic_return" in series else 0,
        "final_return": window_mean(series["episodic_return"], last_step) if "episodic_return" in series else float("nan"),
    }
    for name in (
        "final_tv",
        "backward_tv",
        "staleness_mean",
        "vaco_filter_frac",
        "vaco_over_budget_frac",
        "vaco_tv",
        "clipfrac",
        "ratio_dev",
        "sps",
    ):
        if name in series:
            row[name] = window_mean(series[name], last_step)
    row["eval_return"] = float(evals.mean()) if evals is not None and len(evals) else float("nan")
    if summary:
        for key in ("final_return", "final_tv", "sps", "eval_return", "rollout_seconds", "update_seconds"):
            v = summary.get(key)
            row[f"summary_{key}"] = float(v) if v is not None else float("nan")
        row["_mtime"] = summary_path.stat().st_mtime
    for key in (
        "total_timesteps",
        "num_envs",
        "num_steps",
        "tv_threshold",
        "rho_bar",
        "c_bar",
        "realign",
        "filter",
        "clip_coef",
        "exp_name",
    ):
        if key in args:
            row[key] = args[key]
    tidy = wide.reset_index()
    for key in ("algo", "task", "lag", "lag_mode", "seed"):
        tidy.insert(0 if key == "algo" else tidy.columns.get_loc("step"), key, row[key])
    tidy.insert(0, "run_dir", str(run_dir))
    return row, tidy


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


def load_all(roots, include_unfinished=False, log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, tidies, skipped = [], [], []
    for d in find_run_dirs(roots):
        if not include_unfinished and not (d / "summary.json").exists():
            skipped.append(d)
            continue
        try:
            row, tidy = load_run(d)
        except Exception as e:  # a broken folder should not stop the aggregation
            log(f"warning: cannot read {d}: {type(e).__name__}: {e}")
            continue
        rows.append(row)
        tidies.append(tidy)
    if skipped:
        log(f"note: {len(skipped)} unfinished run(s) (no summary.json) left out, e.g. {skipped[0]}")
    if not rows:
        raise SystemExit(f"error: no {'runs' if include_unfinished else 'finished runs'} found under {list(map(str, roots))}")
    final = pd.DataFrame(rows)
    key = ["algo", "task", "lag", "seed"]
    if "_mtime" in final:
        final = final.sort_values("_mtime", na_position="first")
    dup = final.duplicated(key, keep="last")
    if dup.any():
        log(f"warning: {int(dup.sum())} duplicate run(s) of the same (algo, task, lag, seed); keeping the newest:")
        for d in final.loc[dup, "run_dir"]:
            log(f"  dropped {d}")
        final = final[~dup]
    final = final.drop(columns=["_mtime"], errors="ignore").sort_values(key).reset_index(drop=True)
    runs = pd.concat(tidies, ignore_index=True)
    runs = runs[runs["run_dir"].isin(final["run_dir"])]
    runs = runs.sort_values(["algo", "task", "lag", "seed", "step"]).reset_index(drop=True)
    return final, runs


# ----------------------------------------------------------------------------------------------- statistics


def score_matrix(df: pd.DataFrame, column: str, warn=None):
    """(runs x tasks) matrix of `column` for one (algo, lag) slice, equal runs per task (lowest seeds kept)."""
    tasks = sorted(df["task"].unique())
    per_task = [df[df["task"] == t].sort_values("seed")[column].to_numpy(float) for t in tasks]
    n = min(len(x) for x in per_task)
    if warn and any(len(x) != n for x in per_task):
        warn(f"unequal runs per task ({dict(zip(tasks, map(len, per_task)))}); using {n} per task")
    return np.stack([x[:n] for x in per_task], axis=1), tasks


def _interval(score_dict, func, reps, seed):
    from rliable import library as rly

    # rliable 1.2's StratifiedBootstrap draws its resamples from NumPy's *global* RNG (random_state only reaches
    # arch, which does not use it for them), so the global RNG is seeded here, per call, and restored after.
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # arch: "random_state is deprecated"
            point, ci = rly.get_interval_estimates(score_dict, func, reps=reps, random_state=np.random.RandomState(seed))
    finally:
        np.random.set_state(saved)
    return point, ci


def _iqm(x: np.ndarray, axis=None):
    """scipy.stats.trim_mean(x, 0.25, axis) (= rliable's aggregate_iqm for axis=None), with a plain sort."""
    a = np.sort(x, axis=None) if axis is None else np.sort(x, axis=axis)
    n = a.shape[0]
    k = int(0.25 * n)
    return a[k : n - k].mean(axis=0)


def aggregate_metrics(x: np.ndarray) -> np.ndarray:
    """[median, IQM, mean, optimality gap (gamma=1)] of a (runs x tasks) matrix, as rliable.metrics defines them
    (aggregate_median / _iqm / _mean / _optimality_gap), written with plain NumPy because scipy's trim_mean
    dominated the bootstrap's run time; tests/test_tooling.py checks they equal rliable's."""
    task_means = x.mean(axis=0)
    return np.array([np.median(task_means), _iqm(x), task_means.mean(), 1.0 - np.minimum(x, 1.0).mean()])


def iqm_only(x: np.ndarray) -> np.ndarray:
    return np.array([_iqm(x)])


def iqm_per_point(x: np.ndarray) -> np.ndarray:
    """IQM at every curve point of a (runs x tasks x points) array (rliable's aggregate_iqm per point)."""
    return _iqm(x.reshape(-1, x.shape[-1]), axis=0)


def aggregate_table(final: pd.DataFrame, reps: int, seed: int, log=print) -> pd.DataFrame:
    rows = []
    for (algo, lag), df in final.groupby(["algo", "lag"], sort=True):
        if not np.isfinite(df["normalized_score"]).all():
            log(
                f"warning: {algo} lag {lag}: runs without any episodic return left out: "
                f"{list(df.loc[~np.isfinite(df['normalized_score']), 'run_dir'])}"
            )
            df = df[np.isfinite(df["normalized_score"])]
        if df.empty:
            continue
        warn = lambda m: log(f"warning: {algo} lag {lag}: {m}")  # noqa: E731
        x, tasks = score_matrix(df, "normalized_score", warn)
        point, ci = _interval({algo: x}, aggregate_metrics, reps, seed)
        entries = list(zip(METRICS, point[algo], ci[algo][0], ci[algo][1]))
        if "auc" in df and np.isfinite(df["auc"]).all():
            a, _ = score_matrix(df, "auc")
            p2, c2 = _interval({algo: a}, iqm_only, reps, seed)
            entries.append(("auc_iqm", p2[algo][0], c2[algo][0][0], c2[algo][1][0]))
        for metric, p, lo, hi in entries:
            rows.append(
                {
                    "algo": algo,
                    "lag": lag,
                    "metric": metric,
                    "estimate": p,
                    "ci_low": lo,
                    "ci_high": hi,
                    "n_tasks": x.shape[1],
                    "runs_per_task": x.shape[0],
                    "tasks": " ".join(tasks),
                }
            )
    return pd.DataFrame(rows)


def curve_grid(final: pd.DataFrame, points: int, log=print) -> np.ndarray:
    horizon = float(final["last_step"].min())
    if final["last_step"].max() > 1.1 * horizon:
        log(f"note: runs have different lengths; learning curves are cut at the shortest ({horizon:,.0f} steps)")
    return np.linspace(horizon / points, horizon, points)


def run_curves(final: pd.DataFrame, runs: pd.DataFrame, grid: np.ndarray, ref) -> dict[str, np.ndarray]:
    """run_dir -> normalised return interpolated on `grid` (raw return if ref is None)."""
    out = {}
    for (run, task), df in runs.groupby(["run_dir", "task"]):
        d = df[["step", "episodic_return"]].dropna() if "episodic_return" in df else df.iloc[:0]
        if d.empty:
            continue
        raw = np.interp(grid, d["step"].to_numpy(float), d["episodic_return"].to_numpy(float))
        out[run] = normalise(raw, [task] * len(grid), ref)
    return out


def curve_table(final: pd.DataFrame, curves: dict, grid: np.ndarray, reps: int, seed: int) -> pd.DataFrame:
    rows = []
    final = final[final["run_dir"].isin(curves)]
    for (algo, lag), df in final.groupby(["algo", "lag"], sort=True):
        tasks = sorted(df["task"].unique())
        per_task = [[curves[r] for r in df[df["task"] == t].sort_values("seed")["run_dir"]] for t in tasks]
        n = min(len(c) for c in per_task)
        x = np.stack([np.stack(c[:n]) for c in per_task], axis=1)  # runs x tasks x points
        point, ci = _interval({algo: x}, iqm_per_point, reps, seed)
        for i, step in enumerate(grid):
            rows.append(
                {
                    "algo": algo,
                    "lag": lag,
                    "step": step,
                    "iqm": point[algo][i],
                    "ci_low": ci[algo][0][i],
                    "ci_high": ci[algo][1][i],
                }
            )
    return pd.DataFrame(rows)


def per_task_table(final: pd.DataFrame) -> pd.DataFrame:
    g = final.groupby(["algo", "task", "lag"])
    out = g["final_return"].agg(runs="count", return_mean="mean", return_std="std", return_median="median")
    if "final_tv" in final:
        out["final_tv_mean"] = g["final_tv"].mean()
    out["normalized_mean"] = g["normalized_score"].mean()
    return out.reset_index()


# ----------------------------------------------------------------------------------------------- plots


def is_ablation(label: str) -> bool:
    return label.startswith("vaco-")


def colors_for(labels) -> dict[str, str]:
    import matplotlib.pyplot as plt

    cycle = [c for c in plt.rcParams["axes.prop_cycle"].by_key()["color"] if c not in MAIN_COLORS.values()]
    cycle += ["#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#843c39"]
    out, i = {}, 0
    for label in labels:
        base = label.split("[")[0]
        if base in MAIN_COLORS and base == label:
            out[label] = MAIN_COLORS[base]
        else:
            out[label] = cycle[i % len(cycle)]
            i += 1
    return out


def _lag_axis(ax, lags):
    ax.set_xticks(range(len(lags)))
    ax.set_xticklabels([str(k) for k in lags])
    ax.set_xlabel("lag K (policy-buffer staleness)")


def plot_metric_vs_lag(agg: pd.DataFrame, labels, lags, colors, metrics, path, title, ylabel="normalised score"):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for j, label in enumerate(labels):
            d = agg[(agg["algo"] == label) & (agg["metric"] == metric)].set_index("lag").reindex(lags)
            x = np.arange(len(lags)) + (j - (len(labels) - 1) / 2) * 0.04
            ax.plot(x, d["estimate"], "o-", color=colors[label], label=label, lw=1.8, ms=4)
            ax.fill_between(x, d["ci_low"], d["ci_high"], color=colors[label], alpha=0.15, lw=0)
            ax.errorbar(
                x,
                d["estimate"],
                yerr=[d["estimate"] - d["ci_low"], d["ci_high"] - d["estimate"]],
                fmt="none",
                ecolor=colors[label],
                alpha=0.6,
                capsize=2,
            )
        _lag_axis(ax, lags)
        ax.set_title(METRIC_TITLES.get(metric, metric) + (" (lower is better)" if metric == "optimality_gap" else ""))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=8, loc="best")
    _suptitle(fig, title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_intervals(agg: pd.DataFrame, labels, lags, colors, path):
    """rliable-style interval plot: rows = lags, columns = the four metrics, one bar (95% CI) per algorithm."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(lags), 4, figsize=(14, 0.45 * len(labels) * len(lags) + 1.2 * len(lags) + 0.5), squeeze=False, sharex="col"
    )
    for r, lag in enumerate(lags):
        for c, metric in enumerate(METRICS):
            ax = axes[r][c]
            for i, label in enumerate(labels):
                d = agg[(agg["algo"] == label) & (agg["metric"] == metric) & (agg["lag"] == lag)]
                if d.empty:
                    continue
                d = d.iloc[0]
                ax.barh(i, d["ci_high"] - d["ci_low"], left=d["ci_low"], height=0.6, color=colors[label], alpha=0.75)
                ax.vlines(d["estimate"], i - 0.3, i + 0.3, color="k", lw=1.5)
            ax.set_yticks(range(len(labels)))
            ax.set_yticklabels(labels if c == 0 else [])
            ax.grid(axis="x", alpha=0.3)
            if r == 0:
                ax.set_title(METRIC_TITLES[metric])
            if c == 0:
                ax.set_ylabel(f"lag {lag}")
    for ax in axes[-1]:
        ax.set_xlabel("normalised score")
    _suptitle(fig, "Aggregate metrics with 95% stratified-bootstrap CIs (bar = CI, tick = point estimate)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_iqm_curves(curves: pd.DataFrame, labels, lags, colors, path, title):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(lags), figsize=(3.8 * len(lags), 3.4), squeeze=False, sharey=True)
    for ax, lag in zip(axes[0], lags):
        for label in labels:
            d = curves[(curves["algo"] == label) & (curves["lag"] == lag)]
            if d.empty:
                continue
            ax.plot(d["step"], d["iqm"], color=colors[label], label=label, lw=1.6)
            ax.fill_between(d["step"], d["ci_low"], d["ci_high"], color=colors[label], alpha=0.15, lw=0)
        ax.set_title(f"lag {lag}")
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("IQM normalised return")
    axes[0][-1].legend(fontsize=8)
    _suptitle(fig, title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_task_curves(final, runs, labels, lags, colors, grid, path):
    """Raw episodic return per task (rows) and lag (columns): mean over seeds +- one standard error."""
    import matplotlib.pyplot as plt

    tasks = sorted(final["task"].unique())
    fig, axes = plt.subplots(len(tasks), len(lags), figsize=(3.6 * len(lags), 2.8 * len(tasks)), squeeze=False, sharey="row")
    curves = run_curves(final, runs, grid, None)
    for r, task in enumerate(tasks):
        for c, lag in enumerate(lags):
            ax = axes[r][c]
            for label in labels:
                names = final[(final["algo"] == label) & (final["task"] == task) & (final["lag"] == lag)]["run_dir"]
                ys = [curves[n] for n in names if n in curves]
                if not ys:
                    continue
                y = np.stack(ys)
                m = y.mean(0)
                se = y.std(0, ddof=1) / np.sqrt(len(y)) if len(y) > 1 else np.zeros_like(m)
                ax.plot(grid, m, color=colors[label], label=f"{label} (n={len(y)})", lw=1.4)
                ax.fill_between(grid, m - se, m + se, color=colors[label], alpha=0.15, lw=0)
            if r == 0:
                ax.set_title(f"lag {lag}")
            if c == 0:
                ax.set_ylabel(f"{task}\nepisodic return")
            if r == len(tasks) - 1:
                ax.set_xlabel("environment steps")
            ax.grid(alpha=0.3)
            if r == 0 and c == len(lags) - 1:
                ax.legend(fontsize=7)
    _suptitle(fig, "Training episodic return per task: mean over seeds ± 1 standard error")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mean_ci(v):
    v = np.asarray(v, float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return np.nan, np.nan
    half = 1.96 * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
    return v.mean(), half


def delta_of(final: pd.DataFrame, label: str) -> float:
    d = final[final["algo"] == label]
    if "tv_threshold" in d and d["tv_threshold"].notna().any():
        return float(d["tv_threshold"].dropna().iloc[0])
    return VACO_DEFAULTS["tv_threshold"] if label.startswith("vaco") else float("nan")


def _suptitle(fig, text):
    """A figure title wrapped to the figure's width (narrow figures would clip it)."""
    fig.suptitle(textwrap.fill(text, width=max(30, int(13 * fig.get_figwidth()))), fontsize=10)


def plot_tv(final: pd.DataFrame, labels, lags, colors, path, title):
    """Final TV (after the update) and backward TV (before it) vs lag: mean over runs ± 95% normal CI."""
    import matplotlib.pyplot as plt

    rows = [c for c in ("final_tv", "backward_tv") if c in final and final[c].notna().any()]
    if not rows:
        return False
    tasks = sorted(final["task"].unique())
    panels = ["all tasks"] + (tasks if len(tasks) > 1 else [])
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(3.8 * len(panels), 3.2 * len(rows)), squeeze=False)
    deltas = {lab: delta_of(final, lab) for lab in labels if lab.startswith("vaco")}
    for r, col in enumerate(rows):
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            sub = final if panel == "all tasks" else final[final["task"] == panel]
            for j, label in enumerate(labels):
                stats = [_mean_ci(sub[(sub["algo"] == label) & (sub["lag"] == k)][col]) for k in lags]
                m, h = np.array(stats).T
                x = np.arange(len(lags)) + (j - (len(labels) - 1) / 2) * 0.05
                ax.errorbar(x, m, yerr=h, fmt="o-", color=colors[label], label=label, capsize=2, ms=4, lw=1.5)
            if col == "final_tv":
                for d in sorted(set(v for v in deltas.values() if np.isfinite(v))):
                    ax.axhline(d / 2, ls="--", color="k", lw=0.9, alpha=0.7)
                    ax.text(len(lags) - 1, d / 2, f" δ/2={d / 2:g}", va="bottom", ha="right", fontsize=7)
            _lag_axis(ax, lags)
            ax.set_title(f"{'final' if col == 'final_tv' else 'backward'} TV — {panel}", fontsize=9)
            ax.grid(alpha=0.3)
        axes[r][0].set_ylabel("½ mean|π/β − 1|" + (" after update" if col == "final_tv" else " before update"))
    axes[0][-1].legend(fontsize=7)
    _suptitle(fig, title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def ablation_families(labels) -> dict[str, list[str]]:
    fam: dict[str, list[str]] = {"components": [], "delta": [], "rhobar": [], "other": []}
    for lab in labels:
        if not is_ablation(lab) or "[" in lab:
            continue
        parts = lab[len("vaco-") :].split("-")
        if all(p in ("nofilter", "norealign") for p in parts):
            fam["components"].append(lab)
        elif len(parts) == 1 and parts[0].startswith("delta"):
            fam["delta"].append(lab)
        elif len(parts) == 1 and parts[0].startswith("rhobar"):
            fam["rhobar"].append(lab)
        else:
            fam["other"].append(lab)
    return {k: v for k, v in fam.items() if v}


def _num_key(label):
    m = re.search(r"(delta|rhobar)([0-9.eE-]+)$", label)
    return float(m.group(2)) if m else 0.0


def plot_ablation(final, agg, family, variants, lags, path):
    import matplotlib.pyplot as plt

    present = set(final["algo"])
    labels = ["vaco"] if "vaco" in present else []
    if family in ("delta", "rhobar"):
        default = VACO_DEFAULTS["tv_threshold" if family == "delta" else "rho_bar"]
        variants = sorted(variants, key=_num_key)
        names = {v: f"{v} ({'δ' if family == 'delta' else 'ρ̄'}={_num_key(v):g})" for v in variants}
        names["vaco"] = f"vaco ({'δ' if family == 'delta' else 'ρ̄'}={default:g})"
        labels = sorted(labels + variants, key=lambda v: default if v == "vaco" else _num_key(v))
    else:
        labels = labels + sorted(variants)
        names = {v: v for v in labels}
    refs = [r for r in ("ppo",) if r in present]
    cmap = plt.get_cmap("viridis")
    colors = {lab: cmap(i / max(1, len(labels) - 1) * 0.9) for i, lab in enumerate(labels)}
    colors.update({"ppo": MAIN_COLORS["ppo"]})
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for j, lab in enumerate(labels + refs):
        style = "--" if lab in refs else "-"
        x = np.arange(len(lags)) + (j - len(labels) / 2) * 0.04
        d = agg[(agg["algo"] == lab) & (agg["metric"] == "iqm")].set_index("lag").reindex(lags)
        axes[0].plot(x, d["estimate"], "o" + style, color=colors[lab], label=names.get(lab, lab), ms=4)
        axes[0].fill_between(x, d["ci_low"], d["ci_high"], color=colors[lab], alpha=0.12, lw=0)
        axes[0].errorbar(
            x,
            d["estimate"],
            yerr=[d["estimate"] - d["ci_low"], d["ci_high"] - d["estimate"]],
            fmt="none",
            ecolor=colors[lab],
            alpha=0.6,
            capsize=2,
        )
        if "final_tv" in final:
            stats = [_mean_ci(final[(final["algo"] == lab) & (final["lag"] == k)]["final_tv"]) for k in lags]
            m, h = np.array(stats).T
            axes[1].errorbar(x, m, yerr=h, fmt="o" + style, color=colors[lab], capsize=2, ms=4)
            if lab.startswith("vaco"):
                axes[1].axhline(delta_of(final, lab) / 2, color=colors[lab], ls=":", lw=1)
    axes[0].set_title("IQM normalised final score (95% CI)")
    axes[0].set_ylabel("normalised score")
    axes[1].set_title("final TV (mean ± 95% CI; dotted: δ/2)")
    for ax in axes:
        _lag_axis(ax, lags)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    _suptitle(fig, f"VACO ablation: {family}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------- driver


def aggregate(
    roots,
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
) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    final, runs = load_all(roots, include_unfinished, log)

    ref = None
    if normalization == "reference":
        ref = load_reference(reference)
        missing = sorted(set(final["task"]) - set(ref.index))
        if missing:
            raise SystemExit(
                f"error: no reference scores for {missing} in {reference}; add them with "
                f"`tools/aggregate.py --measure-random {' '.join(missing)} --write` or use "
                "--normalization none"
            )
    else:
        log("note: --normalization none: aggregate metrics are over raw returns (only meaningful for one task)")
    final["normalized_score"] = normalise(final["final_return"], final["task"], ref)

    grid = curve_grid(final, curve_points, log)
    curves = run_curves(final, runs, grid, ref)
    final["auc"] = [float(np.mean(curves[d])) if d in curves else np.nan for d in final["run_dir"]]

    agg = aggregate_table(final, reps, seed, log)
    curve_df = curve_table(final, curves, grid, curve_reps, seed)
    per_task = per_task_table(final)
    front = [
        "algo",
        "task",
        "lag",
        "lag_mode",
        "seed",
        "final_return",
        "normalized_score",
        "final_tv",
        "backward_tv",
        "auc",
        "eval_return",
        "last_step",
        "n_returns",
        "finished",
    ]
    final = final[[c for c in front if c in final] + [c for c in final if c not in front]]
    final.to_csv(out / "final.csv", index=False)
    runs.to_csv(out / "runs.csv", index=False)
    agg.to_csv(out / "aggregate.csv", index=False)
    curve_df.to_csv(out / "iqm_curves.csv", index=False)
    per_task.to_csv(out / "per_task.csv", index=False)
    written = ["final.csv", "runs.csv", "aggregate.csv", "iqm_curves.csv", "per_task.csv"]

    if plots:
        labels = sorted(final["algo"].unique(), key=lambda s: (s.split("[")[0] not in MAIN_COLORS, s))
        main = [lab for lab in labels if not is_ablation(lab)] or labels
        lags = sorted(final["lag"].unique())
        colors = colors_for(labels)
        yl = "normalised score" if ref is not None else "return"
        plot_metric_vs_lag(
            agg,
            main,
            lags,
            colors,
            METRICS,
            out / "aggregate_vs_lag.png",
            f"Normalised final score vs lag ({len(set(final['task']))} tasks; 95% stratified-bootstrap" f" CIs, {reps} reps)",
            yl,
        )
        plot_intervals(agg, main, lags, colors, out / "aggregate_intervals.png")
        plot_iqm_curves(
            curve_df,
            main,
            lags,
            colors,
            out / "iqm_curves.png",
            "IQM normalised training return (95% stratified-bootstrap CIs)",
        )
        plot_task_curves(final, runs, main, lags, colors, grid, out / "task_curves.png")
        written += ["aggregate_vs_lag.png", "aggregate_intervals.png", "iqm_curves.png", "task_curves.png"]
        if plot_tv(
            final, main, lags, colors, out / "final_tv.png", "Divergence from the behaviour policy (dashed: VACO's δ/2)"
        ):
            written.append("final_tv.png")
        for family, variants in ablation_families(labels).items():
            plot_ablation(final, agg, family, variants, lags, out / f"ablation_{family}.png")
            written.append(f"ablation_{family}.png")
    log(f"{len(final)} runs ({', '.join(f'{a}: {n}' for a, n in final['algo'].value_counts().sort_index().items())})")
    log(f"wrote {', '.join(written)} to {out}/")
    return {"final": final, "runs": runs, "aggregate": agg, "curves": curve_df, "written": written}


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
        epilog="See the module docstring for definitions.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("roots", nargs="*", help="folders containing run folders (searched recursively for args.json)")
    p.add_argument("--out", default="results", help="output folder for CSVs and PNGs")
    p.add_argument("--reference", default=str(DEFAULT_REFERENCE), help="reference table (CSV)")
    p.add_argument("--normalization", choices=["reference", "none"], default="reference")
    p.add_argument("--reps", type=int, default=5000, help="bootstrap resamples for aggregate metrics")
    p.add_argument("--curve-reps", type=int, default=500, help="bootstrap resamples for the IQM curves")
    p.add_argument("--curve-points", type=int, default=50, help="points on the common learning-curve grid")
    p.add_argument("--seed", type=int, default=0, help="bootstrap random state")
    p.add_argument("--include-unfinished", action="store_true", help="also use runs without summary.json")
    p.add_argument("--no-plots", action="store_true")
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
    if opts.measure_random is not None:
        measured = measure_random(opts.measure_random or REFERENCE_ENVS, opts.episodes, opts.seed)
        if opts.write:
            write_reference(measured, opts.reference)
            print(f"updated {opts.reference}")
        else:
            print(measured.to_csv(index=False))
        return 0
    if not opts.roots:
        p.error("give at least one folder of runs (or --measure-random)")
    aggregate(
        opts.roots,
        opts.out,
        opts.reference,
        opts.normalization,
        opts.reps,
        opts.curve_reps,
        opts.curve_points,
        opts.seed,
        opts.include_unfinished,
        not opts.no_plots,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
