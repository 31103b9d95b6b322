"""tools/grid/wandb_from_tb.py on damaged and unusual input, with synthetic run folders (run.json, args.json and one
TensorBoard event file of a few steps; no training): a damaged event file or .wandb file, an args.json that is not
an object, a path that is not a folder, a folder it cannot write into. Each is one `error:` line naming the file, exit
2, and nothing written anywhere; a complete run is written once, and again only when the event files hold more.

    .venv/bin/python -m pytest -q tests/tools/grid/test_wandb_from_tb.py
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from torch.utils.tensorboard import SummaryWriter

from tools.grid import wandb_from_tb
from tools.grid.run_records import check_event_file, tensorboard_events

RUN_ID = "abc123"


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """wandb offline, its settings and caches in tmp_path; the system temp folder is tmp_path/systemp, checked empty
    after each test (wandb writes there when it cannot write into the run folder)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    systemp = tmp_path / "systemp"
    systemp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systemp))
    yield
    assert not (systemp / "wandb").exists()


def add_steps(run_dir: Path, steps, suffix=""):
    """One more TensorBoard event file (TensorBoard's own writer) with charts/episodic_return at these steps."""
    w = EventFileWriter(str(run_dir), filename_suffix=suffix)
    for step in steps:
        value = Summary.Value(tag="charts/episodic_return", simple_value=float(step))
        w.add_event(Event(wall_time=1.0, step=step, summary=Summary(value=[value])))
    w.close()


def make_run(tmp_path, steps=(64, 128)) -> tuple[Path, Path]:
    """(a run folder, its event file)."""
    run_dir = tmp_path / "Hopper-v5__ppo__lag0__s1"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"run_id": RUN_ID}))
    (run_dir / "args.json").write_text(json.dumps({"track": True, "exp_name": "ppo_mujoco", "env_id": "Hopper-v5"}))
    add_steps(run_dir, steps)
    (events,) = run_dir.glob("events.out.tfevents.*")
    return run_dir, events


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))}


def one_error(capsys, *names) -> str:
    """The one line on stderr: an `error:` naming each of `names`, no traceback."""
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and all(str(name) in line for name in names), err
    return line


def cut(path: Path, nbytes: int):
    data = path.read_bytes()
    path.write_bytes(data[:-nbytes])


def flip(path: Path, at: int):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def record_starts(data: bytes) -> list[int]:
    """Where each record of an event file starts (each: 8-byte length, 4-byte CRC, data, 4-byte CRC)."""
    starts = [0]
    while starts[-1] < len(data):
        starts.append(starts[-1] + 16 + int.from_bytes(data[starts[-1] : starts[-1] + 8], "little"))
    return starts[:-1]


@pytest.mark.parametrize("damage", ["tail-cut", "cut-mid-record", "bit-flip-last-record", "bit-flip-middle", "empty"])
def test_damaged_event_file_is_refused(tmp_path, capsys, damage):
    run_dir, events = make_run(tmp_path)
    size = events.stat().st_size
    version, first, last = record_starts(events.read_bytes())  # TensorBoard's file version record, then 2 scalars
    if damage == "tail-cut":
        cut(events, 5)
        says = f"its last record (byte {last} of {size - 5}) is cut short: the file was not written to the end"
    elif damage == "cut-mid-record":
        cut(events, size - first - 10)
        says = f"its last record (byte {first} of {first + 10}) is cut short"
    elif damage == "bit-flip-last-record":
        flip(events, size - 10)
        says = f"the record at byte {last} fails its checksum: the file is damaged"
    elif damage == "bit-flip-middle":
        flip(events, first + 9)  # the CRC of its length
        says = f"the record at byte {first} fails its checksum"
    else:
        events.write_bytes(b"")
        says = "empty (0 bytes), not a TensorBoard event file"
    before = tree(run_dir)
    for _ in range(2):  # and again: still refused, as nothing was written
        assert wandb_from_tb.main([str(run_dir)]) == 2
        assert says in one_error(capsys, events)
    assert tree(run_dir) == before
    with pytest.raises(ValueError) as e:
        check_event_file(events)
    assert says in str(e.value)


def test_written_once_and_again_when_the_events_hold_more(tmp_path, capsys):
    run_dir, _ = make_run(tmp_path)
    # a .wandb file of one of the run's starts that does not read back (a start that was killed): not this tool's
    start = run_dir / "wandb" / f"offline-run-20000101_000000-{RUN_ID}"
    start.mkdir(parents=True)
    (start / f"run-{RUN_ID}.wandb").write_bytes(b":W&B\xe1\xbe\x00\x07\x07\x07")
    assert wandb_from_tb.main([str(run_dir)]) == 0
    (first,) = set((run_dir / "wandb").glob("offline-run-*")) - {start}
    assert capsys.readouterr().out.startswith("wrote ")
    run = wandb_from_tb.read_offline_run(first)
    assert [row["global_step"] for row in run["history"]] == [64, 128] and run["exit_code"] == 0
    assert wandb_from_tb.main([str(run_dir)]) == 0
    assert capsys.readouterr().out.startswith("already written: ")
    add_steps(run_dir, [192], suffix=".later")  # a later start logged more: the first copy is not complete any more
    assert wandb_from_tb.main([str(run_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("note: ") and first.name in out[0] and "do not sync it" in out[0]
    assert out[1].startswith("wrote ")
    (second,) = set((run_dir / "wandb").glob("offline-run-*")) - {start, first}
    assert [row["global_step"] for row in wandb_from_tb.read_offline_run(second)["history"]] == [64, 128, 192]
    assert wandb_from_tb.main([str(run_dir)]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(f"already written: {os.path.relpath(second)}")


@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_damaged_wandb_file_is_refused(tmp_path, capsys, damage):
    run_dir, _ = make_run(tmp_path)
    assert wandb_from_tb.main([str(run_dir)]) == 0
    capsys.readouterr()
    (written,) = (run_dir / "wandb").glob("offline-run-*/*.wandb")
    if damage == "cut":
        cut(written, 30)
    else:
        flip(written, written.stat().st_size - 20)
    says = "cut short at byte" if damage == "cut" else "is damaged (its CRC-32 or type is wrong)"
    assert wandb_from_tb.main(["--show", str(written)]) == 2
    assert says in one_error(capsys, written)
    assert wandb_from_tb.main(["--show", str(written.parent)]) == 2
    assert says in one_error(capsys, written)
    before = tree(run_dir)
    assert wandb_from_tb.main([str(run_dir)]) == 2  # the copy an earlier call wrote is damaged: left for the user
    line = one_error(capsys, written)
    assert says in line and f"move {written.parent} out of" in line
    assert tree(run_dir) == before


@pytest.mark.parametrize(
    "name, text, says",
    [
        ("args.json", "[1, 2]", "args.json: not a JSON object"),
        ("args.json", "{", "args.json: not readable as JSON"),
        ("run.json", '["abc"]', "run.json: not a JSON object with a 'run_id'"),
        ("run.json", '{"run_id": 7}', "run.json: not a JSON object with a 'run_id'"),
    ],
)
def test_run_files_that_are_not_objects(tmp_path, capsys, name, text, says):
    run_dir, _ = make_run(tmp_path)
    (run_dir / name).write_text(text)
    before = tree(run_dir)
    assert wandb_from_tb.main([str(run_dir)]) == 2
    assert says in one_error(capsys, run_dir / name)
    assert tree(run_dir) == before


def test_paths_that_are_not_run_folders(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    assert wandb_from_tb.main([str(a_file)]) == 2
    assert one_error(capsys, a_file) == f"error: {a_file}: not a directory (a run folder)"
    assert wandb_from_tb.main([str(tmp_path / "missing")]) == 2
    assert one_error(capsys, tmp_path / "missing").endswith("no such folder (a run folder)")
    assert wandb_from_tb.main(["--show", str(a_file)]) == 2
    assert one_error(capsys, a_file) == f"error: {a_file}: not a wandb run file (.wandb)"
    assert a_file.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "systemp"]


def test_read_only_run_folder_is_refused(tmp_path, capsys, monkeypatch):
    run_dir, _ = make_run(tmp_path)
    before = tree(run_dir)
    run_dir.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    if os.geteuid() == 0:  # root writes anywhere: let os.access answer from the mode, as for any other user
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and (Path(p) != run_dir or not mode & os.W_OK))
    try:
        for _ in range(2):  # and again: no copy per call, in the run folder or elsewhere
            assert wandb_from_tb.main([str(run_dir)]) == 2
            assert one_error(capsys) == f"error: {run_dir} is not writable: the offline run is written into " + (
                f"{run_dir / 'wandb'}; nothing written"
            )
    finally:
        run_dir.chmod(0o755)
    assert tree(run_dir) == before


def test_wandb_folder_that_is_a_link_is_refused(tmp_path, capsys):
    run_dir, _ = make_run(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_dir / "wandb").symlink_to(elsewhere)
    assert wandb_from_tb.main([str(run_dir)]) == 2
    assert "is a link: this tool writes only into the run folder itself" in one_error(capsys, run_dir / "wandb")
    assert list(elsewhere.iterdir()) == []


def test_a_cut_record_that_a_later_start_resumed_after_is_read(tmp_path):
    """A start killed while writing leaves its events file's last record cut short; the next start's file follows it
    and its writer purged that step, so the run's scalars are whole. In the newest file the same cut is refused."""
    run_dir, events = make_run(tmp_path)
    cut(events, 5)
    with pytest.raises(ValueError, match="cut short"):
        tensorboard_events(run_dir)
    later = SummaryWriter(str(run_dir), purge_step=2, filename_suffix=".z")  # sorts after the first file
    later.add_scalar("charts/episodic_return", 5.0, 2)
    later.close()
    assert sorted(run_dir.glob("events*"))[-1].name.endswith(".z")
    assert tensorboard_events(run_dir)["charts/episodic_return"][-1] == (2, 5.0)
