"""Throughput of ppo_mujoco.py against Stable-Baselines3 PPO at CleanRL's shape, as one command.

Both train the same task, gymnasium's Hopper-v5 (ppo_mujoco.py with `--env-backend gymnasium`: the same env code
as SB3's), with the same hyperparameters: one env, 2048-step rollouts, 10 epochs of 64-sample
minibatches, learning rate 3e-4 annealed linearly to 0, gamma 0.99, GAE lambda 0.95, clip 0.2 (policy and value),
no entropy bonus, value coefficient 0.5, gradient norm 0.5, observation and reward normalisation, separate
64-64 tanh actor and critic with orthogonal initialisation and a state-independent log-std starting at 0.
SB3 is a peer, not a dependency: it runs from another Python environment (--sb3-python), e.g.
`python3 -m venv ~/sb3 && ~/sb3/bin/pip install torch==2.13.0 stable-baselines3 "gymnasium[mujoco]==1.4.0" mujoco==4.0.0`
(outside the checkout, which the format/lint check and the tests scan).

Both report steps per second over training alone (rollouts and updates; not start-up), one torch thread each, by
wall clock and per CPU-second (which a busy shared machine distorts far less).
Runs alternate between the two, so that drift on a shared machine hits both alike; the table gives the medians
and the ratio per pair. Learning is compared with the repository's one final score (tools/grid/aggregate.py): the
mean training episodic return over the last 10% of steps, from the per-rollout means of the episodes that
ended in each 2048-step rollout, for both (SB3's episodes are grouped into its rollouts the same way). Learning
needs a few seeds of 200k steps (`--total-timesteps 200000`); short runs are a smoke check.

Usage: python -m tools.studies.compare_sb3 --sb3-python ~/sb3/bin/python --total-timesteps 40960 --repeats 3
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tools.grid.aggregate import SCORE_DEF, record_frames, window_mean  # one score definition
from tools.grid.run_records import record_from_run_dir

ROOT = Path(__file__).resolve().parents[2]

ROLLOUT = 2048

# Run by --sb3-python: SB3's PPO with ppo_mujoco.py's hyperparameters; prints one JSON line.
SB3_PROGRAM = """
import json, sys, time
import gymnasium as gym, torch
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

env_id, total_timesteps, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
envs = VecNormalize(DummyVecEnv([lambda: Monitor(gym.make(env_id))]), norm_obs=True, norm_reward=True, gamma=0.99)
model = PPO(
    "MlpPolicy", envs, learning_rate=lambda progress: 3e-4 * progress, n_steps=2048, batch_size=64, n_epochs=10,
    gamma=0.99, gae_lambda=0.95, clip_range=0.2, clip_range_vf=0.2, normalize_advantage=True, ent_coef=0.0,
    vf_coef=0.5, max_grad_norm=0.5, seed=seed, device="cpu",
    policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh, log_std_init=0.0,
                       ortho_init=True),
)
start, cpu_start = time.perf_counter(), time.process_time()
model.learn(total_timesteps)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
monitor = envs.venv.envs[0]
print(json.dumps({"sps": model.num_timesteps / seconds, "steps": model.num_timesteps, "cpu_seconds": cpu,
                  "episode_returns": monitor.get_episode_rewards(), "episode_lengths": monitor.get_episode_lengths()}))
"""


def run_ours(python, env_id, total_timesteps, seed):
    """ppo_mujoco.py's SPS over rollouts and updates, by wall clock and per CPU-second: the process's CPU time
    less that of a one-rollout run (start-up, env construction), over the steps of the other rollouts."""
    with tempfile.TemporaryDirectory() as folder:
        cmd = [python, str(ROOT / "ppo_mujoco.py"), "--env-id", env_id, "--num-envs", "1", "--num-steps", "2048"]
        cmd += ["--seed", str(seed), "--eval-episodes", "0", "--env-backend", "gymnasium"]
        cpu = []
        for name, steps in (("full", total_timesteps), ("one-rollout", 2048)):
            run_dir = os.path.join(folder, name)  # a fresh run folder per run: the script refuses a used one
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            run = cmd + ["--run-dir", run_dir, "--total-timesteps", str(steps)]
            proc = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if proc.returncode:
                raise SystemExit(f"error: ppo_mujoco.py failed:\n{proc.stderr[-2000:]}")
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if name == "full":
                summary = json.loads(Path(run_dir, "summary.json").read_text())
                final_return = record_frames(record_from_run_dir(run_dir))[0]["final_return"]
    steps = summary["global_step"]
    return {
        "sps": steps / (summary["rollout_seconds"] + summary["update_seconds"]),
        "cpu_sps": (steps - 2048) / max(cpu[0] - cpu[1], 1e-9) if steps > 2048 else None,
        "final_return": None if np.isnan(final_return) else final_return,
    }


def final_score_of_episodes(returns, lengths, total_steps):
    """The final score of a run given as its episodes in order: each rollout's mean over the episodes that
    ended in it, logged at the rollout's last step (as ppo_mujoco.py logs charts/episodic_return), then the
    window mean of tools/grid/aggregate.py."""
    if not returns:
        return None
    rollout = (np.cumsum(lengths) - 1) // ROLLOUT  # the rollout in which each episode ended
    ends = np.unique(rollout)
    steps = (ends + 1) * ROLLOUT
    means = np.array([np.mean(np.asarray(returns)[rollout == r]) for r in ends])
    return window_mean(steps.astype(float), means, float(total_steps))


def run_sb3(python, env_id, total_timesteps, seed):
    """SB3's SPS in model.learn, by wall clock and per CPU-second (less a one-rollout run's, as for ours)."""
    results = []
    for steps in (total_timesteps, 2048):
        cmd = [python, "-c", SB3_PROGRAM, env_id, str(steps), str(seed)]
        proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"error: Stable-Baselines3 run failed:\n{proc.stderr[-2000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    full, one = results
    cpu_delta = full["cpu_seconds"] - one["cpu_seconds"]
    return {
        "sps": full["sps"],
        "cpu_sps": (full["steps"] - one["steps"]) / max(cpu_delta, 1e-9) if full["steps"] > one["steps"] else None,
        "final_return": final_score_of_episodes(full["episode_returns"], full["episode_lengths"], full["steps"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sb3-python", required=True, help="a Python interpreter that can import stable_baselines3")
    parser.add_argument("--python", default=sys.executable, help="the interpreter for ppo_mujoco.py (default: this one)")
    parser.add_argument("--env-id", default="Hopper-v5")
    parser.add_argument("--total-timesteps", type=int, default=40960, help="per run (CleanRL's shape: 2048 per rollout)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternating; seeds 1, 2, ...")
    args = parser.parse_args()
    if args.total_timesteps < 2048 or args.repeats < 1:
        parser.error("--total-timesteps must be >= 2048 (one rollout) and --repeats >= 1")
    probe = subprocess.run([args.sb3_python, "-c", "import stable_baselines3"], capture_output=True, text=True)
    if probe.returncode:
        parser.error(f"{args.sb3_python} cannot import stable_baselines3")

    ours, sb3 = [], []
    for seed in range(1, args.repeats + 1):
        ours.append(run_ours(args.python, args.env_id, args.total_timesteps, seed))
        sb3.append(run_sb3(args.sb3_python, args.env_id, args.total_timesteps, seed))
        print(f"seed {seed}: ppo_mujoco {ours[-1]['sps']:,.0f} SPS, SB3 {sb3[-1]['sps']:,.0f} SPS", flush=True)
    with_cpu = all(r["cpu_sps"] for r in ours + sb3)

    def row(name, runs):
        returns = [r["final_return"] for r in runs if r["final_return"] is not None]
        mean_return = f"{statistics.mean(returns):.1f} ({', '.join(f'{r:.0f}' for r in returns)})" if returns else "n/a"
        sps = statistics.median(r["sps"] for r in runs)
        cpu_sps = statistics.median(r["cpu_sps"] for r in runs) if with_cpu else None
        per_run = ", ".join(f"{r['sps']:,.0f}" for r in runs)
        cpu = f"{cpu_sps:,.0f}" if with_cpu else "n/a"
        return f"| {name} | {sps:,.0f} | {per_run} | {cpu} | {mean_return} |", sps, cpu_sps

    print(f"\n{args.env_id}, 1 env x 2048 steps, {args.total_timesteps:,} steps per run, {os.cpu_count()} cores")
    print("| what | median SPS | SPS per run | median SPS per CPU-second | mean final score (per run) |")
    print("|---|---:|---|---:|---:|")
    line, ours_sps, ours_cpu = row("ppo_mujoco.py", ours)
    print(line)
    line, sb3_sps, sb3_cpu = row("Stable-Baselines3 PPO", sb3)
    print(line)
    print(f"({SCORE_DEF})")
    pairs = ", ".join(f"{o['sps'] / s['sps']:.2f}" for o, s in zip(ours, sb3))
    print(f"\nppo_mujoco.py / SB3: {ours_sps / sb3_sps:.2f}x (medians; per pair: {pairs})")
    if with_cpu:
        pairs = ", ".join(f"{o['cpu_sps'] / s['cpu_sps']:.2f}" for o, s in zip(ours, sb3))
        print(f"ppo_mujoco.py / SB3 per CPU-second: {ours_cpu / sb3_cpu:.2f}x (medians; per pair: {pairs})")


if __name__ == "__main__":
    main()
