"""Tests of tools/grid/run_grid.py: its tiers (sweep files) against the committed records, round 2's command lines,
the refusal of tier 5 before the calibration of the TV-matched PPO is complete (on synthetic records), `--commit`,
the command lines the real scripts accept; and, on a tiny fake training script written into tmp_path, records,
resuming, chunks, locks and signals.

    .venv/bin/python -m pytest tests/tools/grid/test_run_grid.py -q

Nothing here writes into the checkout: every call that may write gets `--records` in tmp_path; the tiers' cells are
checked against the committed records (results/records/tier*), read only.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from calibration_records import TASKS, T, write_calibration, write_first_grid_vaco
from conftest import ROOT, import_script
from tools.grid import aggregate, run_grid, run_records

SHAPE = "--num-envs 8 --num-steps 256 --eval-episodes 10 --lag-mode uniform --env-backend gymnasium"


def runner(*argv, env=None):
    """The runner in a subprocess, from an empty folder (the repository on PYTHONPATH): run folders under ./runs (on
    a machine that ran the grid) would otherwise count as finished runs and turn dry-run lines into "would skip"."""
    cmd = [sys.executable, "-m", "tools.grid.run_grid", *argv]
    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as empty:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=empty)


def dry_lines(proc) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def options(argv) -> dict:
    """{flag: value} of a command line, in either form (`--a-b v` or `--a_b=v`; `--no-x` is x False)."""
    flags, i = {}, 0
    while i < len(argv):
        key, eq, value = argv[i][2:].partition("=")
        if not eq and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            key, value = (key[3:], "False") if key.startswith("no-") else (key, "True")
        elif not eq:
            value, i = argv[i + 1], i + 1
        flags[key.replace("_", "-")] = value
        i += 1
    return flags


def canonical(line: str) -> tuple[str, dict]:
    """(the script, its flags) of a dry-run line, whatever the order and form of the flags."""
    argv = shlex.split(line.split("  #")[0])
    assert argv[0] == "OMP_NUM_THREADS=1" and argv[1] == sys.executable
    return argv[2], options(argv[3:])


def expected_line(script, label, env, seed, lag, tier, flags, steps=500000):
    """The command line of one run, written out here independently of the runner's code."""
    run = f"runs/tier{tier}/{env}__{label}__lag{lag}__s{seed}"
    return (
        f"OMP_NUM_THREADS=1 {shlex.quote(sys.executable)} {ROOT}/{script}_mujoco.py --exp-name {label} --env-id {env} "
        f"--seed {seed} --lag {lag} --total-timesteps {steps} --torch-threads 1 --env-threads 1 --run-dir {run}"
        + (f" {flags}" if flags else "")
        + f" {SHAPE}"
    )


def same_run(line: str, *expected, **kw) -> bool:
    """The dry-run line runs the expected script with the expected flags (order and form aside)."""
    return canonical(line) == canonical(expected_line(*expected, **kw))


def test_tier5_refused_until_the_calibration_is_complete(tmp_path):
    write_first_grid_vaco(tmp_path)
    write_calibration(tmp_path, skip={("0.5", "Walker2d-v5", 103)})
    common = ["--records", str(tmp_path), "--total-timesteps", str(T), "--dry-run"]
    proc = runner("--tier", "5", *common)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: tier 5") and "Walker2d-v5__ppo-clip0.5__lag0__s103" in line and "--tier 4" in line
    # with tier 4 in the same call (--round 2), tier 5 waits: tiers 4, 6, 7, 8 run, tier 4's 17 records are skipped
    lines = dry_lines(proc := runner("--round", "2", *common))
    assert "tier 5 (the TV-matched PPO) waits for the calibration: 1 record(s) missing" in proc.stderr
    assert len(lines) == 18 + 40 + 60 + 20 and not any("runs/tier5/" in x for x in lines)
    assert sum(x.endswith("# record exists, would skip") for x in lines) == 17
    assert not lines[17].endswith("would skip") and "Walker2d-v5__ppo-clip0.5__lag0__s103" in lines[17]
    # once it is complete, tier 5 is the calibrated PPO, and runs right after tier 4
    write_calibration(tmp_path)
    proc = runner("--tier", "5", *common)
    tier5 = dry_lines(proc)
    assert "chosen: --clip-coef 0.4" in proc.stderr and len(tier5) == 60
    assert same_run(tier5[0], "ppo", "ppo-clip0.4", "Hopper-v5", 1, 0, 5, "--clip-coef 0.4", steps=T)
    assert all(canonical(x)[1]["exp-name"] == "ppo-clip0.4" and canonical(x)[1]["clip-coef"] == "0.4" for x in tier5)
    assert {(canonical(x)[1]["env-id"], canonical(x)[1]["lag"]) for x in tier5} == {
        (t, k) for t in TASKS for k in ("0", "4", "8")
    }
    every = dry_lines(runner("--round", "2", *common))
    assert len(every) == 198 and every[18:78] == tier5 and all("runs/tier4/" in x for x in every[:18])


def test_round2_command_lines(tmp_path):
    """The tiers of round 2 as written in docs/evidence_round2.md, in the order they run (calibration incomplete)."""
    proc = runner("--round", "2", "--records", str(tmp_path), "--dry-run")
    lines = dry_lines(proc)
    tiers = [x.split("--run-dir runs/tier")[1][0] for x in lines]
    assert tiers == ["4"] * 18 + ["6"] * 40 + ["7"] * 60 + ["8"] * 20
    assert same_run(lines[0], "ppo", "ppo-clip0.3", "Hopper-v5", 101, 0, 4, "--clip-coef 0.3")
    assert same_run(lines[5], "ppo", "ppo-clip0.5", "Walker2d-v5", 101, 0, 4, "--clip-coef 0.5")
    assert same_run(lines[17], "ppo", "ppo-clip0.5", "Walker2d-v5", 103, 0, 4, "--clip-coef 0.5")
    one_pass = "--update-epochs 1 --no-norm-adv --no-clip-vloss"
    assert same_run(lines[18], "impala", "impala-1pass", "Hopper-v5", 1, 0, 6, one_pass)
    assert same_run(lines[21], "impala", "impala-1pass", "Walker2d-v5", 1, 8, 6, one_pass)
    assert same_run(lines[58], "ppo", "ppo", "HalfCheetah-v5", 1, 0, 7, "")
    assert same_run(lines[59], "vaco", "vaco", "HalfCheetah-v5", 1, 0, 7, "")
    assert same_run(lines[62], "ppo", "ppo", "HalfCheetah-v5", 1, 4, 7, "")  # lags 0, 8, then 4
    assert same_run(lines[118], "vaco", "vaco-delta0.1", "Hopper-v5", 1, 8, 8, "--tv-threshold 0.1")
    assert same_run(lines[-1], "vaco", "vaco-delta0.4", "Walker2d-v5", 5, 8, 8, "--tv-threshold 0.4")
    # seed-major inside each tier; the cells of each tier
    for tier, seeds in (("4", [101, 102, 103]), ("6", range(1, 11)), ("7", range(1, 11)), ("8", range(1, 6))):
        got = [int(canonical(x)[1]["seed"]) for x, t in zip(lines, tiers) if t == tier]
        assert got == sorted(got) and set(got) == set(seeds)
    # the first grid's tiers are untouched by round 2: a hand-written line and the count
    first = dry_lines(runner("--round", "1", "--records", str(tmp_path), "--dry-run"))
    assert len(first) == 200 and same_run(first[0], "ppo", "ppo", "Hopper-v5", 1, 0, 1, "")
    assert first == dry_lines(runner("--tier", "1", "2", "3", "--records", str(tmp_path), "--dry-run"))
    for bad in (["--round", "2", "--tier", "4"], ["--round", "3"], ["--round", "2", "--algos", "ppo"]):
        proc = runner(*bad, "--dry-run")
        assert proc.returncode == 2 and "error:" in proc.stderr, bad


def test_round2_lines_accepted_by_the_scripts(tmp_path):
    write_first_grid_vaco(tmp_path)
    write_calibration(tmp_path)
    lines = dry_lines(runner("--round", "2", "--records", str(tmp_path), "--total-timesteps", str(T), "--dry-run"))
    picks = {4: lines[0], 5: lines[18], 6: lines[78], 7: lines[119], 8: lines[178]}
    expect = {
        4: ("ppo", {"clip_coef": 0.3, "lag": 0, "seed": 101}),
        5: ("ppo", {"clip_coef": 0.4, "lag": 0, "seed": 1}),
        6: ("impala", {"update_epochs": 1, "norm_adv": False, "clip_vloss": False, "num_minibatches": 32, "rho_bar": 1.0}),
        7: ("vaco", {"env_id": "HalfCheetah-v5", "tv_threshold": 0.2}),
        8: ("vaco", {"tv_threshold": 0.1, "lag": 8}),
    }
    for tier, line in picks.items():
        name, want = expect[tier]
        argv = shlex.split(line.split("  #")[0])[2:]
        assert argv[0].endswith(f"{name}_mujoco.py")
        argv = [str(tmp_path / "run") if a.startswith("runs/tier") else a for a in argv[1:]]
        args = import_script(f"{name}_mujoco").parse_args(argv)
        assert (args.num_envs, args.num_steps, args.eval_episodes, args.env_backend) == (8, 256, 10, "gymnasium")
        for key, value in want.items():
            assert getattr(args, key) == value, (tier, key)


def test_commit_each_record(tmp_path):
    """--commit: each finished run's record is committed on its own; other staged changes stay out."""
    repo = tmp_path / "repo"
    repo.mkdir()
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    git = ["git", "-C", str(repo)]
    subprocess.run(git + ["init", "-q"], check=True, env=env)
    (repo / "staged.txt").write_text("not a record")
    subprocess.run(git + ["add", "staged.txt"], check=True, env=env)
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_SCRIPT)
    argv = ["--algos", "ppo", "--envs", "Hopper-v5", "--lags", "0", "--seeds", "1", "2", "--total-timesteps", "100"]
    argv += ["--workers", "2", "--out", str(tmp_path / "grid"), "--records", str(repo / "records"), "--poll", "0.1"]
    proc = runner(*argv, "--script", f"ppo={fake}", "--commit", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = subprocess.run(git + ["log", "--format=%s"], capture_output=True, text=True, env=env).stdout.split("\n")
    assert sorted(x for x in log if x) == [f"Evidence grid, records: Hopper-v5__ppo__lag0__s{s}" for s in (1, 2)]
    tracked = subprocess.run(
        git + ["ls-tree", "-r", "--name-only", "HEAD"], capture_output=True, text=True, env=env
    ).stdout.split()
    assert sorted(tracked) == ["records/Hopper-v5__ppo__lag0__s1.json.gz", "records/Hopper-v5__ppo__lag0__s2.json.gz"]
    staged = subprocess.run(git + ["diff", "--cached", "--name-only"], capture_output=True, text=True, env=env).stdout
    assert staged.split() == ["staged.txt"]
    # outside a git repository: the runs still count, with a warning each
    argv[argv.index("--out") + 1], argv[argv.index("--records") + 1] = str(tmp_path / "grid2"), str(tmp_path / "plain")
    proc = runner(*argv, "--script", f"ppo={fake}", "--commit", env=env)
    assert proc.returncode == 0 and proc.stdout.count("not committed (git add failed") == 2, proc.stdout


# ------------------------------------------------------------------------------- the tiers are sweep files


@pytest.mark.parametrize("tier", sorted(run_grid.TIERS))
def test_tier_cells_are_the_committed_records(tier):
    """Each tier, read from its sweep files, has exactly the committed records' cells: every record is seen as done
    (the same file names), and every run's command line has the arguments its record holds (label included)."""
    folder = ROOT / "results" / "records" / f"tier{tier}"
    lines = dry_lines(runner("--tier", str(tier), "--dry-run"))
    assert all(x.endswith("  # record exists, would skip") for x in lines)
    names = [shlex.split(x.split("  #")[0])[-1].split("/")[-1] for x in lines]  # each line ends with its run folder
    assert sorted(f"{name}.json.gz" for name in names) == sorted(p.name for p in folder.glob("*.json.gz"))
    for name, line in zip(names, lines):
        record = run_records.read_record(folder / f"{name}.json.gz")
        script, flags = canonical(line)
        assert (
            Path(script).name == f"{record['args']['exp_name'].split('-')[0]}_mujoco.py"
            and record["algo"] == flags["exp-name"]
        )
        for key, value in flags.items():
            if key not in ("run-dir", "torch-threads", "env-threads"):  # the runner's thread counts are its own
                assert str(record["args"][key.replace("-", "_")]) == value, (name, key)


def test_sweep_option_runs_a_sweep_file(tmp_path):
    """--sweep: the same cells, folders and flags as the launcher, without the wandb-only parameters."""
    lines = dry_lines(runner("--sweep", str(ROOT / "sweeps" / "round2_vaco_delta.yaml"), "--seeds", "1", "--dry-run"))
    assert len(lines) == 4 and not any("--track" in x for x in lines)
    script, flags = canonical(lines[0])
    assert flags["run-dir"] == "runs/grid/Hopper-v5__vaco-delta0.1__lag8__s1" and flags["tv-threshold"] == "0.1"
    proc = runner("--sweep", str(tmp_path / "none.yaml"), "--dry-run")
    assert proc.returncode == 2 and "none.yaml cannot be read" in proc.stderr


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
    module = import_script(Path(run.cmd[1]).stem)
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
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


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


def test_run_grid_redoes_a_damaged_record(tmp_path):
    argv = fake_argv(tmp_path, ["ppo"], seeds=("1", "2"))
    out, records = tmp_path / "grid", tmp_path / "records"
    assert run_runner(argv).returncode == 0
    s1, s2 = (records / f"Hopper-v5__ppo__lag2__s{i}.json.gz" for i in (1, 2))
    good = s1.read_bytes()
    s1.write_bytes(good[: len(good) // 2])  # cut short; its run folder is finished: the record is made again from it
    s2.write_bytes(b"garbage\n")
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
    first = subprocess.Popen([sys.executable, "-m", "tools.grid.run_grid", *argv, "--", "--sleep", "120"], cwd=ROOT,
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
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
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
        cwd=ROOT,
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
        args = import_script(Path(r.cmd[1]).stem).parse_args(argv)
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
    assert import_script("impala_mujoco").parse_args(v.flags).c_bar == 2.0  # a real flag of the script
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
