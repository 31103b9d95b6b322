"""GPU check for vaco_gsm8k.py without the hub: generation and training tokens/s and peak memory at K = 1 and 8,
and a one-process torchrun on NCCL.

A Qwen2-architecture model of Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads, MLP 4864,
vocabulary 151,936, tied embeddings) is built from a `Qwen2Config` with random weights and saved to a temporary
folder with the character-level tokenizer of tools/tiny_gsm8k.py; nothing is downloaded.
vaco_gsm8k.py's own `main()` then runs on it in this process, with bf16 autocast on CUDA, at the paper's
minibatch (32 prompts x 8 completions, micro-batches of 16) and 400 new tokens, for each forward lag K: one
generation batch of K x 32 prompts and K optimizer steps per iteration. A random model almost never emits its
stop token, so every completion is 400 tokens long: the numbers are for full-length completions. The reward is
the toy `digit_fraction` (a random model's GSM8k reward is always 0, which would give no gradient). Checkpoints
are not written (a 0.5B model's weights and Adam state are 6 GB of disk and seconds of write that measure the
disk, not the script).

Reported per K: generation tokens/s (completion tokens over the generate time), training tokens/s (prompt +
completion tokens of the training passes over their time), seconds per iteration and peak memory (CUDA: the
allocator's peak; CPU: the process's peak resident memory). The first iteration at the first K warms up CUDA
kernels and is not counted. Then `torchrun --standalone --nproc-per-node 1` starts this file as a worker that
initialises the NCCL process group (gloo on a CPU), checks an all-reduce and runs one short iteration of
vaco_gsm8k.py.

Budget: at the defaults, about 3 to 6 minutes on one H100 or H200 (an estimate: this tool has not yet run on
a GPU). Writes a JSON file (--out) and prints a table.

Usage:
    python -m tools.bench.gsm8k_gpu_check --out gpu_check.json                      # the 0.5B shape on the GPU
    python -m tools.bench.gsm8k_gpu_check --tiny --out /tmp/cpu.json                 # seconds, on a CPU (the tests)
    python -m tools.bench.gsm8k_gpu_check --hidden-size 1536 --layers 28 --heads 12 --intermediate-size 8960  # 1.5B
"""

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# Qwen2.5-0.5B's architecture (its config.json), with random weights.
QWEN_05B = dict(
    hidden_size=896, intermediate_size=4864, layers=24, heads=14, kv_heads=2, vocab_size=151936
)  # fmt: skip
TINY = dict(hidden_size=32, intermediate_size=64, layers=2, heads=2, kv_heads=1, vocab_size=128)
TINY_RUN = dict(prompts_per_step=4, num_generations=4, micro_batch_size=8, max_new_tokens=8, iterations=1)


def build_model_folder(folder: str, options) -> int:
    """A random Qwen2ForCausalLM of the requested shape and the tests' tokenizer, saved to `folder`; its size."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tools.tiny_gsm8k import make_tokenizer

    tokenizer = make_tokenizer()
    if options.vocab_size < len(tokenizer):
        raise SystemExit(f"error: --vocab-size must be >= {len(tokenizer)} (the tokenizer's size)")
    config = Qwen2Config(
        vocab_size=options.vocab_size,
        hidden_size=options.hidden_size,
        intermediate_size=options.intermediate_size,
        num_hidden_layers=options.layers,
        num_attention_heads=options.heads,
        num_key_value_heads=options.kv_heads,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def train_args(options, model_dir: str, data_file: str, run_dir: str, k: int, iterations: int, **extra):
    import vaco_gsm8k as V

    return V.Args(
        model_id=model_dir, data_file=data_file, run_dir=run_dir, overwrite=True, eval_every=0, loss="vaco",
        forward_lag=k, num_iterations=iterations, prompts_per_step=options.prompts_per_step,
        num_generations=options.num_generations, micro_batch_size=options.micro_batch_size,
        max_new_tokens=options.max_new_tokens, learning_rate=1e-6, cuda=options.device != "cpu",
        torch_threads=options.torch_threads, **extra,
    )  # fmt: skip


@contextlib.contextmanager
def benchmark_patches():
    """The toy reward (so gradients are not all zero) and no checkpoint writes, inside this process only."""
    import vaco_gsm8k as V

    from tools.tiny_gsm8k import digit_fraction

    saved = V.compute_reward, V.write_checkpoint_file
    V.compute_reward, V.write_checkpoint_file = digit_fraction, lambda path, state: None
    try:
        yield V
    finally:
        V.compute_reward, V.write_checkpoint_file = saved


def release_cuda_memory():
    gc.collect()
    torch.cuda.empty_cache()


def peak_memory_gib(cuda: bool) -> float:
    if cuda:
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def measure(options, model_dir: str, data_file: str, work: str) -> list[dict]:
    cuda = options.device != "cpu"
    rows = []
    with benchmark_patches() as V:
        for index, k in enumerate(options.lags):
            iterations = options.iterations + (1 if index == 0 and cuda else 0)  # one warm-up iteration on a GPU
            if cuda:  # the previous K's model and optimizer are garbage by now: free them, then count afresh
                release_cuda_memory()
                torch.cuda.reset_peak_memory_stats()
            args = train_args(options, model_dir, data_file, os.path.join(work, f"k{k}"), k, iterations)
            log = io.StringIO()
            begin = time.perf_counter()
            with contextlib.redirect_stdout(log):
                history = V.main(args)
            seconds = time.perf_counter() - begin
            counted = history["iterations"][iterations - options.iterations :]

            def mean(key):
                return sum(r[key] for r in counted) / len(counted)

            rows.append(
                {
                    "K": k,
                    "sequences_per_generation_batch": k * options.prompts_per_step * options.num_generations,
                    "iterations_measured": len(counted),
                    "generation_tokens_per_s": mean("generation_tokens_per_s"),
                    "training_tokens_per_s": mean("training_tokens_per_s"),
                    "iteration_seconds": mean("iteration_seconds"),
                    "generation_seconds": mean("generation_seconds"),
                    "training_seconds": mean("training_seconds"),
                    "response_length": mean("response_length"),
                    "peak_memory_gib": peak_memory_gib(cuda),
                    "peak_memory_kind": "CUDA allocator" if cuda else "host peak RSS",
                    "wall_seconds": seconds,
                }
            )
            print(f"K={k}: {rows[-1]}", flush=True)
    return rows


def torchrun_check(options, model_dir: str, data_file: str, work: str) -> dict:
    """`torchrun --standalone --nproc-per-node 1` of this file's worker: process group, all-reduce, one iteration."""
    backend = "nccl" if options.device != "cpu" else "gloo"
    if backend == "nccl":  # the worker is another process: hand it the memory this one cached
        release_cuda_memory()
    settings = dict(vars(options), model_dir=model_dir, data_file=data_file, work=work, backend=backend)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    command += ["--module", "tools.bench.gsm8k_gpu_check", "--worker", json.dumps(settings)]
    env = dict(os.environ, OMP_NUM_THREADS=str(options.torch_threads or 1))
    begin = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=options.torchrun_timeout)
    result = {"backend": backend, "returncode": done.returncode, "seconds": time.perf_counter() - begin}
    for line in done.stdout.splitlines():
        if line.startswith("worker: "):
            result.update(json.loads(line[len("worker: ") :]))
    if done.returncode:
        result["stderr_tail"] = done.stderr[-2000:]
    return result


def worker(settings: dict):
    """Runs under torchrun: the collective works, then vaco_gsm8k.py trains one short iteration."""
    options = argparse.Namespace(**settings)
    cuda = settings["backend"] == "nccl"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group(settings["backend"])
    value = torch.ones(4, device="cuda" if cuda else "cpu") * (torch.distributed.get_rank() + 1)
    torch.distributed.all_reduce(value)
    world = torch.distributed.get_world_size()
    expected = world * (world + 1) / 2
    report = {"world_size": world, "all_reduce_ok": bool(torch.all(value == expected).item())}
    options.max_new_tokens = min(options.max_new_tokens, 16)  # a short iteration: the launch path, not speed
    with benchmark_patches() as V:
        args = train_args(options, settings["model_dir"], settings["data_file"], os.path.join(options.work, "torchrun"), 1, 1)
        with contextlib.redirect_stdout(io.StringIO()):
            history = V.main(args)
    report["iterations_trained"] = len(history["iterations"])
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    print("worker: " + json.dumps(report), flush=True)


def table(result: dict) -> str:
    lines = [
        f"device: {result['device']}; model: Qwen2 {result['parameters'] / 1e6:.3g}M parameters (random weights), "
        f"{result['dtype']}; {result['prompts_per_step']} prompts x {result['num_generations']} completions per "
        f"minibatch, {result['max_new_tokens']} new tokens",
        "",
        "| K | sequences per generation batch | generation tokens/s | training tokens/s | s per iteration "
        "(generation, training) | peak memory GiB |",
        "|---:|---:|---:|---:|---|---:|",
    ]
    for row in result["runs"]:
        lines.append(
            f"| {row['K']} | {row['sequences_per_generation_batch']} | {row['generation_tokens_per_s']:,.0f} | "
            f"{row['training_tokens_per_s']:,.0f} | {row['iteration_seconds']:.2f} ({row['generation_seconds']:.2f}, "
            f"{row['training_seconds']:.2f}) | {row['peak_memory_gib']:.2f} ({row['peak_memory_kind']}) |"
        )
    run = result.get("torchrun")
    if run:
        ok = run["returncode"] == 0 and run.get("all_reduce_ok") and run.get("iterations_trained") == 1
        lines += ["", f"torchrun, 1 process, {run['backend']}: {'ok' if ok else 'FAILED'} ({run['seconds']:.0f} s)"]
        if not ok:
            lines.append(run.get("stderr_tail", ""))
    lines.append(f"total {result['total_seconds']:.0f} s")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json", help="JSON file for the results")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and budget (a CPU test in seconds)")
    parser.add_argument("--lags", type=int, nargs="+", default=[1, 8], help="forward lags K to measure")
    parser.add_argument("--hidden-size", type=int)
    parser.add_argument("--intermediate-size", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--vocab-size", type=int)
    parser.add_argument("--prompts-per-step", type=int)
    parser.add_argument("--num-generations", type=int)
    parser.add_argument("--micro-batch-size", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--iterations", type=int, help="iterations measured per K (default 1)")
    parser.add_argument("--torch-threads", type=int, default=None, help="CPU threads for torch (CPU runs)")
    parser.add_argument("--no-torchrun", action="store_true", help="skip the torchrun check")
    parser.add_argument("--torchrun-timeout", type=int, default=180)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        worker(json.loads(options.worker))
        return None
    shape = TINY if options.tiny else QWEN_05B
    run = TINY_RUN if options.tiny else dict(prompts_per_step=32, num_generations=8, micro_batch_size=16)
    run = {"max_new_tokens": 400, "iterations": 1, **run}
    for name, value in {**shape, **run}.items():
        if getattr(options, name) is None:
            setattr(options, name, value)
    numbers = {**shape, **run, "lags": options.lags, "torch_threads": options.torch_threads or 1}
    bad = [name for name, value in numbers.items() if any(v < 1 for v in (value if isinstance(value, list) else [value]))]
    if bad:
        parser.error(f"--{bad[0].replace('_', '-')} must be >= 1")
    if options.hidden_size % options.heads or options.heads % options.kv_heads:
        parser.error("--hidden-size must be a multiple of --heads, and --heads of --kv-heads")
    if options.device == "auto":
        options.device = "cuda" if torch.cuda.is_available() else "cpu"
    if options.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    if options.torch_threads:
        torch.set_num_threads(options.torch_threads)
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gsm8k_gpu_check_") as work:
        from tools.tiny_gsm8k import write_gsm8k_jsonl

        model_dir = os.path.join(work, "model")
        parameters = build_model_folder(model_dir, options)
        data_file = write_gsm8k_jsonl(os.path.join(work, "train.jsonl"))
        runs = measure(options, model_dir, data_file, work)
        torchrun = None if options.no_torchrun else torchrun_check(options, model_dir, data_file, work)
    cuda = options.device == "cuda"
    result = {
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})",
        "dtype": "bf16 autocast (fp32 weights)" if cuda else "fp32",
        "torch": torch.__version__,
        "parameters": parameters,
        "shape": {name: getattr(options, name) for name in QWEN_05B},
        **{name: getattr(options, name) for name in ("prompts_per_step", "num_generations", "micro_batch_size")},
        "max_new_tokens": options.max_new_tokens,
        "runs": runs,
        "torchrun": torchrun,
        "total_seconds": time.perf_counter() - begin,
    }
    with open(options.out, "w") as handle:
        json.dump(result, handle, indent=2)
    print(table(result))
    failed = torchrun is not None and not (torchrun["returncode"] == 0 and torchrun.get("all_reduce_ok"))
    if failed:
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
