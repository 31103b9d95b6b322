#!/usr/bin/env python
"""One complete offline wandb run per training run, written from the run's TensorBoard event files.

    python -m tools.grid.wandb_from_tb runs/grid/Hopper-v5__vaco__lag8__s1    # -> <run-dir>/wandb/offline-run-*
    wandb sync runs/grid/Hopper-v5__vaco__lag8__s1/wandb/latest-run             # later, where there is internet
    python -m tools.grid.wandb_from_tb --show <offline run folder or .wandb file>   # what an offline run holds

A tracked run logs to wandb itself, at the environment step, and each start of a resumed run gives wandb what
TensorBoard holds up to its checkpoint: its last start's offline folder holds the whole run, the one to sync. This
tool is for a run whose wandb files are missing or incomplete (a run without --track, a folder copied without
`wandb/`, runs of earlier versions): it writes TensorBoard's scalars as one offline wandb run, each iteration once
(TensorBoard drops what a resumed run's writer purged, the steps after its checkpoint), `_step` the environment step
(also logged as `global_step`, every chart's x axis), the run's arguments (args.json) as its config, the run's
wandb id (run.json), the run folder's name, and args.json's project and entity. A later `wandb sync` of a run id
replaces what an earlier one sent, so sync this folder or the run's last start, not both.

The run folder is read, never changed, except for `wandb/`, where wandb writes the new folder (and `latest-run`,
its link); a run folder it cannot write into (or whose `wandb/` is a link) is refused, as wandb would write into the
system's temp folder instead. A run folder that already holds the complete run written by this tool (every
iteration the event files now hold, to its end) is left as it is (exit 0), so it can be called at the end of every
start of a job; one written by an earlier call that misses iterations logged since is named ("do not sync it") and
a complete one is written beside it. Damaged input is refused with one `error:` line naming the file, exit 2, before
anything is written: an event file that is empty, cut short or fails a checksum (TensorBoard's reader would skip
what it lost in silence, and the run would miss iterations), a run.json or args.json that is not a JSON object, a
.wandb file (`--show`, or one this tool wrote earlier) that is cut short or fails a CRC. `--show` reads an offline
run's .wandb file without wandb's service or a network: its id, config, and the history rows (`_step`,
`global_step`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import struct
import sys
import zlib
from pathlib import Path

from tools.grid.run_records import tensorboard_events

TAG = "from-tensorboard"  # the wandb tag of the runs this tool writes: how it finds one it wrote before


# -------------------------------------------------------------------------------- reading an offline run back

# A .wandb file: a 7-byte header (":W&B", 0xBEE1, a version byte), then LevelDB's log format: 32 KiB blocks of chunks,
# each with a 7-byte header (CRC-32, length, type: 1 whole, 2 first, 3 middle, 4 last), each record a protobuf
# wandb.proto.wandb_internal_pb2.Record. Block space too small for a chunk header is zero padding.
HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")
BLOCK = 32 * 1024


def read_records(path):
    """The records of a .wandb file, in order; ValueError naming the file if it is not one, or if a chunk is damaged
    (fails its CRC-32) or cut short (a run killed while writing it)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if len(data) < HEADER.size or HEADER.unpack_from(data)[:2] != (b":W&B", 0xBEE1):
        raise ValueError(f"{path}: not a wandb run file (.wandb)")
    pending, pos = None, HEADER.size  # pending: the chunks so far of a record split over blocks
    while pos < len(data):
        if BLOCK - pos % BLOCK < CHUNK.size:  # the rest of the block is padding
            pos += BLOCK - pos % BLOCK
            continue
        if pos + CHUNK.size > len(data):
            raise ValueError(f"{path}: cut short at byte {pos} of {len(data)} (a chunk header not written to the end)")
        crc, length, kind = CHUNK.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zeros: padding, or the end of what was written
            pos += BLOCK - pos % BLOCK
            continue
        body = data[pos + CHUNK.size : pos + CHUNK.size + length]
        if len(body) < length:
            raise ValueError(f"{path}: cut short at byte {pos} of {len(data)} (a record not written to the end)")
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) != crc or kind > 4 or (pending is None) != (kind in (1, 2)):
            raise ValueError(f"{path}: the chunk at byte {pos} is damaged (its CRC-32 or type is wrong)")
        pos += CHUNK.size + length
        pending = body if kind in (1, 2) else pending + body
        if kind in (1, 4):
            record = pb.Record()
            try:
                record.ParseFromString(pending)
            except DecodeError:
                raise ValueError(f"{path}: the record ending at byte {pos} does not parse") from None
            yield record
            pending = None
    if pending is not None:
        raise ValueError(f"{path}: cut short (its last record not written to the end)")


def read_offline_run(folder) -> dict:
    """{id, config, tags, history: [row: {key: value}], exit_code, preempting} of an offline run folder (or its
    .wandb file)."""
    folder = Path(folder)
    files = [folder] if folder.is_file() else sorted(folder.glob("*.wandb"))
    if not files:
        raise ValueError(f"{folder} holds no .wandb file")
    run = {"id": None, "config": {}, "tags": [], "history": [], "exit_code": None, "preempting": False}
    for record in read_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["id"], run["tags"] = record.run.run_id, list(record.run.tags)
            run["config"].update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            run["config"].update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            run["history"].append(row)
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
        elif kind == "preempting":
            run["preempting"] = True
    return run


# ---------------------------------------------------------------------------------- writing the complete run


def iterations(run_dir) -> list[dict]:
    """One row per logged step, in step order: {"global_step": step, tag: its value at that step, ...}; a step
    logged twice keeps its last value (after TensorBoard's own purge on resume)."""
    rows = {}
    for tag, events in tensorboard_events(run_dir).items():
        for step, value in events:
            if math.isfinite(value):  # wandb stores NaN and inf, but charts and summaries skip them anyway
                rows.setdefault(step, {})[tag] = value
    return [{"global_step": step, **rows[step]} for step in sorted(rows)]


def written_here(folder) -> bool:
    """Whether an offline run folder is one this tool wrote (the tag in its run record), not one of a run's starts
    (whose damage, e.g. of a start that was killed, is not this tool's concern)."""
    try:
        for record in read_records(next(Path(folder).glob("*.wandb"))):
            if record.WhichOneof("record_type") == "run":  # after the header record
                return TAG in record.run.tags
    except (StopIteration, OSError, ValueError):
        pass
    return False


def existing(run_dir, run_id, steps) -> tuple[Path | None, list[Path]]:
    """(the offline run folder this tool wrote for the run that holds the given steps, each once, to the end (its exit
    record), if there is one; the others it wrote, which do not: from a call before the run had finished).
    ValueError naming the file if one it wrote does not read back whole."""
    complete, others = None, []
    own = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?")  # wandb adds -N within one second
    for folder in sorted(p for p in Path(run_dir, "wandb").glob("offline-run-*") if own.fullmatch(p.name)):
        if not written_here(folder):
            continue
        try:
            run = read_offline_run(folder)
        except ValueError as e:
            raise ValueError(
                f"{e}; written by an earlier call: move {folder} out of {folder.parent} to write the run again"
            ) from None
        if run["exit_code"] == 0 and [row.get("global_step") for row in run["history"]] == steps:
            complete = folder
        else:
            others.append(folder)
    return complete, others


def read_run(run_dir: Path) -> tuple[str, dict]:
    """(the run's wandb id, its arguments), from run.json and args.json; ValueError naming the file that does not hold them."""
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: {'not a directory' if run_dir.exists() else 'no such folder'} (a run folder)")
    found = []
    for name, key in (("run.json", "run_id"), ("args.json", None)):
        path = run_dir / name
        try:
            value = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{run_dir} holds no run (run.json and args.json): {path} does not exist") from None
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not readable as JSON ({getattr(e, 'strerror', None) or e})") from None
        if not isinstance(value, dict) or (key and not (isinstance(value.get(key), str) and value[key])):
            raise ValueError(f"{path}: not a JSON object" + (f" with a {key!r}" if key else " (the run's arguments)"))
        found.append((value.get("wandb_id") or value[key]) if key else value)  # a sweep agent's run has its own id
    return found[0], found[1]


def writable(run_dir: Path) -> None:
    """ValueError unless wandb can write into `run_dir`/wandb: where it cannot, wandb.init writes the run into the
    system's temp folder instead, a new copy on every call."""
    out = run_dir / "wandb"
    if out.is_symlink():
        raise ValueError(f"{out} is a link: this tool writes only into the run folder itself; nothing written")
    for folder in (run_dir, out):
        if folder.exists() and not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"{folder} is not writable: the offline run is written into {out}; nothing written")


def write_offline_run(run_dir) -> tuple[Path, bool, list[Path]]:
    """Write the complete offline run of `run_dir`; (its folder, whether it was written now, the incomplete ones this
    tool wrote before)."""
    run_dir = Path(run_dir)
    run_id, args = read_run(run_dir)
    if not any(run_dir.glob("events.out.tfevents.*")):
        raise ValueError(f"{run_dir} holds no TensorBoard event files")
    rows = iterations(run_dir)  # ValueError naming an event file that is damaged or cut short
    folder, others = existing(run_dir, run_id, [row["global_step"] for row in rows])
    if folder is not None:
        return folder, False, others
    writable(run_dir)
    import wandb

    run = wandb.init(
        mode="offline",
        dir=run_dir,
        id=run_id,
        project=args.get("wandb_project_name"),
        entity=args.get("wandb_entity"),
        name=run_dir.resolve().name,
        config=args,
        tags=[TAG],
        settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_machine_info=True, silent=True),
    )
    run.define_metric("global_step")
    run.define_metric("*", step_metric="global_step")
    for row in rows:
        run.log(row, step=row["global_step"])
    folder = Path(run.dir).parent
    run.finish()
    wandb.teardown()  # finish() returns before wandb's service has written all of the run: wait for it
    return folder, True, others


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a run folder (or, with --show, an offline run folder or .wandb file)")
    p.add_argument("--show", action="store_true", help="print what an offline wandb run holds, and write nothing")
    opts = p.parse_args(argv)
    try:
        if opts.show:
            run = read_offline_run(opts.run_dir)
            steps = [row.get("_step") for row in run["history"]]
            print(f"id {run['id']}, tags {run['tags']}, {len(run['config'])} config keys, exit code {run['exit_code']}")
            print(f"{len(steps)} history rows, _step {steps[:1]}..{steps[-1:]}")
            for row in run["history"]:
                print(json.dumps({k: row[k] for k in ("_step", "global_step") if k in row}))
            return 0
        folder, written, others = write_offline_run(opts.run_dir)
    except OSError as e:
        print(f"error: {e.filename}: {e.strerror}" if e.filename else f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for other in others:
        print(f"note: {os.path.relpath(other)}, written by an earlier call, does not hold every iteration: do not sync it")
    print(f"{'wrote' if written else 'already written:'} {os.path.relpath(folder)}; sync it with: wandb sync {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
