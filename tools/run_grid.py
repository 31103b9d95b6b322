#!/usr/bin/env python
"""Run a grid of the MuJoCo scripts (algorithm x task x lag x seed) on one machine, in resumable chunks.

    python tools/run_grid.py --tier 1 --workers 2 --time-budget 3h       # the evidence grid's Tier 1, 3 hours of it
    python tools/run_grid.py --tier 1 2 3 --workers 2 --max-runs 20      # the next 20 runs of all three tiers
    python tools/run_grid.py --algos ppo vaco spo impala --envs Hopper-v5 HalfCheetah-v5 \
        --lags 0 4 8 --seeds 1 2 3 --total-timesteps 200000 --workers 2 --out runs/grid \
        --records results/records/mygrid -- --num-envs 8 --num-steps 256    # flags after `--` go to every run

Each run gets a deterministic folder `{out}/{env}__{label}__lag{K}__s{seed}` (plus `-{mode}` after the lag
when `--lag-modes` is given), passed to the script with `--run-dir` (the script creates it: the
scripts refuse a non-empty run folder); its stdout and stderr go to `{out}/{run folder name}.log`. A run is finished when its summary.json exists and is not marked `interrupted`.

Records and resuming. With `--records DIR` every run that finishes is written at once as a compact record,
`DIR/{run folder name}.json.gz` (per-iteration scalars, summary, arguments: a few KB; format in
results/records/README.md), and a run whose record exists is skipped. Commit the records as chunks finish:
the same command on a fresh machine then continues from what the repository holds. Without `--records`,
finished run folders are skipped. A run folder without a finished summary (a crash, an interrupt) is deleted
and the run started over, or with `--resume-unfinished` continued from its last checkpoint (the
script gets `--resume`). `--max-runs N` starts at most N runs; `--time-budget` starts no run that would not
finish within the budget (judged by the runs finished so far); both leave the rest for the next call.

Tiers (`--tier`, the evidence grid; every run `--num-envs 8 --num-steps 256 --eval-episodes 10 --lag-mode
uniform --env-backend gymnasium`, 500k steps, records in results/records/tier{N}, run folders in runs/tier{N}):
  1: ppo, vaco x Hopper-v5, Walker2d-v5 x lags 0, 4, 8 x seeds 1-10 (120 runs)
  2: vaco-norealign, vaco-nofilter x both tasks x lag 8 x seeds 1-10 (40 runs)
  3: spo, impala x both tasks x lags 0, 8 x seeds 1-5 (40 runs)
With `--tier`, `--seeds` may restrict the seeds; changing the budget or the flags of a tier requires an
explicit `--records` (so that a modified tier never writes into the committed records).

Order: seed-major (all runs of seed 1, then seed 2, ...; with several tiers, seed 1 of every tier first),
within a seed the lowest and highest lag first, then the others, tasks and algorithms interleaved: a grid
stopped part-way has complete comparisons for the first seeds rather than one algorithm for all seeds.

Every run gets `OMP_NUM_THREADS=1`, `MKL_NUM_THREADS=1`, `--torch-threads 1` and `--env-threads 1` (EnvPool's
worker threads), so `--workers N` uses about N cores.

Algorithm labels (`--algos`); the label becomes the run's `--exp-name`, which `tools/aggregate.py` uses to
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
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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
TASKS = ["Hopper-v5", "Walker2d-v5"]
# The evidence grid: algorithms, lags and seeds of each tier; the budget and flags are common to all tiers.
TIERS = {
    1: {"algos": ["ppo", "vaco"], "envs": TASKS, "lags": [0, 4, 8], "seeds": list(range(1, 11))},
    2: {"algos": ["vaco-norealign", "vaco-nofilter"], "envs": TASKS, "lags": [8], "seeds": list(range(1, 11))},
    3: {"algos": ["spo", "impala"], "envs": TASKS, "lags": [0, 8], "seeds": list(range(1, 6))},
}
TIER_TIMESTEPS = 500_000
# The committed records were made with gymnasium's SyncVectorEnv (the scripts' default then): a rerun stays on it.
TIER_FLAGS = ["--num-envs", "8", "--num-steps", "256", "--eval-episodes", "10", "--lag-mode", "uniform"]
TIER_FLAGS += ["--env-backend", "gymnasium"]


def is_finished(run_dir: Path) -> bool:
    """A run is finished when its summary.json exists and does not mark it as interrupted (aggregate.py's rule)."""
    import aggregate  # pandas: imported only when needed

    return aggregate.is_finished(run_dir)


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


def grid_runs(opts, algos, envs, lags, seeds, total_timesteps, extra, out, records) -> list[Run]:
    variants = [parse_variant(s) for s in algos]
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate algorithm labels in {labels}")
    scripts = {b: Path(opts.script_dir) / f"{b}_mujoco.py" for b in BASE_ALGOS}
    for override in opts.script or []:
        base, _, path = override.partition("=")
        if base not in BASE_ALGOS or not path:
            raise ValueError(f"--script {override!r}: expected BASE=PATH with BASE in {BASE_ALGOS}")
        scripts[base] = Path(path)
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


def build_runs(opts) -> list[Run]:
    if opts.tier:
        runs = []
        for tier in opts.tier:
            t = TIERS[tier]
            seeds = [s for s in t["seeds"] if opts.seeds is None or s in opts.seeds]
            steps = TIER_TIMESTEPS if opts.total_timesteps is None else opts.total_timesteps
            out = Path(opts.out or "runs") / f"tier{tier}"
            records = Path(opts.records) / f"tier{tier}" if opts.records else REPO / "results" / "records" / f"tier{tier}"
            runs += [
                (r.seed, tier, i, r)
                for i, r in enumerate(
                    grid_runs(
                        opts, t["algos"], t["envs"], t["lags"], seeds, steps, TIER_FLAGS + list(opts.extra), out, records
                    )
                )
            ]
        runs = [r for *_, r in sorted(runs, key=lambda x: x[:3])]  # seed-major across tiers
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


def write_record(run: Run) -> None:
    """Write the finished run's record (tools/aggregate.py defines the format)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import aggregate

    aggregate.write_record(aggregate.record_from_run_dir(run.run_dir), run.record)


def skip_reason(r: Run) -> str | None:
    if r.record is not None and r.record.exists():
        return "record exists"
    if is_finished(r.run_dir):
        return "finished run folder"
    return None


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
            why = skip_reason(r)
            print("OMP_NUM_THREADS=1 " + shlex.join(r.cmd) + (f"  # {why}, would skip" if why else ""))
        print(f"# {len(runs)} runs", file=sys.stderr)
        return 0

    missing = sorted({r.cmd[1] for r in runs if not Path(r.cmd[1]).exists()})
    if missing:
        raise ValueError(f"script(s) not found: {', '.join(missing)}")
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
            write_record(r)
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
                cmd, mode = r.cmd, "w"
                if r.run_dir.exists() and opts.resume_unfinished:  # continue it from its last checkpoint
                    cmd, mode = r.cmd + ["--resume"], "a"
                elif r.run_dir.exists():  # an earlier attempt that did not finish: start clean
                    shutil.rmtree(r.run_dir)
                r.run_dir.parent.mkdir(parents=True, exist_ok=True)
                log = open(r.log, mode)
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
                        write_record(r)
                    except Exception as e:
                        why = f"record not written: {type(e).__name__}: {e}"
                if why is None:
                    progress.done += 1
                    progress.durations.append(elapsed)
                    progress.event(f"[ok]     {name} ({fmt_time(elapsed)})", len(running), opts.workers)
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
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Flags after `--` are passed to every run. See the module docstring (top of this file) for details.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--tier", nargs="+", type=int, choices=sorted(TIERS), help="run these tiers of the evidence grid")
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
    if opts.tier:
        given = [f"--{n.replace('_', '-')}" for n in ("algos", "envs", "lags", "lag_modes") if getattr(opts, n) is not None]
        if given or opts.ablations:
            p.error(f"--tier sets the algorithms, tasks and lags; drop {' '.join(given or ['--ablations'])}")
        if (opts.total_timesteps is not None or extra) and opts.records is None:
            p.error("a tier with another --total-timesteps or extra flags needs an explicit --records folder")
    else:
        opts.algos = opts.algos or list(BASE_ALGOS)
        opts.envs = opts.envs or ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5"]
        opts.lags = opts.lags if opts.lags is not None else [0, 1, 2, 4, 8]
        opts.seeds = opts.seeds or [1, 2, 3]
        if opts.ablations:
            opts.algos = list(dict.fromkeys(list(opts.algos) + ["vaco", *ABLATIONS]))
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


if __name__ == "__main__":
    sys.exit(main())
