"""Step time of vaco_gsm8k.py on a CPU profile shape: wall time per iteration, tokens/s and the phase breakdown.

A random Qwen2-architecture model (hidden 256, 4 layers, a character-level tokenizer, built in code, nothing
downloaded) trains on the toy reward `digit_fraction` (tools/tiny_gsm8k.py), so every pass
does real work. Several scripts (e.g. the current one and an older revision saved to a file) run the same
shape in turn, interleaved, so that a shared machine's load falls on all of them alike.

Usage:
    python -m tools.bench.gsm8k_step_profile                                  # the current vaco_gsm8k.py
    git show <rev>:vaco_gsm8k.py > runs/old_vaco_gsm8k.py
    python -m tools.bench.gsm8k_step_profile --scripts runs/old_vaco_gsm8k.py vaco_gsm8k.py --repeats 2
    cp vaco_gsm8k.py runs/new_vaco_gsm8k.py    # the same script once more, with new options
    python -m tools.bench.gsm8k_step_profile --scripts runs/old_vaco_gsm8k.py vaco_gsm8k.py runs/new_vaco_gsm8k.py --last-flags=--final-tv-fraction=0.25
"""

import argparse
import importlib.util
import os
import shutil
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tools.tiny_gsm8k import digit_fraction, write_gsm8k_jsonl, write_tiny_model  # noqa: E402

SHAPE = ["--forward-lag=2", "--prompts-per-step=8", "--num-generations=4", "--micro-batch-size=16"]
SHAPE += ["--max-new-tokens=64", "--eval-every=0", "--learning-rate=1e-3", "--torch-threads=1", "--loss=vaco"]


def load_script(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", nargs="+", default=[os.path.join(ROOT, "vaco_gsm8k.py")])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--extra", nargs="*", default=[], help="more vaco_gsm8k.py flags for every run")
    parser.add_argument("--last-flags", nargs="*", default=[], help="flags for the last script only (e.g. new options)")
    options = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="gsm8k_profile_")
    # A Qwen2-architecture model: 4 layers, hidden 256, character-level tokenizer.
    shape = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, max_position_embeddings=1024)
    model = write_tiny_model(os.path.join(folder, "model"), "qwen2", 0, **shape)
    data = write_gsm8k_jsonl(os.path.join(folder, "train.jsonl"))
    modules = [load_script(path, f"profiled_{i}") for i, path in enumerate(options.scripts)]
    results = {path: [] for path in options.scripts}
    if len(set(options.scripts)) < len(options.scripts):
        parser.error("--scripts must differ")
    for repeat in range(options.repeats):
        for index, (path, module) in enumerate(zip(options.scripts, modules)):
            module.compute_reward = digit_fraction
            run_dir = os.path.join(folder, f"run_{repeat}_{len(results[path])}_{os.path.basename(path)}")
            argv = [f"--model-id={model}", f"--data-file={data}", f"--run-dir={run_dir}", *SHAPE, *options.extra]
            argv += options.last_flags if index == len(modules) - 1 else []
            args = module.parse_args(argv + [f"--num-iterations={options.iterations}"])
            start, cpu_start = time.perf_counter(), time.process_time()
            history = (module.main if hasattr(module, "main") else module.train)(args)  # train in older revisions
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            sequences = args.forward_lag * args.prompts_per_step * args.num_generations
            tokens = sum(r["response_length"] * sequences for r in history["iterations"])
            results[path].append((wall, cpu, tokens, history["iterations"]))
    # CPU seconds (one torch thread) measure the work done; wall seconds also count waiting for a shared CPU.
    shutil.rmtree(folder)
    for path, runs in results.items():
        wall, cpu, tokens = (sum(r[i] for r in runs) for i in range(3))
        count = sum(len(r[3]) for r in runs)
        print(
            f"{path}: {cpu / count:.2f} CPU s per iteration ({tokens / cpu:.0f} generated tokens per CPU s), "
            f"wall {wall / count:.2f} s per iteration ({tokens / wall:.0f} tokens/s); model load included"
        )
        phases = {}
        for _, _, _, iterations in runs:
            for record in iterations:
                for key, value in record.items():
                    if key.endswith("_seconds") and key != "iteration_seconds":
                        phases[key] = phases.get(key, 0.0) + value / count
        if phases:
            total = sum(phases.values())
            print("  " + ", ".join(f"{k[:-8]} {v:.2f} s ({100 * v / total:.0f}%)" for k, v in sorted(phases.items())))


if __name__ == "__main__":
    main()
