"""GPU check for the MuJoCo scripts: the paper's shape with the networks on CUDA and the envs on CPU, and the
agreement of a short run on CUDA with the same run on the CPU.

1. Throughput. Each script (--scripts) trains at the paper's shape (HalfCheetah-v5, 500 envs x 1000 steps,
   EnvPool with one thread per core, lag 0, --cuda) for --iterations iterations; the first warms up CUDA and
   is not counted. Reported per script: env-steps/s over the counted iterations' rollout and update time, and
   that time split into rollout and update. One more row trains ppo_mujoco with the update on the CPU
   (--torch-threads one per core) for comparison.
2. Agreement. A short run (HalfCheetah-v5 on gymnasium's SyncVectorEnv, 64 envs x 16 steps, one iteration of
   4 epochs x 4 minibatches) of each script, once on the CPU and once with --cuda. The action noise is drawn on
   the CPU in both (torch.randn_like is replaced by a CPU draw moved to the device: on the CPU the same stream as
   before), so the two runs differ only in how the device rounds. One iteration of 16 steps keeps the envs' chaos
   from growing those differences into different trajectories. Reported: the largest relative difference of the
   logged losses and of the final weights (|cuda - cpu| / max |cpu| per tensor). The tolerance is calibrated on
   the CPU: the `reference` is the same difference between two CPU runs, one with its action noise scaled by
   1 + 1e-6, a change of the size of float32 rounding (on a 2-core CPU it gave 1.7e-3 on the losses and 1.4e-2 on
   the weights for PPO: Adam turns near-zero gradients into full-size steps, so weights that have barely moved
   differ by a visible fraction). The check passes when the CUDA run differs by at most --factor (10) times the
   reference, in both measures: a device that rounds like a CPU passes, one that computes something else (or
   float32 matmuls in TF32, ~1e-3 per product) does not.

Budget: about 2 to 4 minutes on one H100 with 16 CPU cores (an estimate: it has not run on a GPU yet).
Writes a JSON file (--out) and prints a table; exits 1 when the agreement fails.

Usage:
    python -m tools.bench.mujoco_gpu_check --out mujoco_gpu_check.json          # on a machine with a GPU
    python -m tools.bench.mujoco_gpu_check --device cpu --num-envs 8 --num-steps 64 --scripts ppo_mujoco  # dry path
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["ppo_mujoco", "vaco_mujoco", "spo_mujoco", "impala_mujoco"]
AGREEMENT_SHAPE = ["--env-id", "HalfCheetah-v5", "--env-backend", "gymnasium", "--num-envs", "64", "--num-steps", "16"]
AGREEMENT_SHAPE += ["--total-timesteps", "1024", "--update-epochs", "4", "--num-minibatches", "4"]
LOSSES = ("losses/value_loss", "losses/policy_loss")
# Runs a script with the action noise drawn on the CPU whatever the device (see the module docstring).
CPU_NOISE = """import os, runpy, sys, torch
scale = float(os.environ.get("NOISE_SCALE", "1"))
torch.randn_like = lambda t: (torch.randn(t.shape, dtype=t.dtype) * scale).to(t.device)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def cores():
    return len(os.sched_getaffinity(0))


def run_script(script, flags, run_dir, cpu_noise=False, env=None):
    """Train `script` with `flags` into run_dir; its TensorBoard scalars as {tag: [values per iteration]}."""
    prefix = ["-c", CPU_NOISE] if cpu_noise else []
    cmd = [sys.executable, *prefix, str(ROOT / f"{script}.py"), *flags, "--eval-episodes", "0", "--run-dir", run_dir]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    )
    if proc.returncode:
        raise SystemExit(f"error: {script} failed:\n{proc.stderr[-2000:]}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir)
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def throughput(script, options, device, torch_threads=1):
    """Env-steps/s and the rollout/update seconds of the iterations after the first, at the paper's shape."""
    flags = ["--env-id", "HalfCheetah-v5", "--env-backend", "envpool", "--num-envs", str(options.num_envs)]
    flags += ["--num-steps", str(options.num_steps), "--lag", "0", "--torch-threads", str(torch_threads)]
    flags += ["--total-timesteps", str(options.num_envs * options.num_steps * options.iterations)]
    flags += ["--cuda"] if device == "cuda" else []
    with tempfile.TemporaryDirectory() as run_dir:
        scalars = run_script(script, flags, run_dir)
    rollout, update = (scalars[f"perf/{part}_seconds"] for part in ("rollout", "update"))  # cumulative per iteration
    counted = options.iterations - 1
    rollout_s, update_s = rollout[-1] - rollout[0], update[-1] - update[0]
    steps = counted * options.num_envs * options.num_steps
    return {"sps": steps / (rollout_s + update_s), "rollout_seconds": rollout_s, "update_seconds": update_s}


def final_weights(run_dir):
    import torch

    return torch.load(next(Path(run_dir).glob("*.cleanrl_model")), weights_only=True)["agent"]


def difference(a, b):
    """The largest relative difference of two runs: logged losses (per iteration) and final weights (per tensor)."""
    losses = max(abs(x - y) / max(abs(y), 1e-8) for tag in LOSSES for x, y in zip(a[0][tag], b[0][tag]))
    weights = max(((a[1][k] - b[1][k]).abs().max() / b[1][k].abs().max().clamp(min=1e-8)).item() for k in b[1])
    return {"losses": losses, "weights": weights}


def agreement_run(script, flags, env=None):
    with tempfile.TemporaryDirectory() as run_dir:
        scalars = run_script(script, [*AGREEMENT_SHAPE, *flags, "--save-model"], run_dir, cpu_noise=True, env=env)
        return scalars, final_weights(run_dir)


def agreement(script, device):
    """The short run on the CPU, on `device` and (the reference) on the CPU with the noise scaled by 1 + 1e-6."""
    cpu = agreement_run(script, [])
    other = agreement_run(script, ["--cuda"] if device == "cuda" else [])
    reference = agreement_run(script, [], env={"NOISE_SCALE": repr(1 + 1e-6)})
    return {"device": difference(other, cpu), "reference": difference(reference, cpu)}


def table(result):
    lines = [
        f"MuJoCo GPU check on {result['device_name']} ({result['cores']} CPU cores): "
        f"{result['num_envs']} envs x {result['num_steps']} steps, HalfCheetah-v5, EnvPool",
        "| script | update on | env-steps/s | rollout s | update s |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result["throughput"]:
        lines.append(
            f"| {r['script']} | {r['update_on']} | {r['sps']:,.0f} | {r['rollout_seconds']:.1f} | {r['update_seconds']:.1f} |"
        )
    lines += ["", f"Agreement, largest relative difference (passes: at most {result['factor']:g} x the reference)"]
    lines += [
        "| script | losses | weights | reference: CPU, noise x (1 + 1e-6) (losses / weights) | passes |",
        "|---|---:|---:|---|---|",
    ]
    for r in result["agreement"]:
        d, ref = r["device"], r["reference"]
        lines.append(
            f"| {r['script']} | {d['losses']:.2e} | {d['weights']:.2e} | {ref['losses']:.2e} / {ref['weights']:.2e} "
            f"| {'yes' if r['passes'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the dry path (no GPU needed)")
    parser.add_argument("--scripts", nargs="+", choices=SCRIPTS, default=SCRIPTS)
    parser.add_argument("--num-envs", type=int, default=500)
    parser.add_argument("--num-steps", type=int, default=1000)
    parser.add_argument("--iterations", type=int, default=2, help="training iterations per script; the first is not counted")
    parser.add_argument("--factor", type=float, default=10.0, help="tolerance: this many times the CPU's reference")
    parser.add_argument("--out", help="write the result as JSON to this file")
    options = parser.parse_args(argv)
    if options.num_envs < 1 or options.num_steps < 1:
        parser.exit(2, "error: --num-envs and --num-steps must be positive\n")
    if options.iterations < 2:
        parser.exit(2, "error: --iterations must be at least 2 (the first is not counted)\n")
    if not 0 < options.factor < float("inf"):
        parser.exit(2, "error: --factor must be a positive number\n")
    if options.out and not os.path.isdir(os.path.dirname(os.path.abspath(options.out))):
        parser.exit(2, f"error: --out: no such folder: {os.path.dirname(os.path.abspath(options.out))}\n")
    import torch

    if options.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "error: CUDA is not available here (--device cpu runs the dry path)\n")
    name = torch.cuda.get_device_name() if options.device == "cuda" else "the CPU (dry path)"
    result = {"device_name": name, "cores": cores(), "factor": options.factor, "throughput": [], "agreement": []}
    result.update(num_envs=options.num_envs, num_steps=options.num_steps, iterations=options.iterations)
    for script in options.scripts:
        row = throughput(script, options, options.device)
        result["throughput"].append({"script": script, "update_on": options.device, **row})
        print(f"{script} on {options.device}: {row['sps']:,.0f} env-steps/s", flush=True)
    row = throughput("ppo_mujoco", options, "cpu", torch_threads=cores())
    result["throughput"].append({"script": "ppo_mujoco", "update_on": f"cpu, {cores()} threads", **row})
    for script in options.scripts:
        r = agreement(script, options.device)
        r["passes"] = all(r["device"][k] <= options.factor * r["reference"][k] for k in r["device"])
        result["agreement"].append({"script": script, **r})
        print(f"{script} agreement: {r['device']}", flush=True)
    result["passes"] = all(r["passes"] for r in result["agreement"])
    print("\n" + table(result))
    if options.out:
        Path(options.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["passes"] else 1


if __name__ == "__main__":
    sys.exit(main())
