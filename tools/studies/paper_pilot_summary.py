#!/usr/bin/env python
"""The paper-shape pilot's table and figure, from its committed records (docs/paper_pilot.md gives the design).

    python -m tools.studies.paper_pilot_summary      # results/records/paper_pilot -> results/paper_pilot/

Writes runs.csv (one row per finished run), summary.md (the cells, D with its Welch interval, the spread between
seeds against the evidence grid's, the seeds a decisive test would need and what it would cost, VACO's filter at
lag 0, the time per iteration) and curves.png/.svg (the training return of every run). The same records give the
same bytes. Exit 2 with one line if no finished record is there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from tools.grid.run_records import collect_records
from tools.readings import reading, value
from tools.stats import pooled_sd, runs_per_cell, welch_contrast_interval

RECORDS = Path("results/records/paper_pilot")
GRID_RECORDS = Path("results/records/tier1")  # the evidence grid at 2,048 samples per iteration
OUT = Path("results/paper_pilot")
TASK = "Hopper-v5"
CELLS = [(algo, lag) for algo in ("ppo", "vaco") for lag in (0, 8)]
SIGNS = {("vaco", 8): 1, ("vaco", 0): -1, ("ppo", 8): -1, ("ppo", 0): 1}  # D = (VACO 8 - 0) - (PPO 8 - 0)
LAST = 10  # iterations of the final training return
FINAL_FRACTION = 0.1  # the evidence grid's final score: the last tenth of the steps (docs/results.md)
# The sizes a decisive test is judged by (normalised score): an interval of D of this half-width, and 80% power at
# the 5% level against a true D of this size.
HALF_WIDTH, EFFECT = 0.1, 0.1


def reference(task=TASK, path=Path("results/reference_scores.csv")) -> tuple[float, float]:
    """(random return, reference return) of the task: normalised = (return - random) / (reference - random)."""
    for line in path.read_text().splitlines():
        if line.startswith(task + ","):
            fields = line.split(",")
            return float(fields[1]), float(fields[5])
    raise SystemExit(f"error: {path} has no reference return for {task}")


def column(record, name) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in record["scalars"].get(name, [])], float)


def run_row(record, random_return, reference_return) -> dict:
    """What the pilot reads from one run."""
    ret = column(record, "episodic_return")
    last = ret[-LAST:]
    pilot = record.get("pilot") or {}
    starts, perf = pilot.get("starts", []), pilot.get("perf", {})
    norm = lambda x: (x - random_return) / (reference_return - random_return)  # noqa: E731
    row = {
        "name": record["name"],
        "algo": record["algo"],
        "lag": record["lag"],
        "seed": record["seed"],
        "iterations": len(ret),
        "final_return": float(np.nanmean(last)) if np.isfinite(last).any() else float("nan"),
        "eval_return": float((record.get("summary") or {}).get("eval_return") or float("nan")),
    }
    row["final_score"], row["eval_score"] = norm(row["final_return"]), norm(row["eval_return"])
    for name in ("vaco_over_budget_frac", "vaco_filter_frac", "vaco_tv"):
        values = column(record, name)
        row[name] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
    for name in ("rollout_seconds", "update_seconds"):  # logged as running totals: each iteration's is a difference
        per_iteration = np.diff(perf.get(name) or [np.nan], prepend=0.0)
        row[f"median_{name}"] = float(np.median(per_iteration))
    row["cpu_hours"] = sum(s.get("cpu_seconds") or 0 for s in starts) / 3600
    row["wall_hours"] = sum(s.get("wall_seconds") or 0 for s in starts) / 3600
    row["starts"] = len(starts)
    row["commit"] = pilot.get("commit", "")
    return row


def grid_scores(records, random_return, reference_return) -> dict:
    """{(algo, lag): normalised final scores} of the evidence grid's Hopper runs (mean return over the last tenth)."""
    scores = {}
    for r in records:
        if r["task"] != TASK or (r["algo"], r["lag"]) not in SIGNS:
            continue
        steps, ret = column(r, "step"), column(r, "episodic_return")
        ok = np.isfinite(ret) & (steps > (1 - FINAL_FRACTION) * steps.max())
        score = (ret[ok].mean() - random_return) / (reference_return - random_return)
        scores.setdefault((r["algo"], r["lag"]), []).append(float(score))
    return scores


def grid_filter(records) -> tuple[float, float]:
    """VACO's mean over-budget and masked fractions at lag 0 in the evidence grid's Hopper runs (minibatches of 64)."""
    runs = [r for r in records if r["task"] == TASK and r["algo"] == "vaco" and r["lag"] == 0]
    means = [[np.nanmean(column(r, name)) for r in runs] for name in ("vaco_over_budget_frac", "vaco_filter_frac")]
    return (float(np.mean(means[0])), float(np.mean(means[1]))) if runs else (float("nan"), float("nan"))


def contrast(samples: dict) -> tuple[float, float, float]:
    """D and its 95% Welch interval (tools/stats.py's interval of a contrast of cell means, one task)."""
    cells = [np.asarray(samples[cell], float)[:, None] for cell in SIGNS]
    estimate = sum(sign * x.mean() for sign, x in zip(SIGNS.values(), cells))
    (low, _), (high, _) = welch_contrast_interval(cells, list(SIGNS.values()))
    return float(estimate), float(low), float(high)


def fmt(x, digits=3) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.{digits}f}"


def summary_markdown(rows, grid, grid_filter_fractions) -> str:
    by_cell = {cell: [r for r in rows if (r["algo"], r["lag"]) == cell] for cell in CELLS}
    lines = [
        "| algorithm | lag | seeds | final score (last 10 iterations) | evaluation score | VACO over budget / masked | VACO TV (δ/2 = 0.1) | rollout / update s per iteration | CPU-hours per run |"
    ]
    lines.append("|---|---:|---:|---|---|---|---:|---|---:|")
    for (algo, lag), runs in by_cell.items():
        if not runs:
            lines.append(f"| {algo} | {lag} | 0 | | | | | | |")
            continue
        m = lambda key: float(np.mean([r[key] for r in runs]))  # noqa: E731
        sd = lambda key: float(np.std([r[key] for r in runs], ddof=1)) if len(runs) > 1 else float("nan")  # noqa: E731
        filt = f"{fmt(m('vaco_over_budget_frac'))} / {fmt(m('vaco_filter_frac'))}" if algo == "vaco" else ""
        lines.append(
            f"| {algo} | {lag} | {len(runs)} | {fmt(m('final_score'))} (sd {fmt(sd('final_score'))}) "
            f"| {fmt(m('eval_score'))} (sd {fmt(sd('eval_score'))}) | {filt} | {fmt(m('vaco_tv')) if algo == 'vaco' else ''} "
            f"| {fmt(m('median_rollout_seconds'), 1)} / {fmt(m('median_update_seconds'), 1)} | {fmt(m('cpu_hours'), 2)} |"
        )
    out = ["<!-- generated by python -m tools.studies.paper_pilot_summary from results/records/paper_pilot -->", ""]
    out += [f"{len(rows)} of 8 runs finished.", "", *lines, ""]
    samples = {cell: [r["final_score"] for r in runs] for cell, runs in by_cell.items()}
    if all(len(x) >= 2 for x in samples.values()):
        d, lo, hi = contrast(samples)
        # Two seeds per cell give no bootstrap interval worth the name: D is read by its Welch interval alone.
        words = reading(d, (lo, hi), higher="VACO loses less", lower="VACO loses more")
        out.append(f"D = (VACO lag 8 − lag 0) − (PPO lag 8 − lag 0), final score: {value(d, lo, hi)} (95% Welch t): {words}")
        sd_here, sd_grid = pooled_sd(samples), pooled_sd(grid)
        n_interval, n_power = runs_per_cell(sd_here, len(SIGNS), HALF_WIDTH, EFFECT)
        hours = float(np.mean([r["cpu_hours"] for r in rows]))
        out += [
            "",
            f"Spread between seeds (pooled per-cell standard deviation of the final score): {fmt(sd_here)} at this shape, "
            f"{fmt(sd_grid)} in the evidence grid at 2,048 samples per iteration (Hopper-v5, the same four cells).",
            "",
            f"Seeds per cell for D's 95% interval to be ±{HALF_WIDTH}: {n_interval}; for 80% power against D = "
            f"{EFFECT}: {n_power}, that is {4 * n_power} runs, about {fmt(4 * n_power * hours, 0)} CPU-hours at "
            f"{fmt(hours, 1)} per run.",
        ]
    else:
        out.append("D and the seeds a decisive test would need: once both seeds of every cell have finished.")
    over, masked = grid_filter_fractions
    out += ["", f"VACO at lag 0 in the evidence grid (minibatches of 64): over budget {fmt(over)}, masked {fmt(masked)}."]
    return "\n".join(out) + "\n"


def curves_figure(records, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "paper-pilot"  # the same records give the same bytes
    styles = {
        ("ppo", 0): ("tab:blue", "-"),
        ("ppo", 8): ("tab:blue", "--"),
        ("vaco", 0): ("tab:red", "-"),
        ("vaco", 8): ("tab:red", "--"),
    }
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in sorted(records, key=lambda r: (r["algo"], r["lag"], r["seed"])):
        color, line = styles[(r["algo"], r["lag"])]
        marker = "o" if r["seed"] == 1 else "s"
        ax.plot(column(r, "step") / 1e6, column(r, "episodic_return"), color=color, linestyle=line, marker=marker,
                markevery=20, markersize=4, label=f"{r['algo']} lag {r['lag']} seed {r['seed']}")  # fmt: skip
    ax.set_xlabel("environment steps (millions)")
    ax.set_ylabel("training episodic return")
    ax.set_title("Hopper-v5, 500 envs × 1,000 steps")
    ax.legend(fontsize=7)
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        fig.savefig(path.with_suffix(suffix), metadata={"Date": None} if suffix == ".svg" else {"Software": None})
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=Path, default=RECORDS)
    p.add_argument("--grid-records", type=Path, default=GRID_RECORDS)
    p.add_argument("--out", type=Path, default=OUT)
    opts = p.parse_args(argv)
    records = (
        [r for r in collect_records([opts.records], log=lambda m: None) if r["finished"]] if opts.records.is_dir() else []
    )
    if not records:
        print(f"error: {opts.records} holds no finished run's record", file=sys.stderr)
        return 2
    random_return, reference_return = reference()
    rows = [run_row(r, random_return, reference_return) for r in sorted(records, key=lambda r: r["name"])]
    grid_records = collect_records([opts.grid_records], log=lambda m: None)
    grid = grid_scores(grid_records, random_return, reference_return)
    opts.out.mkdir(parents=True, exist_ok=True)
    keys = list(rows[0])
    csv = [",".join(keys)] + [",".join(f"{r[k]:.6g}" if isinstance(r[k], float) else str(r[k]) for k in keys) for r in rows]
    (opts.out / "runs.csv").write_text("\n".join(csv) + "\n")
    (opts.out / "summary.md").write_text(summary_markdown(rows, grid, grid_filter(grid_records)))
    curves_figure(records, opts.out / "curves")
    print(f"wrote {opts.out}/runs.csv, summary.md, curves.png, curves.svg from {len(records)} record(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
