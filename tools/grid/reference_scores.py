"""The reference table that normalises scores: random-policy returns measured here, CleanRL PPO's returns at 8M steps
(`python -m tools.grid.aggregate --measure-random [ENV ...] --write` measures and rewrites it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

DEFAULT_REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference_scores.csv"

# CleanRL ppo_continuous_action_8M (tag v1.0.0-13-gcbd83f6), 8M steps, 10 seeds, MuJoCo v4: the mean of the
# per-run final returns. Source: vwxyzjn/cleanrl docs/rl-algorithms/rpo.md ("MuJoCo v4" tab; Pusher-v4 is the
# v4 task, which does not run on mujoco>=3 here, so it only serves Pusher-v5).
CLEANRL_PPO_8M = {
    "Ant": 1824.17,
    "HalfCheetah": 2637.19,
    "Hopper": 2741.42,
    "Walker2d": 2872.92,
    "Humanoid": 583.17,
    "HumanoidStandup": 109325.87,
    "InvertedPendulum": 888.83,
    "InvertedDoublePendulum": 5626.22,
    "Reacher": -4.65,
    "Swimmer": 124.88,
    "Pusher": -30.35,
}
REFERENCE_ENVS = [f"{name}-{v}" for name in CLEANRL_PPO_8M for v in ("v4", "v5") if f"{name}-{v}" != "Pusher-v4"]
REFERENCE_HEADER = """\
# Reference returns for score normalisation: normalized = (return - random_return) / (reference_return - random_return).
# random_return: mean undiscounted return of uniformly random actions (env.action_space.sample()), measured on this
#   machine with gymnasium 1.4.0 + mujoco 4.0.0 by `python -m tools.grid.aggregate --measure-random --write`
#   (random_episodes episodes, reset seeds seed..seed+episodes-1, action-space seed `seed`).
# reference_return: CleanRL ppo_continuous_action (tag v1.0.0-13-gcbd83f6) after 8M steps, mean over 10 seeds,
#   MuJoCo v4, from vwxyzjn/cleanrl docs/rl-algorithms/rpo.md ("MuJoCo v4" tab). The same v4 number is used for
#   the v5 task (v5 changed some tasks, e.g. Ant's observation, so for v5 it is an approximate anchor), and
#   Pusher-v5 uses the Pusher-v4 number. 1.0 = CleanRL PPO at 8M steps, not an optimum: scores above 1 are possible.
"""


def load_reference(path) -> pd.DataFrame:
    return pd.read_csv(path, comment="#").set_index("env_id")


def measure_random(env_ids, episodes=20, seed=0) -> pd.DataFrame:
    """Mean undiscounted return of uniformly random actions per env (reset seeds seed..seed+episodes-1)."""
    import gymnasium as gym

    try:
        import mujoco

        mujoco.set_mju_user_warning(lambda msg: None)  # HalfCheetah's settotalmass deprecation warning
    except Exception:
        pass
    rows = []
    for env_id in env_ids:
        env, returns = gym.make(env_id), []
        env.action_space.seed(seed)
        for ep in range(episodes):
            env.reset(seed=seed + ep)
            total, done = 0.0, False
            while not done:
                _, r, terminated, truncated, _ = env.step(env.action_space.sample())
                total, done = total + float(r), terminated or truncated
            returns.append(total)
        env.close()
        m, s = float(np.mean(returns)), float(np.std(returns))
        rows.append(
            {
                "env_id": env_id,
                "random_return": round(m, 3),
                "random_std": round(s, 3),
                "random_episodes": episodes,
                "seed": seed,
            }
        )
        print(f"{env_id:28s} random return {m:10.2f} ± {s:.2f} ({episodes} episodes)", flush=True)
    return pd.DataFrame(rows)


def write_reference(measured: pd.DataFrame, path) -> pd.DataFrame:
    path = Path(path)
    table = load_reference(path).reset_index() if path.exists() else pd.DataFrame(columns=["env_id"])
    new = measured.copy()
    new["reference_return"] = [CLEANRL_PPO_8M.get(e.rsplit("-", 1)[0], np.nan) for e in new["env_id"]]
    new["reference_source"] = [
        "cleanrl ppo_continuous_action_8M v4" if np.isfinite(v) else "" for v in new["reference_return"]
    ]
    table = table[~table["env_id"].isin(measured["env_id"])]
    table = (pd.concat([table, new], ignore_index=True) if len(table) else new).sort_values("env_id").reset_index(drop=True)
    table = table[["env_id", "random_return", "random_std", "random_episodes", "seed", "reference_return", "reference_source"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(REFERENCE_HEADER)
        table.to_csv(f, index=False)
    return table
