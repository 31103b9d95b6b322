"""tools/grid/calibration.py: the window TV by hand, and the rule that chooses the TV-matched PPO's clip on synthetic
records (the window decides, a tie goes to the smaller clip, records count by their arguments)."""

import pytest

from calibration_records import D, PPO_TV, T, TASKS, VACO_TV, put_record, tv_series, write_calibration, write_first_grid_vaco
from tools.grid import calibration, run_records


def test_window_tv_by_hand(tmp_path):
    tv = {D: 9.0, 2 * D: 9.0, 3 * D: 1.0, 5 * D: 2.0, 8 * D: 6.0, 9 * D: 9.0, T: 9.0}
    put_record(tmp_path, "r", "ppo", "Hopper-v5", 1, tv)
    rec = run_records.read_record(tmp_path / "r.json.gz")
    assert calibration.window_tv(rec) == pytest.approx(3.0)  # steps 3 D, 5 D, 8 D: (1 + 2 + 6) / 3
    assert calibration.window_tv(rec, (0.9, 1.0)) == pytest.approx(9.0)


def test_calibration_rule_on_synthetic_records(tmp_path):
    write_first_grid_vaco(tmp_path)
    # early/late values that make the whole-run mean and the last 10% pick clip 0.3: only the window picks 0.4
    write_calibration(tmp_path, early={"0.3": 0.5, "0.4": 0.2, "0.5": 0.2}, late={"0.3": 0.01, "0.4": 0.05, "0.5": 0.05})
    cal = calibration.calibrate(tmp_path, total_timesteps=T)
    assert cal.missing == [] and cal.clip == "0.4"
    assert cal.vaco_tv == pytest.approx(VACO_TV)
    assert cal.ppo_tv == pytest.approx(PPO_TV)
    assert cal.distance == pytest.approx({"0.3": 0.030, "0.4": 0.0075, "0.5": 0.015})
    assert "chosen: --clip-coef 0.4" in cal.report()
    # the same records at another budget do not count
    assert calibration.calibrate(tmp_path, total_timesteps=2 * T).clip is None


def test_calibration_tie_goes_to_the_smaller_clip(tmp_path):
    # exact binary fractions: clips 0.3 and 0.5 are both 0.125 from VACO's 0.375
    for task in TASKS:
        for seed in range(1, 11):
            put_record(tmp_path / "tier1", f"{task}__vaco__lag0__s{seed}", "vaco", task, seed, tv_series(0.5, 0.375, 0.0))
        for clip, value in (("0.3", 0.25), ("0.4", 0.875), ("0.5", 0.5)):
            for seed in (101, 102, 103):
                put_record(
                    tmp_path / "tier4",
                    f"{task}__ppo-clip{clip}__lag0__s{seed}",
                    f"ppo-clip{clip}",
                    task,
                    seed,
                    tv_series(0.0, value, 0.0),
                    {"clip_coef": float(clip)},
                )
    cal = calibration.calibrate(tmp_path, total_timesteps=T)
    assert cal.distance == {"0.3": 0.125, "0.4": 0.5, "0.5": 0.125} and cal.clip == "0.3"


def test_calibration_matches_records_by_arguments(tmp_path):
    """Records made elsewhere (a wandb sweep's folders, exported) count by their arguments, not their names;
    unfinished records and other seeds do not count."""
    write_first_grid_vaco(tmp_path)
    write_calibration(tmp_path, name=lambda clip, task, seed: f"{task}__ppo_mujoco__{seed}__17650{clip[-1]}")
    put_record(tmp_path / "tier4", "other_seed", "ppo", "Hopper-v5", 7, tv_series(0, 0.0, 0), {"clip_coef": 0.4})
    assert calibration.calibrate(tmp_path, total_timesteps=T).clip == "0.4"
    (tmp_path / "tier4" / "Walker2d-v5__ppo_mujoco__103__176505.json.gz").unlink()
    put_record(
        tmp_path / "tier4", "unfinished", "ppo", "Walker2d-v5", 103, tv_series(0, 0.12, 0), {"clip_coef": 0.5}, finished=False
    )
    cal = calibration.calibrate(tmp_path, total_timesteps=T)
    assert cal.clip is None and cal.missing == ["Walker2d-v5__ppo-clip0.5__lag0__s103"]
    assert "not complete: 1 missing" in cal.report()
