"""The figures of tools/grid/aggregate.py: rliable's IQM curves, performance profiles and probability of improvement,
and ours for what rliable does not draw (score against lag, interval estimates, the difference in degradation,
per-task curves, final TV against lag, the post-hoc deciles).

Every figure is laid out for the documentation's text column (WIDTH inches, about 750 px at a 1280-px window, so
that 9-point text is about 12 px on screen), saved as a PNG at 200 dpi (sharp when scaled) and as an SVG beside it
(the full-size view a page links to). Titles are short; the definitions are in the pages' captions and the CSVs'
headers. Algorithms carry their display names (`display_name`) and one colour each (COLORS); legends go
below the panels, never over the points."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
from rliable import library as rly

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
from tools.stats import standard_error

COLORS = {  # one colour per algorithm in every figure (matplotlib's tab10), its variants in shades of it
    "ppo": "#1f77b4",
    "ppo-clip0.3": "#6baed6",
    "vaco": "#d62728",
    "vaco-delta0.1": "#fc9272",
    "vaco-delta0.4": "#67000d",
    "spo": "#2ca02c",
    "impala": "#ff7f0e",
    "impala-1pass": "#a63603",
    "vaco-norealign": "#9467bd",
    "vaco-nofilter": "#8c564b",
    "vaco-norealign-nofilter": "#e377c2",
}
EXTRA_COLORS = ["#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#843c39", "#7b4173", "#3182bd"]
WIDTH = 7.5  # inches: the site's text column at a 1280-px window
DPI = 200
STYLE = {
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "legend.fontsize": 8.5,
    "figure.titlesize": 11,
    "svg.hashsalt": "vaco",  # fixed element ids: the same figure gives the same SVG
    "svg.fonttype": "none",  # text stays text in the SVG (smaller, selectable)
}
DISPLAY = {
    "ppo": "PPO",
    "vaco": "VACO",
    "spo": "SPO",
    "impala": "IMPALA",
    "impala-1pass": "IMPALA, one pass",
    "impala-epochs1": "IMPALA, 1 epoch",
    "ppo-clip": "PPO-clip",
    "vaco-norealign": "VACO without realignment",
    "vaco-nofilter": "VACO without filter",
    "vaco-norealign-nofilter": "VACO without either",
}
NOT_LEARNED_CAPTION = "† hatched: did not learn (IQM at lag 0 indistinguishable from 0): nothing to lose"


def display_name(label: str) -> str:
    """The name a reader knows: 'PPO', 'IMPALA, one pass', 'PPO ε = 0.3', 'VACO δ = 0.1' (a lag mode kept)."""
    base, mode = (label.split("[", 1) + [""])[:2]
    mode = f" ({mode.rstrip(']')})" if mode else ""
    if base in DISPLAY:
        return DISPLAY[base] + mode
    m = re.fullmatch(r"ppo-clip([\d.]+)", base) or re.fullmatch(r"vaco-delta([\d.]+)", base)
    if m:
        return ("PPO ε = " if base.startswith("ppo") else "VACO δ = ") + m.group(1) + mode
    return label


def display_text(text: str) -> str:
    """`text` with every algorithm label in it replaced by its display name ('D(vaco, ppo-clip0.3)')."""
    return re.sub(r"[a-z][a-z0-9.\-]*(?:\[\w+\])?", lambda m: display_name(m.group(0)), text)


def colors_for(labels) -> dict[str, str]:
    """A fixed colour per known label (its lag mode ignored); others get the extra colours in sorted order."""
    out, extra = {}, iter(EXTRA_COLORS * (1 + len(labels) // len(EXTRA_COLORS)))
    for label in sorted(labels):
        out[label] = COLORS.get(label.split("[")[0]) or next(extra)
    return out


_FIGURE_LABEL = {"text": ""}  # set by make_figures from its Aggregation's label: prefixed to every figure title


def _figure(nrows, ncols, row_height, **kw):
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    return plt.subplots(nrows, ncols, figsize=(WIDTH, row_height * nrows), squeeze=False, layout="constrained", **kw)


def _legend_below(fig, axes, ncol=None, handles=None):
    """One legend for the figure, below the panels (never over a point): the first label of each name wins."""
    if handles is None:
        handles = {}
        for ax in np.ravel(axes):
            for h, name in zip(*ax.get_legend_handles_labels()):
                if not name.startswith("_"):
                    handles.setdefault(name, h)
    if handles:
        n = len(handles)
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=ncol or min(n, 3), frameon=False)


def save(fig, path, title):
    """Short title (after the aggregation's label), then the PNG and an SVG beside it; closes the figure."""
    import matplotlib.pyplot as plt

    fig.suptitle(f"{_FIGURE_LABEL['text']}: {title}" if _FIGURE_LABEL["text"] else title)
    fig.savefig(path, dpi=DPI)
    fig.savefig(path.with_suffix(".svg"), metadata={"Date": None})
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
    name = display_name(label)
    ran = f"{'lags' if len(pos) > 1 else 'lag'} {', '.join(map(str, run_lags))}"
    x, name = pos + offset * 0.06, name if len(pos) == len(lags) else f"{name} ({ran})"
    ax.errorbar(x, est, yerr=yerr, fmt="o", color=color, label=name, capsize=2, ms=4)
    for i in np.flatnonzero(np.diff(pos) == 1):
        ax.plot(x[i : i + 2], est[i : i + 2], "-", color=color, lw=1.5)


def meaningful_metrics(final, n_tasks):
    """IQM and mean always; the median of task means only with 3+ tasks (with 2 it equals the mean); the
    optimality gap only when some run reaches the reference (otherwise it is 1 - mean)."""
    return ["iqm", "mean"] + ["median"] * (n_tasks >= 3) + ["optimality_gap"] * bool((final["normalized_score"] >= 1).any())


def plot_score_vs_lag(path, title, agg, labels, lags, colors, metrics_shown, ylabel):
    ncols = min(2, len(metrics_shown))
    nrows = -(-len(metrics_shown) // ncols)
    fig, axes = _figure(nrows, ncols, 2.9)
    for ax, metric in zip(axes.flat, metrics_shown):
        for j, label in enumerate(labels):
            d = agg[(agg.algo == label) & (agg.metric == metric)].set_index("lag").sort_index()
            est, lo, hi = (d[c].to_numpy(float) for c in ("estimate", "ci_low", "ci_high"))
            _lag_points(ax, d.index, lags, j - (len(labels) - 1) / 2, est, [est - lo, hi - est], colors[label], label)
        ax.axhline(0, color="k", lw=0.8, ls=":", label="random policy")
        _lag_axis(ax, lags)
        ax.set_title(AGG_METRICS[metric] + " (lower is better)" * (metric == "optimality_gap"))
        ax.set_ylabel(ylabel)
    for ax in axes.flat[len(metrics_shown) :]:
        ax.remove()
    _legend_below(fig, axes)
    save(fig, path, title)


def plot_forest(path, title, table, colors, xlabel, marked=()):
    """One row per (algorithm or measure, task or pooled): point and 95% bootstrap interval; a line at 0. A row with
    a Welch t interval (columns t_low, t_high) draws it too, thinner, just below: the pages read such a measure
    only when both intervals exclude 0 (tools/readings.py). The `marked` algorithms (did not learn) keep their
    colour, dashed on a hatched band, with a † and the reason below."""
    if not len(table):
        return False
    rows = list(table.itertuples())
    fig, axes = _figure(1, 1, 0.3 * len(rows) + 1.3 + 0.25 * bool(marked))
    ax = axes[0][0]
    welch = False
    for i, r in enumerate(rows):
        y, c = len(rows) - 1 - i, colors.get(r.algo, "k")
        if r.algo in marked:
            ax.axhspan(y - 0.45, y + 0.45, facecolor="none", edgecolor="#bbbbbb", hatch="///", lw=0)
        xerr = [[r.estimate - r.ci_low], [r.ci_high - r.estimate]]
        ax.errorbar(r.estimate, y, xerr=xerr, fmt="o", color=c, capsize=3, ms=5,
                    mfc=c if r.task == "pooled" else "white", ls="--" if r.algo in marked else "-")  # fmt: skip
        t_low, t_high = getattr(r, "t_low", np.nan), getattr(r, "t_high", np.nan)
        if np.isfinite(t_low) and np.isfinite(t_high):
            welch = True
            ax.plot([t_low, t_high], [y - 0.25, y - 0.25], color=c, lw=0.9, ls=":", marker="|", ms=5)
    names = [f"{display_text(r.algo)}{' †' * (r.algo in marked)}, {r.task}" for r in reversed(rows)]
    ax.set_yticks(range(len(rows)), names)
    ax.axvline(0, color="k", lw=0.9, ls="--")
    note = "\nsolid: 95% bootstrap; dotted: 95% Welch t" if welch else ""
    ax.set_xlabel(xlabel + note + ("\n" + NOT_LEARNED_CAPTION if any(r.algo in marked for r in rows) else ""))
    ax.grid(axis="x", alpha=0.3)
    save(fig, path, title)


def plot_intervals(path, title, agg, labels, lags, colors, metrics_shown):
    """Interval estimates (as rliable's plot): one row per (algorithm, lag), one panel per metric, one x-range."""
    keys = [(a, k) for a in labels for k in lags if ((agg.algo == a) & (agg.lag == k)).any()]
    fig, axes = _figure(1, len(metrics_shown), 0.24 * len(keys) + 1.0, sharey=True)
    for ax, metric in zip(axes[0], metrics_shown):
        for i, (a, k) in enumerate(keys):
            r = agg[(agg.algo == a) & (agg.lag == k) & (agg.metric == metric)].iloc[0]
            y = len(keys) - 1 - i
            ax.plot([r.ci_low, r.ci_high], [y, y], color=colors[a], lw=5, alpha=0.75, solid_capstyle="butt")
            ax.plot([r.estimate], [y], "|", color="k", ms=9, mew=1.5)
        ax.set_title(AGG_METRICS[metric])
        ax.set_xlabel("normalised score")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(keys)), [f"{display_name(a)}, lag {k}" for a, k in reversed(keys)])
    lo = min(ax.get_xlim()[0] for ax in axes[0])
    hi = max(ax.get_xlim()[1] for ax in axes[0])
    for ax in axes[0]:
        ax.set_xlim(lo, hi)
    save(fig, path, title)


def plot_iqm_curves(path, title, curves, labels, lags, colors):
    """rliable's sample-efficiency curves: the IQM at logged steps with its interval band, one panel per lag."""
    from rliable import plot_utils

    if not len(curves):
        return False
    fig, axes = _figure(1, len(lags), 2.7, sharey=True)
    for ax, lag in zip(axes[0], lags):
        for label in labels:
            d = curves[(curves.algo == label) & (curves.lag == lag)]
            if len(d):
                name = display_name(label)
                plot_utils.plot_sample_efficiency_curve(
                    d.step.to_numpy(),
                    {name: d.iqm.to_numpy()},
                    {name: d[["ci_low", "ci_high"]].to_numpy().T},
                    [name],
                    colors={name: colors[label]},
                    ax=ax,
                    xlabel="",
                    ylabel="",
                    labelsize="medium",
                    ticklabelsize="small",
                    marker="",
                    linewidth=1.4,
                )
        ax.axhline(0, color="k", lw=0.8, ls=":")
        ax.set_title(f"lag {lag}")
        _step_axis(ax)
    axes[0][0].set_ylabel("IQM normalised return")
    _legend_below(fig, axes)
    save(fig, path, title)


def plot_profiles(path, title, final, labels, lags, colors, reps, seed):
    """rliable's performance profiles (fraction of runs with normalised final score > τ), one panel per lag."""
    from rliable import plot_utils

    taus = np.linspace(min(0.0, final.normalized_score.min()), max(1.0, final.normalized_score.max()), 81)
    fig, axes = _figure(1, len(lags), 2.7, sharey=True)
    for ax, lag in zip(axes[0], lags):
        d = final[final.lag == lag]
        scores = {display_name(a): score_matrix(d[d.algo == a])[0] for a in labels if (d.algo == a).any()}
        np.random.seed(seed)  # rliable's bootstrap draws from numpy's global generator
        profiles, cis = rly.create_performance_profile(scores, taus, reps=reps)
        plot_utils.plot_performance_profiles(
            profiles,
            taus,
            cis,
            ax=ax,
            colors={display_name(a): colors[a] for a in labels},
            xlabel="normalised score τ",
            ylabel="",
            labelsize="medium",
            ticklabelsize="small",
        )
        ax.set_title(f"lag {lag}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of runs > τ")
    _legend_below(fig, axes)
    save(fig, path, title)


def plot_improvement(path, title, poi, colors):
    """rliable's probability-of-improvement plot: P(X > PPO) per algorithm and lag, with its interval."""
    from rliable import plot_utils

    if not len(poi):
        return False
    fig, axes = _figure(1, 1, 0.3 * len(poi) + 1.2)
    keys = [f"{display_text(r.x)}|{display_text(r.y)}" for r in poi.itertuples()]  # display names hold commas
    plot_utils.plot_probability_of_improvement(
        dict(zip(keys, poi.estimate)),
        dict(zip(keys, poi[["ci_low", "ci_high"]].to_numpy())),
        ax=axes[0][0],
        colors=[colors[r.x.split(" lag ")[0]] for r in poi.itertuples()],
        pair_separator="|",
        labelsize="medium",
        ticklabelsize="small",
    )
    save(fig, path, title)


def plot_task_curves(path, title, final, runs, labels, lags, colors, max_points, ref_lines):
    """Training return per task (rows) and lag (columns): mean over seeds ± one standard error, at logged steps."""
    tasks = sorted(final["task"].unique())
    fig, axes = _figure(len(tasks), len(lags), 2.3, sharey="row", sharex=True)
    n = final.groupby(["algo", "task", "lag"]).size()
    for (r, task), (c, lag) in ((rt, cl) for rt in enumerate(tasks) for cl in enumerate(lags)):
        ax = axes[r][c]
        for label in labels:
            group = [g for _, g in runs[(runs.algo == label) & (runs.task == task) & (runs.lag == lag)].groupby("seed")]
            steps = curve_steps(group, max_points) if group else []
            if len(steps):
                y = np.stack([g.set_index("step")["episodic_return"].reindex(steps).to_numpy(float) for g in group])
                m, se = y.mean(0), standard_error(y)
                runs_per_cell = "–".join(map(str, sorted({n[label].min(), n[label].max()})))
                ax.plot(steps, m, "-", color=colors[label], label=f"{display_name(label)}, {runs_per_cell} runs", lw=1.4)
                ax.fill_between(steps, m - se, m + se, color=colors[label], alpha=0.15, lw=0)
        if task in ref_lines:
            ax.axhline(ref_lines[task], color="k", lw=0.8, ls=":", label="random policy")
        ax.set_title(f"{task}, lag {lag}", fontsize=8.5)
        ax.set_ylabel("return" if c == 0 else "")
        _step_axis(ax)
        if r < len(tasks) - 1:
            ax.set_xlabel("")
    _legend_below(fig, axes)
    save(fig, path, title)


def _band(ax, delta):
    ax.axhline(delta / 2, ls="--", color="k", lw=0.9, label=f"δ/2 = {delta / 2:g}, ±{TV_TOLERANCE:.0%} shaded")
    ax.axhspan(delta / 2 * (1 - TV_TOLERANCE), delta / 2 * (1 + TV_TOLERANCE), color="k", alpha=0.08, lw=0)


def plot_tv(path, title, per_task, labels, lags, colors, delta):
    """Final TV vs lag per task, mean ± 95% t-interval, with δ/2 and the ±25% band. The runs without a trust region
    (IMPALA with 10 epochs, VACO without its filter) get their own row and scale, so that they do not squash the
    others; a panel with nothing to draw is left out."""
    if "final_tv_mean" not in per_task or per_task["final_tv_mean"].isna().all():
        return False
    unbounded = [lab for lab in labels if lab.split("[")[0] == "impala" or "nofilter" in lab]
    groups = [g for g in ([lab for lab in labels if lab not in unbounded], unbounded) if g]
    panels = [
        (group, task)
        for group in groups
        for task in sorted(per_task["task"].unique())
        if per_task[per_task.algo.isin(group) & (per_task.task == task)].final_tv_mean.notna().any()
    ]
    ncols = min(3, per_task["task"].nunique())
    fig, axes = _figure(-(-len(panels) // ncols), ncols, 2.6)
    for ax, (group, task) in zip(axes.flat, panels):
        for j, label in enumerate(group):
            d = per_task[(per_task.algo == label) & (per_task.task == task)].set_index("lag").sort_index()
            if not len(d):
                continue
            est, err = d.final_tv_mean.to_numpy(float), d.final_tv_ci95.fillna(0).to_numpy(float)
            _lag_points(ax, d.index, lags, j - (len(group) - 1) / 2, est, err, colors[label], label)
        if group is not unbounded and any(lab.startswith("vaco") for lab in group) and np.isfinite(delta):
            _band(ax, delta)
        ax.set_ylim(bottom=0)
        _lag_axis(ax, lags)
        ax.set_title(task + (", no trust region" if group is unbounded else ""))
        ax.set_ylabel("final TV")
    for ax in axes.flat[len(panels) :]:
        ax.remove()
    _legend_below(fig, axes)
    save(fig, path, title)


def plot_deciles(path, title, dec, colors, delta, algo="vaco"):
    """Post hoc: `algo`'s TV and filter statistics against the training decile, one line per (task, lag), mean ±
    95% t-interval over runs (darker and another marker: larger lag; line style: task); the TV panel shows δ/2 and
    the ±25% band."""
    from matplotlib.colors import to_rgb

    d = dec[(dec.algo == algo) & dec.decile.str.isdigit()] if len(dec) else dec
    cols = [c for c in DECILE_COLUMNS if c != "episodic_return" and f"{c}_mean" in d and d[f"{c}_mean"].notna().any()]
    if not len(d) or not cols:
        return False
    fig, axes = _figure(1, len(cols), 2.8)
    lags, tasks = sorted(d.lag.unique()), sorted(d.task.unique())
    for ax, col in zip(axes[0], cols):
        for (task, lag), g in d.groupby(["task", "lag"], sort=True):
            shade = 0.35 + 0.65 * (lags.index(lag) + 1) / len(lags)
            color = tuple(1 - shade * (1 - v) for v in to_rgb(colors.get(algo, "k")))
            ax.errorbar(
                g.decile.astype(int),
                g[f"{col}_mean"],
                yerr=g[f"{col}_ci95"].fillna(0),
                fmt=["o", "s", "^", "D"][lags.index(lag) % 4] + ["-", "--", ":", "-."][tasks.index(task) % 4],
                color=color,
                ms=3,
                capsize=2,
                label=f"{task}, lag {lag}",
            )
        if col == "final_tv" and np.isfinite(delta):
            _band(ax, delta)
        ax.set_xticks([1, 4, 7, 10])
        ax.set_xlabel("training decile")
        ax.set_title({"final_tv": "final TV", "vaco_over_budget_frac": "minibatches over δ/2"}.get(col, "samples masked"))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    _legend_below(fig, axes)
    save(fig, path, title)


@dataclass(frozen=True)
class Aggregation:
    """What the aggregation (tools/grid/aggregate.py) computed, as its figures draw it. The aggregates over tasks
    (`agg`, `deg`, `abl`, `curves`, `poi`, `final_common`) hold only the tasks every algorithm ran, so that like is
    compared with like (`tasks_note` names them when a task is left out); the per-task tables (`final`, `runs`,
    `per_task`, `dec`) every task."""

    label: str  # heads every figure's title
    final: pd.DataFrame  # one row per run: its final score
    runs: pd.DataFrame  # one row per run and logged step: the training curves
    ref: pd.DataFrame | None  # the reference table (None: scores not normalised)
    per_task: pd.DataFrame  # per (algorithm, task, lag): runs, mean return, normalised score, final TV, eval return
    agg: pd.DataFrame  # per (algorithm, lag): IQM, mean, median, optimality gap over tasks and runs
    deg: pd.DataFrame  # the difference in degradation against PPO, per task and pooled
    abl: pd.DataFrame  # each VACO ablation's effect at the high lag, per task and pooled
    dec: pd.DataFrame  # post hoc: per (algorithm, task, lag) and training decile
    curves: pd.DataFrame  # the IQM of the normalised training return at logged steps, per (algorithm, lag)
    poi: pd.DataFrame  # P(X > PPO) at the same lag
    marked: set  # algorithms that did not learn (drawn dashed)
    curve_reps: int  # bootstrap resamples of the curves and profiles
    curve_points: int  # points per training curve
    seed: int  # the bootstrap's seed
    final_common: pd.DataFrame | None = None  # `final` on the tasks every algorithm ran (None: all of them)
    tasks_note: str = ""  # those tasks, named in the titles when one is left out


def make_figures(a: Aggregation, out) -> list[str]:
    """Every figure of the aggregation into `out` (PNG and SVG); `a.label` heads every title. Returns the file names
    written."""
    import matplotlib

    matplotlib.use("Agg")
    _FIGURE_LABEL["text"] = a.label
    final, runs, ref, per_task, agg, deg, abl, dec, curves, poi, marked = (
        a.final, a.runs, a.ref, a.per_task, a.agg, a.deg, a.abl, a.dec, a.curves, a.poi, a.marked
    )  # fmt: skip
    curve_reps, curve_points, seed, tasks_note = a.curve_reps, a.curve_points, a.seed, a.tasks_note
    fc = final if a.final_common is None else a.final_common
    labels = order_labels(final["algo"].unique())
    colors, main = colors_for(labels), [lab for lab in labels if not is_ablation(lab)] or labels
    lags, n_tasks, delta = sorted(int(k) for k in final["lag"].unique()), fc["task"].nunique(), delta_of(final, "vaco")
    shown = meaningful_metrics(fc, n_tasks)
    on = f" ({tasks_note})" if tasks_note else ""
    dd = deg[deg.measure == "degradation_difference"] if len(deg) else deg
    random_lines = {t: ref.loc[t, "random_return"] for t in runs["task"].unique()} if ref is not None else {}
    figures = [  # (file, function, title, the function's data), in the order of the results page
        (
            "score_vs_lag.png",
            plot_score_vs_lag,
            "Final score against the lag" + on,
            (agg, main, lags, colors, shown, "normalised score" if ref is not None else "return"),
        ),
        ("intervals.png", plot_intervals, "Final score, 95% intervals" + on, (agg, labels, lags, colors, shown)),
        (
            "performance_profiles.png",
            plot_profiles,
            "Performance profiles" + on,
            (fc, labels, lags, colors, curve_reps, seed),
        ),
        (
            "degradation.png",
            plot_forest,
            "Difference in degradation against PPO" + on,
            (
                dd,
                colors,
                f"(X lag {LAG_HI} − X lag {LAG_LO}) − (PPO lag {LAG_HI} − PPO lag {LAG_LO}); > 0: X loses less",
                marked,
            ),
        ),
        (
            "ablation.png",
            plot_forest,
            f"Ablations at lag {LAG_HI}" + on,
            (abl, colors, "ablation − VACO, normalised score"),
        ),
        ("probability_of_improvement.png", plot_improvement, "P(X > PPO) at the same lag" + on, (poi, colors)),
        ("iqm_curves.png", plot_iqm_curves, "IQM of the training return" + on, (curves, main, lags, colors)),
        (
            "task_curves.png",
            plot_task_curves,
            "Training return per task and lag",
            (final, runs, main, lags, colors, curve_points, random_lines),
        ),
        ("final_tv.png", plot_tv, "Final TV against the lag", (per_task, labels, lags, colors, delta)),
        ("deciles.png", plot_deciles, "VACO per training decile (post hoc)", (dec, colors, delta)),
    ]
    written = []
    for name, plot, title, data in figures:  # a function with nothing to draw returns False and writes no file
        if plot(out / name, title, *data) is not False:
            written += [name, name.replace(".png", ".svg")]
    return written
