"""Synthetic run records for the calibration of the TV-matched PPO (tools/grid/calibration.py): the first grid's VACO
at lag 0 (tier 1) and the calibration's PPO at each clip (tier 4), with a final TV chosen per logged step. Shared by
tests/tools/grid/test_calibration.py (the rule) and tests/tools/grid/test_run_grid.py (the runner's tier 5)."""

from pathlib import Path

from tools.grid import run_records

TASKS = ("Hopper-v5", "Walker2d-v5")

T = 10_000  # a synthetic run (at least one batch of 8 x 256: the scripts accept its budget): logged every T / 10
D = T // 10  # steps; the TV window (0.2 T, 0.8 T] holds the steps 3 D ... 8 D


def tv_series(early: float, window: float, late: float) -> dict[int, float]:
    """final TV per logged step: `early` at steps D and 2 D, `window` at 3 D ... 8 D, `late` at 9 D and T."""
    return {k * D: early if k <= 2 else window if k <= 8 else late for k in range(1, 11)}


def put_record(folder: Path, name: str, algo: str, task: str, seed: int, tv: dict, extra_args=None, finished=True):
    args = {"exp_name": algo, "env_id": task, "lag": 0, "seed": seed, "total_timesteps": T, "lag_mode": "uniform"}
    args.update(extra_args or {})
    summary = {"global_step": T} if finished else None
    rec = run_records.make_record(name, args, summary, {"final_tv": tv, "episodic_return": {T: 1.0}}, [], algo)
    run_records.write_record(rec, folder / f"{name}.json.gz")


# VACO's window TV at lag 0 per task, and PPO's per (clip, task). Outside the window the values are chosen so that
# another window picks another clip: over the whole run clip 0.3 is closest, over the last 10% also clip 0.3.
VACO_TV = {"Hopper-v5": 0.090, "Walker2d-v5": 0.100}
PPO_TV = {
    ("0.3", "Hopper-v5"): 0.060,  # |0.060 - 0.090| = 0.030
    ("0.3", "Walker2d-v5"): 0.070,  # 0.030 -> mean 0.030
    ("0.4", "Hopper-v5"): 0.085,  # 0.005
    ("0.4", "Walker2d-v5"): 0.110,  # 0.010 -> mean 0.0075: the closest
    ("0.5", "Hopper-v5"): 0.100,  # 0.010
    ("0.5", "Walker2d-v5"): 0.120,  # 0.020 -> mean 0.015
}
VACO_OFFSETS = [-0.001, 0.001] * 5  # seeds 1-10: the mean over seeds is the value above
PPO_OFFSETS = {101: -0.002, 102: 0.0, 103: 0.002}


def write_first_grid_vaco(parent: Path):
    for task in TASKS:
        for seed, off in zip(range(1, 11), VACO_OFFSETS):
            put_record(
                parent / "tier1", f"{task}__vaco__lag0__s{seed}", "vaco", task, seed, tv_series(0.5, VACO_TV[task] + off, 0.01)
            )


def write_calibration(parent: Path, skip=(), early=None, late=None, name=None):
    for (clip, task), value in PPO_TV.items():
        for seed, off in PPO_OFFSETS.items():
            if (clip, task, seed) in skip:
                continue
            e = early[clip] if early else 0.5
            tv = tv_series(e, value + off, late[clip] if late else 0.01)
            label = f"ppo-clip{clip}"
            fname = name(clip, task, seed) if name else f"{task}__{label}__lag0__s{seed}"
            put_record(parent / "tier4", fname, label, task, seed, tv, {"clip_coef": float(clip)})
