"""What the aggregation's tables (tools/grid/aggregate.py) and its figures (tools/grid/aggregate_figures.py) both
read off the final-score table: the primary measure's lags, the TV tolerance, the post-hoc decile columns, the
aggregate metrics' names, the order of the algorithms, and the small functions that cut the table (runs x tasks
matrices, the steps common to a group of runs, an algorithm's δ).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tools.grid.run_records import VACO_DEFAULTS

LAG_LO, LAG_HI = 0, 8  # the primary measure's lags
TV_TOLERANCE = 0.25  # "near delta/2": within +-25% of delta/2 (pre-registered)
DECILE_COLUMNS = {  # post hoc, not pre-registered
    "episodic_return": "training episodic return (raw)",
    "final_tv": "final TV",
    "vaco_over_budget_frac": "fraction of minibatches over δ/2",
    "vaco_filter_frac": "fraction of samples masked",
}
AGG_METRICS = {"iqm": "IQM", "mean": "Mean", "median": "Median of task means", "optimality_gap": "Optimality gap"}
MAIN_ALGOS = ("ppo", "vaco", "spo", "impala")


def score_matrix(df: pd.DataFrame, column="normalized_score", warn=None, tasks=None):
    """(runs x tasks) matrix of `column` for one (algo, lag) slice, equal runs per task (lowest seeds kept)."""
    tasks = tasks or sorted(df["task"].unique())
    per_task = [df[df["task"] == t].sort_values("seed")[column].dropna().to_numpy(float) for t in tasks]
    n = min(len(x) for x in per_task)
    if warn and any(len(x) != n for x in per_task):
        warn(f"unequal runs per task ({dict(zip(tasks, map(len, per_task)))}); using the {n} lowest seeds per task")
    return np.stack([x[:n] for x in per_task], axis=1), tasks


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


def delta_of(final: pd.DataFrame, label: str) -> float:
    d = final[final["algo"] == label]
    if "tv_threshold" in d and d["tv_threshold"].notna().any():
        return float(d["tv_threshold"].dropna().iloc[0])
    return VACO_DEFAULTS["tv_threshold"] if label.startswith("vaco") else float("nan")


def is_ablation(label: str) -> bool:
    return label.startswith("vaco-")


def order_labels(labels):
    return sorted(labels, key=lambda s: (MAIN_ALGOS.index(s.split("[")[0]) if s.split("[")[0] in MAIN_ALGOS else 99, s))
