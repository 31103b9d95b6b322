"""Tests of round 2 of the evidence grid in tools/grid/run_grid.py: its command lines, the calibration rule of the
TV-matched PPO on synthetic records, the refusal of tier 5 before the calibration is complete, and `--commit`.

    .venv/bin/python -m pytest tests/test_run_grid.py -q

Nothing here reads or writes the checkout's runs/ or results/: every call gets `--records` in tmp_path.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tools.grid import run_grid, run_records

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


def expected_line(script, label, env, seed, lag, tier, flags, steps=500000):
    """The command line of one run, written out here independently of the runner's code."""
    run = f"runs/tier{tier}/{env}__{label}__lag{lag}__s{seed}"
    return (
        f"OMP_NUM_THREADS=1 {shlex.quote(sys.executable)} {REPO}/{script}_mujoco.py --exp-name {label} --env-id {env} "
        f"--seed {seed} --lag {lag} --total-timesteps {steps} --torch-threads 1 --env-threads 1 --run-dir {run}"
        + (f" {flags}" if flags else "")
        + f" {SHAPE}"
    )


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
    assert run_grid.window_tv(rec) == pytest.approx(3.0)  # steps 3 D, 5 D, 8 D: (1 + 2 + 6) / 3
    assert run_grid.window_tv(rec, (0.9, 1.0)) == pytest.approx(9.0)


def test_calibration_rule_on_synthetic_records(tmp_path):
    write_first_grid_vaco(tmp_path)
    # early/late values that make the whole-run mean and the last 10% pick clip 0.3: only the window picks 0.4
    write_calibration(tmp_path, early={"0.3": 0.5, "0.4": 0.2, "0.5": 0.2}, late={"0.3": 0.01, "0.4": 0.05, "0.5": 0.05})
    cal = run_grid.calibrate(tmp_path, total_timesteps=T)
    assert cal.missing == [] and cal.clip == "0.4"
    assert cal.vaco_tv == pytest.approx(VACO_TV)
    assert cal.ppo_tv == pytest.approx(PPO_TV)
    assert cal.distance == pytest.approx({"0.3": 0.030, "0.4": 0.0075, "0.5": 0.015})
    assert "chosen: --clip-coef 0.4" in cal.report()
    # the same records at another budget do not count
    assert run_grid.calibrate(tmp_path, total_timesteps=2 * T).clip is None


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
    cal = run_grid.calibrate(tmp_path, total_timesteps=T)
    assert cal.distance == {"0.3": 0.125, "0.4": 0.5, "0.5": 0.125} and cal.clip == "0.3"


def test_calibration_matches_records_by_arguments(tmp_path):
    """Records made elsewhere (a wandb sweep's folders, exported) count by their arguments, not their names;
    unfinished records and other seeds do not count."""
    write_first_grid_vaco(tmp_path)
    write_calibration(tmp_path, name=lambda clip, task, seed: f"{task}__ppo_mujoco__{seed}__17650{clip[-1]}")
    put_record(tmp_path / "tier4", "other_seed", "ppo", "Hopper-v5", 7, tv_series(0, 0.0, 0), {"clip_coef": 0.4})
    assert run_grid.calibrate(tmp_path, total_timesteps=T).clip == "0.4"
    (tmp_path / "tier4" / "Walker2d-v5__ppo_mujoco__103__176505.json.gz").unlink()
    put_record(
        tmp_path / "tier4", "unfinished", "ppo", "Walker2d-v5", 103, tv_series(0, 0.12, 0), {"clip_coef": 0.5}, finished=False
    )
    cal = run_grid.calibrate(tmp_path, total_timesteps=T)
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
    assert tier5[0] == expected_line("ppo", "ppo-clip0.4", "Hopper-v5", 1, 0, 5, "--clip-coef 0.4", steps=T)
    assert all("--exp-name ppo-clip0.4 " in x and " --clip-coef 0.4 " in x for x in tier5)
    assert {(x.split("--env-id ")[1].split()[0], x.split("--lag ")[1].split()[0]) for x in tier5} == {
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
    assert lines[0] == expected_line("ppo", "ppo-clip0.3", "Hopper-v5", 101, 0, 4, "--clip-coef 0.3")
    assert lines[5] == expected_line("ppo", "ppo-clip0.5", "Walker2d-v5", 101, 0, 4, "--clip-coef 0.5")
    assert lines[17] == expected_line("ppo", "ppo-clip0.5", "Walker2d-v5", 103, 0, 4, "--clip-coef 0.5")
    one_pass = "--update-epochs 1 --no-norm-adv --no-clip-vloss"
    assert lines[18] == expected_line("impala", "impala-1pass", "Hopper-v5", 1, 0, 6, one_pass)
    assert lines[21] == expected_line("impala", "impala-1pass", "Walker2d-v5", 1, 8, 6, one_pass)
    assert lines[58] == expected_line("ppo", "ppo", "HalfCheetah-v5", 1, 0, 7, "")
    assert lines[59] == expected_line("vaco", "vaco", "HalfCheetah-v5", 1, 0, 7, "")
    assert lines[62] == expected_line("ppo", "ppo", "HalfCheetah-v5", 1, 4, 7, "")  # lags 0, 8, then 4
    assert lines[118] == expected_line("vaco", "vaco-delta0.1", "Hopper-v5", 1, 8, 8, "--tv-threshold 0.1")
    assert lines[-1] == expected_line("vaco", "vaco-delta0.4", "Walker2d-v5", 5, 8, 8, "--tv-threshold 0.4")
    # seed-major inside each tier; the cells of each tier
    for tier, seeds in (("4", [101, 102, 103]), ("6", range(1, 11)), ("7", range(1, 11)), ("8", range(1, 6))):
        got = [int(x.split("--seed ")[1].split()[0]) for x, t in zip(lines, tiers) if t == tier]
        assert got == sorted(got) and set(got) == set(seeds)
    # the first grid's tiers are untouched by round 2: a hand-written line and the count
    first = dry_lines(runner("--round", "1", "--records", str(tmp_path), "--dry-run"))
    assert len(first) == 200 and first[0] == expected_line("ppo", "ppo", "Hopper-v5", 1, 0, 1, "")
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


# ------------------------------------------------------------------------------- the round-2 wandb sweeps


def sweep_cells(path: Path) -> tuple[str, set]:
    """(script, {(label, task, lag, seed, flags)}) of a round-2 sweep, from its grid (the product of its values)."""
    import yaml

    config = yaml.safe_load(path.read_text())
    params = config["parameters"]
    names = list(params)
    choices = [params[n]["values"] if "values" in params[n] else [params[n]["value"]] for n in names]
    shape = {"total_timesteps": 500000, "num_envs": 8, "num_steps": 256, "eval_episodes": 10, "lag_mode": "uniform"}
    shape.update(env_backend="gymnasium")
    script = config["program"].removesuffix("_mujoco.py")
    cells = set()
    for combo in itertools.product(*choices):
        p = dict(zip(names, combo))
        assert all(p[k] == v for k, v in shape.items()), path.name
        label = run_records.algo_label({"exp_name": p.get("exp_name", f"{script}_mujoco"), **p})
        flags = tuple(sorted((k, v) for k, v in p.items() if k in ("clip_coef", "update_epochs", "norm_adv", "clip_vloss")))
        cells.add((label, p["env_id"], p["lag"], p["seed"], flags))
    return script, cells


def runner_cells(records: Path, tier: int, *extra) -> set:
    """The same tuples from the runner's command lines of one tier."""
    lines = dry_lines(runner("--tier", str(tier), "--records", str(records), *extra, "--dry-run"))
    cells = set()
    for line in lines:
        argv = shlex.split(line.split("  #")[0])[3:]
        opt = {a[2:]: b for a, b in zip(argv, argv[1:]) if a.startswith("--") and not b.startswith("--")}
        flags = []
        if "clip-coef" in opt:
            flags.append(("clip_coef", float(opt["clip-coef"])))
        if "update-epochs" in opt:
            flags += [("clip_vloss", "--no-clip-vloss" not in argv), ("norm_adv", "--no-norm-adv" not in argv)]
            flags.append(("update_epochs", int(opt["update-epochs"])))
        cells.add((opt["exp-name"], opt["env-id"], int(opt["lag"]), int(opt["seed"]), tuple(sorted(flags))))
    return cells


def test_round2_sweeps_match_the_runner(tmp_path):
    """Each round-2 sweep has the cells (label, task, lag, seed, algorithm flags) and the shape of its tier."""
    sweeps = {p.stem: sweep_cells(p) for p in sorted((REPO / "sweeps").glob("round2_*.yaml"))}
    assert len(sweeps) == 8
    empty = tmp_path / "empty"
    # tier 4: the same (clip, task, lag, seed); the sweep has one label for its three clips (the rule reads the clip)
    script, cells = sweeps["round2_ppo_clip_calibration"]
    assert script == "ppo" and {x[0] for x in cells} == {"ppo-clip-calibration"}
    assert {x[1:] for x in cells} == {x[1:] for x in runner_cells(empty, 4)}
    # tier 5: each candidate's file has the cells the runner builds once that candidate is chosen
    for c in run_grid.CALIBRATION_CLIPS:
        expected = {
            (f"ppo-clip{c}", t, k, s, (("clip_coef", float(c)),)) for t in TASKS for k in (0, 4, 8) for s in range(1, 11)
        }
        assert sweeps[f"round2_ppo_tv_matched_clip{c}"] == ("ppo", expected)
    write_first_grid_vaco(tmp_path)
    write_calibration(tmp_path)  # chooses 0.4
    assert runner_cells(tmp_path, 5, "--total-timesteps", str(T)) == sweeps["round2_ppo_tv_matched_clip0.4"][1]
    assert sweeps["round2_impala_one_pass"] == ("impala", runner_cells(empty, 6))
    ppo, vaco = sweeps["round2_halfcheetah_ppo"], sweeps["round2_halfcheetah_vaco"]
    assert (ppo[0], vaco[0]) == ("ppo", "vaco") and ppo[1] | vaco[1] == runner_cells(empty, 7)
    assert sweeps["round2_vaco_delta"] == ("vaco", runner_cells(empty, 8))
