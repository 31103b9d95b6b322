"""Throughput of the MuJoCo scripts against the physical limit of this machine, as one table.

For one task and rollout shape it measures, in env-steps per second:
- env only: each backend (gymnasium SyncVectorEnv, EnvPool) stepped with random actions, through the same
  wrapper classes the scripts use (same-step autoreset included);
- physics limit: `mujoco.rollout` on the task's model with one thread per core, open loop, counted in
  env-steps (physics steps / the task's frame skip): no Python, no policy, no resets;
- training: each script at lag 0 and lag 8 for a few iterations, split into rollout and update time;
- with --baseline-rev REV: the same training runs of the scripts at git revision REV (checked out into a
  temporary worktree), interleaved with the current ones, and the speed-up of the current tree over REV.
Training SPS counts rollout and update time (not start-up), by wall clock and, with --iterations >= 2, per
CPU-second (the process's CPU time less that of a one-iteration run). On a busy shared machine wall-clock rates
drift far more than CPU-time rates (single-threaded rows only): read the fractions and ratios, and take the median
of several --repeats.

Usage: python tools/benchmark.py --env-id Hopper-v5 --num-envs 8 --num-steps 256 --iterations 8 --baseline-rev main
"""

import argparse
import contextlib
import functools
import json
import os
import resource
import subprocess
import sys
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
from mujoco import rollout

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ppo_mujoco import EnvPoolEnvs, GymnasiumEnvs  # noqa: E402  (the scripts' own env wrappers)

mujoco.set_mju_user_warning(lambda msg: None)


def env_only_sps(backend, env_id, num_envs, steps, threads):
    if backend == "envpool":
        envs = EnvPoolEnvs(env_id, num_envs, seed=1, num_threads=threads)
    else:
        envs = GymnasiumEnvs(env_id, num_envs, seed=1)
    space = envs.single_action_space
    rng = np.random.default_rng(0)
    actions = rng.uniform(space.low, space.high, (steps, num_envs) + space.shape).astype(np.float32)
    envs.reset()
    start, cpu_start = time.perf_counter(), time.process_time()
    for t in range(steps):
        envs.step(actions[t])
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    envs.close()
    return steps * num_envs / elapsed, steps * num_envs / cpu


def physics_limit_sps(env_id, num_envs, steps, threads):
    """Open-loop physics with mujoco.rollout, one MjData per thread, counted in env-steps: each of num_envs
    simulations starts from a reset state of the task and gets uniform random controls (as random actions)."""
    env = gym.make(env_id).unwrapped
    model, frame_skip = env.model, env.frame_skip
    sig = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state = np.zeros((num_envs, mujoco.mj_stateSize(model, sig)))
    for i in range(num_envs):
        env.reset(seed=i)
        mujoco.mj_getState(model, env.data, state[i], sig)
    rng = np.random.default_rng(0)
    low, high = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    control = rng.uniform(low, high, (num_envs, steps, model.nu)).repeat(frame_skip, axis=1)
    data = [mujoco.MjData(model) for _ in range(threads)]
    with rollout.Rollout(nthread=threads) as r:
        r.rollout(model, data, state, control[:, :frame_skip])  # warm-up: the thread pool
        start, cpu_start = time.perf_counter(), time.process_time()
        r.rollout(model, data, state, control)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    env.close()
    return num_envs * steps / elapsed, num_envs * steps / cpu


@contextlib.contextmanager
def checkout(rev):
    """The repository at git revision `rev`, checked out into a temporary worktree that is removed afterwards."""
    with tempfile.TemporaryDirectory() as parent:
        path = Path(parent, "baseline")
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True, capture_output=True
        )
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)


def child_cpu_seconds(cmd, cwd):
    """Run cmd; return the CompletedProcess and the CPU seconds (user + system) it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def training(script, env_id, backend, num_envs, num_steps, iterations, lag, root=ROOT):
    """Steps per second of training (rollouts and updates) by wall clock and per CPU-second, and the summary.
    The CPU-time rate is what a busy shared machine distorts least: the process's CPU time less that of a
    one-iteration run of the same kind (start-up, env construction), over the steps of the other iterations."""
    wall_sps, cpu, summary = run_training(script, env_id, backend, num_envs, num_steps, iterations, lag, root)
    if iterations < 2:
        return wall_sps, None, summary
    one_iteration_cpu = one_iteration_cpu_seconds(script, env_id, backend, num_envs, num_steps, lag, root)
    return wall_sps, (iterations - 1) * num_envs * num_steps / max(cpu - one_iteration_cpu, 1e-9), summary


@functools.cache
def one_iteration_cpu_seconds(script, env_id, backend, num_envs, num_steps, lag, root):
    return run_training(script, env_id, backend, num_envs, num_steps, 1, lag, root)[1]


def run_training(script, env_id, backend, num_envs, num_steps, iterations, lag, root):
    """One training run: its wall-clock SPS over rollouts and updates, its CPU seconds, its summary."""
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            str(root / f"{script}.py"),
            "--env-id",
            env_id,
            "--env-backend",
            backend,
            "--num-envs",
            str(num_envs),
            "--num-steps",
            str(num_steps),
            "--lag",
            str(lag),
            "--total-timesteps",
            str(num_envs * num_steps * iterations),
            "--eval-episodes",
            "0",
            "--run-dir",
            run_dir,
        ]
        proc, cpu = child_cpu_seconds(cmd, root)
        if proc.returncode:
            raise SystemExit(f"{script} failed:\n{proc.stderr[-2000:]}")
        summary = json.loads(Path(run_dir, "summary.json").read_text())
    steps = summary["global_step"]
    return steps / (summary["rollout_seconds"] + summary["update_seconds"]), cpu, summary


def median_run(runs):
    """The run with the median SPS (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r[0])[(len(runs) - 1) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=8, help="training iterations per script and lag")
    parser.add_argument("--env-steps", type=int, default=2000, help="vector steps for the env-only measurements")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for EnvPool and the physics limit")
    parser.add_argument("--backend", default="gymnasium", choices=["gymnasium", "envpool"], help="backend for training")
    parser.add_argument("--scripts", nargs="+", default=["ppo_mujoco", "vaco_mujoco", "spo_mujoco", "impala_mujoco"])
    parser.add_argument("--lags", nargs="+", type=int, default=[0, 8])
    parser.add_argument("--baseline-rev", help="also train the scripts at this git revision, interleaved, for a speed-up")
    parser.add_argument("--repeats", type=int, default=1, help="training runs per row (interleaved); the median is shown")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be positive")
    with checkout(args.baseline_rev) if args.baseline_rev else contextlib.nullcontext() as baseline:
        run(args, baseline)


def run(args, baseline):
    """Measure every row and print the table; `baseline` is the checked-out --baseline-rev or None."""
    steps = max(1, args.env_steps // max(1, args.num_envs // 8))  # keep the env-only runs to a few seconds
    limit, _ = physics_limit_sps(args.env_id, args.num_envs, steps, args.threads)
    # gymnasium's SyncVectorEnv steps on one core: its ceiling is the one-thread limit.
    one_core, one_core_cpu = physics_limit_sps(args.env_id, args.num_envs, steps, 1)
    rows = [("physics limit (mujoco.rollout, %d threads)" % args.threads, limit, None, "", "")]
    if args.threads > 1:
        rows.append(("physics limit (mujoco.rollout, 1 thread)", one_core, one_core_cpu, "", ""))
    for backend in ("gymnasium", "envpool"):
        sps, cpu_sps = env_only_sps(backend, args.env_id, args.num_envs, steps, args.threads)
        rows.append((f"env only: {backend}", sps, cpu_sps if backend == "gymnasium" else None, "", ""))
    shape = (args.env_id, args.backend, args.num_envs, args.num_steps, args.iterations)
    ppo_sps = {}
    for lag in args.lags:
        for script in args.scripts:
            runs, baseline_runs = [], []
            for _ in range(args.repeats):  # current and baseline alternate, so that drift hits both alike
                runs.append(training(script, *shape, lag))
                if baseline is not None:
                    baseline_runs.append(training(script, *shape, lag, root=baseline))
            sps, cpu_sps, s = median_run(runs)
            cpu_sps = statistics.median(r[1] for r in runs) if runs[0][1] else None
            ppo_sps.setdefault(lag, (sps, cpu_sps)) if script == "ppo_mujoco" else None
            ratio = f"{sps / ppo_sps[lag][0]:.2f}x PPO" if lag in ppo_sps else ""
            ratio += f" (CPU time: {cpu_sps / ppo_sps[lag][1]:.2f}x)" if lag in ppo_sps and cpu_sps else ""
            split = f"rollout {s['rollout_seconds']:.1f}s / update {s['update_seconds']:.1f}s"
            rows.append((f"train {script} lag {lag} ({args.backend})", sps, cpu_sps, split, ratio))
            if baseline is not None:
                base_sps, _, b = median_run(baseline_runs)
                base_cpu_sps = statistics.median(r[1] for r in baseline_runs) if cpu_sps else None
                split = f"rollout {b['rollout_seconds']:.1f}s / update {b['update_seconds']:.1f}s"
                speedup = f"current is {sps / base_sps:.2f}x"
                if cpu_sps:
                    speedup += f" (CPU time: {cpu_sps / base_cpu_sps:.2f}x)"
                if cpu_sps and args.repeats > 1:
                    pairs = ", ".join(f"{r[1] / q[1]:.2f}" for r, q in zip(runs, baseline_runs))
                    speedup += f"; per run, CPU time: {pairs}"
                name = f"train {script} lag {lag} ({args.backend}) at {args.baseline_rev}"
                rows.append((name, base_sps, base_cpu_sps, split, speedup))

    print(f"\n{args.env_id}, {args.num_envs} envs x {args.num_steps} steps, {os.cpu_count()} cores")
    print(
        "| what | env-steps/s | of physics limit | of 1-thread limit | per CPU-second | of 1-thread limit, CPU time "
        "| time split | vs PPO |\n|---|---:|---:|---:|---:|---:|---|---|"
    )
    for name, sps, cpu_sps, split, ratio in rows:
        cpu = f"{cpu_sps:,.0f} | {cpu_sps / one_core_cpu:.2f}" if cpu_sps else " | "
        print(f"| {name} | {sps:,.0f} | {sps / limit:.2f} | {sps / one_core:.2f} | {cpu} | {split} | {ratio} |")


if __name__ == "__main__":
    main()
