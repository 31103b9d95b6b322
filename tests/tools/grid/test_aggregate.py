"""Tests of the experiment tooling: wandb sweep configs, tools/grid/run_grid.py and tools/grid/aggregate.py.

    .venv/bin/python -m pytest tests/test_tooling.py -q

The grid runner is exercised on a tiny fake training script written into tmp_path (records, resuming,
chunks, signals); aggregation on synthetic run records with known answers. Nothing here reads or writes the
checkout's runs/ or results/ (apart from reading the committed reference table). The sweep test renders each sweep's command lines with
wandb's own agent code (no server) and feeds them to the real scripts' `parse_args` (skipped for a script
that does not exist yet).
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tools.grid import aggregate, aggregate_figures, measures, run_grid, run_records
from tools.stats import t_interval

REPO = Path(__file__).resolve().parent.parent

SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
SCRIPTS = ("ppo_mujoco.py", "vaco_mujoco.py", "spo_mujoco.py", "impala_mujoco.py")
_modules: dict[str, object] = {}


def script_module(name: str):
    """Import a training script as a module (its training code sits under `if __name__ == "__main__"`)."""
    path = REPO / name
    if not path.exists():
        pytest.skip(f"{name} does not exist yet")
    if name not in _modules:
        spec = importlib.util.spec_from_file_location(f"_tooling_test_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # tyro reads the Args docstrings through the module
        spec.loader.exec_module(module)
        _modules[name] = module
    return _modules[name]


# ------------------------------------------------------------------------------------------ wandb sweeps


def expand_grid(config: dict) -> list[dict]:
    """All parameter combinations of a `method: grid` sweep (what the wandb grid search enumerates)."""
    names, choices = [], []
    for name, spec in config["parameters"].items():
        names.append(name)
        choices.append(spec["values"] if "values" in spec else [spec["value"]])
    return [dict(zip(names, combo)) for combo in itertools.product(*choices)]


def covering_subset(config: dict) -> list[dict]:
    """A few combinations that together use every value of every parameter at least once."""
    params = config["parameters"]
    width = max(len(s.get("values", [None])) for s in params.values())
    out = []
    for i in range(width):
        out.append({n: (s["values"][i % len(s["values"])] if "values" in s else s["value"]) for n, s in params.items()})
    return out


def render_with_wandb_agent(config: dict, params: dict, tmp_path, monkeypatch) -> list[str]:
    """The argv `wandb agent` would execute for one run of this sweep, produced by wandb's Agent code."""
    import wandb.wandb_agent as wandb_agent

    for var in ("WANDB_DIR", "WANDB_RUN_ID", "WANDB_SWEEP_ID", "WANDB_SWEEP_PARAM_PATH"):
        monkeypatch.setenv(var, str(tmp_path) if var == "WANDB_DIR" else "x")
    captured = {}

    class Recorder:
        def __init__(self, command=None, env=None, **kwargs):
            captured["command"] = command

    monkeypatch.setattr(wandb_agent, "AgentProcess", Recorder)
    agent = wandb_agent.Agent(api=None, queue=None, sweep_id="test")
    agent._sweep_command = list(config.get("command") or [])
    agent._command_run(
        {"type": "run", "run_id": "run0", "program": config["program"], "args": {k: {"value": v} for k, v in params.items()}}
    )
    return captured["command"]


def test_sweep_files_present():
    names = {p.name for p in SWEEPS}
    for algo in ("ppo", "vaco", "spo", "impala"):
        assert f"{algo}_grid.yaml" in names
    assert {"vaco_ablation_delta.yaml", "vaco_ablation_rho_bar.yaml", "vaco_ablation_components.yaml"} <= names


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.stem)
def test_sweep_renders_and_script_accepts(sweep, tmp_path, monkeypatch):
    from wandb.sdk.launch.sweeps.utils import load_sweep_config

    config = load_sweep_config(str(sweep))
    assert config["method"] == "grid" and config["program"] in SCRIPTS
    grid = expand_grid(config)
    assert {"env_id", "lag", "seed"} <= set(config["parameters"])
    if sweep.stem.startswith(("round1_", "round2_")):  # the evidence grid's lags (tests/test_run_grid.py checks its cells)
        assert set(config["parameters"]["lag"]["values"]) <= {0, 4, 8}
    else:
        assert len(config["parameters"]["lag"]["values"]) == 5  # five degrees of asynchronicity
    n_runs = int(next(line for line in sweep.read_text().splitlines() if line.startswith("# Runs:")).split()[2].rstrip("."))
    assert len(grid) == n_runs  # the header's run count is right
    subset = covering_subset(config)
    rendered = [render_with_wandb_agent(config, p, tmp_path, monkeypatch) for p in subset]
    for argv, params in zip(rendered, subset):
        assert argv[:3] == ["/usr/bin/env", "python", config["program"]]
        assert any(a.startswith("--lag=") for a in argv)
        if "track" in params:
            assert f"--track={params['track']}" in argv  # wandb's boolean style
    module = script_module(config["program"])  # skips if the script is not written yet
    for argv, params in zip(rendered, subset):
        args = module.parse_args(argv[3:])
        for name, value in params.items():
            got = getattr(args, name)
            assert math.isclose(got, value) if isinstance(value, float) else got == value, (name, got, value)


@pytest.mark.parametrize("label", ["ppo", "spo", "impala", "vaco", *run_grid.ABLATIONS])
def test_runner_command_lines_accepted_by_scripts(label, tmp_path):
    opts = run_grid.parse_args(
        [
            "--algos",
            label,
            "--envs",
            "Hopper-v5",
            "--lags",
            "2",
            "--seeds",
            "3",
            "--lag-modes",
            "fixed",
            "--total-timesteps",
            "500000",
            "--out",
            str(tmp_path),
            "--",
            "--num-envs",
            "4",
            "--num-steps",
            "64",
        ]
    )
    (run,) = run_grid.build_runs(opts)
    module = script_module(Path(run.cmd[1]).name)
    args = module.parse_args(run.cmd[2:])
    assert (args.exp_name, args.env_id, args.lag, args.lag_mode, args.seed) == (label, "Hopper-v5", 2, "fixed", 3)
    assert (args.torch_threads, args.run_dir, args.num_envs) == (1, str(run.run_dir), 4)
    if label.startswith("vaco"):
        assert args.filter == ("nofilter" not in label) and args.realign == ("norealign" not in label)
        if "delta" in label:
            assert math.isclose(args.tv_threshold, float(label.split("delta")[1]))
        if "rhobar" in label:
            assert math.isclose(args.rho_bar, float(label.split("rhobar")[1]))
    # aggregate.py labels the run the same way whether it came from the runner (exp_name = label) or from a
    # wandb sweep (exp_name = the script's default, ablation read from the flags)
    parsed = dataclasses.asdict(args)
    assert run_records.algo_label(parsed) == f"{label}[fixed]"
    assert run_records.algo_label(dict(parsed, exp_name=Path(run.cmd[1]).stem)) == f"{label}[fixed]"


# ------------------------------------------------------------------------------------------ grid runner

FAKE_SCRIPT = r"""
import argparse, json, os, signal, subprocess, sys, time
t0 = time.time()
p = argparse.ArgumentParser()
for flag in ("exp-name", "env-id", "run-dir", "lag-mode"):
    p.add_argument("--" + flag, "--" + flag.replace("-", "_"), dest=flag.replace("-", "_"))
for flag in ("seed", "lag", "total-timesteps", "torch-threads"):
    p.add_argument("--" + flag, "--" + flag.replace("-", "_"), dest=flag.replace("-", "_"), type=int)
p.add_argument("--tv-threshold", type=float, default=0.2)
p.add_argument("--filter", dest="filter", action="store_true", default=True)
p.add_argument("--no-filter", dest="filter", action="store_false")
p.add_argument("--fail", action="store_true")
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--spawn", action="store_true", help="start a grandchild process that outlives a plain kill")
p.add_argument("--resume", action="store_true")
p.add_argument("--overwrite", action="store_true")
args, unknown = p.parse_known_args()
args.lag_mode = args.lag_mode or "uniform"
if args.overwrite and os.path.isdir(args.run_dir):  # as the training scripts do: delete only what a run writes
    for name in os.listdir(args.run_dir):
        if name in ("args.json", "summary.json", "resumed", "pids.json") or name.startswith("events.out.tfevents."):
            os.remove(os.path.join(args.run_dir, name))
if os.path.isdir(args.run_dir) and os.listdir(args.run_dir) and not args.resume:  # as the training scripts do
    sys.exit(f"error: run folder {args.run_dir} is not empty")
os.makedirs(args.run_dir, exist_ok=True)
if args.resume:
    open(os.path.join(args.run_dir, "resumed"), "w").write("yes")
record = dict(vars(args), argv=sys.argv[1:], omp=os.environ.get("OMP_NUM_THREADS"))
json.dump(record, open(os.path.join(args.run_dir, "args.json"), "w"))
print("fake training", args.exp_name, args.seed, flush=True)
if args.fail:
    print("Traceback (most recent call last):\nRuntimeError: boom, fake failure", file=sys.stderr)
    sys.exit(3)
def on_signal(signum, frame):  # like the training scripts: mark the summary as interrupted, exit 128 + signum
    json.dump({"interrupted": True}, open(os.path.join(args.run_dir, "summary.json"), "w"))
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
pids = [os.getpid()]
if args.spawn:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(120)"
    pids.append(subprocess.Popen([sys.executable, "-c", code]).pid)  # deaf to SIGTERM/SIGINT: only a kill stops it
json.dump(pids, open(os.path.join(args.run_dir, "pids.json"), "w"))
time.sleep(args.sleep)
# TensorBoard's own event writer (what torch's SummaryWriter wraps), to spare each run the torch import
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter
w = EventFileWriter(args.run_dir)
def add_scalar(tag, value, step):
    w.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)])))
T = args.total_timesteps
base = 100.0 * args.seed + 10.0 * args.lag + (5.0 if args.exp_name.startswith("vaco") else 0.0)
for step in range(T // 10, T + 1, T // 10):
    add_scalar("charts/episodic_return", base if step > 0.9 * T else -1000.0, step)
    add_scalar("lag/final_tv", 0.1 + 0.01 * args.lag, step)
for r in (1.0, 2.0, 6.0):
    add_scalar("eval/episodic_return", r, T)
time.sleep(0.5)  # long enough for the two workers' runs to overlap
w.close()
json.dump({"global_step": T, "final_return": base, "start": t0, "end": time.time()},
          open(os.path.join(args.run_dir, "summary.json"), "w"))
"""


def run_runner(argv, timeout=120):
    cmd = [sys.executable, "-m", "tools.grid.run_grid", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def fake_argv(tmp_path, algos, seeds=("1", "2"), lags=("2",), steps="1000", extra=()):
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_SCRIPT)
    argv = ["--algos", *algos, "--envs", "Hopper-v5", "--lags", *lags, "--seeds", *seeds, "--total-timesteps", steps]
    argv += ["--workers", "2", "--out", str(tmp_path / "grid"), "--records", str(tmp_path / "records"), "--poll", "0.1"]
    for base in ("ppo", "vaco", "spo", "impala"):
        argv += ["--script", f"{base}={fake}"]
    return argv + ["--", *extra] if extra else argv


def test_run_grid_records_and_resume(tmp_path):
    argv = fake_argv(tmp_path, ["ppo", "vaco-nofilter", "bad=spo --fail"], extra=["--num-envs", "3"])
    out, records = tmp_path / "grid", tmp_path / "records"

    dry = run_runner(argv[: argv.index("--")] + ["--dry-run"] + argv[argv.index("--") :])
    assert dry.returncode == 0 and not out.exists() and not records.exists()
    lines = dry.stdout.strip().splitlines()
    assert len(lines) == 6 and all(line.startswith("OMP_NUM_THREADS=1 ") for line in lines)

    first = run_runner(argv)
    assert first.returncode == 1, first.stdout + first.stderr
    good = sorted(p.name for p in records.glob("*.json.gz"))
    assert good == [
        "Hopper-v5__ppo__lag2__s1.json.gz",
        "Hopper-v5__ppo__lag2__s2.json.gz",
        "Hopper-v5__vaco-nofilter__lag2__s1.json.gz",
        "Hopper-v5__vaco-nofilter__lag2__s2.json.gz",
    ]
    assert "4 finished" in first.stdout and "2 failed" in first.stdout
    assert "2 FAILED run(s)" in first.stdout and "RuntimeError: boom, fake failure" in first.stdout
    assert "Hopper-v5__bad__lag2__s1 (exit code 3" in first.stdout
    rec = json.loads((out / "Hopper-v5__vaco-nofilter__lag2__s2" / "args.json").read_text())
    assert rec["omp"] == "1" and rec["torch_threads"] == 1 and rec["filter"] is False
    assert rec["exp_name"] == "vaco-nofilter" and rec["run_dir"] == str(out / "Hopper-v5__vaco-nofilter__lag2__s2")
    assert rec["argv"][-2:] == ["--num-envs", "3"]
    assert (out / "Hopper-v5__ppo__lag2__s1.log").read_text().count("fake training") == 1
    spans = [json.loads(p.read_text()) for p in out.glob("*/summary.json")]
    assert any(a["start"] < b["end"] and b["start"] < a["end"] for a, b in itertools.combinations(spans, 2)), "no overlap"

    # the record holds what the tables need, and nothing machine-specific
    r = run_records.read_record(records / "Hopper-v5__vaco-nofilter__lag2__s2.json.gz")
    assert (r["algo"], r["task"], r["lag"], r["seed"], r["finished"]) == ("vaco-nofilter", "Hopper-v5", 2, 2, True)
    assert r["scalars"]["step"] == list(range(100, 1001, 100)) and r["eval_returns"] == [1.0, 2.0, 6.0]
    assert r["scalars"]["episodic_return"][-1] == 225.0 and "run_dir" not in r["args"]
    assert (records / "Hopper-v5__ppo__lag2__s1.json.gz").stat().st_size < 2000

    # a fresh machine: no run folders, only the records -> everything recorded is skipped
    import shutil

    shutil.rmtree(out)
    ok_only = [a for a in argv if a != "bad=spo --fail"]
    again = run_runner(ok_only)
    assert again.returncode == 0 and "4 skipped" in again.stdout and "0 finished" in again.stdout
    assert [p.name for p in out.iterdir()] == [run_grid.LOCK]

    # the records aggregate: final score = mean over the last 10% of steps
    ref = tmp_path / "ref.csv"
    ref.write_text("env_id,random_return,reference_return\nHopper-v5,0,1000\n")
    res = aggregate.aggregate(
        [records], tmp_path / "res", reference=ref, reps=50, curve_reps=20, plots=False, log=lambda m: None
    )
    final = res["final"].set_index(["algo", "seed"])
    assert final.loc[("ppo", 2), "final_return"] == pytest.approx(220.0)
    assert final.loc[("vaco-nofilter", 1), "normalized_score"] == pytest.approx(0.125)
    assert final.loc[("ppo", 1), "final_tv"] == pytest.approx(0.12) and final.loc[("ppo", 1), "eval_return"] == 3.0


def test_run_grid_writes_records_of_finished_folders_and_max_runs(tmp_path):
    argv = fake_argv(tmp_path, ["ppo"], seeds=("1", "2", "3"))
    records = tmp_path / "records"
    no_records = [a for a in argv if a not in ("--records", str(records))]
    first = run_runner(no_records + ["--max-runs", "1"])  # one chunk of one run, without records
    assert first.returncode == 0 and "1 finished" in first.stdout and "2 run(s) left" in first.stdout
    assert not records.exists()
    second = run_runner(argv + ["--max-runs", "1"])  # records asked for: the finished folder gets its record too
    assert second.returncode == 0 and "1 already finished, 1 to run" in second.stdout
    assert sorted(p.name for p in records.glob("*.gz")) == [
        "Hopper-v5__ppo__lag2__s1.json.gz",
        "Hopper-v5__ppo__lag2__s2.json.gz",
    ]
    # A budget that has run out before the first start starts nothing; one that has room starts the last run.
    # (The budget counts from the runner's start; 1 µs is spent on reading the run folders before the first start.)
    spent = run_runner(argv + ["--time-budget", "0.000001s"])
    assert spent.returncode == 0 and "1 not started within the --time-budget" in spent.stdout
    assert len(list(records.glob("*.gz"))) == 2
    third = run_runner(argv + ["--time-budget", "10m"])
    assert third.returncode == 0 and "2 skipped" in third.stdout and "1 finished" in third.stdout
    assert len(list(records.glob("*.gz"))) == 3


def test_run_grid_resume_unfinished(tmp_path):
    argv = fake_argv(tmp_path, ["ppo"], seeds=("1",))
    run_dir = tmp_path / "grid" / "Hopper-v5__ppo__lag2__s1"
    assert run_runner(argv + ["--", "--fail"]).returncode == 1 and (run_dir / "args.json").exists()  # left unfinished
    resumed = run_runner(argv + ["--resume-unfinished"])
    assert resumed.returncode == 0 and (run_dir / "resumed").exists() and run_records.is_finished(run_dir)
    log = (tmp_path / "grid" / "Hopper-v5__ppo__lag2__s1.log").read_text()
    assert "--fail" in log and "--resume" in log  # the log of both attempts
    assert (tmp_path / "records" / "Hopper-v5__ppo__lag2__s1.json.gz").exists()
    run_runner(argv + ["--", "--fail"])  # record exists: skipped
    (tmp_path / "records" / "Hopper-v5__ppo__lag2__s1.json.gz").unlink()
    (run_dir / "summary.json").unlink()
    again = run_runner(argv)  # without the flag: started over, the script deleting what its run wrote
    assert again.returncode == 0 and not (run_dir / "resumed").exists() and run_records.is_finished(run_dir)
    log = (tmp_path / "grid" / "Hopper-v5__ppo__lag2__s1.log").read_text()
    assert "--overwrite" in log and log.count("fake training") == 3  # appended: every attempt's output is kept


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


def test_run_grid_redoes_a_damaged_record(tmp_path):
    argv = fake_argv(tmp_path, ["ppo"], seeds=("1", "2"))
    out, records = tmp_path / "grid", tmp_path / "records"
    assert run_runner(argv).returncode == 0
    s1, s2 = (records / f"Hopper-v5__ppo__lag2__s{i}.json.gz" for i in (1, 2))
    good = s1.read_bytes()
    damage_record(s1, "cut")  # its run folder is finished: the record is made again from it
    damage_record(s2, "garbage")
    import shutil

    shutil.rmtree(out / s2.name.removesuffix(".json.gz"))  # no run folder (a fresh clone): the run is redone
    dry = run_runner(argv + ["--dry-run"])
    assert dry.returncode == 0
    notes = [line.split("  # ")[1] for line in dry.stdout.splitlines()]
    assert notes == [
        "finished run folder, would skip; not a whole record at its place, would set it aside",
        "not a whole record at its place, would set it aside and redo the run",
    ]
    assert sorted(p.name for p in records.iterdir()) == [s1.name, s2.name]  # the dry run changed nothing
    again = run_runner(argv)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"[grid] warning: {s1}: not a whole run record (cut short: the gzip stream ends early); kept as " in again.stdout
    assert f"[grid] warning: {s2}: not a whole run record (BadGzipFile" in again.stdout
    assert "1 record(s) written for finished run folders" in again.stdout and "1 finished" in again.stdout
    assert (records / f"{s1.name}.damaged-1").read_bytes() == good[: len(good) // 2]
    assert (records / f"{s2.name}.damaged-1").read_bytes() == b"garbage\n"
    assert s1.read_bytes() == good and run_records.read_record(s2)["finished"]
    assert len(run_records.collect_records([records], log=lambda m: None)) == 2  # the kept files are not read as records


def wait_for_log(log: Path, text: str):
    deadline = time.time() + 60
    while text not in (log.read_text() if log.exists() else "") and time.time() < deadline:
        time.sleep(0.1)
    assert text in log.read_text()


def test_run_grid_locks_its_out_folder(tmp_path):
    """A second run_grid on the same --out is refused at once, naming the first, and touches none of its runs;
    the shards of one grid share it."""
    argv = fake_argv(tmp_path, ["ppo"], seeds=("1", "2"))
    out = tmp_path / "grid"
    log = out / "Hopper-v5__ppo__lag2__s1.log"
    first = subprocess.Popen([sys.executable, "-m", "tools.grid.run_grid", *argv, "--", "--sleep", "120"], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_for_log(log, "fake training")
        before = log.read_bytes()
        for extra in ([], ["--shard", "0/2"]):
            second = run_runner(argv + extra)
            assert second.returncode == 2 and second.stdout == "", second.stdout + second.stderr
            (line,) = second.stderr.strip().splitlines()
            assert line.startswith(f"error: {out} is in use by run_grid process {first.pid} on ")
            assert log.read_bytes() == before  # the running run's log, untouched
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 143
    shard = subprocess.Popen([sys.executable, "-m", "tools.grid.run_grid", *argv, "--shard", "0/2", "--", "--sleep", "120"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_for_log(log, "--overwrite")  # the interrupted run, started over
        other = run_runner(argv + ["--shard", "1/2"])  # the other shard runs beside it
        assert other.returncode == 0 and "1 finished" in other.stdout, other.stdout + other.stderr
        whole = run_runner(argv)
        assert whole.returncode == 2 and f"is in use by run_grid process {shard.pid} on " in whole.stderr
    finally:
        shard.send_signal(signal.SIGTERM)
        shard.communicate(timeout=60)
    assert sorted(p.name for p in out.glob("*.lock")) == [
        run_grid.LOCK,
        "run_grid.shard-0-of-2.lock",
        "run_grid.shard-1-of-2.lock",
    ]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_run_grid_signal_leaves_no_process(tmp_path, sig):
    argv = fake_argv(tmp_path, ["ppo"], seeds=("1", "2", "3"), lags=("0",), steps="100", extra=["--sleep", "60", "--spawn"])
    out = tmp_path / "grid"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.grid.run_grid", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 60
    while len(list(out.glob("*/pids.json"))) < 2 and time.time() < deadline:  # both workers' runs (and their children) started
        time.sleep(0.1)
    time.sleep(0.3)
    pids = [pid for f in out.glob("*/pids.json") for pid in json.loads(f.read_text())]
    assert len(pids) == 4
    proc.send_signal(sig)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stdout
    assert f"{signal.Signals(sig).name}: stopped 2 running run(s)" in stdout and "1 not started" in stdout
    time.sleep(0.2)
    alive = []
    for pid in pids:  # neither the training processes nor what they started are alive (zombies count as dead)
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
            os.kill(pid, signal.SIGKILL)  # this test's own leftovers
    assert not alive, f"processes left alive: {alive}"
    # the runs saw the signal (their summaries say interrupted), so none counts as finished
    summaries = [json.loads(p.read_text()) for p in out.glob("*/summary.json")]
    assert len(summaries) == 2 and all(s == {"interrupted": True} for s in summaries)
    assert not (tmp_path / "records").exists()
    assert not any(run_records.is_finished(d) for d in out.iterdir())


def test_tiers(tmp_path):
    def runs(*argv):
        return run_grid.build_runs(run_grid.parse_args(list(argv)))

    t1, t2, t3 = runs("--tier", "1"), runs("--tier", "2"), runs("--tier", "3")
    assert (len(t1), len(t2), len(t3)) == (120, 40, 40)
    for r in t1 + t2 + t3:
        flags = " ".join(r.cmd)
        assert "--total_timesteps=500000" in flags and "--num_envs=8 --num_steps=256 --eval_episodes=10" in flags
        assert "--lag_mode=uniform --env_backend=gymnasium" in flags and "--track" not in flags
        assert (
            r.record.parent.name == f"tier{1 if r in t1 else 2 if r in t2 else 3}" and r.record.parent.parent.name == "records"
        )
        assert r.record.name == r.run_dir.name + ".json.gz"
    assert {(r.variant.label, r.lag) for r in t2} == {("vaco-norealign", 8), ("vaco-nofilter", 8)}
    assert {r.variant.flags[1] for r in t2} == {"--realign=False", "--filter=False"}
    assert {r.variant.label for r in t3} == {"spo", "impala"} and {r.seed for r in t3} == {1, 2, 3, 4, 5}
    assert {r.env for r in t1} == {"Hopper-v5", "Walker2d-v5"} and {r.lag for r in t1} == {0, 4, 8}
    # seed-major; within a seed lags 0 and 8 first (both algorithms and tasks), then lag 4
    assert [r.seed for r in t1] == sorted(r.seed for r in t1)
    assert [(r.lag, r.env, r.variant.label) for r in t1[:8]] == [
        (lag, env, a) for lag in (0, 8) for env in ("Hopper-v5", "Walker2d-v5") for a in ("ppo", "vaco")
    ]
    assert {r.lag for r in t1[8:12]} == {4}
    every = runs("--tier", "1", "2", "3")
    assert len(every) == 200 and [r.seed for r in every] == sorted(r.seed for r in every)
    assert [r.run_dir.parent.name for r in every[:24]] == ["tier1"] * 12 + ["tier2"] * 4 + ["tier3"] * 8
    assert len(runs("--tier", "1", "--seeds", "1", "2")) == 24
    for r in (t1[0], t1[1], t2[0], t2[1], t3[0], t3[1]):  # the real scripts accept every tier's command line
        # The run folder goes to tmp_path: the checkout's own runs/ may hold a run of the grid.
        argv = [str(tmp_path / r.run_dir.name) if a == str(r.run_dir) else a for a in r.cmd[2:]]
        args = script_module(Path(r.cmd[1]).name).parse_args(argv)
        assert (args.num_envs, args.num_steps, args.eval_episodes, args.lag_mode) == (8, 256, 10, "uniform")
        assert (args.total_timesteps, args.exp_name, args.lag) == (500_000, r.variant.label, r.lag)
        assert (args.torch_threads, args.env_threads, args.track) == (1, 1, False)
        if r in t2:
            assert (args.realign, args.filter) == (r.variant.label != "vaco-norealign", r.variant.label != "vaco-nofilter")
    for bad in (["--tier", "1", "--algos", "ppo"], ["--tier", "1", "--total-timesteps", "1000"], ["--tier", "9"]):
        proc = run_runner(bad + ["--dry-run"])
        assert proc.returncode == 2 and "error:" in proc.stderr, bad


def test_run_grid_labels_and_errors():
    assert run_grid.parse_variant("vaco-norealign-nofilter").flags == ["--no-realign", "--no-filter"]
    assert run_grid.parse_variant("vaco-delta0.05").flags == ["--tv-threshold", "0.05"]
    v = run_grid.parse_variant("impala-cbar2=impala --c-bar 2")
    assert (v.label, v.base, v.flags) == ("impala-cbar2", "impala", ["--c-bar", "2"])
    assert script_module("impala_mujoco.py").parse_args(v.flags).c_bar == 2.0  # a real flag of the script
    for bad in ("dqn", "vaco-nonsense", "x=dqn --a"):
        with pytest.raises(ValueError):
            run_grid.parse_variant(bad)
    opts = run_grid.parse_args(
        ["--algos", "ppo", "--ablations", "--envs", "A-v0", "B-v0", "--lags", "0", "8", "--seeds", "1", "2", "--shard", "1/3"]
    )
    assert opts.algos[:2] == ["ppo", "vaco"] and len(opts.algos) == 2 + len(run_grid.ABLATIONS)
    full = run_grid.build_runs(
        run_grid.parse_args(
            ["--algos", "ppo", "--ablations", "--envs", "A-v0", "B-v0", "--lags", "0", "8", "--seeds", "1", "2"]
        )
    )
    assert len(full) == len(opts.algos) * 2 * 2 * 2 and all(r.record is None for r in full)
    assert [r.run_dir for r in run_grid.build_runs(opts)] == [r.run_dir for r in full[1::3]]
    assert full[0].seed == 1 and full[-1].seed == 2  # seed-major order
    assert run_grid.lag_order([0, 1, 2, 4, 8]) == [0, 8, 1, 2, 4] and run_grid.lag_order([3]) == [3]
    assert [run_grid.parse_duration(t) for t in ("90", "90m", "1.5h")] == [90, 5400, 5400]


# ------------------------------------------------------------------------------------------ aggregation

REF = {"TaskA-v0": (0.0, 100.0), "TaskB-v0": (-100.0, 100.0)}  # random, reference
T = 1000
SEEDS = (1, 2, 3, 4)
# Normalised final score of each run: BASE[algo, lag] + task offset + 0.01 * seed (the seed term cancels in
# every difference of means, so the differences below are exact).
BASE = {
    ("ppo", 0): 0.6,
    ("ppo", 4): 0.4,
    ("ppo", 8): 0.2,
    ("vaco", 0): 0.6,
    ("vaco", 4): 0.5,
    ("vaco", 8): 0.4,
    ("vaco-nofilter", 8): 0.3,
    ("vaco-norealign", 8): 0.35,
    ("spo", 0): 0.5,
    ("spo", 8): 0.1,
    ("impala", 0): 0.3,
    ("impala", 8): 0.0,
}
OFFSET = {"TaskA-v0": 0.0, "TaskB-v0": 0.1}
TV = {0: 0.03, 4: 0.09, 8: 0.11}  # VACO's final TV at each lag; delta/2 = 0.1


def score(algo, lag, task, seed):
    extra = 0.1 if (algo, lag, task) == ("vaco", 8, "TaskB-v0") else 0.0  # VACO gains more on TaskB at lag 8
    return BASE[algo, lag] + OFFSET[task] + 0.01 * seed + extra


def synthetic_record(algo, task, lag, seed, norm_score, finished=True, steps=None):
    """A record whose training return is -500 until 90% of training, then final +- 10 (mean: final)."""
    lo, hi = REF[task]
    final = lo + norm_score * (hi - lo)
    steps = steps or [100, 200, 300, 400, 500, 600, 700, 800, 900, 960, 1000]
    ret = {s: (-500.0 if s <= 900 else final + (10.0 if s < 1000 else -10.0)) for s in steps}
    tv = {s: 5.0 if s <= 900 else (TV[lag] if algo == "vaco" else 0.05) for s in steps}
    args = {"exp_name": f"{algo.split('-')[0]}_mujoco", "env_id": task, "lag": lag, "lag_mode": "uniform", "seed": seed}
    args["total_timesteps"] = T
    if algo.startswith("vaco"):
        args.update(tv_threshold=0.2, rho_bar=1.0, realign=algo != "vaco-norealign", filter=algo != "vaco-nofilter")
    summary = {"global_step": T, "final_return": final} if finished else None
    scalars = {"episodic_return": ret, "final_tv": tv, "backward_tv": {s: 0.02 * lag for s in steps}}
    return run_records.make_record(f"{task}__{algo}__lag{lag}__s{seed}", args, summary, scalars, [1.0, 2.0, 6.0])


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    for algo, lag in BASE:
        for task in REF:
            for seed in SEEDS:
                run_records.write_record(
                    synthetic_record(algo, task, lag, seed, score(algo, lag, task, seed)),
                    root / "g" / f"{task}__{algo}__lag{lag}__s{seed}.json.gz",
                )
    run_records.write_record(synthetic_record("ppo", "TaskA-v0", 0, 7, 9.0, finished=False), root / "g" / "unfinished.json.gz")
    ref = root / "reference.csv"
    ref.write_text(
        "# test table\nenv_id,random_return,reference_return\n" + "".join(f"{k},{lo},{hi}\n" for k, (lo, hi) in REF.items())
    )
    out = root / "out"
    res = aggregate.aggregate([root / "g"], out, reference=ref, reps=300, curve_reps=50, seed=0, log=lambda m: None)
    return root, out, res, ref


def test_normalise():
    ref = pd.DataFrame(
        {"random_return": [0.0, -100.0], "reference_return": [100.0, 100.0]},
        index=pd.Index(["TaskA-v0", "TaskB-v0"], name="env_id"),
    )
    assert np.allclose(aggregate.normalise([50.0, 0.0, 300.0], ["TaskA-v0", "TaskB-v0", "TaskB-v0"], ref), [0.5, 0.5, 2.0])


def test_t_interval():
    # Student-t half-widths: t(0.975, 2) = 4.3027, t(0.975, 9) = 2.2622 (tables), not 1.96
    v = np.array([1.0, 2.0, 6.0])
    m, h, n = t_interval(v)
    assert (m, n) == (3.0, 3) and h == pytest.approx(4.302653 * np.std(v, ddof=1) / np.sqrt(3), rel=1e-6)
    w = np.arange(10.0)
    assert t_interval(w)[1] == pytest.approx(2.262157 * np.std(w, ddof=1) / np.sqrt(10), rel=1e-6)
    assert np.isnan(t_interval([5.0])[1]) and t_interval([np.nan, 2.0])[2] == 1


def test_difference_interval_against_exact_bootstrap():
    """D's interval (rliable's stratified independent bootstrap) against the exact bootstrap distribution: every
    resample of the four 3-run cells enumerated (27^4 equally likely combinations)."""
    cells = {("x", 8): [0.1, 0.5, 0.9], ("x", 0): [0.6, 0.8, 1.3], ("ppo", 8): [0.0, 0.2, 0.7], ("ppo", 0): [0.9, 1.0, 1.6]}
    final = pd.DataFrame(
        [
            {"algo": a, "lag": k, "task": "T", "seed": i, "normalized_score": v}
            for (a, k), vs in cells.items()
            for i, v in enumerate(vs)
        ]
    )
    terms = [(1, "x", 8), (-1, "x", 0), (-1, "ppo", 8), (1, "ppo", 0)]
    task, pooled = aggregate.difference_table(final, terms, "d", reps=4000, seed=0)
    resampled = [np.array(list(itertools.product(cells[a, k], repeat=3))).mean(axis=1) for _, a, k in terms]  # 27 each
    grids = np.meshgrid(*resampled, indexing="ij")
    exact = sum(sign * g for (sign, _, _), g in zip(terms, grids)).ravel()
    lo, hi = np.percentile(exact, [2.5, 97.5])
    assert task["estimate"] == pooled["estimate"] == pytest.approx(0.5 - 0.9 - 0.3 + 3.5 / 3)
    assert (task["ci_low"], task["ci_high"]) == pytest.approx((lo, hi), abs=0.03 * (hi - lo))
    assert (pooled["ci_low"], pooled["ci_high"]) == (task["ci_low"], task["ci_high"])  # one task: pooled = the task
    const = aggregate.difference_table(final.assign(normalized_score=0.3), terms[:2], "d", reps=50, seed=0)[0]
    assert (const["estimate"], const["ci_low"], const["ci_high"]) == pytest.approx((0.0, 0.0, 0.0))


def test_probability_of_improvement_by_pairs(synthetic):
    """P(X > PPO) at each lag against counting pairs: mean over tasks of P(x > y) + P(x = y) / 2."""
    res = synthetic[2]
    poi, final = res["improvement"].set_index(["x", "y"]), res["final"]
    for algo, lag in (("vaco", 8), ("spo", 0), ("impala", 8)):
        per_task = []
        for task in REF:
            cell = lambda a: final[
                (final.algo == a) & (final.lag == lag) & (final.task == task)
            ].normalized_score  # noqa: E731
            x, y = cell(algo).to_numpy(), cell("ppo").to_numpy()
            per_task.append(np.mean([(a > b) + 0.5 * (a == b) for a in x for b in y]))
        r = poi.loc[(f"{algo} lag {lag}", f"ppo lag {lag}")]
        assert r.estimate == pytest.approx(np.mean(per_task)) and r.ci_low <= r.estimate <= r.ci_high


def test_final_scores_and_tables(synthetic):
    _, out, res, _ = synthetic
    final = pd.read_csv(out / "final.csv", comment="#")
    assert (out / "final.csv").read_text().startswith("# final score = mean training episodic return over the last 10%")
    assert len(final) == len(BASE) * 2 * len(SEEDS) and 7 not in set(final.seed)  # unfinished left out
    row = final[(final.algo == "ppo") & (final.task == "TaskB-v0") & (final.lag == 0) & (final.seed == 2)].iloc[0]
    assert row.normalized_score == pytest.approx(0.6 + 0.1 + 0.02)  # mean of the two points after 90% of training
    assert row.final_tv == pytest.approx(0.05) and row.eval_return == pytest.approx(3.0)
    assert set(final.algo) == {"ppo", "vaco", "vaco-nofilter", "vaco-norealign", "spo", "impala"}
    per_task = pd.read_csv(out / "per_task.csv", comment="#")
    p = per_task[(per_task.algo == "vaco") & (per_task.task == "TaskA-v0") & (per_task.lag == 4)].iloc[0]
    seeds = np.array(SEEDS) * 0.01
    assert p.runs == 4 and p.normalized_score_mean == pytest.approx(0.5 + seeds.mean())
    assert p.normalized_score_ci95 == pytest.approx(3.182446 * seeds.std(ddof=1) / 2, rel=1e-5)  # t(0.975, 3)
    assert p.final_tv_mean == pytest.approx(0.09)
    agg = pd.read_csv(out / "aggregate.csv", comment="#")
    get = lambda algo, lag, m: agg[(agg.algo == algo) & (agg.lag == lag) & (agg.metric == m)].iloc[0]  # noqa: E731
    values = np.sort([score("ppo", 0, t, s) for t in REF for s in SEEDS])
    assert get("ppo", 0, "iqm").estimate == pytest.approx(values[2:6].mean())
    assert get("ppo", 0, "mean").estimate == pytest.approx(values.mean())
    for r in agg.itertuples():
        assert r.ci_low <= r.estimate + 1e-12 <= r.ci_high + 2e-12 and r.n_tasks == 2 and r.runs_per_task == 4
    again = aggregate.aggregate_table(res["final"], reps=300, seed=0, log=lambda m: None)
    assert np.allclose(again.ci_low, res["aggregate"].ci_low)  # a fixed seed: reproducible intervals


def test_primary_measure_and_ablations(synthetic):
    _, out, res, _ = synthetic
    deg = pd.read_csv(out / "degradation.csv", comment="#")
    d = deg[(deg.measure == "degradation_difference") & (deg.algo == "vaco")].set_index("task")
    # (VACO 8 - VACO 0) - (PPO 8 - PPO 0): TaskA (0.4 - 0.6) - (0.2 - 0.6) = 0.2; TaskB adds VACO's 0.1 there
    assert d.loc["TaskA-v0", "estimate"] == pytest.approx(0.2) and d.loc["TaskB-v0", "estimate"] == pytest.approx(0.3)
    assert d.loc["pooled", "estimate"] == pytest.approx(0.25) and (d.vs == "ppo").all()
    assert (d.ci_low < d.estimate).all() and (d.estimate < d.ci_high).all() and (d.ci_low > 0).all()
    own = deg[(deg.measure == "degradation") & (deg.task == "pooled")].set_index("algo").estimate
    assert own["ppo"] == pytest.approx(-0.4) and own["impala"] == pytest.approx(-0.3) and "vaco-nofilter" not in own
    assert set(deg[deg.measure == "degradation_difference"].algo) == {"vaco", "spo", "impala"}
    abl = pd.read_csv(out / "ablation.csv", comment="#").set_index(["algo", "task"])
    assert abl.loc[("vaco-nofilter", "TaskA-v0"), "estimate"] == pytest.approx(0.3 - 0.4)
    assert abl.loc[("vaco-norealign", "pooled"), "estimate"] == pytest.approx(((0.35 - 0.4) + (0.35 - 0.5)) / 2)
    assert (abl["lag"] == 8).all()


def test_verdict(synthetic, tmp_path, monkeypatch):
    root, out, res, ref = synthetic
    table = res["verdict_table"].set_index("criterion")
    assert res["verdict"] == "supported" and table.holds.tolist() == [True, True, True, True, False, False]
    assert (
        "| supporting | pooled (VACO 8 - VACO 0) - (PPO 8 - PPO 0): 95% interval above 0 | +0.250 ["
        in (out / "verdict.md").read_text()
    )
    assert "**supported (provisional: 4 of the 10" in res["verdict_md"]  # 4 seeds, not the pre-registered 10
    monkeypatch.setattr(aggregate, "PREREGISTERED_SEEDS", 4)
    assert "**supported**" in aggregate.verdict_markdown(res["verdict_table"], res["verdict"], res["final"])
    md = (out / "verdict.md").read_text()  # with the tables a reading needs
    assert "| vaco | +0.200 [" in md and "| vaco-nofilter | -0.100 [" in md and "| vaco | TaskA-v0 | 0.030 ± 0.000 |" in md
    # Flip the grid: VACO loses more than PPO and ends below it -> refuted
    g = tmp_path / "g"
    for f in (root / "g").glob("*.json.gz"):
        rec = run_records.read_record(f)
        if rec["algo"] == "vaco" and rec["lag"] == 8:
            rec["scalars"]["episodic_return"] = [
                -500.0 if v == -500.0 else v - 60.0 for v in rec["scalars"]["episodic_return"]
            ]
        run_records.write_record(rec, g / f.name)
    flipped = aggregate.aggregate([g], tmp_path / "o", reference=ref, reps=100, curve_reps=10, plots=False, log=lambda m: None)
    holds = flipped["verdict_table"].set_index("kind").holds
    assert flipped["verdict"] == "refuted" and holds["refuting"].tolist() == [True, True]
    # Without lag-8 runs nothing can be judged
    only0 = aggregate.aggregate(
        [r for r in g.glob("*lag0*")], tmp_path / "o0", reference=ref, reps=50, curve_reps=10, plots=False, log=lambda m: None
    )
    assert only0["verdict"] == "inconclusive" and only0["verdict_table"].holds.isna().all()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.grid.aggregate",
            str(g),
            "--reference",
            str(ref),
            "--out",
            str(tmp_path / "cli"),
            "--verdict",
            "--no-plots",
            "--reps",
            "50",
            "--curve-reps",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert (
        proc.returncode == 0
        and "pre-registered criteria: **refuted (provisional: 4 of the 10 pre-registered seeds" in proc.stdout
    ), proc.stderr


def test_deciles_post_hoc(tmp_path):
    """Per-decile means against a loop over the steps with the boundaries written out; 1-9 and the whole run too."""
    steps = list(range(50, 1001, 50))  # 20 iterations, 2 per decile
    rs = np.random.RandomState(3)
    values = {seed: {c: rs.rand(len(steps)) for c in measures.DECILE_COLUMNS} for seed in (1, 2, 3)}
    g = tmp_path / "g"
    for seed, cols in values.items():
        rec = synthetic_record("vaco", "TaskA-v0", 8, seed, 0.5, steps=steps)
        for c, v in cols.items():
            rec["scalars"][c] = [float(x) for x in v]
        run_records.write_record(rec, g / f"{seed}.json.gz")
    ref = tmp_path / "ref.csv"
    ref.write_text("env_id,random_return,reference_return\nTaskA-v0,0,100\n")
    res = aggregate.aggregate([g], tmp_path / "o", reference=ref, reps=20, curve_reps=5, log=lambda m: None)
    dec = pd.read_csv(tmp_path / "o" / "deciles.csv", comment="#", dtype={"decile": str}).set_index("decile")
    assert dec.index.tolist() == [*map(str, range(1, 11)), "1-9", "all"] and (dec.runs == 3).all()
    for c in measures.DECILE_COLUMNS:
        for d in range(1, 11):
            per_run = [
                np.mean([v for s, v in zip(steps, values[k][c]) if (d - 1) * T / 10 < s <= d * T / 10]) for k in (1, 2, 3)
            ]
            assert dec.loc[str(d), f"{c}_mean"] == pytest.approx(np.mean(per_run), rel=1e-5)
            assert dec.loc[str(d), f"{c}_ci95"] == pytest.approx(4.302653 * np.std(per_run, ddof=1) / np.sqrt(3), rel=1e-4)
        early = [np.mean([v for s, v in zip(steps, values[k][c]) if s <= 0.9 * T]) for k in (1, 2, 3)]
        assert dec.loc["1-9", f"{c}_mean"] == pytest.approx(np.mean(early), rel=1e-5)
        assert dec.loc["all", f"{c}_mean"] == pytest.approx(np.mean([values[k][c].mean() for k in (1, 2, 3)]), rel=1e-5)
    assert "Post hoc, not pre-registered" in res["verdict_md"] and "deciles.png" in res["written"]


def test_not_learned_is_marked(synthetic):
    agg = pd.DataFrame(
        {
            "algo": ["a", "b", "c", "a"],
            "lag": [0, 0, 0, 8],
            "metric": "iqm",
            "estimate": [0.0, 0.5, -0.01, 0.0],
            "ci_low": [-0.01, 0.4, -0.02, 0.1],
            "ci_high": [0.02, 0.6, 0.0, 0.2],
        }
    )
    assert aggregate.not_learned(agg) == {"a", "c"} and aggregate.not_learned(agg, lag=8) == set()
    res = synthetic[2]  # every synthetic algorithm learns: nothing marked
    assert "†" not in res["verdict_md"]
    md = aggregate.results_markdown(res["aggregate"], res["degradation"], res["ablation"], res["per_task"], marked={"impala"})
    assert "| impala † | " in md and "† did not learn" in md


def test_curves_at_logged_points_only(tmp_path):
    ref = tmp_path / "ref.csv"
    ref.write_text("env_id,random_return,reference_return\nTaskA-v0,0,100\nTaskB-v0,-100,100\n")
    g = tmp_path / "g"
    steps = {1: [100, 300, 500, 1000], 2: [100, 200, 500, 1000], 3: [100, 500, 700, 1000]}  # common: 100, 500, 1000
    for seed, st in steps.items():
        rec = synthetic_record("ppo", "TaskA-v0", 0, seed, 0.5, steps=st)
        run_records.write_record(rec, g / f"{seed}.json.gz")
    res = aggregate.aggregate([g], tmp_path / "o", reference=ref, reps=20, curve_reps=20, log=lambda m: None)
    c = res["curves"]
    assert c.step.tolist() == [100, 500, 1000] and c.iqm.tolist() == pytest.approx([-5.0, -5.0, 0.4])
    assert measures.curve_steps([pd.DataFrame({"step": np.arange(1, 101), "episodic_return": 1.0})], 5).tolist() == [
        1,
        26,
        51,
        75,
        100,
    ]


def test_figures(synthetic):
    _, out, res, _ = synthetic
    for name in (
        "score_vs_lag.png",
        "intervals.png",
        "degradation.png",
        "ablation.png",
        "iqm_curves.png",
        "performance_profiles.png",
        "probability_of_improvement.png",
        "task_curves.png",
        "final_tv.png",
    ):
        assert name in res["written"] and (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    colors = aggregate_figures.colors_for(["impala", "vaco", "ppo", "spo", "vaco-nofilter", "mine", "ppo[fixed]"])
    assert colors["vaco"] == aggregate_figures.COLORS["vaco"] != colors["impala"] and colors["ppo[fixed]"] == colors["ppo"]
    assert len({colors[k] for k in ("impala", "vaco", "ppo", "spo", "vaco-nofilter", "mine")}) == 6
    assert colors == aggregate_figures.colors_for(
        ["ppo[fixed]", "mine", "vaco-nofilter", "spo", "ppo", "vaco", "impala"]
    )  # order-free
    # 2 tasks, no score at the reference: no median panel (= mean), no optimality gap (= 1 - mean)
    assert aggregate_figures.meaningful_metrics(res["final"], 2) == ["iqm", "mean"]
    assert aggregate_figures.meaningful_metrics(res["final"].assign(normalized_score=1.2), 3) == [
        "iqm",
        "mean",
        "median",
        "optimality_gap",
    ]


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


def test_cli_defaults_stay_out_of_tracked_folders():
    assert aggregate.DEFAULT_OUT == "runs/aggregate" and "runs/" in (REPO / ".gitignore").read_text().split()
    assert [p.relative_to(REPO).as_posix() for p in aggregate.DEFAULT_SOURCES] == [
        f"results/records/tier{i}" for i in (1, 2, 3)
    ]


def test_algo_labels():
    base = {"exp_name": "vaco_mujoco", "tv_threshold": 0.2, "rho_bar": 1.0, "realign": True, "filter": True}
    assert run_records.algo_label(base) == "vaco"
    assert run_records.algo_label(dict(base, realign=False, filter=False)) == "vaco-norealign-nofilter"
    assert run_records.algo_label(dict(base, tv_threshold=0.05)) == "vaco-delta0.05"
    assert run_records.algo_label(dict(base, rho_bar=2.0, lag_mode="fixed")) == "vaco-rhobar2[fixed]"
    assert run_records.algo_label({"exp_name": "spo_mujoco"}) == "spo"
    assert run_records.algo_label({"exp_name": "my-variant"}) == "my-variant"


def test_reference_table_committed():
    ref = aggregate.load_reference(aggregate.DEFAULT_REFERENCE)
    for task in ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5"):
        lo, hi = ref.loc[task, ["random_return", "reference_return"]]
        assert np.isfinite(lo) and np.isfinite(hi) and hi > lo + 100, task
    assert ref.loc["Hopper-v5", "reference_return"] == pytest.approx(2741.42)


def test_measure_random(tmp_path):
    measured = aggregate.measure_random(["InvertedPendulum-v5"], episodes=2, seed=0)
    table = aggregate.write_reference(measured, tmp_path / "ref.csv")
    assert table.loc[0, "reference_return"] == pytest.approx(888.83)
    again = aggregate.load_reference(tmp_path / "ref.csv")
    assert 0 < again.loc["InvertedPendulum-v5", "random_return"] < 100  # a random policy drops the pole fast
    assert (tmp_path / "ref.csv").read_text().startswith("# Reference returns")


def test_run_grid_lock_file_is_never_a_link(tmp_path):
    outside, out = tmp_path / "outside", tmp_path / "grid"
    outside.write_text("kept\n")
    out.mkdir()
    for link in (os.symlink, os.link):
        link(outside, out / run_grid.LOCK)
        with pytest.raises(ValueError, match="not a file of its own"):
            run_grid.lock_folders([out], None)
        (out / run_grid.LOCK).unlink()
    assert outside.read_text() == "kept\n"
    held = run_grid.lock_folders([out], None)
    assert (out / run_grid.LOCK).read_text().startswith(f"run_grid process {os.getpid()} on ")
    with pytest.raises(ValueError, match=f"is in use by run_grid process {os.getpid()} on "):
        run_grid.lock_folders([out], None)
    for f in held:
        f.close()
    for f in run_grid.lock_folders([out], None):  # free again once the holder's file is closed
        f.close()
