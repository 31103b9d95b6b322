"""The calibration of the TV-matched PPO (the evidence grid's tier 5): the rule written before the runs
(docs/evidence_round2.md) applied to tier 4's records, and the window TV it compares. The local runner
(tools/grid/run_grid.py) asks it which clip tier 5 runs; tools/studies/aggregate_round2.py reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tools.grid.run_records import read_record
from tools.grid.sweeps import sweep_values

# The calibration of the TV-matched PPO: tier 4's candidates, seeds and tasks; VACO's seeds of tier 1.
CALIBRATION_CLIPS = tuple(f"{c:g}" for c in sweep_values("round2_ppo_clip_calibration", "clip_coef"))
CALIBRATION_SEEDS = tuple(sweep_values("round2_ppo_clip_calibration", "seed"))  # disjoint from the measuring seeds
TASKS = sweep_values("round2_ppo_clip_calibration", "env_id")
VACO_SEEDS = sweep_values("round1_vaco", "seed")
TIER_TIMESTEPS = sweep_values("round2_ppo_clip_calibration", "total_timesteps")[0]
TV_WINDOW = (0.2, 0.8)  # the TV is averaged over logged steps in (0.2 T, 0.8 T]: the last 10% are the annealed regime


def window_tv(record: dict, window=TV_WINDOW) -> float:
    """Mean of a record's per-iteration final TV (lag/final_tv) over the logged steps s with lo T < s <= hi T,
    T = the run's last global step (its summary's global_step)."""
    import numpy as np

    scalars = record.get("scalars") or {}
    steps = np.asarray(scalars.get("step") or [], float)
    tv = np.asarray([np.nan if v is None else v for v in scalars.get("final_tv") or []], float)
    if not len(steps) or len(tv) != len(steps):
        return float("nan")
    last = float((record.get("summary") or {}).get("global_step") or steps.max())
    keep = (steps > window[0] * last) & (steps <= window[1] * last) & np.isfinite(tv)
    return float(tv[keep].mean()) if keep.any() else float("nan")


@dataclass
class Calibration:
    """The TV-matched PPO's clip coefficient, chosen by the rule written before the runs (docs/evidence_round2.md):
    the candidate whose window TV at lag 0 (mean over its 3 seeds per task) is closest to VACO's (mean over the
    first grid's 10 seeds per task), distance = mean over the tasks of |PPO - VACO|; a tie goes to the smaller
    candidate. `clip` is None while records are missing (listed in `missing`)."""

    clip: str | None
    vaco_tv: dict  # task -> VACO's mean window TV at lag 0
    ppo_tv: dict  # (clip, task) -> PPO's mean window TV at lag 0
    distance: dict  # clip -> mean over tasks of |PPO - VACO|
    missing: list  # what is not there yet, one line each
    folder: Path

    def report(self) -> str:
        lines = [f"TV-matched PPO calibration (window TV over {TV_WINDOW[0]:g}-{TV_WINDOW[1]:g} of training, lag 0):"]
        lines += [f"  VACO (first grid), {t}: {v:.4f}" for t, v in self.vaco_tv.items()]
        for c in CALIBRATION_CLIPS:
            per_task = ", ".join(f"{t} {self.ppo_tv[(c, t)]:.4f}" for t in TASKS if (c, t) in self.ppo_tv)
            dist = f"; distance {self.distance[c]:.4f}" if c in self.distance else ""
            lines.append(f"  PPO --clip-coef {c}: {per_task or '(no records)'}{dist}")
        if self.clip is None:
            lines.append(f"  not complete: {len(self.missing)} missing in {self.folder}, e.g. {self.missing[0]}")
        else:
            lines.append(f"  chosen: --clip-coef {self.clip}")
        return "\n".join(lines)


def _records(folder: Path) -> list[dict]:
    out = []
    for f in sorted(Path(folder).glob("*.json.gz")):
        try:
            rec = read_record(f)
        except (OSError, ValueError):
            continue
        if rec.get("finished"):
            out.append(rec)
    return out


def calibrate(records_parent, total_timesteps=TIER_TIMESTEPS) -> Calibration:
    """Apply the calibration rule to the records in `records_parent`/tier4 (PPO at lag 0 with each candidate
    --clip-coef, seeds 101-103) against VACO at lag 0 in `records_parent`/tier1 (seeds 1-10). Records are matched
    by their arguments (script, --clip-coef, task, lag, seed, budget), not by file name, so records of the same
    runs made elsewhere (e.g. by the wandb sweep, exported with tools/grid/aggregate.py) count too."""
    import numpy as np

    parent = Path(records_parent)
    missing, ppo, vaco = [], {}, {}
    for rec in _records(parent / "tier4"):
        args = rec.get("args") or {}
        if rec.get("lag") != 0 or args.get("total_timesteps") != total_timesteps or not str(rec.get("algo")).startswith("ppo"):
            continue
        clip = next((c for c in CALIBRATION_CLIPS if abs(float(args.get("clip_coef", -1)) - float(c)) < 1e-9), None)
        if clip is not None and rec.get("task") in TASKS and rec.get("seed") in CALIBRATION_SEEDS:
            ppo.setdefault((clip, rec["task"], rec["seed"]), window_tv(rec))
    for rec in _records(parent / "tier1"):
        args = rec.get("args") or {}
        if rec.get("algo") == "vaco" and rec.get("lag") == 0 and args.get("total_timesteps") == total_timesteps:
            if rec.get("task") in TASKS and rec.get("seed") in VACO_SEEDS:
                vaco.setdefault((rec["task"], rec["seed"]), window_tv(rec))
    for c in CALIBRATION_CLIPS:
        for t in TASKS:
            missing += [f"{t}__ppo-clip{c}__lag0__s{s}" for s in CALIBRATION_SEEDS if (c, t, s) not in ppo]
    for t in TASKS:
        missing += [f"{t}__vaco__lag0__s{s} (tier1)" for s in VACO_SEEDS if (t, s) not in vaco]
    missing += [f"{k} (no TV in the window)" for k, v in {**ppo, **vaco}.items() if not np.isfinite(v)]
    vaco_tv = {t: float(np.mean([v for (tt, _), v in vaco.items() if tt == t])) for t in TASKS if any(k[0] == t for k in vaco)}
    ppo_tv = {}
    for c in CALIBRATION_CLIPS:
        for t in TASKS:
            vals = [v for (cc, tt, _), v in ppo.items() if (cc, tt) == (c, t)]
            if vals:
                ppo_tv[(c, t)] = float(np.mean(vals))
    distance = {
        c: float(np.mean([abs(ppo_tv[(c, t)] - vaco_tv[t]) for t in TASKS]))
        for c in CALIBRATION_CLIPS
        if all((c, t) in ppo_tv and t in vaco_tv for t in TASKS)
    }
    clip = None
    if not missing:
        clip = min(CALIBRATION_CLIPS, key=lambda c: (distance[c], float(c)))  # ties: the smaller clip
    return Calibration(clip, vaco_tv, ppo_tv, distance, missing, parent / "tier4")
