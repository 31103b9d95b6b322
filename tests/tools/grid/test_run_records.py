"""tools/grid/run_records.py: damaged records (one error line, kept aside when written over), the older result folders
and TensorBoard run folders read as records, the backends of mixed sources flagged, and the algorithm labels."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from tools.grid import aggregate, run_records


def damage_record(path: Path, how: str):
    data = path.read_bytes()
    if how == "cut":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(b"garbage\n")
    elif how == "bit-flip":
        path.write_bytes(data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0x10]) + data[len(data) // 2 + 1 :])
    elif how == "other-format":
        path.write_bytes(gzip.compress(json.dumps({"format": "other/1"}).encode()))
    elif how == "json-list":
        path.write_bytes(gzip.compress(b"[1, 2]"))
    else:  # a record without its scalars
        record = json.loads(gzip.decompress(data))
        path.write_bytes(gzip.compress(json.dumps({k: v for k, v in record.items() if k != "scalars"}).encode()))


RECORD_DAMAGES = ["cut", "empty", "garbage", "bit-flip", "other-format", "json-list", "no-scalars"]


@pytest.mark.parametrize("how", RECORD_DAMAGES)
def test_damaged_record_is_one_error(tmp_path, capsys, how):
    args = {"exp_name": "ppo_mujoco", "env_id": "Hopper-v5", "seed": 1, "lag": 0, "total_timesteps": 100}
    rec = run_records.make_record("r", args, {"global_step": 100}, {"episodic_return": {100: 1.0}}, [])
    path = run_records.write_record(rec, tmp_path / "records" / "r.json.gz")
    assert run_records.read_record(path) == rec
    damage_record(path, how)
    with pytest.raises(run_records.NotARecord, match=str(path)):
        run_records.read_record(path)
    for source in (path, path.parent):  # the file, and the folder that holds it
        assert aggregate.main([str(source), "--out", str(tmp_path / "out"), "--no-plots", "--normalization", "none"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: {path}: not a ") and " run record (" in line
    assert not (tmp_path / "out").exists()
    # exported over: the file there is kept aside, the record written
    assert run_records.export_records([dict(rec, name="r")], path.parent, log=lambda m: None) == [path]
    assert run_records.read_record(path) == rec and (path.parent / "r.json.gz.damaged-1").exists()


def test_sources_legacy_and_run_folders(tmp_path):
    """The older result folders (runs.csv + final.csv) and TensorBoard run folders read like records."""
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    pd.DataFrame(
        {
            "algo": ["ppo[fixed]"],
            "task": ["Hopper-v5"],
            "lag": [8],
            "lag_mode": ["fixed"],
            "seed": [1],
            "last_step": [1000.0],
            "finished": [True],
            "run_dir": ["runs/x/Hopper-v5__ppo__lag8-fixed__s1"],
            "exp_name": ["ppo"],
            "eval_return": [7.0],
            "num_envs": [8],
        }
    ).to_csv(legacy / "final.csv", index=False)
    pd.DataFrame(
        {
            "run_dir": ["runs/x/Hopper-v5__ppo__lag8-fixed__s1"] * 3,
            "step": [500, 950, 1000],
            "episodic_return": [1.0, 10.0, 20.0],
            "final_tv": [0.5, 0.1, 0.2],
            "value_loss": [1.0, 1.0, 1.0],
        }
    ).to_csv(legacy / "runs.csv", index=False)
    (rec,) = run_records.collect_records([legacy])
    assert (rec["algo"], rec["name"], rec["args"]["num_envs"], rec["summary"]["eval_return"]) == (
        "ppo[fixed]",
        "Hopper-v5__ppo__lag8-fixed__s1",
        8,
        7.0,
    )
    row, _ = aggregate.record_frames(rec)
    assert row["final_return"] == 15.0 and row["final_tv"] == pytest.approx(0.15) and row["eval_return"] == 7.0
    exported = run_records.export_records([rec], tmp_path / "rec")
    assert run_records.read_record(exported[0]) == rec and run_records.export_records([rec], tmp_path / "rec") == []
    data = exported[0].read_bytes()
    run_records.write_record(rec, exported[0])
    assert exported[0].read_bytes() == data  # byte-reproducible
    # the tool's own output folder is not mistaken for a source, and an interrupted run is not finished
    res = aggregate.aggregate(
        [legacy], tmp_path / "out", normalization="none", reps=20, curve_reps=10, plots=False, log=lambda m: None
    )
    assert len(run_records.collect_records([tmp_path / "out"], log=lambda m: None)) == 0 and len(res["final"]) == 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "args.json").write_text(
        json.dumps({"exp_name": "vaco_mujoco", "env_id": "Hopper-v5", "seed": 3, "lag": 4, "run_dir": "/x"})
    )
    (run / "summary.json").write_text(json.dumps({"global_step": 10, "interrupted": True}))
    assert not run_records.is_finished(run) and run_records.collect_records([run], log=lambda m: None) == []
    (r,) = run_records.collect_records([run], include_unfinished=True, log=lambda m: None)
    assert (r["algo"], r["lag"], r["finished"], r["scalars"]) == ("vaco", 4, False, {"step": []})


def test_mixed_env_backends_are_flagged(tmp_path):
    for name, backend in (("a", "gymnasium"), ("b", "envpool"), ("c", None)):
        args = {"exp_name": "ppo_mujoco", "env_id": "Hopper-v5", "seed": 1, **({"env_backend": backend} if backend else {})}
        run_records.write_record(run_records.make_record(name, args, {}, {}, []), tmp_path / name / "r.json.gz")
    for folders, expected in ((["a", "c"], []), (["b"], []), (["a", "b", "c"], ["envpool, gymnasium"])):
        logged = []
        run_records.collect_records([tmp_path / f for f in folders], log=logged.append)
        assert [m.split("(")[1].split(")")[0] for m in logged if "backends" in m] == expected


def test_algo_labels():
    base = {"exp_name": "vaco_mujoco", "tv_threshold": 0.2, "rho_bar": 1.0, "realign": True, "filter": True}
    assert run_records.algo_label(base) == "vaco"
    assert run_records.algo_label(dict(base, realign=False, filter=False)) == "vaco-norealign-nofilter"
    assert run_records.algo_label(dict(base, tv_threshold=0.05)) == "vaco-delta0.05"
    assert run_records.algo_label(dict(base, rho_bar=2.0, lag_mode="fixed")) == "vaco-rhobar2[fixed]"
    assert run_records.algo_label({"exp_name": "spo_mujoco"}) == "spo"
    assert run_records.algo_label({"exp_name": "my-variant"}) == "my-variant"
