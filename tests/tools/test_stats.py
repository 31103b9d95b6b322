"""tools/stats.py: the Student-t interval against tabled quantiles, the Welch interval of a contrast against scipy's,
the standard error, and the runs a contrast needs."""

import numpy as np
import pytest
from scipy import stats

from tools.stats import runs_per_cell, standard_error, t_interval, welch_contrast_interval


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


def test_t_interval():
    # Student-t half-widths: t(0.975, 2) = 4.3027, t(0.975, 9) = 2.2622 (tables), not 1.96
    v = np.array([1.0, 2.0, 6.0])
    m, h, n = t_interval(v)
    assert (m, n) == (3.0, 3) and h == pytest.approx(4.302653 * np.std(v, ddof=1) / np.sqrt(3), rel=1e-6)
    w = np.arange(10.0)
    assert t_interval(w)[1] == pytest.approx(2.262157 * np.std(w, ddof=1) / np.sqrt(10), rel=1e-6)
    assert np.isnan(t_interval([5.0])[1]) and t_interval([np.nan, 2.0])[2] == 1


def test_standard_error():
    y = np.array([[1.0, 2.0], [3.0, 2.0], [8.0, 2.0]])
    assert standard_error(y) == pytest.approx([np.std([1, 3, 8], ddof=1) / np.sqrt(3), 0.0])
    assert standard_error(y[:1]).tolist() == [0.0, 0.0]  # one run: no spread to show


def test_runs_per_cell():
    # D over four cells, sd 0.2: var(D) = 4 * 0.04 / n; a 95% half-width of 0.1 needs 1.96 * 0.4 / sqrt(n) <= 0.1
    n_interval, n_power = runs_per_cell(0.2, 4, 0.1, 0.1)
    assert n_interval == 62 and 1.96 * 0.4 / np.sqrt(n_interval) <= 0.1 < 1.96 * 0.4 / np.sqrt(n_interval - 1)
    assert n_power == 126 and 125 < 4 * 0.04 * (1.96 + 0.8416) ** 2 / 0.1**2 < 126
