"""Run records: one compact, byte-reproducible file per finished MuJoCo run, what tools.grid.aggregate needs to
rebuild every table and figure (format in results/records/README.md). Read from TensorBoard run folders, from the
older result folders (runs.csv + final.csv), or from record files; written by tools.grid.run_grid as runs finish.
pandas is imported only to read the older folders, so that the grid runner starts without it."""

from __future__ import annotations

import gzip
import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np

SCRIPT_STEMS = {"ppo_mujoco": "ppo", "vaco_mujoco": "vaco", "spo_mujoco": "spo", "impala_mujoco": "impala"}
VACO_DEFAULTS = {"tv_threshold": 0.2, "rho_bar": 1.0}
RECORD_FORMAT = "vaco-run-record/1"
RECORD_TAGS = {  # TensorBoard tag -> record column
    "charts/episodic_return": "episodic_return",
    "lag/staleness_mean": "staleness_mean",
    "lag/backward_tv": "backward_tv",
    "lag/final_tv": "final_tv",
    "vaco/tv": "vaco_tv",
    "vaco/over_budget_frac": "vaco_over_budget_frac",
    "vaco/filter_frac": "vaco_filter_frac",
}
RECORD_COLUMNS = tuple(RECORD_TAGS.values())
# What every record holds, and its type: what the tables read without looking further.
RECORD_KEYS = {"name": str, "algo": str, "task": (str, type(None)), "lag": int, "lag_mode": str, "seed": int,
               "finished": bool, "summary": dict, "args": dict, "eval_returns": list, "scalars": dict}  # fmt: skip
ARGS_DROPPED = ("run_dir", "wandb_project_name", "wandb_entity")  # machine- or account-specific


class NotARecord(ValueError):
    """A file at a record's place that is not a whole run record; the message names it."""


def fmt_num(x) -> str:
    return f"{float(x):g}"


def algo_label(args: dict) -> str:
    exp = str(args.get("exp_name", ""))
    label = SCRIPT_STEMS.get(exp, exp or "unknown")
    if label == "vaco" and exp in SCRIPT_STEMS:
        parts = [name for key, name in (("realign", "norealign"), ("filter", "nofilter")) if args.get(key) is False]
        for key, tag in (("tv_threshold", "delta"), ("rho_bar", "rhobar")):
            if args.get(key) is not None and not math.isclose(float(args[key]), VACO_DEFAULTS[key]):
                parts.append(f"{tag}{fmt_num(args[key])}")
        label = "-".join([label, *parts])
    mode = args.get("lag_mode", "uniform")
    return label + (f"[{mode}]" if mode and mode != "uniform" else "")


def is_finished(run_dir: Path) -> bool:
    """A run is finished iff its summary.json exists and does not mark it as interrupted."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and not summary.get("interrupted", False)


def _clean(v):
    """JSON-safe scalar: 6 significant digits for floats, None for NaN/inf."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    return float(f"{float(v):.6g}") if math.isfinite(float(v)) else None


def make_record(name, args, summary, scalars: dict[str, dict[int, float]], eval_returns, algo=None) -> dict:
    """A run record: what the tables and figures need, nothing machine-specific. `scalars`: column -> {step: value}."""
    steps = sorted({s for col in scalars.values() for s in col})
    columns = {"step": [int(s) for s in steps]}
    columns.update({c: [_clean(scalars[c].get(s)) for s in steps] for c in RECORD_COLUMNS if scalars.get(c)})
    args = {k: _clean(v) if not isinstance(v, (list, dict)) else v for k, v in args.items() if k not in ARGS_DROPPED}
    return {
        "format": RECORD_FORMAT,
        "name": name,
        "algo": algo or algo_label(args),
        "task": args.get("env_id"),
        "lag": int(args.get("lag", 0)),
        "lag_mode": args.get("lag_mode") or "uniform",
        "seed": int(args.get("seed", 0)),
        "finished": summary is not None and not summary.get("interrupted", False),
        "summary": {k: _clean(v) for k, v in (summary or {}).items()},
        "args": args,
        "eval_returns": [_clean(r) for r in eval_returns],
        "scalars": columns,
    }


def check_event_file(path, resumed_after=False) -> None:
    """ValueError naming the file unless every record of this TensorBoard event file is whole and passes both of its
    checksums (TensorBoard's own reader skips a damaged or cut-off record in silence). A record: its length (8
    bytes), the length's masked CRC-32C, the data, the data's masked CRC-32C. `resumed_after`: a later start's file
    follows this one, so a last record cut short is what a killed start leaves, and the resumed run's writer has
    purged it (it logged the steps after its checkpoint again)."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    data, pos = Path(path).read_bytes(), 0
    if not data:
        raise ValueError(f"{path}: empty (0 bytes), not a TensorBoard event file")
    while pos < len(data):
        length, length_crc = struct.unpack_from("<QI", data, pos) if len(data) - pos >= 12 else (len(data), None)
        if length_crc is not None and masked_crc32c(data[pos : pos + 8]) != length_crc:
            raise ValueError(f"{path}: the record at byte {pos} fails its checksum: the file is damaged")
        end = pos + 12 + length + 4
        if end > len(data) and resumed_after:
            return
        if end > len(data):
            raise ValueError(
                f"{path}: its last record (byte {pos} of {len(data)}) is cut short: the file was not written to the end"
            )
        if masked_crc32c(data[pos + 12 : end - 4]) != struct.unpack_from("<I", data, end - 4)[0]:
            raise ValueError(f"{path}: the record at byte {pos} fails its checksum: the file is damaged")
        pos = end


def tensorboard_events(run_dir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of a run folder's TensorBoard event files, as TensorBoard reads them: in the order
    written, without what a resumed run's writer purged (the steps logged after the checkpoint it resumed from).
    ValueError naming the file if one of them is damaged or cut short: what it lost would be missing in silence."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = [f for f in sorted(Path(run_dir).glob("*tfevents*")) if f.is_file()]  # the files TensorBoard reads
    if not files:
        return {}
    for f in files:
        check_event_file(f, resumed_after=f != files[-1])
    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags().get("scalars", [])}


def record_from_run_dir(run_dir) -> dict:
    run_dir = Path(run_dir)
    args = json.loads((run_dir / "args.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else None
    events = tensorboard_events(run_dir)
    scalars = {col: dict(events[tag]) for tag, col in RECORD_TAGS.items() if tag in events}  # a repeated step keeps its last
    return make_record(run_dir.name, args, summary, scalars, [v for _, v in events.get("eval/episodic_return", [])])


def write_record(record: dict, path) -> Path:
    """gzip'd JSON, byte-reproducible (no timestamp in the gzip header); written to a temp file, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(json.dumps(record, separators=(",", ":")).encode())
    tmp.replace(path)
    return path


def read_record(path) -> dict:
    """The run record in `path`; ValueError naming the file if it is not a whole one (empty, cut short, damaged, not
    gzip'd JSON, another format, or without one of RECORD_KEYS): NotARecord."""
    try:
        with gzip.open(path, "rt") as f:
            record = json.load(f)
    except (gzip.BadGzipFile, EOFError, zlib.error, ValueError) as e:
        why = "cut short: the gzip stream ends early" if isinstance(e, EOFError) else f"{type(e).__name__}: {e}"
        raise NotARecord(f"{path}: not a whole run record ({'empty' if not Path(path).stat().st_size else why})") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise NotARecord(f"{path}: not a run record (format {found!r}, expected {RECORD_FORMAT!r})")
    wrong = [key for key, kind in RECORD_KEYS.items() if not isinstance(record.get(key), kind)]
    if wrong or not isinstance(record["scalars"].get("step"), list):
        raise NotARecord(f"{path}: not a whole run record (missing or malformed: {', '.join(wrong or ['scalars.step'])})")
    return record


def set_aside(path) -> Path:
    """Rename a file that is not a whole record to `<name>.damaged-<n>` (the first n free) and return the new path:
    kept for a look, out of the way of the record that replaces it (and of `*.json.gz`)."""
    path, n = Path(path), 1
    while (aside := path.with_name(f"{path.name}.damaged-{n}")).exists() or aside.is_symlink():
        n += 1
    path.rename(aside)
    return aside


def records_from_legacy(folder: Path) -> list[dict]:
    """Records from a folder written by the earlier aggregate (runs.csv: per step, final.csv: per run)."""
    import pandas as pd

    final, runs, out = pd.read_csv(folder / "final.csv"), pd.read_csv(folder / "runs.csv"), []
    arg_cols = ["total_timesteps", "num_envs", "num_steps", "tv_threshold", "rho_bar", "c_bar", "realign", "filter"]
    for _, row in final.iterrows():
        args = {"exp_name": row["exp_name"], "env_id": row["task"], "lag": int(row["lag"]), "seed": int(row["seed"])}
        args["lag_mode"] = row["lag_mode"]
        args.update(
            {c: row[c].item() if hasattr(row[c], "item") else row[c] for c in arg_cols if c in row and pd.notna(row[c])}
        )
        summary = {"global_step": int(row["last_step"])}
        keys = ("final_return", "final_tv", "sps", "eval_return", "rollout_seconds", "update_seconds")
        summary.update({k: float(row[f"summary_{k}"]) for k in keys if pd.notna(row.get(f"summary_{k}"))})
        r = runs[runs["run_dir"] == row["run_dir"]]
        scalars = {c: {int(s): v for s, v in zip(r["step"], r[c]) if pd.notna(v)} for c in RECORD_COLUMNS if c in r}
        rec = make_record(Path(row["run_dir"]).name, args, summary if row["finished"] else None, scalars, [], row["algo"])
        if rec["finished"] and pd.notna(row.get("eval_return")):
            rec["summary"].setdefault("eval_return", _clean(row["eval_return"]))
        out.append(rec)
    return out


def collect_records(sources, include_unfinished=False, log=print) -> list[dict]:
    """Every run record found under `sources` (record files, folders of them, run folders, legacy folders).
    NotARecord naming the file if a record file is not a whole record."""
    import pandas as pd

    records = []
    for src in map(Path, sources):
        if not src.exists():
            log(f"warning: {src} does not exist; skipped")
            continue
        for f in [src] if src.is_file() else sorted(src.rglob("*.json.gz")):
            records.append(read_record(f))  # one that is not whole stops the aggregation: a run would be missing
        if src.is_dir():
            for legacy in sorted({p.parent for p in src.rglob("final.csv") if (p.parent / "runs.csv").exists()}):
                head = pd.read_csv(legacy / "final.csv", comment="#", nrows=0).columns
                if {"run_dir", "exp_name", "last_step", "finished"} <= set(head):  # this tool's own output is not a source
                    records += records_from_legacy(legacy)
            for run_dir in sorted({p.parent for p in src.rglob("args.json")}):
                try:
                    records.append(record_from_run_dir(run_dir))
                except Exception as e:  # a broken folder should not stop the aggregation
                    log(f"warning: cannot read {run_dir}: {type(e).__name__}: {e}")
    kept = [r for r in records if include_unfinished or r["finished"]]
    if len(kept) < len(records):
        example = next(r["name"] for r in records if not r["finished"])
        log(f"note: {len(records) - len(kept)} unfinished run(s) left out, e.g. {example}")
    # Runs older than the EnvPool default ran on gymnasium and may not name a backend.
    backends = sorted({(r.get("args") or {}).get("env_backend", "gymnasium") for r in kept})
    if len(backends) > 1:
        log(f"warning: the runs used different env backends ({', '.join(backends)}); compare algorithms within one")
    return kept


def export_records(records, folder, log=print) -> list[Path]:
    """Write each record as `{folder}/{record name}.json.gz` (an existing identical file is left untouched; one that
    is not a whole record is set aside, see set_aside)."""
    written = []
    for rec in records:
        path = Path(folder) / f"{rec['name']}.json.gz"
        if path.exists():
            try:
                if read_record(path) == rec:
                    continue
            except NotARecord as e:
                log(f"warning: {e}; kept as {set_aside(path).name}")
        written.append(write_record(rec, path))
    log(f"wrote {len(written)} record(s) to {folder}/ ({len(records) - len(written)} unchanged)")
    return written
