"""The forward-lag experiment on a model that learns, on a CPU: PPO-clip vs VACO at K = 1, 2, 4, 8.

1. A synthetic arithmetic task in GSM8k's schema (tools/studies/make_arith_task.py).
2. A tiny random Llama (character-level tokenizer, tools/tiny_gsm8k.py) supervised on the
   task's rationales until its greedy accuracy on held-out problems reaches --sft-target (partial, so
   that RL has room to improve it).
3. GRPO with vaco_gsm8k.py from that checkpoint: each loss at each forward lag K and seed, the same
   number of optimizer steps (--total-steps) and samples at every K, greedy evaluation every 8 steps.

Writes <out>/setup.json (options, supervised steps and accuracy, seconds), <out>/runs.csv (one row per run:
final accuracy, clip or filter fraction, how often VACO is over budget, final TV), <out>/curves.csv (evaluation
accuracy against optimizer step), <out>/summary.md (the table per loss and K, with 95% t-intervals over seeds)
and <out>/forward_lag.png. The defaults are the committed grid (results/gsm8k_proxy).

Usage:
    python -m tools.studies.gsm8k_proxy_task --out results/gsm8k_proxy --workers 2    # the full grid, ~1 h on 2 cores
    python -m tools.studies.gsm8k_proxy_task --out runs/proxy --lags 1 8 --seeds 1    # a reduced run
    python -m tools.studies.gsm8k_proxy_task --out runs/proxy --work runs/proxy_work   # keep (and reuse) the SFT model
    python -m tools.studies.gsm8k_proxy_task --out results/gsm8k_proxy --replot       # redraw from runs.csv + curves.csv
"""

import argparse
import concurrent.futures
import contextlib
import csv
import json
import multiprocessing
import os
import shutil
import tempfile
import time

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vaco_gsm8k as V  # noqa: E402
from tools.grid.aggregate_figures import COLORS  # noqa: E402
from tools.stats import t_interval  # noqa: E402
from tools.studies.make_arith_task import make_task  # noqa: E402
from tools.tiny_gsm8k import tiny_model  # noqa: E402

# One colour per algorithm in every figure of the repository: PPO-clip is PPO's, VACO is VACO's.
LOSS_COLORS = {"ppo-clip": COLORS["ppo"], "vaco": COLORS["vaco"]}
MAX_NEW_TOKENS = 24  # the longest rationale, "9 * 9 = 81\n#### 81", is 18 characters plus the stop token


def greedy_accuracy(model, tokenizer, rows, max_new_tokens=MAX_NEW_TOKENS) -> float:
    from transformers import GenerationConfig

    model.eval()
    stop = V.stop_token_ids(model, tokenizer)
    model.generation_config = GenerationConfig(eos_token_id=stop, pad_token_id=tokenizer.pad_token_id)
    prompts = [V.encode_prompt(tokenizer, question) for question, _ in rows]
    batch = V.generate(model, prompts, GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens), stop, 0, "cpu")
    texts = V.decode_completions(tokenizer, batch)
    return float(np.mean([V.is_correct(text, reference) for text, (_, reference) in zip(texts, rows)]))


def supervise(folder: str, train_file: str, test_file: str, target: float, max_steps: int, seed: int) -> dict:
    """Teacher-forced training on the rationales until held-out greedy accuracy >= target; saves the model."""
    # A tiny Llama: 3 layers, hidden 128, character-level tokenizer.
    shape = dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_key_value_heads=4, max_position_embeddings=256
    )
    model, tokenizer = tiny_model("llama", seed, **shape)
    with open(train_file) as handle:
        records = [json.loads(line) for line in handle]
    held_out = V.load_jsonl(test_file)[:100]
    examples = []
    for record in records:
        prompt = V.encode_prompt(tokenizer, record["question"])
        completion = tokenizer(record["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        examples.append((prompt, completion))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    accuracy, step = 0.0, 0
    while step < max_steps:
        model.train()
        chosen = [examples[i] for i in rng.choice(len(examples), 32, replace=False)]
        width = max(len(p) + len(c) for p, c in chosen)
        ids = torch.full((32, width), tokenizer.pad_token_id)
        labels = torch.full((32, width), -100)
        mask = torch.zeros((32, width), dtype=torch.long)
        for row, (prompt, completion) in enumerate(chosen):
            sequence = prompt + completion
            ids[row, : len(sequence)] = torch.tensor(sequence)
            labels[row, len(prompt) : len(sequence)] = torch.tensor(completion)
            mask[row, : len(sequence)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 50 == 0:
            accuracy = greedy_accuracy(model, tokenizer, held_out)
            print(f"sft step {step}: loss {loss.item():.3f} held-out accuracy {accuracy:.2f}", flush=True)
            if accuracy >= target:
                break
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"sft_steps": step, "sft_accuracy": accuracy}


def run_one(spec: dict) -> dict:
    """One GRPO run from the supervised model; returns its runs.csv row and curves.csv rows.

    Top-level (picklable) so that --workers can run it in a subprocess: each run is a fresh process with one
    torch thread, and its log goes to a file so that parallel runs do not interleave their output.
    """
    torch.set_num_threads(1)
    loss, k, seed = spec["loss"], spec["K"], spec["seed"]
    args = V.Args(
        model_id=spec["model_dir"], data_file=spec["train_file"], eval_data_file=spec["test_file"],
        run_dir=spec["run_dir"], overwrite=True, checkpoint_every=0, loss=loss, forward_lag=k,
        total_steps=spec["total_steps"], seed=seed, prompts_per_step=spec["prompts_per_step"],
        num_generations=spec["num_generations"], micro_batch_size=spec["prompts_per_step"] * spec["num_generations"],
        max_new_tokens=MAX_NEW_TOKENS, learning_rate=spec["learning_rate"], temperature=spec["temperature"],
        eval_every=max(1, spec["eval_every"] // k), eval_size=spec["eval_size"], torch_threads=1,
    )  # fmt: skip
    os.makedirs(os.path.dirname(spec["log"]), exist_ok=True)
    with open(spec["log"], "w") as log, contextlib.redirect_stdout(log):
        history = V.main(args)
    key = "clip_fraction" if loss == "ppo-clip" else "filter_fraction"
    steps = history["steps"]
    over = [s["over_budget"] for s in steps] if loss == "vaco" else []
    when_over = [s["filter_fraction"] for s in steps if s.get("over_budget")]
    row = {
        "loss": loss, "K": k, "seed": seed,
        "accuracy_start": history["evals"][0]["accuracy"],
        "accuracy_end": history["evals"][-1]["accuracy"],
        "dropped_fraction": float(np.mean([s[key] for s in steps])),
        "over_budget_fraction": float(np.mean(over)) if over else "",
        "filter_fraction_when_over": float(np.mean(when_over)) if when_over else "",
        "tv_final": float(np.mean([r["tv_final"] for r in history["iterations"]])),
        "reward_start": history["iterations"][0]["reward"],
        "reward_end": history["iterations"][-1]["reward"],
    }  # fmt: skip
    curves = [{"loss": loss, "K": k, "seed": seed, **e} for e in history["evals"]]
    return {"spec": spec, "row": row, "curves": curves}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--losses", nargs="+", default=["ppo-clip", "vaco"])
    parser.add_argument("--lags", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--total-steps", type=int, default=256, help="optimizer steps per run (a multiple of every K)")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, default=32, help="greedy evaluation every this many optimizer steps")
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--max-number", type=int, default=6, help="operands 1..max-number (tools/studies/make_arith_task.py)")
    parser.add_argument("--train-size", type=int, default=2000, help="training problems (200 held out)")
    parser.add_argument("--sft-target", type=float, default=0.3)
    parser.add_argument("--sft-max-steps", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel, each a subprocess with one thread")
    parser.add_argument("--work", help="folder for data, models and run folders (default: a temporary one, removed)")
    parser.add_argument(
        "--replot", action="store_true", help="only rewrite summary.md and forward_lag.png from --out's CSVs (no runs)"
    )
    options = parser.parse_args()
    if options.replot:
        replot(options.out)
        return
    if any(options.total_steps % k for k in options.lags):
        parser.error("--total-steps must be a multiple of every lag")
    torch.set_num_threads(1)
    os.makedirs(options.out, exist_ok=True)
    work = options.work or tempfile.mkdtemp(prefix="gsm8k_proxy_")
    task = {name: getattr(options, name) for name in ("max_number", "train_size", "sft_target", "sft_max_steps")}
    data = os.path.join(work, "data")
    train_file, test_file = make_task(data, options.train_size, 200, seed=0, max_number=options.max_number)
    model_dir = os.path.join(work, "sft_model")
    start = time.time()
    sft = None
    if os.path.isfile(os.path.join(model_dir, "sft.json")):  # deterministic: a rerun with the same task reuses it
        with open(os.path.join(model_dir, "sft.json")) as handle:
            sft = json.load(handle)
        if sft.get("task") != task:
            sft = None
    if sft is None:
        sft = supervise(model_dir, train_file, test_file, options.sft_target, options.sft_max_steps, seed=0)
        sft.update(task=task, sft_seconds=round(time.time() - start))
        with open(os.path.join(model_dir, "sft.json"), "w") as handle:
            json.dump(sft, handle)
    print(f"supervised model: {sft} ({time.time() - start:.0f} s)", flush=True)

    shared = {
        "model_dir": model_dir, "train_file": train_file, "test_file": test_file, "sft": sft,
        **{name: getattr(options, name) for name in RUN_OPTIONS},
    }  # fmt: skip
    specs = []
    # Seed by seed, so that a grid stopped early holds whole seeds (every loss and lag).
    for seed in options.seeds:
        for loss in options.losses:
            for k in options.lags:
                name = f"{loss}_K{k}_s{seed}"
                run_dir = os.path.join(work, "runs", name)
                log = os.path.join(work, "logs", f"{name}.log")
                specs.append({**shared, "loss": loss, "K": k, "seed": seed, "run_dir": run_dir, "log": log})
    # A run whose result is in --work under the same settings is not run again (an interrupted grid resumes).
    results, todo = {}, []
    for index, spec in enumerate(specs):
        path = os.path.join(work, "results", os.path.basename(spec["run_dir"]) + ".json")
        if os.path.isfile(path):
            with open(path) as handle:
                saved = json.load(handle)
            if saved["spec"] == spec:
                results[index] = saved
                continue
        todo.append(index)
    run_start = time.time()

    def finished(index: int, result: dict):
        results[index] = result
        os.makedirs(os.path.join(work, "results"), exist_ok=True)
        with open(os.path.join(work, "results", os.path.basename(specs[index]["run_dir"]) + ".json"), "w") as handle:
            json.dump(result, handle)
        # Written after every run, in grid order, so a grid stopped early leaves the runs that finished.
        done = [results[i] for i in sorted(results)]
        write_outputs(options, [r["row"] for r in done], [c for r in done for c in r["curves"]], sft)
        print(f"done {len(results)}/{len(specs)}: {result['row']} ({time.time() - start:.0f} s)", flush=True)

    if options.workers > 1:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no forked torch state
        with concurrent.futures.ProcessPoolExecutor(options.workers, mp_context=context) as pool:
            futures = {pool.submit(run_one, specs[i]): i for i in todo}
            for future in concurrent.futures.as_completed(futures):
                finished(futures[future], future.result())
    else:
        for index in todo:
            finished(index, run_one(specs[index]))

    done = [results[i] for i in sorted(results)]
    write_outputs(options, [r["row"] for r in done], [c for r in done for c in r["curves"]], sft)
    with open(os.path.join(options.out, "setup.json"), "w") as handle:
        settings = {k: v for k, v in vars(options).items() if k not in ("out", "work")}
        seconds = {"seconds_runs": round(time.time() - run_start), "runs_computed": len(todo)}
        json.dump({**settings, **sft, **seconds}, handle, indent=2)
    if not options.work:
        shutil.rmtree(work)
    print(f"wrote {options.out}/runs.csv, curves.csv, summary.md, forward_lag.png, setup.json ({time.time() - start:.0f} s)")


# The options that decide a run's result (a saved result is reused only when all of them match).
RUN_OPTIONS = [
    "total_steps", "learning_rate", "prompts_per_step", "num_generations", "temperature", "eval_every", "eval_size"
]  # fmt: skip


def write_rows(path: str, rows: list):
    """CSV of dict rows, the values as they are; nothing is written for no rows."""
    if not rows:
        return
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_outputs(options, runs: list, curves: list, sft: dict):
    for name, rows in [("runs.csv", runs), ("curves.csv", curves)]:
        write_rows(os.path.join(options.out, name), rows)
    with open(os.path.join(options.out, "summary.md"), "w") as handle:
        handle.write(summary_markdown(runs, curves, options.total_steps))
    plot(options, runs, curves, sft)


def replot(out: str):
    """summary.md and forward_lag.png again from the runs.csv, curves.csv and setup.json a grid wrote."""
    tables = []
    for name in ("runs.csv", "curves.csv"):
        with open(os.path.join(out, name), newline="") as handle:
            rows = list(csv.DictReader(handle))
        for row in rows:
            for key, value in row.items():
                if key in ("K", "seed", "step"):
                    row[key] = int(value)
                elif key != "loss" and value != "":
                    row[key] = float(value)
        tables.append(rows)
    runs, curves = tables
    with open(os.path.join(out, "setup.json")) as handle:
        setup = json.load(handle)
    options = argparse.Namespace(
        out=out, lags=sorted({r["K"] for r in runs}), total_steps=setup["total_steps"], eval_size=setup.get("eval_size")
    )
    with open(os.path.join(out, "summary.md"), "w") as handle:
        handle.write(summary_markdown(runs, curves, options.total_steps))
    plot(options, runs, curves, setup)
    print(f"wrote {out}/summary.md, forward_lag.png")


def mean_interval(values) -> str:
    """mean [95% Student-t interval] over seeds (the mean alone for one seed), tools/stats.py's interval."""
    mean, half, _ = t_interval(values)
    return f"{mean:.3f}" if np.isnan(half) else f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]"


def summary_markdown(runs: list, curves: list, total_steps: int) -> str:
    """One row per (loss, K): accuracy at the end and late in training (the mean of the evaluations from step
    total_steps / 2 on: less noisy than the last one), the change from the start, and the mechanism columns."""
    lines = [
        f"Greedy accuracy on the held-out problems; means over seeds with 95% t-intervals; late = the mean of the "
        f"evaluations at steps >= {total_steps // 2}.",
        "",
        "| loss | K | seeds | accuracy at the end | late accuracy | late − start | clip / filter fraction | "
        "minibatches over budget | filter fraction when over | final TV |",
        "|---|---:|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for loss in dict.fromkeys(r["loss"] for r in runs):
        for k in sorted({r["K"] for r in runs if r["loss"] == loss}):
            chosen = [r for r in runs if r["loss"] == loss and r["K"] == k]
            late, change = [], []
            for r in chosen:
                evals = [c for c in curves if (c["loss"], c["K"], c["seed"]) == (loss, k, r["seed"])]
                late.append(np.mean([c["accuracy"] for c in evals if c["step"] >= total_steps // 2]))
                change.append(late[-1] - r["accuracy_start"])
            over = [r["over_budget_fraction"] for r in chosen if r["over_budget_fraction"] != ""]
            when = [r["filter_fraction_when_over"] for r in chosen if r["filter_fraction_when_over"] != ""]
            lines.append(
                f"| {loss} | {k} | {len(chosen)} | {mean_interval([r['accuracy_end'] for r in chosen])} | "
                f"{mean_interval(late)} | {mean_interval(change)} | "
                f"{np.mean([r['dropped_fraction'] for r in chosen]):.4f} | "
                f"{f'{np.mean(over):.4f}' if over else '–'} | {f'{np.mean(when):.3f}' if when else '–'} | "
                f"{np.mean([r['tv_final'] for r in chosen]):.4f} |"
            )
    return "\n".join(lines) + "\n"


def plot(options, runs, curves, sft):
    """Accuracy against step per loss (one panel each, darker at larger K, 95% t-band over seeds), the clipped or
    filtered fraction and the final TV against K (mean ± 95% t-interval over seeds), with VACO's budget δ/2; laid out
    for the documentation's column (tools/grid/aggregate_figures.py), PNG and SVG."""
    from pathlib import Path

    import matplotlib
    from matplotlib.colors import to_rgb

    from tools.grid import aggregate_figures as F

    matplotlib.use("Agg")

    def interval(values):
        mean, half, _ = t_interval(values)
        return mean, 0.0 if np.isnan(half) else half

    losses = [loss for loss in LOSS_COLORS if any(r["loss"] == loss for r in runs)]
    figure, grid = F._figure(2, 2, 2.9)
    axes = list(grid.flat)[: len(losses)] + list(grid.flat)[2:]
    for axis in list(grid.flat)[len(losses) : 2]:
        axis.remove()
    for i, loss in enumerate(losses):
        for j, k in enumerate(options.lags):
            rows = [c for c in curves if c["loss"] == loss and c["K"] == k]
            if not rows:
                continue
            shade = 0.35 + 0.65 * (j + 1) / len(options.lags)  # the loss's colour, darker at larger K
            color = tuple(1 - shade * (1 - v) for v in to_rgb(LOSS_COLORS[loss]))
            steps = sorted({c["step"] for c in rows})
            mean, half = np.array([interval([c["accuracy"] for c in rows if c["step"] == s]) for s in steps]).T
            axes[i].plot(steps, mean, "-o", ms=3, color=color, label=f"{F.display_name(loss)}, K = {k}")
            axes[i].fill_between(steps, mean - half, mean + half, color=color, alpha=0.12, lw=0)
        axes[i].axhline(sft["sft_accuracy"], color="k", lw=0.8, ls=":", label="supervised start")
        axes[i].set(xlabel="optimizer step", ylabel="greedy accuracy", title={"ppo-clip": "PPO-clip"}.get(loss, "VACO"))
    for offset, loss in zip((-0.04, 0.04), losses):
        chosen = [r for r in runs if r["loss"] == loss]
        lags = [k for k in options.lags if any(r["K"] == k for r in chosen)]
        x = np.array(lags) * np.exp(offset)  # side by side on the log axis
        for axis, key, name in (
            (axes[-2], "dropped_fraction", "clip fraction (PPO-clip)" if loss == "ppo-clip" else "filter fraction (VACO)"),
            (axes[-1], "tv_final", {"ppo-clip": "PPO-clip"}.get(loss, "VACO")),
        ):
            mean, half = np.array([interval([r[key] for r in chosen if r["K"] == k]) for k in lags]).T
            axis.errorbar(x, mean, yerr=half, fmt="-o", ms=4, capsize=2, color=LOSS_COLORS[loss], label=name)
    half_delta = V.Args.tv_threshold / 2
    axes[-1].axhline(half_delta, color="k", ls="--", lw=0.9, label=f"VACO's budget δ/2 = {half_delta:g}")
    axes[-2].set(xlabel="forward lag K", ylabel="fraction of tokens", xscale="log", title="clipped vs filtered")
    axes[-1].set(xlabel="forward lag K", ylabel="TV after the update", xscale="log", title="final TV")
    axes[-1].set_ylim(bottom=0)
    for axis in axes[-2:]:
        axis.set_xticks(options.lags, [str(k) for k in options.lags])
        axis.minorticks_off()
    for axis in axes:
        axis.grid(alpha=0.3)
    F._legend_below(figure, grid, ncol=4)
    F.save(figure, Path(options.out) / "forward_lag.png", "Accuracy, clipping and TV against the forward lag K")


if __name__ == "__main__":
    main()
