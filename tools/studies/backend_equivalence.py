#!/usr/bin/env python
"""Is EnvPool's MuJoCo task the same task as gymnasium's? Construction, evaluation and learning curves.

    python -m tools.studies.backend_equivalence --out results/backend_equivalence  # Hopper-v5, seeds 1-3, 300k, 20 eval eps
    python -m tools.studies.backend_equivalence --stages probe       # only the by-construction comparison (seconds)
    python -m tools.studies.backend_equivalence --seeds 1 --total-timesteps 4096 --eval-episodes 2 \\
        --runs /tmp/be --out /tmp/be/results -- --num-minibatches 4 --update-epochs 1   # a smoke run

Stages (`--stages`, in this order; default all):

* train: `ppo_mujoco.py` on each backend (`--env-backend gymnasium|envpool`) for every seed, with
  `--num-envs 8 --num-steps 256 --save-model --eval-episodes 0 --torch-threads 1` (EnvPool: `--env-threads 1`)
  and the flags after `--`. Run folders `{runs}/{env}__ppo-{backend}__s{seed}` (models stay there, outside
  the repository's tracked files); each finished run is written as a run record (`tools/grid/run_records.py`'s
  format) to `{out}/records/`. A run whose record exists is skipped; an unfinished run folder is started over.
* probe: differences by construction. The two backends' spaces, task parameters (frame skip, timestep,
  reward weights, healthy ranges, reset noise, episode limit) and MuJoCo versions side by side; the spread of
  the reset observations; and state-matched stepping: each of `--probe-envs` EnvPool envs is reset, a
  gymnasium env is put in the same state (Hopper's observation is the full state except the x position, on
  which nothing but the forward reward's difference depends), and both are stepped with the same actions
  (uniform random, and the clipped mean action of the first gymnasium-trained policy, computed from the
  gymnasium observation) until either episode ends; the largest observation and reward differences per step
  and any disagreement on termination are recorded. -> `{out}/probe.json`.
* eval: every saved policy (backend it was trained on x seed) is evaluated for `--eval-episodes` episodes on
  both backends: the mean action, clipped to the action bounds, with the observation statistics frozen inside
  the agent (gymnasium: `ppo_mujoco.evaluate`, episode k seeded `10000 + seed + k`; EnvPool: the same loop
  here, one single-env pool per episode with the same seed). -> `{out}/eval_episodes.csv` (one row per
  episode; a policy whose rows exist is skipped) and `{out}/eval.csv` (mean and t-based 95% interval per
  policy and backend, the difference with a Welch 95% interval, and whether the two intervals overlap).
* curves: the training return (`charts/episodic_return`, the mean over the episodes that ended in an
  iteration) per backend: mean and Student-t 95% interval across seeds at every step that all runs logged,
  and the same on bins of `--bin` iterations (each run's mean over the bin first), whether the two backends'
  intervals overlap at each point, and each run's final score (mean over the last 10% of training).
  -> `{out}/curves.csv`, `{out}/curves_binned.csv`, `{out}/final.csv`, `{out}/curves.png`.

`{out}/results.json` collects the headline numbers of every stage that ran. The rule applied (from the speed
issue): same task iff every policy's evaluation intervals overlap between the backends and the learning
curves' intervals overlap; it is stated next to the numbers, not decided here.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tools.grid.run_records import is_finished, read_record, record_from_run_dir, write_record
from tools.grid.sweeps import split_at_dashes

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("gymnasium", "envpool")
EVAL_SEED_OFFSET = 10_000  # the training script's evaluation seeds: seed + 10000 + episode


def run_name(env_id, backend, seed):
    return f"{env_id}__ppo-{backend}__s{seed}"


def t_bounds(values, confidence=0.95):
    """(mean, lower, upper, n): tools/stats.py's Student-t interval of the mean as its two ends."""
    from tools.stats import t_interval

    mean, half, n = t_interval(values, confidence)
    return mean, mean - half, mean + half, n


def overlap(lo1, hi1, lo2, hi2) -> bool:
    return bool(lo1 <= hi2 and lo2 <= hi1)


# ---------------------------------------------------------------------------------------------- train


def train(opts, log=print) -> list[dict]:
    """Train every (backend, seed) that has no record yet; return the finished runs' records."""
    records_dir = Path(opts.out) / "records"
    records = []
    for seed in opts.seeds:
        for backend in BACKENDS:
            name = run_name(opts.env_id, backend, seed)
            record_path = records_dir / f"{name}.json.gz"
            if record_path.exists():
                records.append(read_record(record_path))
                log(f"[train] {name}: record exists, skipped")
                continue
            run_dir = Path(opts.runs).resolve() / name
            if not is_finished(run_dir):
                cmd = [sys.executable, str(REPO / "ppo_mujoco.py"), *train_flags(opts, backend, seed, run_dir)]
                cmd += ["--overwrite"] if run_dir.exists() else []  # an interrupted run starts over
                env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
                log(f"[train] {name}: {' '.join(cmd[1:])}")
                start = time.time()
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                with open(run_dir.parent / f"{name}.log", "w") as f:
                    rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
                if rc != 0:
                    raise SystemExit(f"error: {name} failed (exit {rc}); see {run_dir.parent / f'{name}.log'}")
                log(f"[train] {name}: finished in {time.time() - start:.0f} s")
            record = record_from_run_dir(run_dir)
            record["algo"] = f"ppo-{backend}"
            write_record(record, record_path)
            records.append(record)
    return records


def train_flags(opts, backend, seed, run_dir) -> list[str]:
    flags = ["--env-id", opts.env_id, "--env-backend", backend, "--seed", str(seed)]
    flags += ["--total-timesteps", str(opts.total_timesteps), "--num-envs", "8", "--num-steps", "256"]
    flags += ["--save-model", "--eval-episodes", "0", "--torch-threads", "1", "--run-dir", str(run_dir)]
    if backend == "envpool":
        flags += ["--env-threads", "1"]
    return flags + list(opts.extra)


def model_path(opts, backend, seed) -> Path:
    return Path(opts.runs) / run_name(opts.env_id, backend, seed) / "ppo_mujoco.cleanrl_model"


# ---------------------------------------------------------------------------------------------- probe


def envpool_mujoco_version() -> str | None:
    """The MuJoCo version compiled into EnvPool's MuJoCo extension (its version string)."""
    import envpool.mujoco

    folder = Path(envpool.mujoco.__file__).parent
    found = set()
    for so in folder.glob("mujoco_gym_envpool*.so"):
        found |= {m.decode() for m in re.findall(rb"\x00(\d+\.\d+\.\d+)\x00", so.read_bytes())}
    return ", ".join(sorted(found)) or None


def construction(env_id) -> dict:
    """The two backends' task definitions side by side (what each reports of itself)."""
    import envpool
    import gymnasium as gym
    import mujoco

    g = gym.make(env_id)
    u = g.unwrapped
    params = {}
    for name in (
        "forward_reward_weight",
        "ctrl_cost_weight",
        "healthy_reward",
        "terminate_when_unhealthy",
        "healthy_state_range",
        "healthy_z_range",
        "healthy_angle_range",
        "reset_noise_scale",
        "exclude_current_positions_from_observation",
    ):
        if hasattr(u, f"_{name}"):
            value = getattr(u, f"_{name}")
            params[name] = list(value) if isinstance(value, tuple) else value
    gym_side = {
        "observation_space": str(g.observation_space),
        "action_space": str(g.action_space),
        "frame_skip": u.frame_skip,
        "timestep": float(u.model.opt.timestep),
        "dt": float(u.dt),
        "integrator": int(u.model.opt.integrator),
        "max_episode_steps": g.spec.max_episode_steps,
        "mujoco": mujoco.__version__,
        "observation_velocity_clip": "qvel clipped to [-10, 10] (hopper_v5._get_obs)" if "Hopper" in env_id else None,
        **params,
    }
    g.close()
    spec = envpool.make_spec(env_id)
    cfg = spec.config._asdict()
    ep_side = {
        "observation_space": str(spec.observation_space),
        "action_space": str(spec.action_space),
        "mujoco": envpool_mujoco_version(),
        "envpool": envpool.__version__,
        **{k: v for k, v in cfg.items() if k not in ("base_path", "env_seed", "seed", "num_envs", "batch_size")},
    }
    return {"gymnasium": gym_side, "envpool": ep_side}


def matched_stepping(env_id, n, seed, agent=None, steps=1000) -> dict:
    """Reset n EnvPool envs, put n gymnasium envs into the same states and step both with the same actions."""
    import envpool
    import gymnasium as gym
    import torch

    pool = envpool.make(env_id, env_type="gymnasium", num_envs=n, seed=seed, num_threads=1)
    ep_obs, _ = pool.reset()
    sims = []
    for i in range(n):
        sim = gym.make(env_id).unwrapped
        sim.reset(seed=seed + i)
        nq = sim.model.nq
        skipped = nq - (ep_obs.shape[1] - sim.model.nv)  # positions left out of the observation (Hopper: x)
        sim.set_state(np.r_[np.zeros(skipped), ep_obs[i, : nq - skipped]], ep_obs[i, nq - skipped :].copy())
        sims.append(sim)
    gym_obs = np.stack([sim._get_obs() for sim in sims])
    rng = np.random.default_rng(seed)
    low, high = pool.action_space.low, pool.action_space.high
    alive = np.ones(n, bool)
    obs_err, rew_err, lengths = [], [], np.zeros(n, int)
    term_mismatch = trunc_mismatch = 0
    ret_gym, ret_ep = np.zeros(n), np.zeros(n)
    for t in range(steps):
        if agent is None:
            actions = rng.uniform(low, high, (n, len(low))).astype(np.float32)
        else:
            with torch.no_grad():
                mean = agent.get_dist(torch.as_tensor(gym_obs, dtype=torch.float32)).mean.numpy()
            actions = np.clip(mean, low, high).astype(np.float32)  # what the training script passes
        ep_obs, ep_rew, ep_term, ep_trunc, _ = pool.step(actions.astype(np.float64))
        worst_obs = worst_rew = 0.0
        for i in np.flatnonzero(alive):
            obs, rew, term, _, _ = sims[i].step(actions[i])
            trunc = t + 1 >= steps
            gym_obs[i] = obs
            worst_obs = max(worst_obs, float(np.abs(obs - ep_obs[i]).max()))
            worst_rew = max(worst_rew, abs(float(rew) - float(ep_rew[i])))
            ret_gym[i] += rew
            ret_ep[i] += ep_rew[i]
            lengths[i] += 1
            term_mismatch += int(bool(term) != bool(ep_term[i]))
            trunc_mismatch += int(bool(trunc) != bool(ep_trunc[i]))
            if term or ep_term[i] or trunc or ep_trunc[i]:
                alive[i] = False
        obs_err.append(worst_obs)
        rew_err.append(worst_rew)
        if not alive.any():
            break
    pool.close()
    obs_err = np.asarray(obs_err)

    def first_above(x):
        above = np.flatnonzero(obs_err > x)
        return int(above[0]) + 1 if len(above) else None

    return {
        "envs": n,
        "actions": "uniform random" if agent is None else "clipped mean action of a trained policy (gymnasium obs)",
        "episode_lengths": lengths.tolist(),
        "max_obs_diff_first_step": float(obs_err[0]),
        "max_obs_diff_first_10_steps": float(obs_err[:10].max()),
        "max_obs_diff_first_100_steps": float(obs_err[:100].max()),
        "max_obs_diff_overall": float(obs_err.max()),
        "first_step_obs_diff_above_1e-9": first_above(1e-9),
        "first_step_obs_diff_above_1e-3": first_above(1e-3),
        "max_reward_diff": float(max(rew_err)),
        "termination_disagreements": term_mismatch,
        "truncation_disagreements": trunc_mismatch,
        "return_gymnasium": ret_gym.round(3).tolist(),
        "return_envpool": ret_ep.round(3).tolist(),
        "obs_diff_per_step": [float(f"{e:.3g}") for e in obs_err],
    }


def reset_spread(env_id, n, seed) -> dict:
    """Std of each reset-observation coordinate on both backends (uniform noise of scale c has std c / sqrt(3))."""
    import envpool
    import gymnasium as gym

    pool = envpool.make(env_id, env_type="gymnasium", num_envs=n, seed=seed, num_threads=1)
    ep = pool.reset()[0]
    pool.close()
    g = gym.make(env_id)
    gy = np.stack([g.reset(seed=seed + i)[0] for i in range(n)])
    noise = getattr(g.unwrapped, "_reset_noise_scale", None)
    g.close()
    return {
        "envs": n,
        "gymnasium_mean": gy.mean(0).round(5).tolist(),
        "envpool_mean": ep.mean(0).round(5).tolist(),
        "gymnasium_std": gy.std(0).round(5).tolist(),
        "envpool_std": ep.std(0).round(5).tolist(),
        "uniform_noise_std": None if noise is None else round(noise / math.sqrt(3), 5),
    }


def probe(opts, log=print) -> dict:
    from ppo_mujoco import load_agent

    out = {"construction": construction(opts.env_id), "reset_spread": reset_spread(opts.env_id, 1000, 1)}
    out["matched_random"] = matched_stepping(opts.env_id, opts.probe_envs, 1)
    path = model_path(opts, "gymnasium", opts.seeds[0])
    if path.exists():
        out["matched_policy"] = matched_stepping(opts.env_id, opts.probe_envs, 2, load_agent(path))
        out["matched_policy"]["policy"] = run_name(opts.env_id, "gymnasium", opts.seeds[0])
    differing = {}
    gym_side, ep_side = out["construction"]["gymnasium"], out["construction"]["envpool"]
    for key in sorted(set(gym_side) & set(ep_side)):
        if gym_side[key] != ep_side[key]:
            differing[key] = {"gymnasium": gym_side[key], "envpool": ep_side[key]}
    out["construction_differences"] = differing
    for key in ("matched_random", "matched_policy"):
        if key in out:
            m = out[key]
            log(
                f"[probe] {key}: max |obs diff| step 1 {m['max_obs_diff_first_step']:.2g}, first 10 steps "
                f"{m['max_obs_diff_first_10_steps']:.2g}, overall {m['max_obs_diff_overall']:.2g} (above 1e-3 from step "
                f"{m['first_step_obs_diff_above_1e-3']}); termination disagreements {m['termination_disagreements']}"
            )
    log(f"[probe] reported differences: {sorted(differing)}")
    return out


# ---------------------------------------------------------------------------------------------- eval


def evaluate_envpool(agent, env_id, episodes, seed) -> list[tuple[float, int]]:
    """`ppo_mujoco.evaluate` on EnvPool: the clipped mean action, frozen statistics, episode k seeded seed + k."""
    import envpool
    import torch

    out = []
    for episode in range(episodes):
        pool = envpool.make(env_id, env_type="gymnasium", num_envs=1, seed=seed + episode, num_threads=1)
        low, high = pool.action_space.low, pool.action_space.high
        obs, _ = pool.reset()
        done, episodic_return, length = False, 0.0, 0
        while not done:
            with torch.no_grad():
                action = agent.get_dist(torch.as_tensor(obs, dtype=torch.float32)).mean
            obs, reward, terminated, truncated, _ = pool.step(np.clip(action.numpy(), low, high))
            episodic_return += float(reward[0])
            length += 1
            done = bool(terminated[0] or truncated[0])
        pool.close()
        out.append((episodic_return, length))
    return out


def evaluate_gymnasium(agent, env_id, episodes, seed) -> list[tuple[float, int]]:
    """`ppo_mujoco.evaluate`'s loop (mean action, frozen statistics, clipped), also counting episode lengths."""
    import gymnasium as gym
    import torch

    env = gym.make(env_id)
    low, high = env.action_space.low, env.action_space.high
    out = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, episodic_return, length = False, 0.0, 0
        while not done:
            with torch.no_grad():
                action = agent.get_dist(torch.as_tensor(obs, dtype=torch.float32)[None]).mean[0]
            obs, reward, terminated, truncated, _ = env.step(np.clip(action.numpy(), low, high))
            episodic_return += float(reward)
            length += 1
            done = terminated or truncated
        out.append((episodic_return, length))
    env.close()
    return out


EPISODE_FIELDS = ["trained_on", "seed", "evaluated_on", "episode", "return", "length"]


def evaluate_all(opts, log=print) -> list[dict]:
    import torch

    from ppo_mujoco import load_agent

    torch.set_num_threads(1)
    path = Path(opts.out) / "eval_episodes.csv"
    rows = []
    if path.exists():
        with open(path) as f:
            rows = [r for r in csv.DictReader(f)]
    done = {(r["trained_on"], int(r["seed"]), r["evaluated_on"]) for r in rows}
    for seed in opts.seeds:
        for trained_on in BACKENDS:
            model = model_path(opts, trained_on, seed)
            for evaluated_on in BACKENDS:
                if (trained_on, seed, evaluated_on) in done:
                    continue
                if not model.exists():
                    log(f"[eval] no model for {trained_on} seed {seed} ({model}); skipped")
                    break
                agent = load_agent(model)
                fn = evaluate_envpool if evaluated_on == "envpool" else evaluate_gymnasium
                start = time.time()
                results = fn(agent, opts.env_id, opts.eval_episodes, EVAL_SEED_OFFSET + seed)
                for k, (ret, length) in enumerate(results):
                    rows.append(dict(zip(EPISODE_FIELDS, (trained_on, seed, evaluated_on, k, f"{ret:.3f}", length))))
                log(
                    f"[eval] {trained_on} s{seed} on {evaluated_on}: mean {np.mean([r for r, _ in results]):.1f} "
                    f"over {len(results)} episodes ({time.time() - start:.0f} s)"
                )
                with open(path, "w", newline="") as f:  # after every policy: an interrupted eval resumes
                    w = csv.DictWriter(f, EPISODE_FIELDS)
                    w.writeheader()
                    w.writerows(rows)
    return rows


def eval_table(rows) -> list[dict]:
    """Per policy: each backend's mean return with a t interval, the difference with a Welch interval."""
    from tools.stats import welch_interval

    by = {}
    for r in rows:
        by.setdefault((r["trained_on"], int(r["seed"])), {}).setdefault(r["evaluated_on"], []).append(float(r["return"]))
    table = []
    for (trained_on, seed), evals in sorted(by.items(), key=lambda kv: (BACKENDS.index(kv[0][0]), kv[0][1])):
        if not all(b in evals for b in BACKENDS):
            continue
        row = {"policy": f"ppo-{trained_on} s{seed}", "trained_on": trained_on, "seed": seed}
        for b in BACKENDS:
            mean, lo, hi, n = t_bounds(evals[b])
            row.update({f"{b}_mean": mean, f"{b}_lo": lo, f"{b}_hi": hi, f"{b}_n": n})
        d, dlo, dhi = welch_interval(evals["gymnasium"], evals["envpool"])
        row.update({"diff_mean": d, "diff_lo": dlo, "diff_hi": dhi})
        row["intervals_overlap"] = overlap(row["gymnasium_lo"], row["gymnasium_hi"], row["envpool_lo"], row["envpool_hi"])
        table.append(row)
    return table


# ---------------------------------------------------------------------------------------------- curves


def run_curve(record) -> tuple[np.ndarray, np.ndarray]:
    steps = np.asarray(record["scalars"]["step"], float)
    values = np.asarray([np.nan if v is None else v for v in record["scalars"].get("episodic_return", [])], float)
    return steps, values


def curve_tables(records, bin_iterations) -> tuple[list[dict], list[dict], list[dict]]:
    """(per logged step, per bin, per run final score) rows of the per-backend learning curves."""
    from tools.grid.aggregate import window_mean

    curves = {b: [run_curve(r) for r in records if r["algo"] == f"ppo-{b}"] for b in BACKENDS}
    common = None
    for b in BACKENDS:
        for steps, values in curves[b]:
            logged = set(steps[np.isfinite(values)].tolist())
            common = logged if common is None else common & logged
    common = sorted(common or [])
    per_step = []
    for s in common:
        row = {"step": int(s)}
        for b in BACKENDS:
            vals = [values[steps == s][0] for steps, values in curves[b]]
            mean, lo, hi, n = t_bounds(vals)
            row.update({f"{b}_mean": mean, f"{b}_lo": lo, f"{b}_hi": hi, f"{b}_n": n})
        row["overlap"] = overlap(row["gymnasium_lo"], row["gymnasium_hi"], row["envpool_lo"], row["envpool_hi"])
        per_step.append(row)
    binned = []
    last = max((steps[-1] for b in BACKENDS for steps, _ in curves[b]), default=0)
    first = min((steps[0] for b in BACKENDS for steps, _ in curves[b]), default=0)
    width = bin_iterations * first  # the first logged step is one iteration (num_envs x num_steps)
    for k in range(int(math.ceil(last / width)) if width else 0):
        lo_s, hi_s = k * width, (k + 1) * width
        row = {"bin_start": int(lo_s), "bin_end": int(hi_s)}
        for b in BACKENDS:
            vals = []
            for steps, values in curves[b]:
                inside = (steps > lo_s) & (steps <= hi_s) & np.isfinite(values)
                if inside.any():
                    vals.append(values[inside].mean())
            mean, lo, hi, n = t_bounds(vals)
            row.update({f"{b}_mean": mean, f"{b}_lo": lo, f"{b}_hi": hi, f"{b}_n": n})
        row["overlap"] = overlap(row["gymnasium_lo"], row["gymnasium_hi"], row["envpool_lo"], row["envpool_hi"])
        binned.append(row)
    final = []
    for r in records:
        steps, values = run_curve(r)
        summary = r.get("summary", {})
        final.append(
            {
                "run": r["name"],
                "backend": r["algo"].removeprefix("ppo-"),
                "seed": r["seed"],
                "final_score": window_mean(steps, values, steps[-1]),
                "global_step": int(steps[-1]),
                "sps": summary.get("sps"),
                "wall_seconds": (summary.get("rollout_seconds") or 0) + (summary.get("update_seconds") or 0),
                "rollout_seconds": summary.get("rollout_seconds"),
            }
        )
    return per_step, binned, final


def plot_curves(per_step, binned, path, env_id):
    """The two backends' training-return curves, laid out for the documentation's column (PNG and SVG). The
    backends get neutral colours: blue and red stand for PPO and VACO in every other figure."""
    import matplotlib

    from tools.grid import aggregate_figures as F

    matplotlib.use("Agg")
    colors = {"gymnasium": "#252525", "envpool": "#969696"}
    styles = {"gymnasium": "-", "envpool": "--"}  # told apart without the shade too
    fig, axes = F._figure(1, 2, 3.0, sharey=True)
    for ax, rows, x_key, title in (
        (axes[0][0], per_step, "step", "per logged step"),
        (axes[0][1], binned, "bin_end", "binned (each run's mean first)"),
    ):
        x = np.array([r[x_key] for r in rows], float)
        for b in BACKENDS:
            m = np.array([r[f"{b}_mean"] for r in rows])
            lo = np.array([r[f"{b}_lo"] for r in rows])
            hi = np.array([r[f"{b}_hi"] for r in rows])
            ax.plot(x, m, color=colors[b], ls=styles[b], label=f"{b}, mean of seeds")
            ax.fill_between(x, lo, hi, color=colors[b], alpha=0.2, label=f"{b}, 95% t-interval")
        ax.set_title(title)
        F._step_axis(ax)
    axes[0][0].set_ylabel("training return")
    F._legend_below(fig, axes, ncol=2)
    F.save(fig, Path(path), f"PPO on {env_id}: gymnasium and EnvPool")


# ---------------------------------------------------------------------------------------------- main


def write_rounded_rows(path, rows):
    """CSV of dict rows, floats to 6 significant digits."""
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def parse_args(argv=None):
    argv, extra = split_at_dashes(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="Hopper-v5")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--total-timesteps", type=int, default=300_000)
    p.add_argument("--eval-episodes", type=int, default=20, help="episodes per policy and backend")
    p.add_argument("--probe-envs", type=int, default=32, help="envs of the state-matched stepping")
    p.add_argument("--bin", type=int, default=10, help="iterations per bin of the binned learning curves")
    p.add_argument("--runs", default="runs/backend_equivalence", help="run folders (the saved models stay there)")
    p.add_argument("--out", default="runs/backend_equivalence/results", help="results folder (committed: results/...)")
    p.add_argument("--stages", nargs="+", choices=["train", "probe", "eval", "curves"], default=None)
    opts = p.parse_args(argv)
    opts.extra = extra
    opts.stages = opts.stages or ["train", "probe", "eval", "curves"]
    return opts


def main(argv=None):
    opts = parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results["settings"] = {
        "env_id": opts.env_id,
        "seeds": opts.seeds,
        "total_timesteps": opts.total_timesteps,
        "train_flags": train_flags(opts, "<backend>", "<seed>", "<run-dir>")[2:],
        "eval_episodes": opts.eval_episodes,
    }
    start = time.time()
    if "train" in opts.stages:
        train(opts)
    if "probe" in opts.stages:
        results["probe"] = probe(opts)
        (out / "probe.json").write_text(json.dumps(results["probe"], indent=1) + "\n")
        results["probe"] = {k: v for k, v in results["probe"].items() if k in ("construction_differences",)}
        for key in ("matched_random", "matched_policy"):
            m = json.loads((out / "probe.json").read_text()).get(key)
            if m:
                results["probe"][key] = {k: v for k, v in m.items() if k.startswith(("max_", "first_", "term", "trunc"))}
    if "eval" in opts.stages:
        table = eval_table(evaluate_all(opts))
        write_rounded_rows(out / "eval.csv", table)
        results["eval"] = {
            "rows": [{k: r[k] for k in ("policy", "gymnasium_mean", "envpool_mean", "intervals_overlap")} for r in table],
            "all_overlap": all(r["intervals_overlap"] for r in table),
        }
        if len(table) >= 2:  # the per-policy differences, as a sample across policies
            mean, lo, hi, n = t_bounds([r["diff_mean"] for r in table])
            results["eval"]["mean_difference_across_policies"] = {"mean": mean, "lo": lo, "hi": hi, "n": n}
    if "curves" in opts.stages:
        records = [read_record(p) for p in sorted((out / "records").glob("*.json.gz"))]
        per_step, binned, final = curve_tables(records, opts.bin)
        write_rounded_rows(out / "curves.csv", per_step)
        write_rounded_rows(out / "curves_binned.csv", binned)
        write_rounded_rows(out / "final.csv", final)
        if per_step:
            plot_curves(per_step, binned, out / "curves.png", opts.env_id)
        fin = {}
        for b in BACKENDS:
            mean, lo, hi, n = t_bounds([r["final_score"] for r in final if r["backend"] == b])
            fin[b] = {"mean": mean, "lo": lo, "hi": hi, "n": n}
            fin[b]["wall_seconds_mean"] = float(np.mean([r["wall_seconds"] for r in final if r["backend"] == b] or [np.nan]))
        results["curves"] = {
            "common_steps": len(per_step),
            "steps_overlapping": sum(r["overlap"] for r in per_step),
            "bins": len(binned),
            "bins_overlapping": sum(r["overlap"] for r in binned),
            "final_score": fin,
        }
        print(
            f"[curves] intervals overlap at {results['curves']['steps_overlapping']}/{len(per_step)} common steps, "
            f"{results['curves']['bins_overlapping']}/{len(binned)} bins"
        )
    results["last_call_seconds"] = round(time.time() - start)
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"results in {out}")


if __name__ == "__main__":
    main()
