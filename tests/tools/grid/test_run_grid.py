"""Tests of the evidence grid in tools/grid/run_grid.py: its tiers (sweep files) against the committed records, the
label rule of tools/grid/sweeps.py, round 2's command lines, the calibration rule of the TV-matched PPO on synthetic records, the refusal of tier 5 before the calibration is complete, and `--commit`.

    .venv/bin/python -m pytest tests/test_run_grid.py -q

Nothing here writes into the checkout: every call that may write gets `--records` in tmp_path; the tiers' cells are
checked against the committed records (results/records/tier*), read only.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tools.grid import calibration, run_grid, run_records

REPO = Path(__file__).resolve().parent.parent

TASKS = ("Hopper-v5", "Walker2d-v5")
SHAPE = "--num-envs 8 --num-steps 256 --eval-episodes 10 --lag-mode uniform --env-backend gymnasium"


def runner(*argv, env=None):
    """The runner in a subprocess, from an empty folder (the repository on PYTHONPATH): run folders under ./runs (on
    a machine that ran the grid) would otherwise count as finished runs and turn dry-run lines into "would skip"."""
    cmd = [sys.executable, "-m", "tools.grid.run_grid", *argv]
    env = dict(os.environ if env is None else env, PYTHONPATH=str(REPO))
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
        f"OMP_NUM_THREADS=1 {shlex.quote(sys.executable)} {REPO}/{script}_mujoco.py --exp-name {label} --env-id {env} "
        f"--seed {seed} --lag {lag} --total-timesteps {steps} --torch-threads 1 --env-threads 1 --run-dir {run}"
        + (f" {flags}" if flags else "")
        + f" {SHAPE}"
    )


def same_run(line: str, *expected, **kw) -> bool:
    """The dry-run line runs the expected script with the expected flags (order and form aside)."""
    return canonical(line) == canonical(expected_line(*expected, **kw))


# ------------------------------------------------------------------------------- synthetic records

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


def script_args(name, argv):
    spec = importlib.util.spec_from_file_location(f"_run_grid_test_{name}", REPO / f"{name}_mujoco.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # tyro reads the Args docstrings through the module
    spec.loader.exec_module(module)
    return module.parse_args(argv)


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
        args = script_args(name, argv)
        assert (args.num_envs, args.num_steps, args.eval_episodes, args.env_backend) == (8, 256, 10, "gymnasium")
        for key, value in want.items():
            assert getattr(args, key) == value, (tier, key)


def test_commit_each_record(tmp_path):
    """--commit: each finished run's record is committed on its own; other staged changes stay out."""
    from test_tooling import FAKE_SCRIPT

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
    folder = REPO / "results" / "records" / f"tier{tier}"
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


def test_sweep_labels():
    """The label rule of tools/grid/sweeps.py, on a file written here: exp_name, or the script's name, then the varied
    parameters (short names; `no` for false; numbers as :g writes them); folder names from it; collisions refused."""
    from tools.grid.sweeps import read_sweep

    def cells(tmp, params):
        path = Path(tmp) / "s.yaml"
        path.write_text(yaml.safe_dump({"program": "vaco_mujoco.py", "method": "grid", "parameters": params}))
        return read_sweep(path)

    with tempfile.TemporaryDirectory() as tmp:
        got = cells(tmp, {"env_id": {"values": ["Hopper-v5"]}, "realign": {"values": [True, False]},
                          "rho_bar": {"values": [2.0]}, "lag": {"values": [8]}, "seed": {"values": [3]}})  # fmt: skip
        assert [(c.name, c.label) for c in got] == [
            ("Hopper-v5__vaco-rhobar2__lag8__s3", "vaco-rhobar2"),
            ("Hopper-v5__vaco-norealign-rhobar2__lag8__s3", "vaco-norealign-rhobar2"),
        ]
        assert got[1].flags()[:2] == ["--exp_name=vaco-norealign-rhobar2", "--env_id=Hopper-v5"]
        named = cells(tmp, {"exp_name": {"value": "mine"}, "env_id": {"values": ["A-v0"]}, "lag": {"values": [0]}})
        assert [c.name for c in named] == ["A-v0__mine__lag0"] and named[0].flags() == [
            "--exp_name=mine",
            "--env_id=A-v0",
            "--lag=0",
        ]
        with pytest.raises(ValueError, match="share a run folder"):
            cells(tmp, {"a": {"values": ["1", 1]}, "lag": {"values": [0]}})  # both are -a1


def test_sweep_option_runs_a_sweep_file(tmp_path):
    """--sweep: the same cells, folders and flags as the launcher, without the wandb-only parameters."""
    lines = dry_lines(runner("--sweep", str(REPO / "sweeps" / "round2_vaco_delta.yaml"), "--seeds", "1", "--dry-run"))
    assert len(lines) == 4 and not any("--track" in x for x in lines)
    script, flags = canonical(lines[0])
    assert flags["run-dir"] == "runs/grid/Hopper-v5__vaco-delta0.1__lag8__s1" and flags["tv-threshold"] == "0.1"
    proc = runner("--sweep", str(tmp_path / "none.yaml"), "--dry-run")
    assert proc.returncode == 2 and "none.yaml cannot be read" in proc.stderr
