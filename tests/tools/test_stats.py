"""The aggregation's Welch t interval against scipy's, and the per-decile measures against the final ones: decile
10 is the final-score window, so D per decile at decile 10 is the verdict's D, bootstrap interval included."""

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from tools.stats import welch_contrast_interval

ROOT = Path(__file__).resolve().parents[1]


def test_welch_interval_matches_scipy_per_task_and_pooled():
    rng = np.random.default_rng(0)
    x, y = rng.normal(0.5, 0.2, (10, 2)), rng.normal(0.3, 0.1, (7, 2))  # runs x tasks
    lo, hi = welch_contrast_interval([x, y], np.array([1.0, -1.0]))
    for t in range(2):
        ci = stats.ttest_ind(x[:, t], y[:, t], equal_var=False).confidence_interval()
        assert np.allclose([lo[t], hi[t]], [ci.low, ci.high])
    # pooled = the mean over tasks: with the tasks' means as one sample per cell it is Welch's on (x1 + x2) / 2 only
    # when the runs pair up, so check it against the formula written out instead
    v = [a.var(axis=0, ddof=1) / len(a) for a in (x, y)]
    var = sum(vi.sum() for vi in v) / 4
    df = var**2 / sum(((vi / 4) ** 2 / (len(a) - 1)).sum() for vi, a in zip(v, (x, y)))
    est = (x.mean(axis=0) - y.mean(axis=0)).mean()
    half = stats.t.ppf(0.975, df) * np.sqrt(var)
    assert np.allclose([lo[2], hi[2]], [est - half, est + half])


def test_decile_10_is_the_final_window():
    folder = ROOT / "results" / "evidence_grid_500k"
    by_decile = pd.read_csv(folder / "deciles_d.csv", comment="#")
    final = pd.read_csv(folder / "degradation.csv", comment="#")
    final = final[(final.measure == "degradation_difference") & (final.algo == "vaco")].set_index("task")
    last = by_decile[by_decile.decile == 10].set_index("task")
    assert len(last) == 3
    for column in ("estimate", "ci_low", "ci_high", "t_low", "t_high"):
        assert np.allclose(last[column], final.loc[last.index, column], rtol=0, atol=1e-9), column
