"""The figures of tools/grid/aggregate.py: rliable's interval plots, IQM curves, performance profiles and probability of
improvement, and ours for what rliable does not draw (score against lag, the difference in degradation, per-task
curves, final TV against lag, the post-hoc deciles). Every figure states its definitions in its title."""

from __future__ import annotations

import textwrap

import numpy as np
from rliable import library as rly

from tools.grid.aggregate import (
    AGG_METRICS,
    COLORS,
    DECILE_COLUMNS,
    EXTRA_COLORS,
    LAG_HI,
    LAG_LO,
    NOT_LEARNED_NOTE,
    SCORE_DEF,
    TV_TOLERANCE,
    curve_steps,
    delta_of,
    is_ablation,
    order_labels,
    score_matrix,
)


def colors_for(labels) -> dict[str, str]:
    """A fixed colour per known label (its lag mode ignored); others get the extra colours in sorted order."""
    out, extra = {}, iter(EXTRA_COLORS * (1 + len(labels) // len(EXTRA_COLORS)))
    for label in sorted(labels):
        out[label] = COLORS.get(label.split("[")[0]) or next(extra)
    return out


_FIGURE_LABEL = {"text": ""}  # set by make_figures(label, ...): prefixed to every figure title


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


def plot_score_vs_lag(path, title, agg, labels, lags, colors, metrics_shown, ylabel):
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


def plot_forest(path, title, table, colors, xlabel, marked=()):
    """One row per (algorithm, task or pooled): point and 95% interval; a line at 0. The `marked` algorithms (did
    not learn) are drawn grey and dashed on a hatched band, with the reason above the plot."""
    if not len(table):
        return False
    rows = list(table.itertuples())
    fig, axes = _figure(1, 1, 7, 0.35 * len(rows) + 2.0 + 0.3 * bool(marked))
    ax = axes[0][0]
    for i, r in enumerate(rows):
        y, c = len(rows) - 1 - i, "#999999" if r.algo in marked else colors.get(r.algo, "k")
        if r.algo in marked:
            ax.axhspan(y - 0.45, y + 0.45, facecolor="none", edgecolor="#bbbbbb", hatch="///", lw=0)
        xerr = [[r.estimate - r.ci_low], [r.ci_high - r.estimate]]
        ax.errorbar(
            r.estimate,
            y,
            xerr=xerr,
            fmt="o",
            color=c,
            capsize=3,
            ms=5,
            mfc=c if r.task == "pooled" else "white",
            ls="--" if r.algo in marked else "-",
        )
    ax.set_yticks(range(len(rows)), [f"{r.algo}{' †' * (r.algo in marked)} — {r.task}" for r in reversed(rows)], fontsize=8)
    if any(r.algo in marked for r in rows):
        ax.set_title(textwrap.fill(f"† grey, hatched: {NOT_LEARNED_NOTE}", 100), fontsize=8, color="#555555")
    ax.axvline(0, color="k", lw=0.9, ls="--")
    ax.set_xlabel(xlabel, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path, title)


def plot_intervals(path, title, agg, labels, lags, colors, metrics_shown):
    """rliable's interval plot: one row per (algorithm, lag), one panel per metric, one x-range for every panel."""
    from rliable import plot_utils

    keys = [(a, k) for k in reversed(lags) for a in reversed(labels) if ((agg.algo == a) & (agg.lag == k)).any()]  # bottom up
    rows = {f"{a} · lag {k}": agg[(agg.algo == a) & (agg.lag == k)].set_index("metric").loc[metrics_shown] for a, k in keys}
    fig, axes = plot_utils.plot_interval_estimates(
        {n: r.estimate.to_numpy() for n, r in rows.items()},
        {n: r[["ci_low", "ci_high"]].to_numpy().T for n, r in rows.items()},
        [AGG_METRICS[m] for m in metrics_shown],
        algorithms=list(rows),
        colors={n: colors[a] for n, (a, _) in zip(rows, keys)},
        xlabel="",
        subfigure_width=4.0,
        row_height=0.32,
    )
    axes = np.atleast_1d(axes)
    lo, hi = min(ax.get_xlim()[0] for ax in axes), max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:
        ax.set(xlim=(lo, hi), xlabel="normalised score")
        ax.title.set_fontsize(10)
        ax.tick_params(labelsize=8)
    _save(fig, path, title, tight=False)


def plot_iqm_curves(path, title, curves, labels, lags, colors):
    """rliable's sample-efficiency curves: the IQM at logged steps with its interval band, one panel per lag."""
    from rliable import plot_utils

    if not len(curves):
        return False
    fig, axes = _figure(1, len(lags), 3.8, 3.4, sharey=True)
    for ax, lag in zip(axes[0], lags):
        for label in labels:
            d = curves[(curves.algo == label) & (curves.lag == lag)]
            if len(d):
                plot_utils.plot_sample_efficiency_curve(
                    d.step.to_numpy(),
                    {label: d.iqm.to_numpy()},
                    {label: d[["ci_low", "ci_high"]].to_numpy().T},
                    [label],
                    colors=colors,
                    ax=ax,
                    xlabel="",
                    ylabel="",
                    labelsize="small",
                    ticklabelsize="small",
                    marker=".",
                    linewidth=1.4,
                )
        ax.axhline(0, color="k", lw=0.8, ls=":")
        ax.set_title(f"lag {lag}", fontsize=9)
        _step_axis(ax)
    axes[0][0].set_ylabel("IQM normalised return")
    axes[0][-1].legend(fontsize=7)
    _save(fig, path, title)


def plot_profiles(path, title, final, labels, lags, colors, reps, seed):
    """rliable's performance profiles (fraction of runs with normalised final score > τ), one panel per lag."""
    from rliable import plot_utils

    taus = np.linspace(min(0.0, final.normalized_score.min()), max(1.0, final.normalized_score.max()), 81)
    fig, axes = _figure(1, len(lags), 3.8, 3.4, sharey=True)
    for ax, lag in zip(axes[0], lags):
        d = final[final.lag == lag]
        scores = {a: score_matrix(d[d.algo == a])[0] for a in labels if (d.algo == a).any()}
        np.random.seed(seed)  # rliable's bootstrap draws from numpy's global generator
        profiles, cis = rly.create_performance_profile(scores, taus, reps=reps)
        plot_utils.plot_performance_profiles(
            profiles,
            taus,
            cis,
            ax=ax,
            colors=colors,
            xlabel="normalised score τ",
            ylabel="",
            labelsize="small",
            ticklabelsize="small",
        )
        ax.set_title(f"lag {lag}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of runs with score > τ")
    axes[0][-1].legend(fontsize=7)
    _save(fig, path, title)


def plot_improvement(path, title, poi, colors):
    """rliable's probability-of-improvement plot: P(X > PPO) per algorithm and lag, with its interval."""
    from rliable import plot_utils

    if not len(poi):
        return False
    fig, axes = _figure(1, 1, 6, 0.35 * len(poi) + 1.5)
    keys = [f"{r.x},{r.y}" for r in poi.itertuples()]
    plot_utils.plot_probability_of_improvement(
        dict(zip(keys, poi.estimate)),
        dict(zip(keys, poi[["ci_low", "ci_high"]].to_numpy())),
        ax=axes[0][0],
        colors=[colors[r.x.split(" lag ")[0]] for r in poi.itertuples()],
        labelsize="small",
        ticklabelsize="small",
    )
    _save(fig, path, title)


def plot_task_curves(path, title, final, runs, labels, lags, colors, max_points, ref_lines):
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
    _save(fig, path, title, tight=False)


def _band(ax, delta):
    ax.axhline(delta / 2, ls="--", color="k", lw=0.9)
    ax.axhspan(delta / 2 * (1 - TV_TOLERANCE), delta / 2 * (1 + TV_TOLERANCE), color="k", alpha=0.08, lw=0)


def plot_tv(path, title, per_task, labels, lags, colors, delta):
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


def plot_deciles(path, title, dec, colors, delta, algo="vaco"):
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
            ax.errorbar(
                g.decile.astype(int),
                g[f"{col}_mean"],
                yerr=g[f"{col}_ci95"].fillna(0),
                fmt="o" + ["-", "--", ":", "-."][tasks.index(task) % 4],
                color=color,
                ms=3,
                capsize=2,
                label=f"{task} lag {lag}",
            )
        if col == "final_tv" and np.isfinite(delta):
            _band(ax, delta)
        ax.set_xticks(range(1, 11))
        ax.set_xlabel("training decile (10: the final-score window)", fontsize=8)
        ax.set_title(DECILE_COLUMNS[col], fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    _save(fig, path, title)


def make_figures(
    label, out, final, runs, ref, norm, boot, per_task, agg, deg, abl, dec, curves, poi, marked, curve_reps, curve_points, seed
):
    """Every figure of the aggregation into `out`; `label` heads every title. Returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    _FIGURE_LABEL["text"] = label
    labels = order_labels(final["algo"].unique())
    colors, main = colors_for(labels), [lab for lab in labels if not is_ablation(lab)] or labels
    lags, n_tasks, delta = sorted(int(k) for k in final["lag"].unique()), final["task"].nunique(), delta_of(final, "vaco")
    shown, caption = meaningful_metrics(final, n_tasks), f"{SCORE_DEF} ({norm}); {n_tasks} task(s); {boot}"
    dd = deg[deg.measure == "degradation_difference"] if len(deg) else deg
    random_lines = {t: ref.loc[t, "random_return"] for t in final["task"].unique()} if ref is not None else {}
    band = f"±{TV_TOLERANCE:.0%}"
    figures = [  # (file, function, title, the function's data), in the order of the results page
        (
            "score_vs_lag.png",
            plot_score_vs_lag,
            "Final score vs lag — " + caption,
            (agg, main, lags, colors, shown, "normalised score" if ref is not None else "return"),
        ),
        ("intervals.png", plot_intervals, "Aggregates of the final score — " + caption, (agg, labels, lags, colors, shown)),
        (
            "performance_profiles.png",
            plot_profiles,
            f"Performance profiles of the final score ({norm}); rliable, {curve_reps}-resample bootstrap bands",
            (final, labels, lags, colors, curve_reps, seed),
        ),
        (
            "degradation.png",
            plot_forest,
            f"Difference in degradation vs PPO, (X lag {LAG_HI} − X lag {LAG_LO}) − (PPO lag {LAG_HI} − PPO lag {LAG_LO}); "
            f"> 0: X loses less. Filled: pooled over tasks. {SCORE_DEF}; {boot}",
            (dd, colors, "difference in degradation (normalised score)", marked),
        ),
        (
            "ablation.png",
            plot_forest,
            f"Ablation effect at lag {LAG_HI}: ablation − VACO (< 0: the removed part helps). Filled: pooled. {SCORE_DEF}; {boot}",
            (abl, colors, "difference (normalised score)"),
        ),
        (
            "probability_of_improvement.png",
            plot_improvement,
            f"Probability of improvement over PPO at the same lag (rliable; {curve_reps} resamples)",
            (poi, colors),
        ),
        (
            "iqm_curves.png",
            plot_iqm_curves,
            f"IQM normalised training return at logged steps ({norm}); rliable, {curve_reps}-resample intervals",
            (curves, main, lags, colors),
        ),
        (
            "task_curves.png",
            plot_task_curves,
            "Training episodic return per task: mean over seeds ± 1 standard error, at logged steps"
            + " (dotted: random policy)" * bool(random_lines),
            (final, runs, main, lags, colors, curve_points, random_lines),
        ),
        (
            "final_tv.png",
            plot_tv,
            "Final TV after the update, mean over the last 10% of steps, ± 95% t-interval over seeds "
            f"(dashed: VACO's δ/2; shaded: {band}, the pre-registered band)",
            (per_task, labels, lags, colors, delta),
        ),
        (
            "deciles.png",
            plot_deciles,
            "POST HOC (not pre-registered): VACO per training decile, mean ± 95% t-interval over runs "
            f"(dashed: δ/2, shaded: {band}); decile 10 is the final-score window",
            (dec, colors, delta),
        ),
    ]
    # A function with nothing to draw (no ablations, no TV logged, ...) returns False and writes no file.
    return [name for name, plot, title, data in figures if plot(out / name, title, *data) is not False]
