"""The run folder of vaco_gsm8k.py: which folders a start may use, its claim and lock, atomic writes, a failed start
undone, what a resume checks, and real faults (a full disk in a tmpfs, no wandb login, Ctrl-C). The tiny offline setup
of tools/tiny_gsm8k.py; the command-line cases run the script in a subprocess, the rest in this process."""

import dataclasses
import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: nothing from the hub

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

import vaco_gsm8k as V  # noqa: E402
from conftest import assert_wandb_holds_tensorboard  # noqa: E402
from tools.tiny_gsm8k import write_gsm8k_jsonl, write_tiny_model  # noqa: E402

torch.set_num_threads(1)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
# tiny_args's settings on the command line (a subprocess resumes a run made in this process with them).
TINY_FLAGS = ["--eval-every", "0", "--num-iterations", "1", "--prompts-per-step", "4", "--num-generations", "8"]
TINY_FLAGS += ["--micro-batch-size", "32", "--max-new-tokens", "12", "--learning-rate", "3e-3", "--torch-threads", "1"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_run_folder")
    return {"llama": write_tiny_model(folder / "llama", "llama"), "data": write_gsm8k_jsonl(folder / "train.jsonl")}


def tiny_args(tiny, tmp_path, **overrides) -> V.Args:
    settings = dict(model_id=tiny["llama"], data_file=tiny["data"], run_dir=str(tmp_path / "run"), eval_every=0)
    settings.update(num_iterations=1, prompts_per_step=4, num_generations=8, micro_batch_size=32, max_new_tokens=12)
    settings.update(learning_rate=3e-3, torch_threads=1)
    return V.Args(**{**settings, **overrides})


def command(tiny, run_dir, *flags) -> list[str]:
    """vaco_gsm8k.py with tiny_args's settings, on the command line."""
    model = ["--model-id", tiny["llama"], "--data-file", tiny["data"], "--run-dir", str(run_dir)]
    return [sys.executable, str(ROOT / "vaco_gsm8k.py"), *model, *TINY_FLAGS, *map(str, flags)]


def refused(capsys, call) -> str:
    """The one `error:` line of a call that must exit 2."""
    with pytest.raises(SystemExit) as stop:
        call()
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def listing(folder) -> dict:
    """Each entry's name and modification time, but run.lock's: it says who holds the folder, rewritten by each claim."""
    return {p.name: p.stat().st_mtime_ns for p in Path(folder).iterdir() if p.name != V.LOCK_FILE}


def run_id(folder) -> str:
    return json.loads(Path(folder, V.RUN_FILE).read_text())["run_id"]


@pytest.fixture(scope="module")
def finished(tiny, tmp_path_factory):
    """A finished run of 2 iterations with a checkpoint after each (checkpoint.pt and checkpoint.prev.pt)."""
    args = tiny_args(tiny, tmp_path_factory.mktemp("finished"), num_iterations=2, checkpoint_every=1)
    V.main(args)
    return args


def copy_of(finished, tmp_path) -> V.Args:
    """A copy of the finished run to change, and the arguments that resume it."""
    shutil.copytree(finished.run_dir, tmp_path / "run")
    return dataclasses.replace(finished, run_dir=str(tmp_path / "run"), resume=True)


def unshare(script: str) -> subprocess.CompletedProcess:
    """`sh -c script` as root of a new user and mount namespace, where it may mount a tmpfs. Fails (not skips) the test
    where this machine cannot: a disk-full test that does not run would pass for the wrong reason."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.fail(f"the disk-full tests need `unshare --user --map-root-user --mount` (a tmpfs): {probe.stderr}")
    return subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


# ---------------------------------------------------------------- which folders a start may use


def test_a_folder_of_the_users_files_is_never_used(tiny, tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "thesis.tex").write_text("the user's")
    (folder / "data.csv").write_text("the user's")
    for flags in ({}, {"overwrite": True}):
        err = refused(capsys, lambda: V.main(tiny_args(tiny, tmp_path, run_dir=str(folder), **flags)))
        assert (
            err
            == f"error: {folder} holds files that are not a run of vaco_gsm8k: data.csv, thesis.tex; choose another --run-dir"
        )
    err = refused(capsys, lambda: V.main(tiny_args(tiny, tmp_path, run_dir=str(folder), resume=True)))
    assert err == f"error: --resume: {folder} holds no run"
    assert sorted(os.listdir(folder)) == ["data.csv", "thesis.tex"]


def test_overwrite_of_a_folder_of_runs_is_refused(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for seed in (1, 2):
        V.main(tiny_args(tiny, tmp_path, run_dir=None, seed=seed))
    runs = sorted(os.listdir("runs"))
    err = refused(capsys, lambda: V.main(tiny_args(tiny, tmp_path, run_dir="runs", overwrite=True)))
    assert err.startswith("error: runs holds files that are not a run of vaco_gsm8k: gsm8k__vaco_gsm8k__vaco__1__"), err
    assert sorted(os.listdir("runs")) == runs and all(Path("runs", run, V.SUMMARY_FILE).exists() for run in runs)


def test_runs_started_in_the_same_second_get_two_folders(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(V.time, "time", lambda: 1_700_000_000.0)
    for _ in range(2):
        V.main(tiny_args(tiny, tmp_path, run_dir=None))
    name = "gsm8k__vaco_gsm8k__vaco__1__1700000000"
    assert sorted(os.listdir("runs")) == [name, f"{name}-2"]
    described = [json.loads(Path("runs", folder, V.RUN_FILE).read_text()) for folder in (name, f"{name}-2")]
    assert [set(d) for d in described] == [{"script", "format", "run_id", "created", "files", "args_sha256", "wandb_id"}] * 2
    assert described[0]["script"] == "vaco_gsm8k" and described[0]["run_id"] != described[1]["run_id"]


def test_another_scripts_run_is_never_used(tiny, tmp_path, capsys):
    folder = tmp_path / "ppo"
    folder.mkdir()
    (folder / V.RUN_FILE).write_text(json.dumps({"script": "ppo_mujoco", "format": 1, "run_id": "f" * 32}))
    (folder / V.ARGS_FILE).write_text(json.dumps({"env_id": "Hopper-v5"}))
    before = listing(folder)
    err = refused(capsys, lambda: V.main(tiny_args(tiny, tmp_path, run_dir=str(folder), resume=True)))
    assert err == f"error: --resume: {folder} holds a run of ppo_mujoco, not of vaco_gsm8k"
    for flags in ({}, {"overwrite": True}):
        err = refused(capsys, lambda: V.main(tiny_args(tiny, tmp_path, run_dir=str(folder), **flags)))
        assert err == f"error: {folder} holds a run of ppo_mujoco, not of vaco_gsm8k; choose another --run-dir"
    assert listing(folder) == before


def test_leftovers_of_a_killed_start_count_as_empty(tiny, tmp_path, capsys):
    """A start killed before it wrote run.json leaves at most run.lock and .tmp files: the folder is usable."""
    folder = tmp_path / "run"
    folder.mkdir()
    for name in (V.LOCK_FILE, "run.json.tmp", "args.json.tmp"):
        (folder / name).write_bytes(b"")
    args = tiny_args(tiny, tmp_path)
    assert refused(capsys, lambda: V.main(dataclasses.replace(args, resume=True))).endswith("holds no run")
    V.main(args)
    assert sorted(p for p in os.listdir(folder) if not p.startswith(V.EVENTS_PREFIX)) == sorted(
        [V.LOCK_FILE, V.RUN_FILE, V.ARGS_FILE, V.CHECKPOINT, V.SUMMARY_FILE]
    )
    assert json.loads((folder / V.ARGS_FILE).read_text())["seed"] == 1


def test_a_folder_in_use_is_refused_at_once(tiny, finished, tmp_path):
    """A second process on a folder, here a resume of a run that is still running: exit 2 before anything loads."""
    args = copy_of(finished, tmp_path)
    fd = os.open(os.path.join(args.run_dir, V.LOCK_FILE), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # this process holds it, as the running run would
        os.ftruncate(fd, 0)
        os.write(fd, b"process 4242 on elsewhere\n")
        before = listing(args.run_dir)
        resume = command(tiny, args.run_dir, "--resume", "--num-iterations", "3", "--checkpoint-every", "1")
        commands = (resume, resume[:-5], [*resume[:-5], "--auto-resume", "--seed", "7"])  # another run's, but in use first
        procs = [subprocess.run(c, env=ENV, capture_output=True, text=True, timeout=120) for c in commands]
    finally:
        os.close(fd)
    for proc in procs:  # a resume, a new start and an --auto-resume: the folder's use is said first
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.strip() == f"error: {args.run_dir} is in use by process 4242 on elsewhere"
    assert listing(args.run_dir) == before


def test_a_file_system_without_locks_warns_and_goes_on(tiny, tmp_path, capsys, monkeypatch):
    def no_locks(fd, operation):  # what lockf raises on a file system without POSIX locks
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(V.fcntl, "lockf", no_locks)
    V.main(tiny_args(tiny, tmp_path))
    warning = f"warning: {tmp_path / 'run'} cannot be locked ({os.strerror(errno.ENOLCK)}): make sure no other process uses it"
    assert warning in capsys.readouterr().out.splitlines()
    assert Path(tmp_path, "run", V.SUMMARY_FILE).exists()


def test_nothing_is_written_through_a_link(tiny, finished, tmp_path, capsys):
    """run.lock or a .tmp made a link (symbolic or hard) to a file outside: a resume, a new start and --overwrite
    refuse the folder, and the writes themselves refuse the link; the file outside is never touched."""
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's\n")
    for link in (os.symlink, os.link):
        for name in (V.LOCK_FILE, "summary.json.tmp"):
            args = copy_of(finished, tmp_path / f"{link.__name__}-{name}")
            Path(args.run_dir, name).unlink(missing_ok=True)
            link(outside, Path(args.run_dir, name))
            expected = f"{args.run_dir}/{name} is a link, which a run writes nothing through: remove it, or choose another"
            for flags in ({}, {"resume": False}, {"resume": False, "overwrite": True}):
                assert refused(capsys, lambda: V.main(dataclasses.replace(args, **flags))).startswith(f"error: {expected}")
    with pytest.raises(ValueError, match="run.lock is a symbolic link, which a run writes nothing through: remove it, or"):
        V.lock_run_dir(str(tmp_path / "symlink-run.lock" / "run"))
    with pytest.raises(OSError, match=r"summary.json.tmp is a hard link \(\d+ names\), which a run writes nothing"):
        V.write_json(str(tmp_path / "link-summary.json.tmp" / "run" / V.SUMMARY_FILE), {})
    assert outside.read_text() == "the user's\n"


def test_overwrite_deletes_only_what_the_run_recorded_writing(finished, tmp_path, capsys):
    args = copy_of(finished, tmp_path)
    recorded = json.loads(Path(args.run_dir, V.RUN_FILE).read_text())["files"]
    assert recorded == [name for name in os.listdir(args.run_dir) if name.startswith(V.EVENTS_PREFIX)] and recorded
    Path(args.run_dir, V.EVENTS_PREFIX + "mycopy").write_text("the user's")
    before = listing(args.run_dir)
    err = refused(capsys, lambda: V.main(dataclasses.replace(args, resume=False, overwrite=True)))
    assert (
        err
        == f"error: --overwrite: {args.run_dir} holds files that are not part of a run: {V.EVENTS_PREFIX}mycopy; move them away first"
    )
    assert listing(args.run_dir) == before


@pytest.mark.parametrize("key, value", [("lag", 1), ("learning_rate", 0.01), ("checkpoint_every", 3)])
def test_a_resume_refuses_arguments_changed_by_hand(finished, tmp_path, capsys, key, value):
    """run.json keeps the SHA-256 of each argument from the run's start: an args.json changed since is refused, naming
    the key, even where the command line now matches the edited file."""
    args = copy_of(finished, tmp_path)
    path = Path(args.run_dir, V.ARGS_FILE)
    path.write_text(json.dumps(json.loads(path.read_text()) | {key: value}))
    before = listing(args.run_dir)
    err = refused(capsys, lambda: V.main(dataclasses.replace(args, **{key: value})))
    assert err == (
        f"error: --resume: {path} has changed since the run started ({key}): put it back; a run's arguments change only "
        "on the command line, where --resume allows"
    )
    assert listing(args.run_dir) == before


def test_names_and_flags_are_checked_before_anything_is_written(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    wide = "\u20ac" * 100  # 100 characters, 300 bytes
    cases = [
        (["--exp-name", wide], "--exp-name makes the run folder's name "),
        (["--run-dir", f"runs/{wide}/x"], f"--run-dir runs/{wide}/x: a name in it is longer than the {limit} bytes"),
        (["--exp-name", "x\udcff"], "--exp-name is not valid UTF-8: b'x\\xff'"),  # the bytes x, 0xff from a shell
        (["--run-dir", ""], "--run-dir must name a folder, got ''"),
        (["--run-dir", "", "--resume"], "--run-dir must name a folder, got ''"),
        (["--overwrite"], "--overwrite needs --run-dir: the folder of the run to replace"),
    ]
    for argv, message in cases:
        err = refused(capsys, lambda: V.parse_args(["--model-id", tiny["llama"], "--data-file", tiny["data"], *argv]))
        assert err.startswith(f"error: {message}"), err
    assert os.listdir(tmp_path) == []
    proc = subprocess.run([*command(tiny, tmp_path / "run"), "--exp-name", b"\xff"], env=ENV, capture_output=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == b"error: --exp-name is not valid UTF-8: b'\\xff'\n", proc.stderr
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- what a resume checks


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda saved: saved.pop("lag"), "args.json lacks lag"),
        (lambda saved: saved.update(num_generations="2"), 'args.json: num_generations must be an integer, got "2"'),
        (lambda saved: saved.update(seed=True), "args.json: seed must be an integer, got true"),
        (lambda saved: saved.update(cuda="false"), 'args.json: cuda must be true or false, got "false"'),
        (lambda saved: saved.update(loss="sgd"), 'args.json: loss must be one of "ppo-clip", "vaco", got "sgd"'),
        (lambda saved: saved.update(total_steps=2.0), "args.json: total_steps must be an integer or null, got 2.0"),
        (lambda saved: saved.update(temperature="1.0"), 'args.json: temperature must be a number, got "1.0"'),
        (lambda saved: saved.update(foo=1), "args.json has unknown keys foo"),
        ("[]", "args.json is not a JSON object"),
        ("", "args.json is not JSON (Expecting value"),  # what a start killed mid-write used to leave
    ],
)
def test_resume_checks_args_json(finished, tmp_path, capsys, change, message):
    args = copy_of(finished, tmp_path)
    path = Path(args.run_dir, V.ARGS_FILE)
    if isinstance(change, str):
        path.write_text(change)
    else:
        saved = json.loads(path.read_text())
        change(saved)
        path.write_text(json.dumps(saved))
    before = listing(args.run_dir)
    err = refused(capsys, lambda: V.main(args))
    assert err.startswith(f"error: --resume: {path}") and message in err, err
    assert listing(args.run_dir) == before


def test_resume_refuses_another_runs_checkpoint(tiny, finished, tmp_path, capsys):
    args = copy_of(finished, tmp_path)
    other = tiny_args(tiny, tmp_path, run_dir=str(tmp_path / "other"))  # the same flags, another run
    V.main(other)
    shutil.copyfile(Path(other.run_dir, V.CHECKPOINT), Path(args.run_dir, V.CHECKPOINT))
    err = refused(capsys, lambda: V.main(args))
    assert f"{args.run_dir}/checkpoint.pt belongs to another run (its run_id is {run_id(other.run_dir)}" in err
    assert "the one before is whole: mv" in err  # this run's checkpoint.prev.pt


def test_checkpoint_of_another_model_is_refused_before_anything_is_written(tiny, tmp_path, capsys):
    model = shutil.copytree(tiny["llama"], tmp_path / "model")
    args = tiny_args(tiny, tmp_path, model_id=str(model))
    V.main(args)
    shutil.rmtree(model)
    write_tiny_model(model, "llama", hidden_size=32, intermediate_size=64)  # the same folder, another model
    before = listing(args.run_dir)
    err = refused(capsys, lambda: V.main(dataclasses.replace(args, resume=True, num_iterations=2)))
    assert f"checkpoint.pt holds another model than --model-id {model} (" in err and "in the checkpoint" in err, err
    assert listing(args.run_dir) == before


def test_an_unreadable_checkpoint_is_not_called_damaged(finished, tmp_path, capsys, monkeypatch):
    args = copy_of(finished, tmp_path)
    path = os.path.join(args.run_dir, V.CHECKPOINT)

    def denied(name, *rest, **options):  # root reads a chmod 000 file: the error a user would get
        if name == path:
            raise PermissionError(errno.EACCES, "Permission denied", name)
        return open(name, *rest, **options)

    monkeypatch.setattr(V, "open", denied, raising=False)
    assert refused(capsys, lambda: V.main(args)) == f"error: --resume: cannot read {path}: Permission denied"


def test_missing_checkpoint_resumes_from_the_previous_one(finished, tmp_path, capsys):
    """A crash between save_checkpoint's two renames: checkpoint.pt moved to checkpoint.prev.pt, the new one still .tmp."""
    args = copy_of(finished, tmp_path)
    os.replace(Path(args.run_dir, V.CHECKPOINT), Path(args.run_dir, V.PREVIOUS_CHECKPOINT))
    Path(args.run_dir, V.CHECKPOINT + ".tmp").write_bytes(b"cut short")
    history = V.main(dataclasses.replace(args, num_iterations=3))
    assert f"continuing from {args.run_dir}/checkpoint.prev.pt" in capsys.readouterr().out
    assert [r["iteration"] for r in history["iterations"]] == [1, 2, 3]
    assert not Path(args.run_dir, V.CHECKPOINT + ".tmp").exists()  # the next checkpoint's write replaced it


def test_resume_of_a_finished_run_does_nothing(finished, tmp_path, capsys, monkeypatch):
    args = copy_of(finished, tmp_path)
    before = listing(args.run_dir)
    monkeypatch.setattr(V, "evaluate", lambda *arguments: pytest.fail("evaluated again"))
    history = V.main(args)
    assert f"the run in {args.run_dir} is finished (2 iterations done, 2 asked): nothing to do" in capsys.readouterr().out
    assert len(history["iterations"]) == 2 and listing(args.run_dir) == before


def test_resume_after_the_last_checkpoint_writes_only_the_end(finished, tmp_path, capsys, monkeypatch):
    """Killed between its last checkpoint and summary.json: the resume writes summary.json, and trains and evaluates
    nothing; then the run is finished."""
    args = copy_of(finished, tmp_path)
    os.remove(Path(args.run_dir, V.SUMMARY_FILE))
    monkeypatch.setattr(V, "evaluate", lambda *arguments: pytest.fail("evaluated again"))
    monkeypatch.setattr(V, "update", lambda *arguments: pytest.fail("trained again"))
    V.main(args)
    assert "all 2 iterations are done; writing the run's end" in capsys.readouterr().out
    summary = json.loads(Path(args.run_dir, V.SUMMARY_FILE).read_text())
    assert summary["interrupted"] is False and summary["iterations"] == 2
    V.main(args)
    assert "is finished (2 iterations done, 2 asked)" in capsys.readouterr().out


def test_relative_data_file_resumes_from_another_working_folder(tiny, tmp_path, capsys, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    shutil.copy(tiny["data"], first / "train.jsonl")
    monkeypatch.chdir(first)
    args = tiny_args(tiny, tmp_path, data_file="train.jsonl", checkpoint_every=1)
    V.main(args)
    saved = Path(args.run_dir, V.ARGS_FILE).read_text()
    assert json.loads(saved)["data_file"] == str(first / "train.jsonl")
    monkeypatch.chdir(second)
    shutil.copy(tiny["data"], second / "train.jsonl")  # another file of the same name
    err = refused(capsys, lambda: V.main(dataclasses.replace(args, resume=True)))
    assert f"--data-file is {second / 'train.jsonl'} here but {first / 'train.jsonl'} in" in err
    history = V.main(dataclasses.replace(args, data_file="../first/train.jsonl", resume=True, num_iterations=2))
    assert len(history["iterations"]) == 2
    assert Path(args.run_dir, V.ARGS_FILE).read_text() == saved  # never rewritten by a resume


# ---------------------------------------------------------------- --auto-resume: one command to start or resume


def test_auto_resume_starts_then_continues_then_leaves_a_finished_run(tiny, finished, tmp_path, capsys):
    """The one command of a requeued job: it starts the run in a new folder, continues it from its checkpoint
    (bit-identical with the run that was not stopped) and, once it has finished, leaves it as it is."""
    run = tmp_path / "run"
    argv = command(tiny, run, "--num-iterations", 2, "--checkpoint-every", 1, "--auto-resume")[2:]
    args = V.parse_args(argv)
    assert args.auto_resume and not args.resume
    V.main(args)
    assert "iter 1/2" in capsys.readouterr().out
    args = V.parse_args(argv)
    assert args.resume
    before = listing(run)
    V.main(args)
    assert f"the run in {run} is finished (2 iterations done, 2 asked): nothing to do" in capsys.readouterr().out
    assert listing(run) == before
    # Back to its first checkpoint, as if it had been killed in its second iteration.
    shutil.copy(run / V.PREVIOUS_CHECKPOINT, run / V.CHECKPOINT)
    os.remove(run / V.SUMMARY_FILE)
    history = V.main(V.parse_args(argv))
    out = capsys.readouterr().out
    assert "iter 2/2" in out and "iter 1/2" not in out, out
    assert [record["iteration"] for record in history["iterations"]] == [1, 2]
    whole, parts = (V.load_checkpoint(os.path.join(folder, V.CHECKPOINT)) for folder in (finished.run_dir, run))
    assert parts["iteration"] == 2 and whole["model"].keys() == parts["model"].keys()
    for key, value in whole["model"].items():
        assert torch.equal(value, parts["model"][key]), key


def test_auto_resume_refuses_any_other_folder(tiny, finished, tmp_path, capsys):
    """Another run (of this script or another), files of the user's, a command without a folder: one error line,
    exit 2, nothing written. What a resume may change may change here too: the same run, resumed."""
    run = copy_of(finished, tmp_path).run_dir
    other = tmp_path / "ppo"
    other.mkdir()
    (other / V.RUN_FILE).write_text(json.dumps({"script": "ppo_mujoco", "format": 1, "run_id": "f" * 32}))
    (other / V.ARGS_FILE).write_text(json.dumps({"env_id": "Hopper-v5"}))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    before = {folder: listing(folder) for folder in (run, other, mine)}
    same = ["--num-iterations", 2, "--checkpoint-every", 1, "--auto-resume"]
    err = refused(capsys, lambda: V.parse_args(command(tiny, run, *same, "--lag", 1, "--learning-rate", 0.01)[2:]))
    assert (
        err
        == f"error: {run} holds another run (learning_rate 0.003 there, 0.01 here; lag 0 there, 1 here): choose another --run-dir"
    )
    err = refused(capsys, lambda: V.parse_args(command(tiny, other, *same)[2:]))
    assert err == f"error: {other} holds a run of ppo_mujoco, not of vaco_gsm8k"
    err = refused(capsys, lambda: V.parse_args(command(tiny, mine, *same)[2:]))
    assert err == f"error: {mine} holds files that are not a run of vaco_gsm8k: notes.txt; choose another --run-dir"
    err = refused(capsys, lambda: V.parse_args([*command(tiny, run, *same)[2:], "--overwrite"]))
    assert err == "error: --auto-resume and --overwrite exclude each other"
    err = refused(capsys, lambda: V.main(dataclasses.replace(finished, run_dir=None, auto_resume=True)))
    assert err.startswith("error: --auto-resume needs --run-dir")
    assert {folder: listing(folder) for folder in (run, other, mine)} == before
    args = V.parse_args(command(tiny, run, *same, "--save-model", "--checkpoint-every", 3)[2:])
    assert args.resume and args.save_model and args.checkpoint_every == 3


def test_a_start_stopped_before_it_wrote_its_arguments(tiny, tmp_path, capsys):
    """run.json without args.json (a start killed between the two): refused as a run to continue and by a plain
    start, started again by --auto-resume (a requeued job's command), replaced by --overwrite. A folder where the run
    wrote more (its TensorBoard events) has started: without args.json, --auto-resume refuses it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / V.LOCK_FILE).write_text("")
    (run / "run.json.tmp").write_text("")
    (run / V.RUN_FILE).write_text(json.dumps({"script": "vaco_gsm8k", "format": 1, "run_id": "x"}))
    err = refused(capsys, lambda: V.parse_args(command(tiny, run)[2:]))
    assert err == f"error: {run} already holds a run: --resume continues it, --overwrite replaces it"
    err = refused(capsys, lambda: V.parse_args(command(tiny, run, "--resume")[2:]))
    expected = f"{run}/args.json is missing: the run never started; --auto-resume or --overwrite starts it afresh"
    assert err == f"error: --resume: {expected}"
    args = V.parse_args(command(tiny, run, "--auto-resume")[2:])
    assert args.auto_resume and not args.resume
    V.main(args)
    assert json.loads((run / V.SUMMARY_FILE).read_text())["interrupted"] is False
    assert run_id(run) != "x" and (run / V.ARGS_FILE).exists() and not list(run.glob("*.tmp"))
    os.remove(run / V.ARGS_FILE)
    err = refused(capsys, lambda: V.parse_args(command(tiny, run, "--auto-resume")[2:]))
    assert err == f"error: {run}/args.json is missing: --overwrite starts it afresh"
    V.main(V.parse_args(command(tiny, run, "--overwrite")[2:]))
    assert (run / V.ARGS_FILE).exists()


def test_a_sweep_agents_rerun_continues_the_run(tiny, tmp_path, capsys, monkeypatch):
    """Under a wandb sweep's agent (WANDB_SWEEP_ID, WANDB_RUN_ID) without --run-dir, the run's folder is named by the
    agent's run and --auto-resume is on: the agent's rerun of a preempted run continues it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SWEEP_ID", "sw1")
    monkeypatch.setenv("WANDB_RUN_ID", "r1")
    argv = [flag for flag in command(tiny, "x", "--checkpoint-every", 1)[2:] if flag not in ("--run-dir", "x")]
    args = V.parse_args(argv)
    assert args.run_dir == "runs/sweep-sw1/r1" and args.auto_resume and not args.resume
    V.main(args)
    run = tmp_path / "runs" / "sweep-sw1" / "r1"
    started = run_id(run)
    os.remove(run / V.SUMMARY_FILE)  # as if preempted after its last checkpoint
    args = V.parse_args(argv)
    assert args.resume
    V.main(args)
    assert run_id(run) == started and (run / V.SUMMARY_FILE).exists() and os.listdir(run.parent) == ["r1"]
    # With --run-dir, or without the agent's ids (or with ids that are no names), nothing changes.
    assert V.parse_args([*argv, "--run-dir", str(tmp_path / "x")]).run_dir == str(tmp_path / "x")
    monkeypatch.setenv("WANDB_RUN_ID", "../r2")
    assert V.parse_args(argv).run_dir is None
    monkeypatch.delenv("WANDB_SWEEP_ID")
    assert V.parse_args(argv).run_dir is None


def test_a_run_whose_args_json_predates_auto_resume_resumes(finished, tmp_path, capsys):
    """An args.json written before --auto-resume existed lacks it: it means False, and the run resumes."""
    args = copy_of(finished, tmp_path)
    path = Path(args.run_dir, V.ARGS_FILE)
    saved = json.loads(path.read_text())
    del saved["auto_resume"]
    path.write_text(json.dumps(saved))
    V.main(args)
    assert "is finished (2 iterations done, 2 asked): nothing to do" in capsys.readouterr().out


# ---------------------------------------------------------------- inputs


def test_data_file_must_be_a_regular_file(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, what in [(fifo, "is not a regular file"), ("/dev/null", "is not a regular file"), (tmp_path, "is a directory")]:
        err = refused(capsys, lambda: V.parse_args(["--data-file", str(path), "--run-dir", str(tmp_path / "run")]))
        assert err == f"error: --data-file {path} {what}" + (", not a JSONL file" if what == "is a directory" else "")


def test_default_run_folder_is_named_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("runs").write_text("not a folder")
    assert refused(capsys, lambda: V.parse_args([])) == "error: runs/ (the default) is a file"


def test_model_folder_errors_are_one_whole_line(tiny, tmp_path, capsys):
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(tiny["llama"], name), no_tokenizer)
    err = refused(capsys, lambda: V.load_model_and_tokenizer(str(no_tokenizer)))
    assert f"could not load the tokenizer from {no_tokenizer}: " in err
    assert "from one of: (1) a `tokenizers` library serialization file, (2) a slow tokenizer" in err  # all its lines
    truncated = shutil.copytree(tiny["llama"], tmp_path / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    err = refused(capsys, lambda: V.load_model_and_tokenizer(str(truncated)))
    assert err.startswith(f"error: could not load the model from {truncated}: Error while deserializing header"), err


# ---------------------------------------------------------------- real faults


class SmallDisk:
    """A file on a disk with room for `room` bytes: a write past them writes what fits, then fails as a full disk."""

    def __init__(self, handle, room: int):
        self.handle, self.room = handle, room

    def write(self, data) -> int:
        free = self.room - self.handle.tell()
        if len(data) > free:
            self.handle.write(bytes(data)[: max(free, 0)])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *failure):
        self.handle.close()


@pytest.mark.parametrize("room", [100, 1000, 500_000])  # in the header, the archive's first record, a tensor
def test_a_full_disk_anywhere_in_a_checkpoint_is_one_oserror(tmp_path, monkeypatch, room):
    """torch.save raises its own RuntimeError ("unexpected pos") after a failed write: the write reports the OSError,
    removes its .tmp, and the checkpoint before it stays whole."""
    path = str(tmp_path / V.CHECKPOINT)
    V.write_checkpoint_file(path, {"iteration": 1, "run_id": "r", "w": torch.zeros(250_000)})
    real_open = open

    def small_disk(name, *rest):  # the checkpoint's .tmp (opened by its descriptor), where save_checkpoint writes
        return SmallDisk(real_open(name, *rest), room) if isinstance(name, int) else real_open(name, *rest)

    monkeypatch.setattr(V, "open", small_disk, raising=False)
    with pytest.raises(OSError) as failure:
        V.write_checkpoint_file(path, {"iteration": 2, "run_id": "r", "w": torch.ones(250_000)})
    monkeypatch.undo()
    assert failure.value.errno == errno.ENOSPC and failure.value.filename == path
    assert os.listdir(tmp_path) == [V.CHECKPOINT] and V.checkpoint_problem(path, "r") is None
    assert V.load_checkpoint(path)["iteration"] == 1


# ---------------------------------------------------------------- real faults, in a subprocess


def test_track_without_a_wandb_login_leaves_the_folder_usable(tiny, tmp_path, capsys):
    """wandb 0.31 online with no API key and no ~/.netrc, no terminal: UsageError at once (no network is tried)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in ENV.items() if not key.startswith("WANDB_")}
    env.update(HOME=str(home), WANDB_MODE="online", WANDB_DIR=str(tmp_path))
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        command(tiny, run_dir, "--track"), env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --track: wandb could not start (No API key"), err
    assert err.endswith("); run wandb login or set WANDB_MODE=offline")
    assert not run_dir.exists()  # this start made it: it is gone
    V.main(tiny_args(tiny, tmp_path))  # and usable
    assert Path(run_dir, V.SUMMARY_FILE).exists()


def test_disk_full_at_the_start_leaves_no_run_and_a_usable_folder(tiny, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    start = shlex.join(command(tiny, disk))
    script = f"mount -t tmpfs -o size=8k tmpfs {disk} && {start}; echo rc=$?; ls -A {disk}; echo ==; "
    script += f"mount -o remount,size=64m {disk} && {start}; echo rc=$?; ls -A {disk}"
    proc = unshare(script)
    full, then = proc.stdout.split("==\n")
    assert full.splitlines()[-2:] == ["rc=2", V.LOCK_FILE], proc.stdout  # only the lock: the folder counts as empty
    err = proc.stderr.strip()
    assert re.fullmatch(rf"error: cannot write {disk}/(run|args)\.json: No space left on device", err), err
    assert "rc=0" in then and {V.RUN_FILE, V.ARGS_FILE, V.CHECKPOINT, V.SUMMARY_FILE} <= set(then.splitlines()), then


def test_disk_full_mid_run_keeps_the_last_checkpoint(tiny, tmp_path):
    """Room for two checkpoints and a half: the third one fails while written, the run stops with one line and exit
    code 1, no .tmp is left, and checkpoint.pt is the second one, whole."""
    measure = tiny_args(tiny, tmp_path, run_dir=str(tmp_path / "measure"), checkpoint_every=1)
    V.main(measure)
    size = os.path.getsize(Path(measure.run_dir, V.CHECKPOINT))
    disk, copy = tmp_path / "disk", tmp_path / "copy"
    disk.mkdir()
    run = shlex.join(command(tiny, disk / "run", "--num-iterations", "20", "--checkpoint-every", "1"))
    proc = unshare(f"mount -t tmpfs -o size={int(2.5 * size) // 1024}k tmpfs {disk} && {run}; echo rc=$?; cp -a {disk} {copy}")
    assert proc.stdout.splitlines()[-1] == "rc=1", proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("iter ") == 3  # the third checkpoint failed
    assert proc.stderr.strip() == f"error: cannot write {disk}/run/checkpoint.pt: No space left on device"
    names = os.listdir(copy / "run")
    assert not [name for name in names if name.endswith(".tmp")], names
    checkpoint = str(copy / "run" / V.CHECKPOINT)
    assert V.checkpoint_problem(checkpoint, run_id(copy / "run")) is None
    assert V.load_checkpoint(checkpoint)["iteration"] == 2
    assert V.load_checkpoint(str(copy / "run" / V.PREVIOUS_CHECKPOINT))["iteration"] == 1


def test_ctrl_c_while_the_libraries_load_prints_no_traceback(tiny, tmp_path):
    process = subprocess.Popen(command(tiny, tmp_path / "run"), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)  # imports take seconds
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGINT and b"Traceback" not in err, err.decode()[-2000:]


def test_a_tracked_run_stopped_by_sigterm_to_its_processes_is_one_wandb_run(tiny, tmp_path):
    """--track, offline: SIGTERM to the run and every process it started (wandb's too, as slurmstepd does) after its
    second iteration, then a resume: exit 143 with no traceback, one wandb id, and the resumed start's offline run
    holds every step TensorBoard holds, once (it gives wandb what TensorBoard held up to the checkpoint)."""
    run_dir = tmp_path / "run"
    env = {**ENV, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env |= {name: str(tmp_path / "wandb-home") for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}
    cmd = command(tiny, run_dir, "--track", "--num-iterations", "4", "--checkpoint-every", "1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)  # fmt: skip
    output = []
    for line in proc.stdout:
        output.append(line)
        if line.startswith("iter 2/4"):
            os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait() == 143 and "Traceback" not in "".join(output), "".join(output)
    resumed = subprocess.run([*cmd, "--resume"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stdout + resumed.stderr, resumed.stderr[-3000:]
    folders = sorted((tmp_path / "wandb").glob("offline-run-*"))
    wandb_id = json.loads((run_dir / "run.json").read_text())["wandb_id"]
    assert len(folders) == 2 and all(folder.name.endswith(f"-{wandb_id}") for folder in folders)
    assert len(assert_wandb_holds_tensorboard(run_dir, folders[-1])) >= 4
