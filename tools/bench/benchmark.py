"""Throughput of the MuJoCo scripts against the physical limit of this machine, as one table.

For one task and rollout shape it measures, in env-steps per second:
- env only: each backend (gymnasium SyncVectorEnv, EnvPool) stepped with random actions, through the same
  wrapper classes the scripts use (same-step autoreset included);
- physics limit: `mujoco.rollout` on the task's model with one thread per core, open loop, counted in
  env-steps (physics steps / the task's frame skip): no Python, no policy, no resets;
- training: each script at lag 0 and lag 8 for a few iterations, split into rollout and update time;
- with --baseline-rev REV: the same training runs of the scripts at git revision REV (checked out into a
  temporary worktree), interleaved with the current ones, and the speed-up of the current tree over REV.
- with --args: flags for the current tree's training runs only (e.g. --args="--torch-threads 2"), so that a flag is
  measured against the baseline's defaults.
- with --overlap, instead of all that: whether running a rollout and an update at the same time pays (what a fixed
  lag of 1 or more would allow). One rollout and one update of ppo_mujoco.py's loop (its functions and arithmetic,
  one torch thread, EnvPool with --threads), timed one after the other and at the same time (the rollout in a
  second Python thread: EnvPool and torch release the GIL), alternating, --repeats times each; with the process's
  CPU seconds and the load average of each.
Training SPS counts rollout and update time (not start-up). Absolute numbers on a shared machine drift by +-30%;
read the fractions and the ratios, and take the median of several --repeats. Each training row gives the 1-minute
load average at its (median) run's start. --out writes the table as JSON; --render prints the table of such a file
(docs/throughput.md's tables are rendered from the files under results/throughput/).

Usage: python -m tools.bench.benchmark --env-id Hopper-v5 --num-envs 8 --num-steps 256 --iterations 8 --baseline-rev main
       python -m tools.bench.benchmark --render results/throughput/paper.json
       python -m tools.bench.benchmark --overlap --num-envs 500 --num-steps 1000 --repeats 3
"""

import argparse
import contextlib
import copy
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
import torch
from mujoco import rollout
from torch.distributions.normal import Normal

import ppo_mujoco
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


def training(script, env_id, backend, num_envs, num_steps, iterations, lag, root=ROOT, extra=()):
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
            "--total-timesteps",
            str(num_envs * num_steps * iterations),
            "--eval-episodes",
            "0",
            "--run-dir",
            run_dir,
            *extra,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{script} failed:\n{proc.stderr[-2000:]}")
        summary = json.loads(Path(run_dir, "summary.json").read_text())
        summary["env_backend"] = json.loads(Path(run_dir, "args.json").read_text())["env_backend"]
    summary["load"] = load
    steps = summary["global_step"]
    return steps / (summary["rollout_seconds"] + summary["update_seconds"]), summary


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
        "--overlap", action="store_true", help="measure a rollout and an update, one after the other vs together"
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
    if args.overlap:
        result = overlap(args)
    else:
        with checkout(args.baseline_rev) if args.baseline_rev else contextlib.nullcontext() as baseline:
            result = run(args, baseline, extra)
    print("\n" + render(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def run(args, baseline, extra=()):
    """Measure every row; `baseline` is the checked-out --baseline-rev or None. Returns the table as a dict."""
    steps = max(1, args.env_steps // max(1, args.num_envs // 8))  # keep the env-only runs to a few seconds
    limit = physics_limit_sps(args.env_id, args.num_envs, steps, args.threads)
    # gymnasium's SyncVectorEnv steps on one core: its ceiling is the one-thread limit.
    one_core = limit if args.threads == 1 else physics_limit_sps(args.env_id, args.num_envs, steps, 1)
    rows = [row("physics limit (mujoco.rollout, %d threads)" % args.threads, limit)]
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
                runs.append(training(script, *shape, lag, extra=extra))
                if baseline is not None:
                    baseline_runs.append(training(script, *shape, lag, root=baseline))
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
                rows.append(row(f"train {script} lag {lag} ({b['env_backend']}) at {args.baseline_rev}", base_sps, b, speedup))
    title = f"{args.env_id}, {args.num_envs} envs x {args.num_steps} steps, {os.cpu_count()} cores"
    return {"title": title, "command": shlex.join(["python", "-m", "tools.bench.benchmark", *sys.argv[1:]]), "rows": rows}


def row(name, sps, summary=None, note=""):
    """One row of the table: a training row carries its time split and the load average at its start."""
    r = {"what": name, "sps": sps, "note": note}
    if summary is not None:
        r.update(rollout_seconds=summary["rollout_seconds"], update_seconds=summary["update_seconds"], load=summary["load"])
    return r


class Iterations:
    """ppo_mujoco.py's rollout and update (main's loop at --lag 1 --lag-mode fixed, one torch thread), as two calls
    that can run at the same time: each rollout writes a fresh batch, which the next update() trains on."""

    def __init__(self, env_id, num_envs, num_steps, threads):
        self.envs = EnvPoolEnvs(env_id, num_envs, 1, threads)
        obs_dim, self.act_dim = self.envs.single_observation_space.shape[0], self.envs.single_action_space.shape[0]
        torch.manual_seed(1)
        self.agent = ppo_mujoco.Agent(obs_dim, self.act_dim)
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=3e-4, eps=1e-5, fused=True)
        self.actor = copy.deepcopy(self.agent).requires_grad_(False)
        self.return_rms, self.rng = ppo_mujoco.RunningMeanStd(), np.random.default_rng(1)
        self.next_obs = torch.as_tensor(self.envs.reset(), dtype=torch.float32)
        self.discounted_return, self.episode_stats = np.zeros(num_envs, np.float32), ppo_mujoco.EpisodeStats(num_envs)
        self.shape, self.batch = (num_steps, num_envs, obs_dim), None

    def rollout(self):
        num_steps, num_envs, obs_dim = self.shape
        space = self.envs.single_action_space
        obs, next_obs_buf = torch.zeros(self.shape), np.zeros(self.shape, dtype=np.float32)
        actions, means = torch.zeros((2, num_steps, num_envs, self.act_dim))
        rewards, terminations, dones = np.zeros((3, num_steps, num_envs), dtype=np.float32)
        for step in range(num_steps):
            obs[step] = self.next_obs
            with torch.inference_mode():
                means[step], actions[step] = self.actor.get_action(self.next_obs)
            next_obs, rewards[step], terminations[step], truncated, next_obs_buf[step] = self.envs.step(
                np.clip(actions[step].numpy(), space.low, space.high)
            )
            dones[step] = np.logical_or(terminations[step], truncated)
            self.episode_stats.step(rewards[step], dones[step].astype(bool))
            self.next_obs = torch.as_tensor(next_obs, dtype=torch.float32)
        logprobs = Normal(means, self.actor.actor_logstd.exp()).log_prob(actions).sum(-1)
        scaled, self.discounted_return = ppo_mujoco.scale_rewards(
            rewards, dones, self.discounted_return, self.return_rms, 0.99
        )
        return (
            obs,
            actions,
            logprobs,
            scaled,
            torch.as_tensor(next_obs_buf),
            torch.as_tensor(terminations),
            torch.as_tensor(dones),
        )

    def update(self, batch, epochs=10, minibatches=32):
        obs, actions, logprobs, rewards, next_obs_buf, terminations, dones = batch
        agent = self.agent
        with torch.no_grad():
            values, next_values = agent.get_value(obs), agent.get_value(next_obs_buf)
            advantages, returns = ppo_mujoco.compute_gae(rewards, values, next_values, terminations, dones, 0.99, 0.95)
        b_obs = obs.reshape(-1, obs.shape[-1])
        flat = (agent.normalize(b_obs), actions.reshape(-1, self.act_dim), logprobs.reshape(-1))
        flat += (advantages.reshape(-1), returns.reshape(-1), values.reshape(-1))
        b_inds, size = np.arange(len(b_obs)), len(b_obs) // minibatches
        for _ in range(epochs):
            self.rng.shuffle(b_inds)
            e_nobs, e_actions, e_logprobs, e_advantages, e_returns, e_values = (x[torch.as_tensor(b_inds)] for x in flat)
            for start in range(0, len(b_obs), size):
                mb = slice(start, start + size)
                newlogprob = agent.get_dist(e_nobs[mb], normalized=True).log_prob(e_actions[mb]).sum(1)
                newvalue = agent.get_value(e_nobs[mb], normalized=True)
                mb_advantages = e_advantages[mb]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                loss = ppo_mujoco.policy_loss((newlogprob - e_logprobs[mb]).exp(), mb_advantages, 0.2)
                loss = loss + 0.5 * ppo_mujoco.value_loss(newvalue, e_values[mb], e_returns[mb], 0.2)
                loss.item()  # main checks that the loss is finite: a synchronisation per minibatch
                self.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                self.optimizer.step()
        agent.obs_rms.update(b_obs)

    def measure(self, together):
        """Wall, rollout and update seconds, CPU seconds of the process and the load at the start of one rollout and
        one update (of the previous rollout's batch), one after the other or together."""
        load, cpu, start, times = os.getloadavg()[0], time.process_time(), time.time(), {}

        def timed(name, fn, *a):
            t = time.time()
            result = fn(*a)
            times[name] = time.time() - t
            return result

        if together:
            rollout_thread = threading.Thread(target=lambda: times.update(batch=timed("rollout", self.rollout)))
            rollout_thread.start()
            timed("update", self.update, self.batch)
            rollout_thread.join()
            self.batch = times.pop("batch")
        else:
            batch = timed("rollout", self.rollout)
            timed("update", self.update, self.batch)
            self.batch = batch
        wall = time.time() - start
        return {
            "wall": wall,
            "rollout": times["rollout"],
            "update": times["update"],
            "cpu": time.process_time() - cpu,
            "load": load,
        }


def overlap(args):
    """--overlap: alternating measurements of a rollout and an update, one after the other and together."""
    torch.set_num_threads(1)
    iterations = Iterations(args.env_id, args.num_envs, args.num_steps, args.threads)
    iterations.batch = iterations.rollout()  # the first update's batch
    runs = {"sequential": [], "together": []}
    for i in range(args.repeats):  # ABBA: drift hits both alike
        for together in (False, True) if i % 2 == 0 else (True, False):
            name = "together" if together else "sequential"
            runs[name].append(iterations.measure(together))
            print(name, {k: round(v, 2) for k, v in runs[name][-1].items()}, flush=True)
    title = (
        f"{args.env_id}, {args.num_envs} envs x {args.num_steps} steps, {os.cpu_count()} cores, "
        f"EnvPool {args.threads} threads, 1 torch thread"
    )
    return {"title": title, "command": shlex.join(["python", "-m", "tools.bench.benchmark", *sys.argv[1:]]), "overlap": runs}


def render_overlap(result):
    runs = result["overlap"]
    lines = [
        f"{result['title']}: `{result['command']}`",
        "",
        "| run | rollout then update: wall / CPU s | together: wall / CPU s | load | together is |",
        "|---:|---|---|---|---:|",
    ]
    for i, (s, t) in enumerate(zip(runs["sequential"], runs["together"])):
        ratio = s["wall"] / t["wall"]
        lines.append(
            f"| {i + 1} | {s['rollout']:.1f} + {s['update']:.1f} = {s['wall']:.1f} / {s['cpu']:.1f} "
            f"| {t['rollout']:.1f} ∥ {t['update']:.1f}: {t['wall']:.1f} / {t['cpu']:.1f} "
            f"| {s['load']:.1f}, {t['load']:.1f} | {ratio:.2f}x |"
        )
    ratios = sorted(s["wall"] / t["wall"] for s, t in zip(runs["sequential"], runs["together"]))
    lines.append(f"| median | | | | {float(np.median(ratios)):.2f}x |")
    return "\n".join(lines)


def render(result):
    """The table of a result of run(), as Markdown; fractions are of the first two rows (the physics limits)."""
    if "overlap" in result:
        return render_overlap(result)
    rows = result["rows"]
    limit, one_core = rows[0]["sps"], rows[1 if "1 thread" in rows[1]["what"] else 0]["sps"]
    lines = [
        f"{result['title']}: `{result['command']}`",
        "",
        "| what | env-steps/s | of physics limit | of 1-thread limit | time split | load | notes |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        split = f"rollout {r['rollout_seconds']:.1f}s / update {r['update_seconds']:.1f}s" if "load" in r else ""
        load = f"{r['load']:.1f}" if "load" in r else ""
        lines.append(
            f"| {r['what']} | {r['sps']:,.0f} | {r['sps'] / limit:.2f} | {r['sps'] / one_core:.2f} | {split} | {load} | {r['note']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
