"""The forward-lag table where the mechanisms act: PPO-clip vs VACO at K = 1..16 on the arithmetic proxy task.

The proxy task of tools/studies/gsm8k_proxy_task.py (a tiny character-level Llama supervised to ~30% on one-step
arithmetic, then GRPO with vaco_gsm8k.py), in a regime chosen by a small sweep so that PPO-clip clips a few
percent of tokens at the largest K and VACO's filter acts, while K = 1 still learns.

Two stages, each resumable: a run whose compact record (records/<name>.json) is already in the output folder
with the same settings is not run again, so a stopped command continues where it stopped, and records
committed to the repository are reused.

- `sweep`: PPO-clip, seed 1, over learning rates and K (default 1 and 16); reports K = 1's accuracy, the
  clip fraction at each K and the share of minibatches whose D = 1/2 mean|r - 1| is over delta/2 for several
  delta (D is the statistic VACO's filter tests, logged by both losses).
- `table`: PPO-clip and VACO x K x seeds at one setting. At K = 1 the two losses are the same computation
  (r = 1 exactly, nothing is clipped or filtered), so that run is made once and recorded for both.

Both write summary.md, runs.csv, curves.csv and a figure into --out; `--report-only` rebuilds them from the
records without training. The supervised start model is rebuilt (deterministically on one machine, ~3 min)
in --work unless it is already there.

Usage:
    python -m tools.studies.gsm8k_forward_lag sweep --out results/gsm8k_forward_lag/sweep
    python -m tools.studies.gsm8k_forward_lag table --out results/gsm8k_forward_lag    # the committed table
    python -m tools.studies.gsm8k_forward_lag table --out results/gsm8k_forward_lag --report-only
"""

import argparse
import contextlib
import json
import os
import time

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vaco_gsm8k as V  # noqa: E402
from tools import readings  # noqa: E402
from tools.grid.aggregate_figures import COLORS  # noqa: E402
from tools.studies.gsm8k_proxy_task import mean_interval, supervise, write_rows  # noqa: E402
from tools.studies.make_arith_task import make_task  # noqa: E402
from tools.stats import t_interval  # noqa: E402

MAX_NEW_TOKENS = 24  # as tools/studies/gsm8k_proxy_task.py: the longest rationale plus the stop token fits
TASK = {"max_number": 6, "train_size": 2000, "sft_target": 0.3, "sft_max_steps": 3000}
DELTAS = [0.01, 0.02, 0.03, 0.05]  # delta values whose budget delta/2 the sweep tests D against
# The figure's colours: MuJoCo's palette (tools/grid/aggregate.py), PPO-clip as PPO.
LOSS_COLORS = {"ppo-clip": COLORS["ppo"], "vaco": COLORS["vaco"]}
# Settings that decide a run's result; a record is reused only when all of them match.
RUN_KEYS = [
    "loss", "K", "seed", "learning_rate", "tv_threshold", "total_steps", "prompts_per_step", "num_generations",
    "temperature", "eval_every", "eval_size", "task",
]  # fmt: skip


def start_model(work: str) -> tuple[str, str, str, dict]:
    """The task files and the supervised start model in `work` (made once, reused): paths and its sft.json."""
    data = os.path.join(work, "data")
    train_file, test_file = make_task(data, TASK["train_size"], 200, seed=0, max_number=TASK["max_number"])
    model_dir = os.path.join(work, "sft_model")
    info = os.path.join(model_dir, "sft.json")
    if os.path.isfile(info):
        with open(info) as handle:
            sft = json.load(handle)
        if sft.get("task") == TASK:
            return model_dir, train_file, test_file, sft
    begin = time.time()
    sft = supervise(model_dir, train_file, test_file, TASK["sft_target"], TASK["sft_max_steps"], seed=0)
    sft.update(task=TASK, sft_seconds=round(time.time() - begin))
    with open(info, "w") as handle:
        json.dump(sft, handle)
    return model_dir, train_file, test_file, sft


def rounded(values, digits=5):
    return [None if v is None else float(f"{v:.{digits}g}") for v in values]


def run_spec(spec: dict, paths: tuple, work: str) -> dict:
    """One GRPO run; returns its compact record: settings, per-step mechanism statistics, evaluations."""
    model_dir, train_file, test_file, sft = paths
    name = record_name(spec)
    args = V.Args(
        model_id=model_dir, data_file=train_file, eval_data_file=test_file, run_dir=os.path.join(work, "runs", name),
        overwrite=True, checkpoint_every=0, loss=spec["loss"], forward_lag=spec["K"], total_steps=spec["total_steps"],
        seed=spec["seed"], prompts_per_step=spec["prompts_per_step"], num_generations=spec["num_generations"],
        micro_batch_size=spec["prompts_per_step"] * spec["num_generations"], max_new_tokens=MAX_NEW_TOKENS,
        learning_rate=spec["learning_rate"], temperature=spec["temperature"], tv_threshold=spec["tv_threshold"],
        eval_every=max(1, spec["eval_every"] // spec["K"]), eval_size=spec["eval_size"], torch_threads=1,
    )  # fmt: skip
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    begin = time.time()
    with open(os.path.join(work, "logs", name + ".log"), "w") as log, contextlib.redirect_stdout(log):
        history = V.main(args)
    steps = history["steps"]
    dropped = "clip_fraction" if spec["loss"] == "ppo-clip" else "filter_fraction"
    record = {
        "spec": spec,
        "sft_accuracy": sft["sft_accuracy"],
        "seconds": round(time.time() - begin),
        "steps": {
            "position": [s["position"] for s in steps],
            "tv": rounded([s["tv"] for s in steps]),
            "dropped_fraction": rounded([s[dropped] for s in steps]),
            "over_budget": [int(s.get("over_budget", 0)) for s in steps],
            "filtered_completion_fraction": rounded([s.get("filter_completion_fraction", 0.0) for s in steps]),
        },
        "iterations": {
            "reward": rounded([r["reward"] for r in history["iterations"]]),
            "tv_final": rounded([r["tv_final"] for r in history["iterations"]]),
        },
        "evals": [{"step": e["step"], "accuracy": e["accuracy"]} for e in history["evals"]],
    }
    return record


def record_name(spec: dict) -> str:
    lr = f"{spec['learning_rate']:g}"
    return f"{spec['loss']}_K{spec['K']}_s{spec['seed']}_lr{lr}_d{spec['tv_threshold']:g}"


def load_records(folder: str) -> dict:
    records = {}
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".json"):
                with open(os.path.join(folder, name)) as handle:
                    record = json.load(handle)
                records[name[: -len(".json")]] = record
    return records


def same_settings(a: dict, b: dict) -> bool:
    return all(a.get(key) == b.get(key) for key in RUN_KEYS)


def run_all(specs: list, out: str, work: str, report, workers: int = 1) -> dict:
    """Run the specs not yet recorded in <out>/records, writing each record and the report as it finishes (so
    a stop leaves every finished run). `specs` items may carry `same_as`: a spec whose computation is identical,
    recorded under this spec's name once that one is recorded, without running again. With workers > 1, runs
    go to that many subprocesses (one torch thread each), in the order of `specs`."""
    folder = os.path.join(out, "records")
    os.makedirs(folder, exist_ok=True)
    records = load_records(folder)

    def recorded(spec) -> bool:
        name = record_name(spec)
        return name in records and same_settings(records[name]["spec"], spec)

    def keep(name: str, record: dict):
        with open(os.path.join(folder, name + ".json"), "w") as handle:
            json.dump(record, handle, separators=(",", ":"))
        records[name] = record
        print(f"done {name} ({record['seconds']} s): final accuracy {record['evals'][-1]['accuracy']:.3f}", flush=True)

    def copy_shared():
        for spec in specs:
            source = spec.get("same_as")
            if source is not None and not recorded(spec) and recorded(source):
                record = json.loads(json.dumps(records[record_name(source)]))
                record["spec"] = {k: v for k, v in spec.items() if k != "same_as"}
                record["same_as"] = record_name(source)
                keep(record_name(spec), record)

    copy_shared()
    todo = [s for s in specs if not recorded(s) and s.get("same_as") is None]
    if todo:
        paths = start_model(work)
        print(f"start model: {paths[3]}; {len(todo)} runs to make", flush=True)
        if workers > 1:
            import concurrent.futures
            import multiprocessing

            context = multiprocessing.get_context("spawn")  # a fresh interpreter per worker
            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
                futures = {pool.submit(run_spec, spec, paths, work): spec for spec in todo}
                for future in concurrent.futures.as_completed(futures):
                    keep(record_name(futures[future]), future.result())
                    copy_shared()
                    report(records)
        else:
            for spec in todo:
                keep(record_name(spec), run_spec(spec, paths, work))
                copy_shared()
                report(records)
    report(records)
    return records


def late_accuracy(record: dict) -> float:
    total = record["spec"]["total_steps"]
    return float(np.mean([e["accuracy"] for e in record["evals"] if e["step"] >= total // 2]))


def run_row(record: dict) -> dict:
    """The per-run numbers of the tables (runs.csv)."""
    spec, steps = record["spec"], record["steps"]
    lagged = [i for i, p in enumerate(steps["position"]) if p > 1]  # minibatches trained on stale data
    over = [steps["over_budget"][i] for i in range(len(steps["position"]))]
    when = [i for i, o in enumerate(over) if o]
    return {
        "loss": spec["loss"],
        "K": spec["K"],
        "seed": spec["seed"],
        "learning_rate": spec["learning_rate"],
        "tv_threshold": spec["tv_threshold"],
        "accuracy_start": record["evals"][0]["accuracy"],
        "accuracy_end": record["evals"][-1]["accuracy"],
        "accuracy_late": late_accuracy(record),
        "dropped_fraction": float(np.mean(steps["dropped_fraction"])),
        "over_budget_fraction": float(np.mean(over)) if spec["loss"] == "vaco" else "",
        "tokens_filtered_when_over": float(np.mean([steps["dropped_fraction"][i] for i in when])) if when else "",
        "completions_filtered_when_over": (
            float(np.mean([steps["filtered_completion_fraction"][i] for i in when])) if when else ""
        ),
        "D_mean_lagged": float(np.mean([steps["tv"][i] for i in lagged])) if lagged else 0.0,
        "D_max": float(np.max(steps["tv"])),
        "tv_final": float(np.mean(record["iterations"]["tv_final"])),
        "seconds": record["seconds"],
        "same_as": record.get("same_as", ""),
    }


def sweep_report(out: str):
    def report(records: dict):
        rows = [run_row(r) for r in records.values()]
        write_rows(os.path.join(out, "runs.csv"), rows)
        lines = [
            "PPO-clip, seed 1. K = 1: greedy accuracy on the 200 held-out problems (start, end, late = mean of the",
            "evaluations from half-way on, best). K > 1: clip fraction (share of tokens clipped, all minibatches, and the",
            "minibatches of the last half of each generation batch, positions > K/2), the",
            "mean D = 1/2 mean|r - 1| over the stale minibatches (position > 1), and the share of all minibatches whose",
            "D is over delta/2 for each delta (the minibatches VACO's filter would act on).",
            "",
            "| lr | K | steps | accuracy start → end (late, best) | clip fraction | clip fraction, last half | "
            "mean D (stale) | max D | " + " | ".join(f"D > {d / 2:g}" for d in DELTAS) + " | final TV |",
            "|---:|---:|---:|---|---:|---:|---:|---:|" + "---:|" * len(DELTAS) + "---:|",
        ]
        for record in sorted(records.values(), key=lambda r: (r["spec"]["learning_rate"], r["spec"]["K"])):
            spec, row, tv = record["spec"], run_row(record), record["steps"]["tv"]
            best = max(e["accuracy"] for e in record["evals"])
            steps = record["steps"]
            half = [f for f, p in zip(steps["dropped_fraction"], steps["position"]) if p > spec["K"] / 2]
            lines.append(
                f"| {spec['learning_rate']:g} | {spec['K']} | {spec['total_steps']} | {row['accuracy_start']:.3f} → "
                f"{row['accuracy_end']:.3f} ({row['accuracy_late']:.3f}, {best:.3f}) | {row['dropped_fraction']:.4f} | "
                f"{np.mean(half) if half else 0.0:.4f} | {row['D_mean_lagged']:.4f} | {row['D_max']:.4f} | "
                + " | ".join(f"{np.mean([d > delta / 2 for d in tv]):.3f}" for delta in DELTAS)
                + f" | {row['tv_final']:.4f} |"
            )
        with open(os.path.join(out, "summary.md"), "w") as handle:
            handle.write("\n".join(lines) + "\n")

    return report


def table_summary(records: dict) -> str:
    runs = [run_row(r) for r in records.values()]
    any_record = next(iter(records.values()))
    total = any_record["spec"]["total_steps"]
    lines = [
        f"Greedy accuracy on the 200 held-out problems; means over seeds with 95% t-intervals; late = the mean of the "
        f"evaluations at steps >= {total // 2}. Clip fraction (PPO-clip) / filter fraction (VACO): share of tokens "
        "without gradient, over all minibatches. Over budget: share of minibatches with D > delta/2 (VACO). "
        "When over: the share of tokens, and of completions (any token masked), that the filter masks in those "
        "minibatches.",
        "",
        "| loss | K | seeds | accuracy at the end | late accuracy | late − start | clip / filter fraction | "
        "minibatches over budget | tokens masked when over | completions masked when over | final TV |",
        "|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for loss in ["ppo-clip", "vaco"]:
        for k in sorted({r["K"] for r in runs if r["loss"] == loss}):
            chosen = [r for r in runs if r["loss"] == loss and r["K"] == k]
            over = [r["over_budget_fraction"] for r in chosen if r["over_budget_fraction"] != ""]
            tokens = [r["tokens_filtered_when_over"] for r in chosen if r["tokens_filtered_when_over"] != ""]
            completions = [r["completions_filtered_when_over"] for r in chosen if r["completions_filtered_when_over"] != ""]
            lines.append(
                f"| {loss} | {k} | {len(chosen)} | {mean_interval([r['accuracy_end'] for r in chosen])} | "
                f"{mean_interval([r['accuracy_late'] for r in chosen])} | "
                f"{mean_interval([r['accuracy_late'] - r['accuracy_start'] for r in chosen])} | "
                f"{np.mean([r['dropped_fraction'] for r in chosen]):.4f} | "
                f"{f'{np.mean(over):.4f}' if over else '–'} | {f'{np.mean(tokens):.3f}' if tokens else '–'} | "
                f"{f'{np.mean(completions):.3f}' if completions else '–'} | "
                f"{np.mean([r['tv_final'] for r in chosen]):.4f} |"
            )
    lines += [
        "",
        "Late − start, read by its 95% t-interval over seeds (tools/readings.py: a direction only when the interval "
        "excludes 0).",
        "",
        "| loss | K | seeds | late − start | reading |",
        "|---|---:|---:|---|---|",
    ]
    for loss in ["ppo-clip", "vaco"]:
        for k in sorted({r["K"] for r in runs if r["loss"] == loss}):
            gains = [r["accuracy_late"] - r["accuracy_start"] for r in runs if r["loss"] == loss and r["K"] == k]
            lines.append(f"| {loss} | {k} | {len(gains)} | {read(gains, 3, 'gains', 'loses')} |")
    lines += [
        "",
        "VACO − PPO-clip, paired by seed: mean and 95% t-interval over seeds of the difference in late accuracy and "
        "in final TV, each read by its interval.",
        "",
        "| K | seeds | VACO − PPO-clip, late accuracy | reading | VACO − PPO-clip, final TV | reading |",
        "|---:|---:|---|---|---|---|",
    ]
    by_run = {(r["loss"], r["K"], r["seed"]): r for r in runs}
    for k in sorted({r["K"] for r in runs if r["K"] > 1}):
        seeds = sorted(s for (loss, kk, s) in by_run if loss == "vaco" and kk == k and ("ppo-clip", k, s) in by_run)
        if seeds:
            cells = [
                read(
                    [by_run["vaco", k, s][key] - by_run["ppo-clip", k, s][key] for s in seeds],
                    digits,
                    "VACO higher",
                    "VACO lower",
                )
                for key, digits in (("accuracy_late", 3), ("tv_final", 4))
            ]
            lines.append(f"| {k} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def read(values, digits, higher, lower) -> str:
    """'mean [95% t-interval] | reading' over seeds, by the one reading rule (tools/readings.py); one seed has no
    interval and no reading."""
    mean, half, _ = t_interval(values)
    if np.isnan(half):
        return f"{readings.number(mean, digits)} | no interval (one seed)"
    low, high = mean - half, mean + half
    said = readings.reading(mean, (low, high), higher=higher, lower=lower)
    return f"{readings.value(mean, low, high, digits)} | {said}"


def plot_table(records: dict, path: str):
    """Six panels: accuracy curves (one line style and marker per K), final accuracy vs K, clipped/filtered share vs K,
    final TV vs K, and VACO − PPO-clip paired by seed in late accuracy and final TV with the 95% t-interval the
    readings use (summary.md); PPO-clip and VACO in the MuJoCo figures' PPO and VACO colours, laid out for the documentation's
    column (tools/grid/aggregate_figures.py), PNG and SVG."""
    from pathlib import Path

    import matplotlib

    from tools.grid import aggregate_figures as F

    matplotlib.use("Agg")

    runs = [run_row(r) for r in records.values()]
    lags = sorted({r["K"] for r in runs})
    styles = dict(zip([2, 4, 8, 16, 32], [":", "-.", "--", "-", (0, (5, 1))]))
    markers = dict(zip([1, 2, 4, 8, 16, 32], ["o", "v", "s", "^", "D", "P"]))  # with the line style, one K per curve
    widths = dict(zip([2, 4, 8, 16, 32], [1.2, 1.2, 1.4, 1.8, 2.0]))
    figure, grid = F._figure(3, 2, 2.9)
    axes = grid.flat
    for loss, label in [("ppo-clip", "PPO-clip"), ("vaco", "VACO")]:
        for k in lags:
            chosen = [r for r in records.values() if r["spec"]["loss"] == loss and r["spec"]["K"] == k]
            if not chosen or (k == 1 and loss == "vaco"):  # K = 1: one run for both losses, drawn once
                continue
            if k == 1:
                color, name = "black", "K = 1 (both losses)"
            else:
                color, name = LOSS_COLORS[loss], f"{label}, K = {k}"
            steps = sorted({e["step"] for r in chosen for e in r["evals"]})
            means = [np.mean([e["accuracy"] for r in chosen for e in r["evals"] if e["step"] == s]) for s in steps]
            axes[0].plot(steps, means, linestyle=styles.get(k, "-"), lw=widths.get(k, 1.0), color=color, label=name,
                         marker=markers.get(k, "x"), ms=3.5)  # fmt: skip
        present = [k for k in lags if any(r["loss"] == loss and r["K"] == k for r in runs)]
        for axis, key in [(axes[1], "accuracy_late"), (axes[2], "dropped_fraction"), (axes[3], "tv_final")]:
            means, halves = [], []
            for k in present:
                mean, half, _ = t_interval([r[key] for r in runs if r["loss"] == loss and r["K"] == k])
                means.append(mean)
                halves.append(0.0 if np.isnan(half) else half)
            name = {"accuracy_late": label, "tv_final": label}.get(key)
            if key == "dropped_fraction":
                name = "PPO-clip: tokens clipped" if loss == "ppo-clip" else "VACO: tokens filtered"
            shifted = [k * 2 ** (0.05 if loss == "vaco" else -0.05) for k in present]  # side by side on the log axis
            axis.errorbar(shifted, means, yerr=halves, color=LOSS_COLORS[loss], marker="o", capsize=3, label=name)
        if loss == "vaco":
            over = [np.mean([r["over_budget_fraction"] for r in runs if r["loss"] == loss and r["K"] == k]) for k in present]
            axes[2].plot(present, over, color=LOSS_COLORS[loss], marker="s", ls="--", label="VACO: minibatches over δ/2")
    start = np.mean([r["accuracy_start"] for r in runs])
    axes[0].axhline(start, color="grey", lw=0.8)
    axes[0].set(xlabel="optimizer step", ylabel="greedy accuracy", title="accuracy (mean of seeds)")
    axes[1].axhline(start, color="grey", lw=0.8, label="start")
    axes[1].set(xlabel="forward lag K", ylabel="late accuracy", title="late accuracy, 95% t-interval")
    axes[2].set(xlabel="forward lag K", ylabel="fraction", title="clipped vs filtered (symlog)")
    axes[2].set_yscale("symlog", linthresh=1e-3)  # PPO-clip's fractions are 10-100x smaller than VACO's
    axes[2].set_ylim(bottom=0)  # fractions: a t-interval's lower end below 0 is cut at 0
    axes[3].set(xlabel="forward lag K", ylabel="TV to the behaviour policy", title="final TV")
    by_run = {(r["loss"], r["K"], r["seed"]): r for r in runs}
    for axis, key, what in [(axes[4], "accuracy_late", "late accuracy"), (axes[5], "tv_final", "final TV")]:
        present, means, halves = [], [], []
        for k in (k for k in lags if k > 1):
            seeds = [s for (loss, kk, s) in by_run if loss == "vaco" and kk == k and ("ppo-clip", k, s) in by_run]
            if seeds:
                mean, half, _ = t_interval([by_run["vaco", k, s][key] - by_run["ppo-clip", k, s][key] for s in seeds])
                present.append(k), means.append(mean), halves.append(0.0 if np.isnan(half) else half)
        axis.errorbar(present, means, yerr=halves, color="black", marker="D", capsize=3, ls="none")
        axis.axhline(0, color="grey", lw=0.8)
        axis.set(xlabel="forward lag K", ylabel="VACO − PPO-clip", title=f"{what}, paired by seed, 95% t-interval")
    for axis in axes[1:]:
        axis.set_xscale("log", base=2)
        axis.set_xticks(lags, [str(k) for k in lags])
        axis.minorticks_off()
    for axis in axes:
        axis.grid(alpha=0.3)
    F._legend_below(figure, grid, ncol=4)
    F.save(figure, Path(path), "PPO-clip and VACO under forward lag K")


def table_report(out: str, options):
    def report(records: dict):
        if not records:
            return
        ordered = dict(
            sorted(records.items(), key=lambda kv: (kv[1]["spec"]["loss"], kv[1]["spec"]["K"], kv[1]["spec"]["seed"]))
        )
        write_rows(os.path.join(out, "runs.csv"), [run_row(r) for r in ordered.values()])
        curves = [
            {"loss": r["spec"]["loss"], "K": r["spec"]["K"], "seed": r["spec"]["seed"], **e}
            for r in ordered.values()
            for e in r["evals"]
        ]
        write_rows(os.path.join(out, "curves.csv"), curves)
        with open(os.path.join(out, "summary.md"), "w") as handle:
            handle.write(table_summary(ordered))
        plot_table(ordered, os.path.join(out, "forward_lag.png"))

    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["sweep", "table"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", default="runs/gsm8k_forward_lag_work", help="start model, data, run folders, logs")
    parser.add_argument("--lags", type=int, nargs="+", help="K values (sweep: 1 16; table: 1 2 4 8 16)")
    parser.add_argument("--learning-rates", type=float, nargs="+", help="sweep: 1e-4 3e-4 5e-4 1e-3; table: 3e-4")
    parser.add_argument("--seeds", type=int, nargs="+", help="sweep: 1; table: 1 2 3")
    parser.add_argument(
        "--tv-threshold", type=float, help="VACO's delta, the filter acts at D > delta/2 (sweep: 0.05; table: 0.03)"
    )
    parser.add_argument("--total-steps", type=int, default=128, help="optimizer steps per run (a multiple of every K)")
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, default=16, help="greedy evaluation every this many optimizer steps")
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--report-only", action="store_true", help="rebuild the outputs from the records; no training")
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel (subprocesses, one thread each)")
    options = parser.parse_args(argv)
    sweep = options.stage == "sweep"
    lags = options.lags or ([1, 16] if sweep else [1, 2, 4, 8, 16])
    rates = options.learning_rates or ([1e-4, 3e-4, 5e-4, 1e-3] if sweep else [3e-4])
    seeds = options.seeds or ([1] if sweep else [1, 2, 3])
    # The table's setting, chosen by the sweep (docs/gsm8k_forward_lag.md): the largest learning rate at which
    # K = 1 still learns, and the delta whose budget the stale minibatches of K = 16 cross now and then.
    if options.tv_threshold is None:
        options.tv_threshold = 0.05 if sweep else 0.03
    bad = [k for k in lags if k < 1 or options.total_steps % k]
    if bad or options.total_steps < 1:
        parser.error(f"--total-steps ({options.total_steps}) must be a positive multiple of every lag (got {lags})")
    if not 0 < options.tv_threshold < 2 or any(not 0 < lr < 1 for lr in rates):
        parser.error("--tv-threshold must be in (0, 2) and learning rates in (0, 1)")
    if options.workers < 1 or any(seed < 0 for seed in seeds):
        parser.error("--workers must be >= 1 and seeds >= 0")
    torch.set_num_threads(1)
    os.makedirs(options.out, exist_ok=True)
    common = {
        "tv_threshold": options.tv_threshold, "total_steps": options.total_steps,
        "prompts_per_step": options.prompts_per_step, "num_generations": options.num_generations,
        "temperature": options.temperature, "eval_every": options.eval_every, "eval_size": options.eval_size,
        "task": TASK,
    }  # fmt: skip
    specs = []
    if sweep:
        for lr in rates:
            for k in lags:
                specs.append({"loss": "ppo-clip", "K": k, "seed": seeds[0], "learning_rate": lr, **common})
        report = sweep_report(options.out)
    else:
        # Seed by seed, so that a table stopped early holds whole seeds.
        for seed in seeds:
            for k in lags:
                for loss in ["ppo-clip", "vaco"]:
                    spec = {"loss": loss, "K": k, "seed": seed, "learning_rate": rates[0], **common}
                    if k == 1 and loss == "vaco":
                        spec["same_as"] = {**spec, "loss": "ppo-clip"}
                    specs.append(spec)
        report = table_report(options.out, options)
    if options.report_only:
        report(load_records(os.path.join(options.out, "records")))
        return
    begin = time.time()
    records = run_all(specs, options.out, options.work, report, options.workers)
    wanted = {record_name(s) for s in specs}
    print(f"{len(wanted & set(records))}/{len(wanted)} runs recorded in {options.out}/records ({time.time() - begin:.0f} s)")


if __name__ == "__main__":
    main()
