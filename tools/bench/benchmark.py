"""Throughput of the MuJoCo scripts against the physical limit of this machine, as one table.

For one task and rollout shape it measures, in env-steps per second:
- env only: each backend (gymnasium SyncVectorEnv, EnvPool) stepped with random actions, through the same
  wrapper classes the scripts use (same-step autoreset included);
- physics limit: `mujoco.rollout` on the task's model with one thread per core, open loop, counted in
  env-steps (physics steps / the task's frame skip): no Python, no policy, no resets; measured at the start and
  again before each training run, the table gives the median and the notes the range (the 1-thread limit: once);
- training: each script at lag 0 and lag 8 for a few iterations, split into rollout and update time;
- with --baseline-rev REV: the same training runs of the scripts at git revision REV (checked out into a
  temporary worktree), interleaved with the current ones, and the speed-up of the current tree over REV.
- with --args: flags for the current tree's training runs only (e.g. --args="--torch-threads 2"), so that a flag is
  measured against the baseline's defaults.
- with --lag-mode: the lag mode of every training run, both revisions' (--args=--overlap needs fixed).
Training SPS counts rollout and update time (not start-up); from 3 iterations on, the notes add the SPS of the
iterations between the first and the last (a long run's pace: --overlap's first rollout and last update run alone),
and the cores the run kept busy (its CPU time over its wall time, start-up included).
Absolute numbers on a shared machine drift by +-30%; read the fractions and the ratios, and take the median of
several --repeats. Each training row gives the 1-minute load average at its (median) run's start. --out writes the
table as JSON; --render prints the table of such a file (docs/throughput.md's tables are rendered from the files
under results/throughput/).

Usage: python -m tools.bench.benchmark --env-id Hopper-v5 --num-envs 8 --num-steps 256 --iterations 8 --baseline-rev main
       python -m tools.bench.benchmark --render results/throughput/paper.json
       python -m tools.bench.benchmark --num-envs 500 --num-steps 1000 --iterations 4 --lags 1 --lag-mode fixed \
           --args=--overlap --baseline-rev main
"""

import argparse
import contextlib
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
from mujoco import rollout

from ppo_mujoco import EnvPoolEnvs, GymnasiumEnvs  # the scripts' own env wrappers

ROOT = Path(__file__).resolve().parents[2]

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
    start = time.perf_counter()
    for t in range(steps):
        envs.step(actions[t])
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * num_envs / elapsed


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
        start = time.perf_counter()
        r.rollout(model, data, state, control)
        elapsed = time.perf_counter() - start
    env.close()
    return num_envs * steps / elapsed


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


def training(script, env_id, backend, num_envs, num_steps, iterations, lag, lag_mode=None, root=ROOT, extra=()):
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            str(root / f"{script}.py"),
            "--env-id",
            env_id,
            *(["--env-backend", backend] if backend else []),
            "--num-envs",
            str(num_envs),
            "--num-steps",
            str(num_steps),
            "--lag",
            str(lag),
            *(["--lag-mode", lag_mode] if lag_mode else []),
            "--total-timesteps",
            str(num_envs * num_steps * iterations),
            "--eval-episodes",
            "0",
            "--run-dir",
            run_dir,
            *extra,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cpu_before, wall_start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        wall, cpu_after = time.perf_counter() - wall_start, resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode:
            raise SystemExit(f"{script} failed:\n{proc.stderr[-2000:]}")
        summary = json.loads(Path(run_dir, "summary.json").read_text())
        summary["env_backend"] = json.loads(Path(run_dir, "args.json").read_text())["env_backend"]
        summary["steady_sps"] = steady_sps(run_dir, num_envs * num_steps)
    summary["load"] = load
    # The cores the run kept busy: its CPU time (all threads, start-up included) over its wall time.
    cpu = cpu_after.ru_utime - cpu_before.ru_utime + cpu_after.ru_stime - cpu_before.ru_stime
    summary["cores_busy"] = cpu / wall
    steps = summary["global_step"]
    return steps / (summary["rollout_seconds"] + summary["update_seconds"]), summary


def steady_sps(run_dir, batch):
    """SPS of the iterations between the first and the last, from the logged cumulative rollout and update times
    (None below 3 iterations): a long run's pace, where --overlap's first rollout and last update run alone."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir)
    events.Reload()
    rollout, update = ([e.value for e in events.Scalars(f"perf/{part}_seconds")] for part in ("rollout", "update"))
    if len(rollout) < 3:
        return None
    return (len(rollout) - 2) * batch / (rollout[-2] + update[-2] - rollout[0] - update[0])


def median_run(runs):
    """The run with the median SPS (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r[0])[(len(runs) - 1) // 2]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=8, help="training iterations per script and lag")
    parser.add_argument("--env-steps", type=int, default=2000, help="vector steps for the env-only measurements")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for EnvPool and the physics limit")
    parser.add_argument(
        "--backend", choices=["gymnasium", "envpool"], help="backend for training (default: each revision's own default)"
    )
    parser.add_argument("--scripts", nargs="+", default=["ppo_mujoco", "vaco_mujoco", "spo_mujoco", "impala_mujoco"])
    parser.add_argument("--lags", nargs="+", type=int, default=[0, 8])
    parser.add_argument("--baseline-rev", help="also train the scripts at this git revision, interleaved, for a speed-up")
    parser.add_argument("--repeats", type=int, default=1, help="training runs per row (interleaved); the median is shown")
    parser.add_argument("--args", default="", help="flags for the current tree's training runs (not the baseline's)")
    parser.add_argument(
        "--lag-mode", choices=["uniform", "fixed"], help="--lag-mode of every training run (default: the scripts')"
    )
    parser.add_argument("--out", help="also write the table as JSON to this file")
    parser.add_argument("--render", metavar="JSON", help="print the table of a file written by --out, and nothing else")
    args = parser.parse_args(argv)
    if args.render:
        try:
            result = json.loads(Path(args.render).read_text())
        except (OSError, ValueError) as e:
            parser.exit(2, f"error: cannot read {args.render}: {e}\n")
        print(render(result))
        return
    if args.repeats < 1:
        parser.error("--repeats must be positive")
    try:
        extra = shlex.split(args.args)
    except ValueError as e:
        parser.error(f"--args: {e}")
    with checkout(args.baseline_rev) if args.baseline_rev else contextlib.nullcontext() as baseline:
        result = run(args, baseline, extra)
    print("\n" + render(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def run(args, baseline, extra=()):
    """Measure every row; `baseline` is the checked-out --baseline-rev or None. Returns the table as a dict."""
    steps = max(1, args.env_steps // max(1, args.num_envs // 8))  # keep the env-only runs to a few seconds
    limits = [physics_limit_sps(args.env_id, args.num_envs, steps, args.threads)]
    # gymnasium's SyncVectorEnv steps on one core: its ceiling is the one-thread limit.
    one_core = limits[0] if args.threads == 1 else physics_limit_sps(args.env_id, args.num_envs, steps, 1)
    rows = []  # the physics limit's row (--threads) goes first, once all its measurements are in

    def train(*a, **kw):
        """A training run, after one more measurement of the physics limit: the machine's speed drifts during a long
        benchmark, and the table's limit is the median of all of them."""
        limits.append(physics_limit_sps(args.env_id, args.num_envs, steps, args.threads))
        return training(*a, **kw)

    if args.threads > 1:
        rows.append(row("physics limit (mujoco.rollout, 1 thread)", one_core))
    for backend in ("gymnasium", "envpool"):
        rows.append(row(f"env only: {backend}", env_only_sps(backend, args.env_id, args.num_envs, steps, args.threads)))
    shape = (args.env_id, args.backend, args.num_envs, args.num_steps, args.iterations)
    flags = f" {shlex.join(extra)}" if extra else ""
    ppo_sps = {}
    for lag in args.lags:
        for script in args.scripts:
            runs, baseline_runs = [], []
            for _ in range(args.repeats):  # current and baseline alternate, so that drift hits both alike
                runs.append(train(script, *shape, lag, args.lag_mode, extra=extra))
                if baseline is not None:
                    baseline_runs.append(train(script, *shape, lag, args.lag_mode, root=baseline))
            sps, s = median_run(runs)
            ppo_sps.setdefault(lag, sps) if script == "ppo_mujoco" else None
            ratio = f"{sps / ppo_sps[lag]:.2f}x PPO" if lag in ppo_sps else ""
            rows.append(row(f"train {script} lag {lag} ({s['env_backend']}){flags}", sps, s, ratio))
            if baseline is not None:
                base_sps, b = median_run(baseline_runs)
                speedup = f"current is {sps / base_sps:.2f}x" + (
                    f" (per run: {', '.join(f'{r[0] / q[0]:.2f}' for r, q in zip(runs, baseline_runs))})"
                    if args.repeats > 1
                    else ""
                )
                if s.get("steady_sps") and b.get("steady_sps"):
                    speedup += f"; iterations 2 to n-1: {s['steady_sps'] / b['steady_sps']:.2f}x"
                rows.append(row(f"train {script} lag {lag} ({b['env_backend']}) at {args.baseline_rev}", base_sps, b, speedup))
    spread = f"{min(limits):,.0f} to {max(limits):,.0f}"
    note = f"median of {len(limits)}, one at the start and one before each training run: {spread}" if len(limits) > 1 else ""
    rows.insert(0, row("physics limit (mujoco.rollout, %d threads)" % args.threads, float(np.median(limits)), note=note))
    title = f"{args.env_id}, {args.num_envs} envs x {args.num_steps} steps, {os.cpu_count()} cores"
    title += f", --lag-mode {args.lag_mode}" if args.lag_mode else ""
    command = shlex.join(["python", "-m", "tools.bench.benchmark", *sys.argv[1:]])
    return {"title": title, "command": command, "rows": rows, "physics_limits": limits}


def row(name, sps, summary=None, note=""):
    """One row of the table: a training row carries its time split and the load average at its start."""
    r = {"what": name, "sps": sps, "note": note}
    if summary is not None:
        r.update(rollout_seconds=summary["rollout_seconds"], update_seconds=summary["update_seconds"], load=summary["load"])
        r.update(steady_sps=summary.get("steady_sps"), cores_busy=summary.get("cores_busy"))
    return r


def render(result):
    """The table of a result of run(), as Markdown; fractions are of the first two rows (the physics limits)."""
    rows = result["rows"]
    limit, one_core = rows[0]["sps"], rows[1 if "1 thread" in rows[1]["what"] else 0]["sps"]
    lines = [
        f"{result['title']}: `{result['command']}`",
        "",
        "| what | env-steps/s | of physics limit | of 1-thread limit | time split | load | notes |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        notes = [r["note"]] if r["note"] else []
        if r.get("steady_sps"):
            notes.append(f"iterations 2 to n-1: {r['steady_sps']:,.0f}/s, {r['steady_sps'] / limit:.2f} of the limit")
        if r.get("cores_busy"):
            notes.append(f"cores busy {r['cores_busy']:.2f}")
        r = {**r, "note": "; ".join(notes)}
        split = f"rollout {r['rollout_seconds']:.1f}s / update {r['update_seconds']:.1f}s" if "load" in r else ""
        load = f"{r['load']:.1f}" if "load" in r else ""
        lines.append(
            f"| {r['what']} | {r['sps']:,.0f} | {r['sps'] / limit:.2f} | {r['sps'] / one_core:.2f} | {split} | {load} | {r['note']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
