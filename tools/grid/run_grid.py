#!/usr/bin/env python
"""Run a grid of the MuJoCo scripts (algorithm x task x lag x seed) on one machine, in resumable chunks.

    python -m tools.grid.run_grid --tier 1 --workers 2 --time-budget 3h       # the evidence grid's Tier 1, 3 hours of it
    python -m tools.grid.run_grid --tier 1 2 3 --workers 2 --max-runs 20      # the next 20 runs of all three tiers
    python -m tools.grid.run_grid --algos ppo vaco spo impala --envs Hopper-v5 HalfCheetah-v5 \
        --lags 0 4 8 --seeds 1 2 3 --total-timesteps 200000 --workers 2 --out runs/grid \
        --records results/records/mygrid -- --num-envs 8 --num-steps 256    # flags after `--` go to every run

Each run gets a deterministic folder `{out}/{env}__{label}__lag{K}__s{seed}` (plus `-{mode}` after the lag
when `--lag-modes` is given), passed to the script with `--run-dir` (the script creates it: the
scripts refuse a non-empty run folder); its stdout and stderr are appended to `{out}/{run folder name}.log` (every
attempt's output stays). A run is finished when its summary.json exists and is not marked `interrupted`. While it
runs, the runner holds a lock on each `{out}` (`{out}/run_grid.lock`; the system drops it when the runner ends,
however it ends): a second runner on the same folder is refused at once with one line naming the first, since each
would start the other's runs again. The shards of one grid (`--shard`) share the folder. `--dry-run` takes no lock.

Records and resuming. With `--records DIR` every run that finishes is written at once as a compact record,
`DIR/{run folder name}.json.gz` (per-iteration scalars, summary, arguments: a few KB; format in
results/records/README.md), and a run whose record exists is skipped. A file at a record's place that is not a
whole record (cut short, empty, damaged, another format) is not taken as done: it is renamed
`{name}.json.gz.damaged-{n}` (kept, and no longer read as a record), said so, and the record is made again (from the
run's finished folder, else by running the run). Commit the records as chunks finish:
the same command on a fresh machine then continues from what the repository holds. Without `--records`,
finished run folders are skipped. A run folder without a finished summary (a crash, an interrupt) is started
over with the script's `--overwrite` (which deletes only what a run wrote, and refuses a folder that holds
anything else), or with `--resume-unfinished` continued from its last checkpoint (the script gets `--resume`).
`--max-runs N` starts at most N runs; `--time-budget` starts no run that would not finish within the budget (judged by the runs finished so far); both leave the rest for the next call.

Grids from sweep files. `--sweep FILE...` runs the cells of wandb grid sweep files (sweeps/*.yaml), the same
cells, labels and folder names as the SLURM launcher (tools/grid/sweeps.py gives the rule), without the parameters
only wandb's agent needs (track, wandb_project_name: add `-- --track` to track).
Tiers (`--tier`, the evidence grid) are lists of sweep files (TIERS below), which define every tier's cells: 500k
steps, `--num-envs 8 --num-steps 256 --eval-episodes 10 --lag-mode uniform --env-backend gymnasium`; records in
results/records/tier{N}, run folders in runs/tier{N}:
  1: sweeps/round1_ppo.yaml, round1_vaco.yaml: both tasks (Hopper-v5, Walker2d-v5) x lags 0, 4, 8 x seeds 1-10
  2: round1_vaco_norealign.yaml, round1_vaco_nofilter.yaml: both tasks x lag 8 x seeds 1-10
  3: round1_spo.yaml, round1_impala.yaml: both tasks x lags 0, 8 x seeds 1-5
Round 2 (`--round 2` = tiers 4-8 in this order; the criteria, written first: docs/evidence_round2.md):
  4: round2_ppo_clip_calibration.yaml: PPO --clip-coef 0.3, 0.4, 0.5 x both tasks x lag 0 x seeds 101-103
  5: round2_ppo_tv_matched_clip<X>.yaml for the calibrated X: both tasks x lags 0, 4, 8 x seeds 1-10; X is chosen
     from tier 4's records (and tier 1's VACO) by the calibration rule; until those are complete, `--tier 5` is
     refused and `--round 2` leaves tier 5 for its next call
  6: round2_impala_one_pass.yaml: IMPALA with one epoch and its own losses x both tasks x lags 0, 8 x seeds 1-10
  7: round2_halfcheetah_ppo.yaml, round2_halfcheetah_vaco.yaml: HalfCheetah-v5 x lags 0, 4, 8 x seeds 1-10
  8: round2_vaco_delta.yaml: VACO --tv-threshold 0.1, 0.4 x both tasks x lag 8 x seeds 1-5
With `--tier`, `--seeds` may restrict the seeds; changing the budget or the flags of a tier requires an
explicit `--records` (so that a modified tier never writes into the committed records). `--commit` commits
each record (that file only) as soon as its run finishes.

Order: seed-major (all runs of seed 1, then seed 2, ...; with several of tiers 1-3, seed 1 of every tier
first), within a seed the lowest and highest lag first, then the others, tasks and algorithms interleaved: a
grid stopped part-way has complete comparisons for the first seeds rather than one algorithm for all seeds.
Round 2's tiers run one after another (4, 5, 6, 7, 8), each seed-major: each answers one question.

Every run gets `OMP_NUM_THREADS=1`, `MKL_NUM_THREADS=1`, `--torch-threads 1` and `--env-threads 1` (EnvPool's
worker threads), so `--workers N` uses about N cores.

Algorithm labels (`--algos`, a grid given on the command line); the label becomes the run's `--exp-name`, which `tools/grid/aggregate.py` uses to
group runs:
  ppo, vaco, spo, impala                  the four scripts with their defaults
  vaco-nofilter, vaco-norealign,          VACO ablations (realignment off, filter off, both off)
  vaco-norealign-nofilter
  vaco-delta<X>                           VACO with --tv-threshold X     (e.g. vaco-delta0.1)
  vaco-rhobar<X>                          VACO with --rho-bar X          (e.g. vaco-rhobar2)
  'LABEL=BASE FLAG ...'                   any other variant: script BASE with extra flags,
                                          e.g. 'vaco-cbar2=vaco --c-bar 2'
`--ablations` adds the standard VACO ablation set (see ABLATIONS below) to `--algos`.

Signals: SIGINT (Ctrl-C) and SIGTERM are passed on to every running training process (each runs in its own
process group), which are waited for (`--grace` seconds, then killed with their process groups); the
runner then exits 130 (SIGINT) or 143 (SIGTERM) and leaves no process behind. At the end a summary lists
every failed run with the tail of its log; the exit status is 1 if any run failed, else 0. `--dry-run`
only prints the command lines.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import re
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


from tools.grid.run_records import NotARecord, is_finished, read_record, record_from_run_dir, set_aside, write_record
from tools.grid.calibration import TIER_TIMESTEPS, calibrate
from tools.grid.sweeps import SWEEPS, read_sweep, split_at_dashes

REPO = Path(__file__).resolve().parents[2]
BASE_ALGOS = ("ppo", "vaco", "spo", "impala")
# The standard VACO ablation set: filter / realignment off, the delta sweep and the rho-bar sweep.
ABLATIONS = (
    "vaco-nofilter",
    "vaco-norealign",
    "vaco-norealign-nofilter",
    "vaco-delta0.05",
    "vaco-delta0.1",
    "vaco-delta0.4",
    "vaco-rhobar0.5",
    "vaco-rhobar2",
    "vaco-rhobar5",
)
# The evidence grid's tiers: each a list of sweep files (sweeps/{stem}.yaml), which define its cells (tasks, lags,
# seeds, budget, shape and the algorithms' flags). Tier 5's file is the calibrated clip's: `{clip}` is filled in
# from tier 4's records (tools/grid/calibration.py).
TIERS = {
    1: ["round1_ppo", "round1_vaco"],
    2: ["round1_vaco_norealign", "round1_vaco_nofilter"],
    3: ["round1_spo", "round1_impala"],
    # Round 2 (docs/evidence_round2.md, written before its runs): the controls a reviewer asks for, at round 1's
    # budget, shape and backend, so that its cells compare with round 1's.
    4: ["round2_ppo_clip_calibration"],
    5: ["round2_ppo_tv_matched_clip{clip}"],
    6: ["round2_impala_one_pass"],
    7: ["round2_halfcheetah_ppo", "round2_halfcheetah_vaco"],
    8: ["round2_vaco_delta"],
}
ROUNDS = {1: [1, 2, 3], 2: [4, 5, 6, 7, 8]}
# Parameters of a sweep file that only wandb's agent needs: a local run tracks if given `-- --track`.
WANDB_ONLY = ("track", "wandb_project_name", "wandb_entity")


@dataclass
class Variant:
    label: str
    base: str  # one of BASE_ALGOS (selects the script)
    flags: list[str] = field(default_factory=list)


def parse_variant(spec: str) -> Variant:
    """Turn an `--algos` entry into (label, script, flags); see the module docstring."""
    if "=" in spec:
        label, rest = spec.split("=", 1)
        parts = shlex.split(rest)
        if not parts or parts[0] not in BASE_ALGOS:
            raise ValueError(f"variant {spec!r}: expected 'LABEL=BASE [FLAGS...]' with BASE in {BASE_ALGOS}")
        label = label.strip()
        if not re.fullmatch(r"[\w.+-]+", label):
            raise ValueError(f"variant label {label!r} may only contain letters, digits, '_', '.', '+', '-'")
        return Variant(label, parts[0], parts[1:])
    if spec in BASE_ALGOS:
        return Variant(spec, spec)
    if spec.startswith("vaco-"):
        flags = []
        for part in spec[len("vaco-") :].split("-"):
            if part == "nofilter":
                flags.append("--no-filter")
            elif part == "norealign":
                flags.append("--no-realign")
            elif m := re.fullmatch(r"delta([0-9.]+(?:e-?[0-9]+)?)", part):
                flags += ["--tv-threshold", m.group(1)]
            elif m := re.fullmatch(r"rhobar([0-9.]+(?:e-?[0-9]+)?)", part):
                flags += ["--rho-bar", m.group(1)]
            else:
                flags = None
                break
        if flags:
            return Variant(spec, "vaco", flags)
    raise ValueError(
        f"unknown algorithm label {spec!r}: use one of {BASE_ALGOS}, a vaco-* ablation label "
        "(nofilter, norealign, delta<X>, rhobar<X>, joined with '-'), or 'LABEL=BASE FLAGS...'"
    )


@dataclass
class Run:
    variant: Variant
    env: str
    lag: int
    lag_mode: str | None
    seed: int
    run_dir: Path
    cmd: list[str]
    record: Path | None = None  # where its record goes (None: no records)

    @property
    def log(self) -> Path:
        """stdout and stderr of the run, next to (not in) its folder, which the script must find empty."""
        return self.run_dir.parent / f"{self.run_dir.name}.log"


def lag_order(lags) -> list[int]:
    """The lowest and the highest lag first (the comparison the grid is for), then the others ascending."""
    lags = sorted(set(lags))
    return lags[:1] + lags[-1:] + lags[1:-1] if len(lags) > 1 else lags


def script_paths(opts) -> dict[str, Path]:
    """{algorithm: its script}: {algo}_mujoco.py in --script-dir, or a --script override."""
    scripts = {b: Path(opts.script_dir) / f"{b}_mujoco.py" for b in BASE_ALGOS}
    for override in opts.script or []:
        base, _, path = override.partition("=")
        if base not in BASE_ALGOS or not path:
            raise ValueError(f"--script {override!r}: expected BASE=PATH with BASE in {BASE_ALGOS}")
        scripts[base] = Path(path)
    return scripts


def grid_runs(opts, algos, envs, lags, seeds, total_timesteps, extra, out, records) -> list[Run]:
    variants = [parse_variant(s) for s in algos]
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate algorithm labels in {labels}")
    scripts = script_paths(opts)
    modes = opts.lag_modes or [None]
    runs = []
    for seed in seeds:
        for mode in modes:
            for lag in lag_order(lags):
                for env in envs:
                    for v in variants:
                        lag_tag = f"lag{lag}" + (f"-{mode}" if mode else "")
                        run_dir = Path(out) / f"{env}__{v.label}__{lag_tag}__s{seed}"
                        cmd = [opts.python, str(scripts[v.base]), "--exp-name", v.label, "--env-id", env]
                        cmd += ["--seed", str(seed), "--lag", str(lag)]
                        if mode:
                            cmd += ["--lag-mode", mode]
                        if total_timesteps is not None:
                            cmd += ["--total-timesteps", str(total_timesteps)]
                        cmd += ["--torch-threads", "1", "--env-threads", "1", "--run-dir", str(run_dir)]
                        cmd += v.flags + list(extra)
                        record = Path(records) / f"{run_dir.name}.json.gz" if records else None
                        runs.append(Run(v, env, lag, mode, seed, run_dir, cmd, record))
    return runs


def tiers_to_run(opts) -> tuple[dict[int, list[str]], list[str]]:
    """{tier: its sweep files' stems} of this call, and notes for stderr. Tier 5's file is the calibrated PPO's, so
    it needs the calibration (tier 4) complete: asked for with tier 4 in the same call it is left for the next call;
    asked for without it, refused."""
    tiers = list(dict.fromkeys(ROUNDS[opts.round] if opts.round else opts.tier))
    notes = []
    stems = {t: TIERS[t] for t in tiers}
    if 5 in tiers:
        cal = calibrate(opts.records or REPO / "results" / "records", opts.total_timesteps or TIER_TIMESTEPS)
        if cal.clip is None and 4 in tiers:
            del stems[5]
            notes.append(
                f"note: tier 5 (the TV-matched PPO) waits for the calibration: {len(cal.missing)} record(s) missing "
                f"(e.g. {cal.missing[0]}); it runs first in the call after tier 4's records are committed"
            )
        elif cal.clip is None:
            raise ValueError(
                f"tier 5 (the TV-matched PPO) needs the calibration complete: {len(cal.missing)} record(s) missing, "
                f"e.g. {cal.missing[0]}; run --tier 4 and commit its records in {cal.folder} first"
            )
        else:
            stems[5] = [stem.format(clip=cal.clip) for stem in TIERS[5]]
            notes.append(cal.report())
    return stems, notes


def sweep_runs(opts, paths, out, records) -> list[Run]:
    """The runs of the cells of these sweep files, seed-major; within a seed the lowest and highest lag first, tasks
    and the files' algorithms interleaved (as grid_runs orders them). Each gets the cell's flags but those only
    wandb's agent needs, one thread each, `--total-timesteps` if given, and the flags after `--`."""
    scripts = script_paths(opts)
    keyed = []
    for f, path in enumerate(paths):
        cells = read_sweep(path)
        lags = lag_order(cell.params["lag"] for cell in cells)
        envs = list(dict.fromkeys(cell.params["env_id"] for cell in cells))
        for i, cell in enumerate(cells):
            seed, lag, env = cell.params["seed"], cell.params["lag"], cell.params["env_id"]
            if opts.seeds is not None and seed not in opts.seeds:
                continue
            base = Path(cell.program).stem.removesuffix("_mujoco")
            if base not in BASE_ALGOS:
                raise ValueError(f"{path}: program {cell.program} is not one of the MuJoCo scripts")
            override = dict(torch_threads=1, env_threads=1)
            if opts.total_timesteps is not None:
                override["total_timesteps"] = opts.total_timesteps
            flags = [x for x in cell.flags(**override) if x[2:].split("=")[0] not in WANDB_ONLY]
            run_dir = Path(out) / cell.name
            cmd = [opts.python, str(scripts[base]), *flags, "--run-dir", str(run_dir), *opts.extra]
            record = Path(records) / f"{cell.name}.json.gz" if records else None
            mode = cell.params.get("lag_mode")
            run = Run(Variant(cell.label, base, flags), env, lag, mode, seed, run_dir, cmd, record)
            keyed.append(((seed, lags.index(lag), envs.index(env), f, i), run))
    runs = [run for _, run in sorted(keyed, key=lambda x: x[0])]
    names = [r.run_dir.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError("two sweep files' cells would share a run folder name")
    return runs


def build_runs(opts) -> list[Run]:
    if opts.tier or opts.round:
        runs = []
        tier_stems, notes = tiers_to_run(opts)
        for note in notes:
            print(note, file=sys.stderr)
        for tier, stems in tier_stems.items():
            out = Path(opts.out or "runs") / f"tier{tier}"
            records = Path(opts.records) / f"tier{tier}" if opts.records else REPO / "results" / "records" / f"tier{tier}"
            paths = [SWEEPS / f"{stem}.yaml" for stem in stems]
            runs += [
                (0 if tier in ROUNDS[1] else tier, r.seed, tier, i, r)
                for i, r in enumerate(sweep_runs(opts, paths, out, records))
            ]
        # Seed-major across the first grid's tiers; round 2's tiers one after another (4 before 5: 5 needs it).
        runs = [r for *_, r in sorted(runs, key=lambda x: x[:4])]
    elif opts.sweep:
        runs = sweep_runs(opts, opts.sweep, opts.out or "runs/grid", opts.records)
    else:
        runs = grid_runs(
            opts,
            opts.algos,
            opts.envs,
            opts.lags,
            opts.seeds,
            opts.total_timesteps,
            opts.extra,
            opts.out or "runs/grid",
            opts.records,
        )
    if opts.shard:
        i, n = opts.shard
        runs = runs[i::n]
    return runs


def tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text[-lines:])


def fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Progress:
    """One live status line on a terminal; one line per finished run otherwise."""

    def __init__(self, total: int):
        self.total, self.live, self.start = total, sys.stdout.isatty(), time.time()
        self.done = self.failed = self.skipped = 0
        self.durations: list[float] = []

    def line(self, running: int, workers: int) -> str:
        finished = self.done + self.failed
        todo = self.total - self.skipped - finished
        eta = ""
        if self.durations and todo:
            mean = sum(self.durations) / len(self.durations)
            eta = f" | ETA ~{fmt_time(mean * todo / max(1, workers))}"
        return (
            f"[grid] {finished + self.skipped}/{self.total} ({self.done} ok, {self.failed} failed, "
            f"{self.skipped} skipped) | running {running} | elapsed {fmt_time(time.time() - self.start)}{eta}"
        )

    def event(self, message: str, running: int, workers: int) -> None:
        if self.live:
            print("\r\033[K" + message, flush=True)
            self.refresh(running, workers)
        else:
            print(message + "  " + self.line(running, workers), flush=True)

    def refresh(self, running: int, workers: int) -> None:
        if self.live:
            print("\r\033[K" + self.line(running, workers), end="", flush=True)


class Stop(Exception):
    """Raised by the signal handler: SIGINT or SIGTERM arrived."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum, frame):
    raise Stop(signum)


def save_record(run: Run) -> None:
    """Write the finished run's record (tools/grid/run_records.py defines the format)."""
    write_record(record_from_run_dir(run.run_dir), run.record)


def commit_record(path: Path, message: str) -> str | None:
    """Commit this one record file to the git repository that holds it (other staged changes stay out of the
    commit: `--only`). Returns None, or why it could not."""
    where = ["git", "-C", str(path.parent)]
    for cmd in (["add", "--", path.name], ["commit", "-q", "--only", "-m", message, "--", path.name]):
        proc = subprocess.run(where + cmd, capture_output=True, text=True)
        if proc.returncode:
            text = (proc.stderr or proc.stdout).strip()
            return f"git {cmd[0]} failed: {text.splitlines()[-1] if text else f'exit code {proc.returncode}'}"
    return None


def damaged_record(r: Run) -> str | None:
    """Why the file at the run's record path is not a whole record; None where there is no file or a whole record."""
    if r.record is None or not r.record.exists():
        return None
    try:
        read_record(r.record)
    except NotARecord as e:
        return str(e)
    return None


def skip_reason(r: Run) -> str | None:
    if r.record is not None and r.record.exists() and damaged_record(r) is None:
        return "record exists"
    if is_finished(r.run_dir):
        return "finished run folder"
    return None


LOCK = "run_grid.lock"


def lock_folders(folders, shard) -> list:
    """Lock each folder of run folders (`--out`) for as long as the returned files stay open, i.e. this call's life
    (the system drops the lock of a process that ends, however it ends): a second run_grid on the same folder is
    refused at once, naming the holder, as each would start the other's runs again and take them for failed. The
    shards of a `--shard I/N` grid share the folder (each holds its own shard's lock)."""
    held = []
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        if shard:
            held.append(_lock(folder / LOCK, fcntl.LOCK_SH))
        held.append(_lock(folder / (f"run_grid.shard-{shard[0]}-of-{shard[1]}.lock" if shard else LOCK), fcntl.LOCK_EX))
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        held[-1].truncate(0)
        held[-1].write(f"run_grid process {os.getpid()} on {socket.gethostname()}, started {started}\n")
        held[-1].flush()
    return held


def _lock(path: Path, kind: int):
    """The file at `path` (created if missing, never through a link), locked; ValueError naming the holder if another
    process holds a lock that excludes this one."""
    not_its_own = f"cannot lock {path}: not a file of its own (a link?); remove it"
    try:
        f = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), "r+")
    except OSError as e:
        raise ValueError(not_its_own if e.errno == errno.ELOOP else f"cannot lock {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode) or os.fstat(f.fileno()).st_nlink != 1:
        f.close()
        raise ValueError(not_its_own)
    try:
        fcntl.flock(f, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ValueError(
            f"{path.parent} is in use by {lock_holders(path.parent) or 'another run_grid'}; a second run_grid on it "
            "would start its runs again: wait for it to end, or stop it first"
        ) from None
    return f


def lock_holders(folder: Path) -> str:
    """Who holds an exclusive lock in `folder` (the lines they wrote into their lock files)."""
    holders = []
    for path in sorted(folder.glob("run_grid*.lock")):
        try:
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW)) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # taken (and dropped at close): no one holds it
                except BlockingIOError:
                    holders.append(f.read().strip() or path.name)
        except OSError:
            continue
    return "; ".join(holders)


def stop_children(running: dict, signum: int, grace: float) -> None:
    """Pass the signal to every child's process group, wait up to `grace` s, then kill what is left."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
    for proc in running:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace
    for proc, (_, _, log) in running.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
        _kill_group(proc)
        proc.wait()
        log.close()


def _kill_group(proc) -> None:
    """SIGKILL the process group of a child (also reaches processes it started that outlived it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError("expected a positive duration: seconds, or a number with s, m or h (e.g. 90m)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def run_grid(opts) -> int:
    runs = build_runs(opts)
    if opts.dry_run:
        for r in runs:
            why, damaged = skip_reason(r), damaged_record(r)
            notes = [f"{why}, would skip"] if why else []
            if damaged:
                notes.append("not a whole record at its place, would set it aside" + ("" if why else " and redo the run"))
            print("OMP_NUM_THREADS=1 " + shlex.join(r.cmd) + ("  # " + "; ".join(notes) if notes else ""))
        print(f"# {len(runs)} runs", file=sys.stderr)
        return 0

    missing = sorted({r.cmd[1] for r in runs if not Path(r.cmd[1]).exists()})
    if missing:
        raise ValueError(f"script(s) not found: {', '.join(missing)}")
    locks = lock_folders(sorted({r.run_dir.parent for r in runs}), opts.shard)
    try:
        return run_locked(opts, runs)
    finally:
        for f in locks:
            f.close()


def run_locked(opts, runs: list[Run]) -> int:
    """Run the grid's runs, with its folders locked (lock_folders)."""
    for r in runs:
        if why := damaged_record(r):  # kept, and the run is redone (or its record made again from its finished folder)
            print(f"[grid] warning: {why}; kept as {set_aside(r.record).name}, the run's record is made again", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    progress = Progress(len(runs))
    pending, late_records = [], []
    for r in runs:
        why = skip_reason(r)
        if why is None:
            pending.append(r)
            continue
        progress.skipped += 1
        if why == "finished run folder" and r.record is not None:
            late_records.append(r)  # finished before records were asked for: write its record now
    for r in late_records:
        try:
            save_record(r)
        except Exception as e:  # reported, and the run is left as it is
            print(f"[grid] warning: no record for {r.run_dir}: {type(e).__name__}: {e}", flush=True)
    held_back = 0
    if opts.max_runs is not None and len(pending) > opts.max_runs:
        held_back, pending = len(pending) - opts.max_runs, pending[: opts.max_runs]
    print(
        f"[grid] {len(runs)} runs: {progress.skipped} already finished, {len(pending)} to run"
        + (f" ({held_back} more left for later calls by --max-runs)" if held_back else "")
        + f" with {opts.workers} workers; logs in <out>/<run name>.log"
        + (f"; {len(late_records)} record(s) written for finished run folders" if late_records else ""),
        flush=True,
    )

    running: dict[subprocess.Popen, tuple[Run, float, object]] = {}
    failures: list[tuple[Run, str]] = []
    stopped_by = None
    budget_stop = 0
    handlers = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while pending or running:
            while pending and len(running) < opts.workers:
                if opts.time_budget is not None:
                    expected = sum(progress.durations) / len(progress.durations) if progress.durations else 0.0
                    if time.time() - progress.start + expected > opts.time_budget:
                        budget_stop, pending = len(pending), []
                        break
                r = pending.pop(0)
                cmd = r.cmd
                if r.run_dir.exists() and opts.resume_unfinished:  # continue it from its last checkpoint
                    cmd = r.cmd + ["--resume"]
                elif r.run_dir.exists():  # an earlier attempt that did not finish: the script deletes what it wrote
                    cmd = r.cmd + ["--overwrite"]
                log = open(r.log, "a")  # an earlier attempt's output stays, above this one's
                log.write("# " + shlex.join(cmd) + "\n")
                log.flush()
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                running[proc] = (r, time.time(), log)
            time.sleep(opts.poll)
            for proc in list(running):
                r, t0, log = running[proc]
                rc = proc.poll()
                if rc is None and opts.timeout and time.time() - t0 > opts.timeout:
                    _kill_group(proc)
                    rc = proc.wait()
                    with open(r.log, "a") as f:
                        f.write(f"\n[run_grid] killed after the --timeout of {opts.timeout} s\n")
                if rc is None:
                    continue
                _kill_group(proc)  # whatever the run started and left behind
                log.close()
                del running[proc]
                elapsed = time.time() - t0
                name = r.run_dir.name
                why = None
                if rc != 0:
                    why = f"exit code {rc}"
                elif not is_finished(r.run_dir):
                    why = "exit code 0 but no finished summary.json"
                elif r.record is not None:
                    try:
                        save_record(r)
                    except Exception as e:
                        why = f"record not written: {type(e).__name__}: {e}"
                if why is None:
                    progress.done += 1
                    progress.durations.append(elapsed)
                    progress.event(f"[ok]     {name} ({fmt_time(elapsed)})", len(running), opts.workers)
                    if opts.commit and r.record is not None:
                        problem = commit_record(r.record, f"Evidence grid, {r.record.parent.name}: {name}")
                        if problem:  # the record stays on disk: commit it by hand
                            print(f"[grid] warning: {r.record} not committed ({problem})", flush=True)
                else:
                    progress.failed += 1
                    failures.append((r, why))
                    progress.event(f"[FAILED] {name} ({why}, {fmt_time(elapsed)})", len(running), opts.workers)
            progress.refresh(len(running), opts.workers)
    except Stop as e:
        stopped_by = e.signum
        n_stopped = len(running)
        stop_children(running, e.signum, opts.grace)
        name = signal.Signals(e.signum).name
        print(f"\n[grid] {name}: stopped {n_stopped} running run(s) (they start over on the next call)", flush=True)
    finally:
        for proc in running:  # only reached with children left on an unexpected error
            _kill_group(proc)
        for sig, h in handlers.items():
            signal.signal(sig, h)

    if progress.live:
        print()
    left = held_back + budget_stop + (len(pending) if stopped_by else 0)
    print(
        f"[grid] done in {fmt_time(time.time() - progress.start)}: {progress.done} finished, "
        f"{progress.skipped} skipped (already finished), {progress.failed} failed"
        + (f", {len(running)} stopped and {len(pending)} not started (interrupted)" if stopped_by else "")
        + (f"; {budget_stop} not started within the --time-budget" if budget_stop else "")
        + (f"; {left} run(s) left: run the same command again to continue" if left else "")
    )
    if failures:
        print(f"\n[grid] {len(failures)} FAILED run(s):")
        for r, why in failures:
            print(f"\n--- {r.run_dir} ({why}); last {opts.tail} lines of {r.log}:")
            print(tail(r.log, opts.tail))
            print(f"--- rerun: OMP_NUM_THREADS=1 {shlex.join(r.cmd)}")
    if stopped_by:
        return 128 + stopped_by
    return 1 if failures else 0


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not int(m.group(1)) < int(m.group(2)):
        raise argparse.ArgumentTypeError("expected I/N with 0 <= I < N, e.g. 0/2")
    return int(m.group(1)), int(m.group(2))


def parse_args(argv=None):
    argv, extra = split_at_dashes(argv)
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Flags after `--` are passed to every run. See the module docstring (top of this file) for details.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--tier", nargs="+", type=int, choices=sorted(TIERS), help="run these tiers of the evidence grid (their sweep files)"
    )
    p.add_argument(
        "--sweep", nargs="+", type=Path, default=None, help="run the cells of these grid sweep files (sweeps/*.yaml)"
    )
    p.add_argument(
        "--round", type=int, choices=sorted(ROUNDS), help="run every tier of this round (1: tiers 1-3; 2: tiers 4-8, in order)"
    )
    p.add_argument(
        "--algos",
        nargs="+",
        default=None,
        help="algorithm labels: ppo vaco spo impala, vaco-* ablations, or 'LABEL=BASE FLAGS...' (default: the four)",
    )
    p.add_argument("--ablations", action="store_true", help=f"also run the standard VACO ablation set: {' '.join(ABLATIONS)}")
    p.add_argument("--envs", nargs="+", default=None, help="default: Hopper, Walker2d, HalfCheetah, Ant, Humanoid (v5)")
    p.add_argument("--lags", nargs="+", type=int, default=None, help="default: 0 1 2 4 8")
    p.add_argument(
        "--lag-modes",
        nargs="+",
        choices=["uniform", "fixed"],
        default=None,
        help="pass --lag-mode to the scripts (if not given: not passed, the scripts' default)",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=None, help="default: 1 2 3 (with --tier: the tier's)")
    p.add_argument(
        "--total-timesteps", type=int, default=None, help="passed to every run (if not given: the scripts' own default)"
    )
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel runs (one core each)")
    p.add_argument("--out", default=None, help="parent folder of the run folders (default: runs/grid; with --tier: runs)")
    p.add_argument(
        "--records",
        default=None,
        help="write each finished run's record here and skip runs whose record exists "
        "(with --tier: the parent of tier{N}/, default results/records)",
    )
    p.add_argument("--max-runs", type=int, default=None, help="start at most this many runs in this call")
    p.add_argument(
        "--time-budget",
        type=parse_duration,
        default=None,
        help="start no run that would not finish within this time (seconds, or e.g. 90m, 3h)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the command lines and exit")
    p.add_argument(
        "--commit",
        action="store_true",
        help="git-commit each run's record as soon as it is written (only that file), so that a cut-off loses no run",
    )
    p.add_argument(
        "--shard",
        type=parse_shard,
        default=None,
        help="run only every N-th run starting at I (I/N), to split a grid across machines",
    )
    p.add_argument(
        "--resume-unfinished",
        action="store_true",
        help="continue an unfinished run from its folder (passes --resume to the script) instead of starting it over",
    )
    p.add_argument("--timeout", type=float, default=0, help="kill a run after this many seconds (0 = never)")
    p.add_argument("--grace", type=float, default=60, help="on SIGINT/SIGTERM: seconds to wait for the runs to stop")
    p.add_argument("--tail", type=int, default=20, help="log lines shown per failed run")
    p.add_argument("--python", default=sys.executable, help="interpreter for the scripts")
    p.add_argument("--script-dir", default=str(REPO), help="folder holding {algo}_mujoco.py")
    p.add_argument(
        "--script", action="append", metavar="BASE=PATH", help="use PATH as the script for BASE (repeatable), e.g. for testing"
    )
    p.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    opts.extra = extra
    if sum(x is not None for x in (opts.tier, opts.round, opts.sweep)) > 1:
        p.error("give one of --tier, --round and --sweep")
    if opts.tier or opts.round or opts.sweep:
        given = [f"--{n.replace('_', '-')}" for n in ("algos", "envs", "lags", "lag_modes") if getattr(opts, n) is not None]
        if given or opts.ablations:
            p.error(f"--tier/--round/--sweep set the algorithms, tasks and lags; drop {' '.join(given or ['--ablations'])}")
        if (opts.tier or opts.round) and (opts.total_timesteps is not None or extra) and opts.records is None:
            p.error("a tier with another --total-timesteps or extra flags needs an explicit --records folder")
        for path in opts.sweep or []:
            try:
                read_sweep(path)
            except ValueError as e:
                p.error(str(e))
    else:
        opts.algos = opts.algos or list(BASE_ALGOS)
        opts.envs = opts.envs or ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5"]
        opts.lags = opts.lags if opts.lags is not None else [0, 1, 2, 4, 8]
        opts.seeds = opts.seeds or [1, 2, 3]
        if opts.ablations:
            opts.algos = list(dict.fromkeys(list(opts.algos) + ["vaco", *ABLATIONS]))
    if opts.commit and opts.records is None and not (opts.tier or opts.round):
        p.error("--commit commits records: give --records DIR (a tier or round writes them by default)")
    if opts.workers < 1:
        p.error("--workers must be >= 1")
    if opts.max_runs is not None and opts.max_runs < 1:
        p.error("--max-runs must be >= 1")
    if any(k < 0 for k in opts.lags or []):
        p.error("--lags must be >= 0")
    try:
        for s in opts.algos or []:
            parse_variant(s)
    except ValueError as e:
        p.error(str(e))
    return opts


def main(argv=None) -> int:
    opts = parse_args(argv)
    try:
        return run_grid(opts)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. a record that cannot be read
        print(f"error: {e.filename}: {e.strerror}" if e.filename else f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
