"""The statistics every table of tools/ reports: Student-t and Welch t intervals, the Welch interval of a contrast of
cell means, rliable's stratified bootstrap, the standard error, the pooled standard deviation and the runs a contrast
needs. Pure functions of their arguments (the
bootstrap seeds numpy's global generator, which rliable draws from); the grid's aggregation and the studies both
import them from here.
"""

from __future__ import annotations

import math

import numpy as np


def t_interval(values, confidence=0.95) -> tuple[float, float, int]:
    """(mean, half-width of the Student-t interval, n) of the finite values; half-width NaN for n < 2."""
    from scipy import stats

    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return (float(v[0]) if len(v) else float("nan")), float("nan"), len(v)
    return float(v.mean()), float(stats.t.ppf(0.5 + confidence / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))), len(v)


def welch_interval(a, b, confidence=0.95):
    """(mean(a) - mean(b), lower, upper): Welch's t interval of the difference of two samples' means."""
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    d = float(a.mean() - b.mean())
    if va + vb == 0:
        return d, d, d
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, dof) * np.sqrt(va + vb))
    return d, d - half, d + half


def bootstrap(score_dict, func, reps, seed):
    """rliable's stratified bootstrap (percentile intervals, 95%): {key: point}, {key: (2, ...) low/high}. An array
    value is resampled as one (runs x tasks [x points]) matrix, a list value as independent matrices. rliable draws
    from numpy's global generator: seeded here, so a fixed seed gives fixed intervals."""
    from rliable import library as rly

    np.random.seed(seed)
    return rly.get_interval_estimates(score_dict, func, reps=reps)


def welch_contrast_interval(mats, signs, confidence=0.95):
    """The Welch t interval of sum(sign x cell mean) per task and pooled (the mean over tasks): variance
    sum(s^2 / n) over the (cell, task) samples, degrees of freedom by Welch-Satterthwaite. Given beside the
    percentile bootstrap, which undercovers at 5-10 runs per cell, where a reading rests on one end of an interval."""
    from scipy import stats

    dof = np.array([x.shape[0] - 1 for x in mats], float)[:, None]
    v = np.stack([x.var(axis=0, ddof=1) / x.shape[0] for x in mats])  # (cells, tasks): s^2 / n
    est = sum(s * x.mean(axis=0) for s, x in zip(signs, mats))
    est = np.append(est, est.mean())
    pooled = v / v.shape[1] ** 2
    total = np.append(v.sum(axis=0), pooled.sum())
    with np.errstate(invalid="ignore", divide="ignore"):  # no spread in any cell: no interval (NaN)
        df = total**2 / np.append((v**2 / dof).sum(axis=0), (pooled**2 / dof).sum())
        half = stats.t.ppf(0.5 + confidence / 2, df) * np.sqrt(total)
    return est - half, est + half


def pooled_sd(samples) -> float:
    """The per-cell standard deviation pooled over the cells (each cell's variance weighted by its n - 1); `samples`
    maps a cell to its values, cells with fewer than two values are left out."""
    cells = [np.asarray(x, float) for x in samples.values() if len(x) > 1]
    return float(np.sqrt(sum((len(x) - 1) * x.var(ddof=1) for x in cells) / sum(len(x) - 1 for x in cells)))


def standard_error(y, axis=0):
    """The standard error of the mean along `axis` (sample standard deviation / sqrt(n)); zeros for n < 2."""
    n = y.shape[axis]
    return y.std(axis, ddof=1) / np.sqrt(n) if n > 1 else np.zeros(np.delete(y.shape, axis))


def runs_per_cell(sd: float, cells: int, half_width: float, effect: float) -> tuple[int, int]:
    """Runs per cell for a contrast of `cells` cell means with signs +-1 (a common per-cell sd; its variance is
    cells x sd^2 / n) to have a 95% interval of +-half_width, and for 80% power against `effect` (two-sided 5% test),
    by the normal approximation."""
    z_interval, z_power = 1.96, 1.96 + 0.8416
    return math.ceil((z_interval * math.sqrt(cells) * sd / half_width) ** 2), math.ceil(cells * sd**2 * z_power**2 / effect**2)
