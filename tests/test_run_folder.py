"""The run folder holds the user's data: what the four MuJoCo scripts take, write, delete, refuse and recover there.

Every test runs for each script, so that the shared plumbing cannot hold in one script and not in another."""

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, SUBPROCESS_ENV, TINY, existing_scripts, import_script, read_checkpoint_file, run_script

SCRIPTS = existing_scripts()
NAMES = [param.values[0] for param in SCRIPTS]


def refused(module, argv, capsys):
    """parse_args on argv must exit 2 with one `error:` line: the line, without its prefix."""
    with pytest.raises(SystemExit) as exc:
        module.parse_args([str(arg) for arg in argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err[len("error: ") : -1]


def files(folder):
    """{path relative to folder: bytes} of every file under folder: what a test compares before and after."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def command(script, *args):
    return [sys.executable, str(ROOT / f"{script}.py"), *map(str, args)]


def run_in(cwd, script, *args, env=None):
    return subprocess.run(
        command(script, *args), cwd=cwd, env={**SUBPROCESS_ENV, **(env or {})}, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished tiny run per script (2 iterations, a checkpoint after each), copied by the tests."""
    folder = tmp_path_factory.mktemp("finished")
    for script in NAMES:
        run_script(script, *TINY, "--checkpoint-every", "1", "--run-dir", folder / script)
    return folder


def copy_run(finished, script, to, done=False):
    """A copy of the script's finished run; with done=False, as if it had stopped after its last checkpoint."""
    shutil.copytree(finished / script, to)
    if not done:
        (to / "summary.json").unlink()
    return to


def edit_header(path, **changes):
    """Change fields of a checkpoint's header line (the payload and its digest stay)."""
    data = path.read_bytes()
    header = json.loads(data[:256]) | changes
    path.write_bytes(json.dumps(header).encode().ljust(255) + b"\n" + data[256:])


# ---------------------------------------------------------------- what --overwrite may delete


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_folder_of_the_users_is_refused_whatever_the_flag(script, tmp_path, capsys):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('mine')\n")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    before = files(tmp_path)
    expected = f"holds files that are not a run of {script}.py (code, data.csv): choose another --run-dir"
    proc = run_in(tmp_path, script, *TINY, "--run-dir", ".", "--overwrite")  # the report's command
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == f"error: . {expected}\n", proc.stderr
    assert refused(import_script(script), [*TINY, "--run-dir", tmp_path], capsys) == f"{tmp_path} {expected}"
    assert files(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["code", "data.csv"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_overwrite_of_a_folder_of_runs_deletes_none(script, finished, tmp_path, capsys):
    module = import_script(script)
    runs = tmp_path / "runs"
    for name in ("a", "b", "c", "d"):
        copy_run(finished, script, runs / name, done=True)
    before = files(runs)
    message = refused(module, [*TINY, "--run-dir", runs, "--overwrite"], capsys)
    assert message == f"{runs} holds files that are not a run of {script}.py (a, b, c, ...): choose another --run-dir"
    assert files(runs) == before


@pytest.mark.parametrize("script", SCRIPTS)
def test_overwrite_deletes_what_the_run_wrote_and_nothing_else(script, finished, tmp_path, capsys):
    module = import_script(script)
    run = copy_run(finished, script, tmp_path / "run", done=True)
    (run / "notes.txt").write_text("mine")
    before = files(run)
    message = refused(module, [*TINY, "--run-dir", run, "--overwrite"], capsys)
    assert message == f"{run} holds files that a run does not write (notes.txt); --overwrite deletes only a run's"
    assert files(run) == before
    (run / "notes.txt").unlink()
    old_id = json.loads((run / "run.json").read_text())["run_id"]
    old_events = {p.name for p in run.glob("events.out.tfevents.*")}
    run_script(script, *TINY, "--checkpoint-every", "0", "--run-dir", run, "--overwrite")
    assert json.loads((run / "run.json").read_text())["run_id"] != old_id
    assert not old_events & {p.name for p in run.glob("events.out.tfevents.*")}
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith("events.")) == [
        "args.json",
        "run.json",
        "run.lock",
        "summary.json",
    ]
    other = NAMES[(NAMES.index(script) + 1) % len(NAMES)]
    elsewhere = copy_run(finished, other, tmp_path / "other", done=True)
    message = refused(module, [*TINY, "--run-dir", elsewhere, "--overwrite"], capsys)
    assert message == f"{elsewhere} holds a run of {other}.py, not of {script}.py"


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_folder_from_an_earlier_version_is_kept(script, finished, tmp_path, capsys):
    """Runs written before run.json existed (args.json, events, a checkpoint without header) are neither continued nor
    deleted."""
    module = import_script(script)
    run = copy_run(finished, script, tmp_path / "run")
    (run / "run.json").unlink()
    (run / "run.lock").unlink()
    before = files(run)
    assert refused(module, ["--resume", "--run-dir", run], capsys) == f"{run} holds no run (no run.json)"
    for flags in ([], ["--overwrite"]):
        message = refused(module, [*TINY, "--run-dir", run, *flags], capsys)
        assert message == f"{run} holds a run of an earlier version (no run.json): choose another --run-dir"
    assert files(run) == before


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_start_stopped_before_it_wrote_its_arguments(script, tmp_path, capsys):
    """What a start killed at any moment leaves: only run.lock and *.tmp (taken as empty), or run.json without
    args.json (a run that never started: refused as a run to continue, started again by --auto-resume, which a
    requeued job runs, and replaced by --overwrite)."""
    module = import_script(script)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.lock").write_text("")
    (run / "run.json.tmp").write_text("")
    assert module.parse_args([*TINY, "--run-dir", str(run)]).run_dir == str(run)
    (run / "run.json").write_text(json.dumps({"script": script, "format": 1, "run_id": "x"}))
    message = refused(module, [*TINY, "--run-dir", run], capsys)
    assert message == f"{run} already holds a run: --resume continues it, --overwrite replaces it"
    message = refused(module, ["--resume", "--run-dir", run], capsys)
    assert message == f"{run}/args.json is missing: the run never started; --auto-resume or --overwrite starts it afresh"
    args = module.parse_args([*TINY, "--run-dir", str(run), "--auto-resume"])
    assert not args.resume and args.auto_resume
    run_script(script, *TINY, "--run-dir", run, "--auto-resume")
    assert json.loads((run / "summary.json").read_text())["interrupted"] is False
    assert json.loads((run / "run.json").read_text())["run_id"] != "x" and (run / "args.json").exists()
    assert not list(run.glob("*.tmp"))
    # A folder where the run wrote more (here its TensorBoard events) has started: without args.json it is refused.
    (run / "args.json").unlink()
    (run / "summary.json").unlink()
    message = refused(module, [*TINY, "--run-dir", run, "--auto-resume"], capsys)
    assert message == f"{run}/args.json is missing: --overwrite starts it afresh"
    run_script(script, *TINY, "--run-dir", run, "--overwrite")
    assert json.loads((run / "summary.json").read_text())["interrupted"] is False


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_sweep_agents_rerun_continues_the_run(script, tmp_path, capsys):
    """Under a wandb sweep's agent (WANDB_SWEEP_ID, WANDB_RUN_ID) without --run-dir, the run's folder is named by the
    agent's run and --auto-resume is on: the agent's rerun of a preempted run continues it."""
    module = import_script(script)
    sweep = {"WANDB_SWEEP_ID": "sw1", "WANDB_RUN_ID": "r1"}
    run_in(tmp_path, script, *TINY, "--checkpoint-every", "1", env=sweep).check_returncode()
    run = tmp_path / "runs" / "sweep-sw1" / "r1"
    assert os.listdir(tmp_path / "runs") == ["sweep-sw1"] and os.listdir(run.parent) == ["r1"]
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    (run / "summary.json").unlink()  # as if preempted after its last checkpoint
    rerun = run_in(tmp_path, script, *TINY, "--checkpoint-every", "1", env=sweep)
    assert rerun.returncode == 0, rerun.stderr  # a start in a folder that holds a run would be refused
    assert json.loads((run / "run.json").read_text())["run_id"] == run_id and (run / "summary.json").exists()
    assert os.listdir(tmp_path / "runs") == ["sweep-sw1"] and os.listdir(run.parent) == ["r1"]
    # Another run of the sweep, another folder; without the agent's ids, or with --run-dir, nothing changes.
    os.environ.update(WANDB_SWEEP_ID="sw1", WANDB_RUN_ID="r2")
    try:
        assert module.parse_args([*TINY]).run_dir == "runs/sweep-sw1/r2"
        assert module.parse_args([*TINY, "--run-dir", str(tmp_path / "x")]).run_dir == str(tmp_path / "x")
        os.environ["WANDB_RUN_ID"] = "../r2"
        assert module.parse_args([*TINY]).run_dir is None
    finally:
        del os.environ["WANDB_SWEEP_ID"], os.environ["WANDB_RUN_ID"]
    assert module.parse_args([*TINY]).run_dir is None


@pytest.mark.parametrize("script", SCRIPTS)
def test_overwrite_deletes_only_what_the_run_recorded_writing(script, finished, tmp_path, capsys):
    """Files of the user's named like a run's (a model, an events file copied in) are not the run's: run.json records
    the files the run wrote, and --overwrite refuses a folder that holds others, deleting nothing."""
    module = import_script(script)
    run = copy_run(finished, script, tmp_path / "run", done=True)
    recorded = json.loads((run / "run.json").read_text())["files"]
    assert recorded == [p.name for p in run.glob("events.out.tfevents.*")] and len(recorded) == 1
    (run / "best-from-other-run.cleanrl_model").write_text("mine")
    (run / "events.out.tfevents.mycopy").write_text("mine")
    before = files(run)
    message = refused(module, [*TINY, "--run-dir", run, "--overwrite"], capsys)
    listed = "best-from-other-run.cleanrl_model, events.out.tfevents.mycopy"
    assert message == f"{run} holds files that a run does not write ({listed}); --overwrite deletes only a run's"
    assert files(run) == before
    module.remove_run_files(str(run), "new")  # even called on such a folder, it deletes only what run.json records
    assert sorted(os.listdir(run)) == ["best-from-other-run.cleanrl_model", "events.out.tfevents.mycopy", "run.lock"]
    # A model of the user's where a resume would save the run's: refused, not replaced.
    run = copy_run(finished, script, tmp_path / "again")
    (run / f"{script}.cleanrl_model").write_text("mine")
    message = refused(module, ["--resume", "--run-dir", run, "--save-model"], capsys)
    assert (
        message
        == f"{run} holds {script}.cleanrl_model, which the run did not write: move it away, or resume without --save-model"
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_nothing_is_written_through_a_link(script, finished, tmp_path, capsys):
    """run.lock, a *.tmp or videos/ made a link (symbolic or hard) to a file outside: every start refuses the folder
    (--resume, --auto-resume, a new run, --overwrite), and the writes themselves refuse the link; the file outside is
    never touched."""
    module = import_script(script)
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's\n")
    for link in (os.symlink, os.link):
        for name in ("run.lock", "checkpoint.pt.tmp", "videos"):
            run = copy_run(finished, script, tmp_path / f"{link.__name__}-{name}")
            if name == "videos" and link is os.link:
                (run / "videos").mkdir()
                name = "videos/rl-video-episode-0.mp4"
            (run / name).unlink(missing_ok=True)
            link(outside, run / name)
            expected = f"{run}/{name} is a link, which a run writes nothing through: remove it, or choose another --run-dir"
            for flags in (["--resume"], FINISHED_COMMAND, TINY, [*TINY, "--overwrite"]):
                assert refused(module, [*flags, "--run-dir", run], capsys) == expected
    run = copy_run(finished, script, tmp_path / "late")  # a link made after the checks: the writes refuse it
    (run / "run.lock").unlink()
    os.symlink(outside, run / "run.lock")
    with pytest.raises(ValueError, match="run.lock is a symbolic link, which a run writes nothing through"):
        module.lock_run_dir(str(run))
    os.link(outside, run / "summary.json.tmp")
    with pytest.raises(OSError, match=r"summary.json.tmp is a hard link \(\d+ names\), which a run writes nothing"):
        module.write_atomically(str(run / "summary.json"), b"{}")
    assert outside.read_text() == "the user's\n" and (run / "summary.json.tmp").exists()
    proc = run_in(tmp_path, script, "--resume", "--run-dir", run)  # the command, end to end
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith(f"error: {run}/run.lock is a link"), proc
    assert outside.read_text() == "the user's\n"


ARGS_EDITS = [  # an args.json edited by hand to other valid values: (key, value)
    ("lag", 3),
    ("learning_rate", 0.001),
    ("num_envs", 2),
    ("total_timesteps", 256),
    ("env_id", "Walker2d-v5"),
    ("checkpoint_every", 7),  # one a resume may change, on the command line
]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_resume_refuses_arguments_changed_by_hand(script, finished, tmp_path, capsys):
    """run.json keeps the SHA-256 of each argument from the run's start: an args.json changed since is refused, naming
    the keys, by --resume and by --auto-resume (even where the command now matches the edited file)."""
    module = import_script(script)
    run = copy_run(finished, script, tmp_path / "run")
    saved = json.loads((run / "args.json").read_text())
    for key, value in ARGS_EDITS:
        (run / "args.json").write_text(json.dumps(saved | {key: value}, indent=2))
        before = files(run)
        expected = f"{run}/args.json has changed since the run started ({key}): put it back; a run's arguments change "
        expected += "only on the command line, where --resume allows"
        assert refused(module, ["--resume", "--run-dir", run], capsys) == expected
        flag = f"--{key.replace('_', '-')}"
        assert refused(module, [*FINISHED_COMMAND, "--run-dir", run, flag, str(value)], capsys) == expected
        assert files(run) == before
    (run / "args.json").write_text(json.dumps(saved | {"lag": 1, "gamma": 0.5}))
    assert refused(module, ["--resume", "--run-dir", run], capsys).endswith(
        "since the run started (gamma, lag): put it back; a run's arguments change only on the command line, where --resume allows"
    )
    (run / "args.json").write_text(json.dumps(saved))  # put back, in another layout: the values count
    assert module.parse_args(["--resume", "--run-dir", str(run), "--checkpoint-every", "7"]).checkpoint_every == 7


@pytest.mark.parametrize("script", SCRIPTS)
def test_names_that_become_files_fit_the_file_system(script, tmp_path, capsys, monkeypatch):
    """--exp-name and --run-dir checked in bytes against the file system's limit before anything is made: 100
    characters of 3 bytes each are 300 bytes."""
    module = import_script(script)
    monkeypatch.chdir(tmp_path)
    wide = "\u20ac" * 100
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    message = refused(module, [*TINY, "--exp-name", wide, "--save-model", "--run-dir", "run"], capsys)
    assert message == f"--exp-name makes the model file's name 318 bytes long; the file system takes {limit}"
    assert refused(module, [*TINY, "--exp-name", wide], capsys).startswith("--exp-name makes the run folder's name ")
    assert module.parse_args([*TINY, "--exp-name", wide, "--run-dir", "run"]).exp_name == wide  # it names no file
    message = refused(module, [*TINY, "--run-dir", f"runs/{wide}/x"], capsys)
    assert message == f"--run-dir runs/{wide}/x: a name in it is longer than the {limit} bytes that the file system takes"
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- one process per folder


@pytest.mark.parametrize("script", SCRIPTS)
def test_default_folders_never_collide(script, tmp_path, monkeypatch):
    module = import_script(script)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "mine.txt").write_text("mine")
    args = module.Args()
    claims = [module.claim_run_dir(args, name) for name in ("same", "same", "same", "taken")]
    assert claims == [("runs/same", True), ("runs/same-2", True), ("runs/same-3", True), ("runs/taken-2", True)]
    assert os.listdir("runs/taken") == ["mine.txt"]
    for run_dir, _ in claims:
        module.release_run_dir(run_dir)


@pytest.mark.parametrize("script", SCRIPTS)
def test_two_runs_started_together_get_their_own_folders(script, tmp_path):
    """The report's case: two runs without --run-dir started in the same second (most often: the folders are told apart
    by -2 then; claim_run_dir's test above shows it for certain)."""
    procs = [
        subprocess.Popen(command(script, *TINY, "--lag", lag), cwd=tmp_path, env=SUBPROCESS_ENV, stdout=subprocess.PIPE)
        for lag in (0, 4)
    ]
    assert [proc.wait(timeout=300) for proc in procs] == [0, 0]
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2
    assert sorted(json.loads((f / "args.json").read_text())["lag"] for f in folders) == [0, 4]
    assert [len(list(f.glob("events.out.tfevents.*"))) for f in folders] == [1, 1]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_folder_in_use_is_refused_at_once_and_freed_by_any_end(script, tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen(
        command(script, *TINY, "--total-timesteps", 10**7, "--checkpoint-every", "1", "--run-dir", run),
        env=SUBPROCESS_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in first.stdout:
            if line.startswith("[2/"):  # a checkpoint exists: the folder holds a run that could be resumed
                break
        for flags in (["--resume"], [*TINY, "--overwrite"], TINY, [*TINY, "--auto-resume"]):  # in use: said first
            begin = time.time()
            second = run_in(tmp_path, script, *flags, "--run-dir", run)
            assert second.returncode == 2 and time.time() - begin < 60, second.stderr
            holder = f"process {first.pid} on {socket.gethostname()}"
            assert second.stderr == f"error: {run} is in use by {holder}\n"
        assert first.poll() is None  # the first run goes on, its files in place
        assert (run / "checkpoint.pt").exists() and (run / "args.json").exists()
    finally:
        first.kill()  # SIGKILL: the lock ends with the process all the same
        first.wait()
    module = import_script(script)
    assert module.lock_run_dir(str(run)) is None
    module.release_run_dir(str(run))


# ---------------------------------------------------------------- resume trusts nothing it reads


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_refuses_another_scripts_run(script, finished, tmp_path, capsys):
    module = import_script(script)
    for other in NAMES:
        if other != script:
            run = copy_run(finished, other, tmp_path / other)
            message = refused(module, ["--resume", "--run-dir", run], capsys)
            assert message == f"{run} holds a run of {other}.py, not of {script}.py"


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_refuses_another_runs_or_scripts_checkpoint(script, finished, tmp_path, capsys):
    module = import_script(script)
    run = copy_run(finished, script, tmp_path / "run")
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    edit_header(run / "checkpoint.pt", run_id="0" * 32)  # e.g. a Walker2d run's checkpoint copied into a Hopper run
    message = refused(module, ["--resume", "--run-dir", run], capsys)
    assert message == f"{run}/checkpoint.pt is another run's checkpoint (run {'0' * 32}; the folder's run is {run_id})"
    other = NAMES[(NAMES.index(script) + 1) % len(NAMES)]
    shutil.copy(finished / other / "checkpoint.pt", run / "checkpoint.pt")
    edit_header(run / "checkpoint.pt", run_id=run_id)
    message = refused(module, ["--resume", "--run-dir", run], capsys)
    assert message == f"{run}/checkpoint.pt is a checkpoint of {other}.py, not of {script}.py"


SAVED_ARGS = [  # (change to args.json, the error after `{run}/args.json`)
    (lambda a: a.pop("lag"), " lacks lag"),
    (lambda a: a.update(foo=1), " has unknown keys foo"),
    (lambda a: a.update(num_envs="2"), ': num_envs must be an integer, got "2"'),
    (lambda a: a.update(gamma="0.99"), ': gamma must be a number, got "0.99"'),
    (lambda a: a.update(total_timesteps=1280.5), ": total_timesteps must be an integer, got 1280.5"),
    (lambda a: a.update(anneal_lr="false"), ': anneal_lr must be true or false, got "false"'),
    (lambda a: a.update(lag=True), ": lag must be an integer, got true"),
    (lambda a: a.update(lag_mode="bogus"), ': lag_mode must be one of "uniform", "fixed", got "bogus"'),
    (lambda a: a.update(target_kl="0.1"), ': target_kl must be a number or null, got "0.1"'),
]


@pytest.mark.parametrize("script", SCRIPTS)
def test_saved_arguments_are_checked_key_by_key(script, finished, tmp_path, capsys):
    module = import_script(script)
    run = copy_run(finished, script, tmp_path / "run")
    saved = json.loads((run / "args.json").read_text())
    for change, error in SAVED_ARGS:
        edited = dict(saved)
        change(edited)
        (run / "args.json").write_text(json.dumps(edited))
        assert refused(module, ["--resume", "--run-dir", run], capsys) == f"{run}/args.json{error}"
    (run / "args.json").write_text(json.dumps(saved | {"lag": -1}))  # well typed: not what the run started with
    assert refused(module, ["--resume", "--run-dir", run], capsys).startswith(f"{run}/args.json has changed since the run")
    (run / "args.json").write_text("[1, 2]")
    assert refused(module, ["--resume", "--run-dir", run], capsys) == f"{run}/args.json is not a JSON object"
    (run / "args.json").write_text(json.dumps(saved))
    assert module.parse_args(["--resume", "--run-dir", str(run)]).lag == saved["lag"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_damaged_checkpoint_is_found_and_the_intact_one_named(script, finished, tmp_path, capsys):
    module = import_script(script)
    run = copy_run(finished, script, tmp_path / "run")
    path, previous = run / "checkpoint.pt", run / "checkpoint.prev.pt"
    good = path.read_bytes()
    middle = len(good) // 2
    remedy = f"the one before is intact: `mv {previous} {path}` resumes from there"
    damages = {  # one byte flipped where torch.load does not look: the payload loads, and would be wrong
        "flipped": (
            good[:middle] + bytes([good[middle] ^ 1]) + good[middle + 1 :],
            "its SHA-256 differs from the one written",
        ),
        "truncated": (good[: len(good) // 3], "its SHA-256 differs from the one written"),
        "empty": (b"", "no checkpoint header"),
        "garbage": (bytes(range(256)) * 8, "no checkpoint header"),
    }
    for data, why in damages.values():
        path.write_bytes(data)
        assert refused(module, ["--resume", "--run-dir", run], capsys) == f"{path} is damaged ({why}); {remedy}"
    previous_bytes = previous.read_bytes()
    previous.write_bytes(b"")  # both damaged: nothing to advise but starting afresh
    message = refused(module, ["--resume", "--run-dir", run], capsys)
    assert message == f"{path} is damaged (no checkpoint header); --overwrite starts the run afresh"
    previous.write_bytes(previous_bytes)
    path.unlink()
    path.mkdir()  # a checkpoint that cannot be read is not called damaged, and no file is to be renamed
    assert refused(module, ["--resume", "--run-dir", run], capsys) == f"cannot read {path}: Is a directory"
    path.rmdir()
    shutil.move(previous, path)  # the remedy of the message above
    assert read_checkpoint_file(path)["progress"]["iteration"] == 1
    assert module.parse_args(["--resume", "--run-dir", str(run)]).resume


@pytest.mark.parametrize("script", SCRIPTS)
def test_read_checkpoint_takes_the_previous_only_where_the_last_is_missing(script, finished, tmp_path):
    module = import_script(script)
    run = copy_run(finished, script, tmp_path / "run")
    assert module.read_checkpoint(run)["progress"]["iteration"] == 2
    (run / "checkpoint.pt").unlink()  # a crash between save_checkpoint's two renames
    assert module.read_checkpoint(run)["progress"]["iteration"] == 1
    (run / "checkpoint.prev.pt").unlink()
    assert module.read_checkpoint(run) is None


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_of_a_finished_run_does_nothing(script, finished, tmp_path):
    run = copy_run(finished, script, tmp_path / "run", done=True)
    before = files(run)
    proc = run_in(tmp_path, script, "--resume", "--run-dir", run)
    assert proc.returncode == 0 and proc.stdout == f"{run}: the run has finished; nothing to do\n", proc.stderr
    assert files(run) == before  # no second evaluation, nothing rewritten


# ---------------------------------------------------------------- --auto-resume: one command to start or resume

# The command that made the `finished` runs: with --auto-resume, the same command continues them.
FINISHED_COMMAND = [*TINY, "--checkpoint-every", "1", "--auto-resume"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_auto_resume_starts_then_continues_then_leaves_a_finished_run(script, finished, tmp_path):
    """The one command of a requeued job: it starts the run in a new folder, continues it from its checkpoint
    (bit-identical with the gymnasium backend) and, once it has finished, leaves it as it is."""
    started = run_in(tmp_path, script, *FINISHED_COMMAND, "--run-dir", "cell")
    assert started.returncode == 0 and "[1/2]" in started.stdout, started.stderr
    run = tmp_path / "cell"
    before = files(run)
    again = run_in(tmp_path, script, *FINISHED_COMMAND, "--run-dir", "cell/")  # any spelling of the folder
    assert again.returncode == 0 and again.stdout == "cell/: the run has finished; nothing to do\n", again.stderr
    assert files(run) == before
    # Back to its first checkpoint, as if it had been killed in its second iteration.
    shutil.copy(run / "checkpoint.prev.pt", run / "checkpoint.pt")
    (run / "summary.json").unlink()
    resumed = run_in(tmp_path, script, *FINISHED_COMMAND, "--run-dir", run)
    assert resumed.returncode == 0, resumed.stderr
    assert "[2/2]" in resumed.stdout and "[1/2]" not in resumed.stdout, resumed.stdout
    whole, parts = (read_checkpoint_file(d / "checkpoint.pt") for d in (finished / script, run))
    assert parts["progress"]["iteration"] == 2
    for key, value in whole["agent"].items():
        assert torch.equal(value, parts["agent"][key]), key


@pytest.mark.parametrize("script", SCRIPTS)
def test_auto_resume_refuses_any_other_folder(script, finished, tmp_path, capsys):
    """Another run (of this script or another), files of the user's, a command without a folder: one error line,
    exit 2, nothing written."""
    module = import_script(script)
    run = copy_run(finished, script, tmp_path / "run")
    other = NAMES[(NAMES.index(script) + 1) % len(NAMES)]
    other_run = copy_run(finished, other, tmp_path / "other")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    before = files(tmp_path)
    message = refused(module, [*FINISHED_COMMAND, "--run-dir", run, "--lag", "3", "--gamma", "0.9"], capsys)
    assert message == f"{run} holds another run (gamma 0.99 there, 0.9 here; lag 0 there, 3 here): choose another --run-dir"
    if other != script:
        message = refused(module, [*FINISHED_COMMAND, "--run-dir", other_run], capsys)
        assert message == f"{other_run} holds a run of {other}.py, not of {script}.py"
    message = refused(module, [*FINISHED_COMMAND, "--run-dir", mine], capsys)
    assert message == f"{mine} holds files that are not a run of {script}.py (notes.txt): choose another --run-dir"
    assert refused(module, FINISHED_COMMAND, capsys).startswith("--auto-resume needs --run-dir")
    message = refused(module, [*FINISHED_COMMAND, "--run-dir", run, "--overwrite"], capsys)
    assert message == "--auto-resume and --overwrite exclude each other"
    assert files(tmp_path) == before
    # What may change on --resume may change here too: the same run, resumed.
    args = module.parse_args([*FINISHED_COMMAND, "--run-dir", str(run), "--save-model", "--torch-threads", "2"])
    assert args.resume and args.save_model and args.torch_threads == 2


# ---------------------------------------------------------------- faults


def in_small_disk(tmp_path, shell):
    """Run a shell script with a 4 MB tmpfs mounted at $DISK (a private mount namespace as an unprivileged user's
    root: nothing outside the test sees it); what it prints is returned. Fails, saying why, where it cannot."""
    if not shutil.which("unshare"):
        pytest.fail("the disk-full tests need util-linux's unshare (apt install util-linux)")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = f"set -u\nmount -t tmpfs -o size=4m tmpfs {disk} || exit 99\nDISK={disk}\n{shell}"
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 99, f"cannot mount a tmpfs in a user namespace: {proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_disk_full_mid_run_keeps_the_last_checkpoint(script, tmp_path):
    python, out = f"{sys.executable} {ROOT / script}.py", tmp_path
    in_small_disk(
        tmp_path,
        f"""
{python} {' '.join(TINY)} --checkpoint-every 1 --run-dir $DISK/run > /dev/null
rm $DISK/run/summary.json $DISK/run/checkpoint.pt   # as if stopped in its second iteration
sha256sum < $DISK/run/checkpoint.prev.pt > {out}/before.sha
dd if=/dev/zero of=$DISK/fill bs=64k 2> /dev/null
{python} --resume --run-dir $DISK/run > /dev/null 2> {out}/full.err; echo $? > {out}/full.exit
ls $DISK/run > {out}/full.ls; sha256sum < $DISK/run/checkpoint.prev.pt > {out}/after.sha
rm $DISK/fill
{python} --resume --run-dir $DISK/run > /dev/null; echo $? > {out}/freed.exit
ls $DISK/run > {out}/freed.ls
""",
    )
    read = {name: (out / name).read_text() for name in ("full.err", "full.exit", "full.ls", "freed.exit", "freed.ls")}
    assert read["full.exit"] == "1\n", read
    # The first write to fail is TensorBoard's (the run folder is named) or the checkpoint's.
    assert re.fullmatch(
        f"error: cannot write {tmp_path}/disk/run(/checkpoint.pt)?: No space left on device\n", read["full.err"]
    )
    assert (out / "before.sha").read_text() == (out / "after.sha").read_text()  # the last checkpoint is intact
    assert ".tmp" not in read["full.ls"] and "checkpoint.pt\n" not in read["full.ls"], read
    assert read["freed.exit"] == "0\n" and "summary.json" in read["freed.ls"] and ".tmp" not in read["freed.ls"], read


@pytest.mark.parametrize("script", SCRIPTS)
def test_disk_full_at_the_start_leaves_nothing(script, tmp_path):
    python = f"{sys.executable} {ROOT / script}.py {' '.join(TINY)} --run-dir $DISK/run"
    out = in_small_disk(
        tmp_path,
        f"""
dd if=/dev/zero of=$DISK/fill bs=64k 2> /dev/null
{python} 2> {tmp_path}/full.err; echo "exit $?"
ls -a $DISK
rm $DISK/fill
{python} > /dev/null; echo "exit $?"
""",
    )
    err = (tmp_path / "full.err").read_text()
    assert err == f"error: cannot write the run folder {tmp_path}/disk/run: No space left on device\n", err
    assert out.split() == ["exit", "2", ".", "..", "fill", "exit", "0"], out


@pytest.mark.parametrize("script", SCRIPTS)
def test_track_without_a_wandb_login_leaves_the_folder_as_it_was(script, finished, tmp_path):
    env = {"WANDB_MODE": "online", "HOME": str(tmp_path), "WANDB_API_KEY": "", "WANDB_DIR": str(tmp_path)}
    (tmp_path / "empty").mkdir()
    old = copy_run(finished, script, tmp_path / "old", done=True)
    before = files(old)
    for run, flags in (("new", []), ("empty", []), ("old", ["--overwrite"])):
        proc = run_in(tmp_path, script, *TINY, "--track", *flags, "--run-dir", tmp_path / run, env=env)
        assert proc.returncode == 2 and proc.stderr.startswith("error: --track: wandb could not start ("), proc.stderr
        assert proc.stderr.endswith("; run `wandb login` or set WANDB_MODE=offline\n") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "new").exists() and os.listdir(tmp_path / "empty") == []
    after = files(old)  # the run --overwrite would have replaced is whole (run.lock names the last process to hold it)
    assert after.keys() == before.keys() and all(after[name] == before[name] for name in before if name != "run.lock")


@pytest.mark.parametrize("script", SCRIPTS)
def test_ctrl_c_while_the_libraries_load_is_quiet(script, tmp_path):
    proc = subprocess.Popen(command(script, *TINY), cwd=tmp_path, env=SUBPROCESS_ENV, stderr=subprocess.PIPE, text=True)
    # Wait until torch is loading (its libraries in the process's memory map): the libraries take seconds to import,
    # and without the script's first lines Python would turn SIGINT into a KeyboardInterrupt traceback there.
    deadline = time.time() + 60
    while "torch" not in Path(f"/proc/{proc.pid}/maps").read_text() and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == -signal.SIGINT and proc.stderr.read() == ""
    assert os.listdir(tmp_path) == []


def test_the_checkpoint_format_is_what_the_tests_read(finished):
    """The header the tests' reader assumes, field by field (read_checkpoint_file checks the digest)."""
    for script in NAMES:
        data = (finished / script / "checkpoint.pt").read_bytes()
        header = json.loads(data[:256])
        run_id = json.loads((finished / script / "run.json").read_text())["run_id"]
        assert header == {"script": script, "format": 1, "run_id": run_id, "sha256": hashlib.sha256(data[256:]).hexdigest()}
        assert read_checkpoint_file(finished / script / "checkpoint.pt")["progress"]["iteration"] == 2
