#!/usr/bin/env python
"""Run a grid of the MuJoCo scripts (algorithm x task x lag x seed) on one machine.

    python tools/run_grid.py --algos ppo vaco spo impala --envs Hopper-v5 HalfCheetah-v5 \
        --lags 0 1 2 4 8 --seeds 1 2 3 --total-timesteps 200000 --workers 2 --out runs/grid \
        -- --num-envs 8 --num-steps 256          # flags after `--` go to every run

Each run gets a deterministic folder `{out}/{env}__{label}__lag{K}__s{seed}` (plus `-{mode}` after the lag
when `--lag-modes` is given), passed to the script with `--run-dir`; its stdout and stderr go to
`{run dir}/train.log`. A run is finished iff `{run dir}/summary.json` exists (the scripts write it last):
finished runs are skipped, so a long grid can be stopped (Ctrl-C) and resumed by running the same command
again. A run folder without summary.json (a crash or an interrupt) is deleted and the run started over.

Every run gets `OMP_NUM_THREADS=1`, `MKL_NUM_THREADS=1` and `--torch-threads 1`, so `--workers N` uses about
N cores. Runs are ordered seed-major (all of seed 1, then seed 2, ...), so a grid stopped half-way has
complete seeds rather than complete algorithms.

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

At the end a summary lists every failed run with the tail of its log; the exit status is 1 if any run
failed, 130 if interrupted, else 0. `--dry-run` only prints the command lines.
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
FINISHED = "summary.json"
LOG = "train.log"


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


def build_runs(opts) -> list[Run]:
    variants = [parse_variant(s) for s in opts.algos]
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
    for seed in opts.seeds:
        for mode in modes:
            for lag in opts.lags:
                for env in opts.envs:
                    for v in variants:
                        lag_tag = f"lag{lag}" + (f"-{mode}" if mode else "")
                        run_dir = Path(opts.out) / f"{env}__{v.label}__{lag_tag}__s{seed}"
                        cmd = [
                            opts.python,
                            str(scripts[v.base]),
                            "--exp-name",
                            v.label,
                            "--env-id",
                            env,
                            "--seed",
                            str(seed),
                            "--lag",
                            str(lag),
                        ]
                        if mode:
                            cmd += ["--lag-mode", mode]
                        if opts.total_timesteps is not None:
                            cmd += ["--total-timesteps", str(opts.total_timesteps)]
                        cmd += ["--torch-threads", "1", "--run-dir", str(run_dir)]
                        cmd += v.flags + list(opts.extra)
                        runs.append(Run(v, env, lag, mode, seed, run_dir, cmd))
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


def run_grid(opts) -> int:
    runs = build_runs(opts)
    if opts.dry_run:
        for r in runs:
            status = "  # finished, would skip" if (r.run_dir / FINISHED).exists() else ""
            print("OMP_NUM_THREADS=1 " + shlex.join(r.cmd) + status)
        print(f"# {len(runs)} runs", file=sys.stderr)
        return 0

    missing = sorted({r.cmd[1] for r in runs if not Path(r.cmd[1]).exists()})
    if missing:
        raise ValueError(f"script(s) not found: {', '.join(missing)}")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    progress = Progress(len(runs))
    pending = []
    for r in runs:
        if (r.run_dir / FINISHED).exists():
            progress.skipped += 1
        else:
            pending.append(r)
    print(
        f"[grid] {len(runs)} runs: {progress.skipped} already finished, {len(pending)} to run "
        f"with {opts.workers} workers; logs in <run dir>/{LOG}",
        flush=True,
    )

    running: dict[subprocess.Popen, tuple[Run, float, object]] = {}
    failures: list[tuple[Run, str]] = []
    interrupted = False
    try:
        while pending or running:
            while pending and len(running) < opts.workers:
                r = pending.pop(0)
                if r.run_dir.exists():  # an earlier attempt that did not finish: start clean
                    shutil.rmtree(r.run_dir)
                r.run_dir.mkdir(parents=True)
                log = open(r.run_dir / LOG, "w")
                log.write("# " + shlex.join(r.cmd) + "\n")
                log.flush()
                proc = subprocess.Popen(r.cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                running[proc] = (r, time.time(), log)
            time.sleep(opts.poll)
            for proc in list(running):
                r, t0, log = running[proc]
                rc = proc.poll()
                if rc is None and opts.timeout and time.time() - t0 > opts.timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    rc = proc.wait()
                    with open(r.run_dir / LOG, "a") as f:
                        f.write(f"\n[run_grid] killed after the --timeout of {opts.timeout} s\n")
                if rc is None:
                    continue
                log.close()
                del running[proc]
                elapsed = time.time() - t0
                name = r.run_dir.name
                if rc == 0 and (r.run_dir / FINISHED).exists():
                    progress.done += 1
                    progress.durations.append(elapsed)
                    progress.event(f"[ok]     {name} ({fmt_time(elapsed)})", len(running), opts.workers)
                else:
                    why = f"exit code {rc}" if rc != 0 else f"exit code 0 but no {FINISHED}"
                    progress.failed += 1
                    failures.append((r, why))
                    progress.event(f"[FAILED] {name} ({why}, {fmt_time(elapsed)})", len(running), opts.workers)
            progress.refresh(len(running), opts.workers)
    except KeyboardInterrupt:
        interrupted = True
        for proc, (r, _, log) in running.items():
            try:
                os.killpg(proc.pid, signal.SIGINT)  # the scripts stop cleanly on Ctrl-C (no summary.json)
            except ProcessLookupError:
                pass
        for proc, (r, _, log) in running.items():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
        print(f"\n[grid] interrupted; stopped {len(running)} running run(s) (they start over on the next call)")

    if progress.live:
        print()
    print(
        f"[grid] done in {fmt_time(time.time() - progress.start)}: {progress.done} finished, "
        f"{progress.skipped} skipped (already finished), {progress.failed} failed"
        + (f", {len(running)} stopped and {len(pending)} not started (interrupted)" if interrupted else "")
    )
    if failures:
        print(f"\n[grid] {len(failures)} FAILED run(s):")
        for r, why in failures:
            print(f"\n--- {r.run_dir} ({why}); last {opts.tail} lines of {r.run_dir / LOG}:")
            print(tail(r.run_dir / LOG, opts.tail))
            print(f"--- rerun: OMP_NUM_THREADS=1 {shlex.join(r.cmd)}")
    if interrupted:
        return 130
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
    p.add_argument(
        "--algos",
        nargs="+",
        default=list(BASE_ALGOS),
        help="algorithm labels: ppo vaco spo impala, vaco-* ablations, or 'LABEL=BASE FLAGS...'",
    )
    p.add_argument("--ablations", action="store_true", help=f"also run the standard VACO ablation set: {' '.join(ABLATIONS)}")
    p.add_argument("--envs", nargs="+", default=["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5"])
    p.add_argument("--lags", nargs="+", type=int, default=[0, 1, 2, 4, 8])
    p.add_argument(
        "--lag-modes",
        nargs="+",
        choices=["uniform", "fixed"],
        default=None,
        help="pass --lag-mode to the scripts (if not given: not passed, the scripts' default)",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument(
        "--total-timesteps", type=int, default=None, help="passed to every run (if not given: the scripts' own default)"
    )
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel runs (one core each)")
    p.add_argument("--out", default="runs/grid", help="parent folder of the run folders")
    p.add_argument("--dry-run", action="store_true", help="print the command lines and exit")
    p.add_argument(
        "--shard",
        type=parse_shard,
        default=None,
        help="run only every N-th run starting at I (I/N), to split a grid across machines",
    )
    p.add_argument("--timeout", type=float, default=0, help="kill a run after this many seconds (0 = never)")
    p.add_argument("--tail", type=int, default=20, help="log lines shown per failed run")
    p.add_argument("--python", default=sys.executable, help="interpreter for the scripts")
    p.add_argument("--script-dir", default=str(REPO), help="folder holding {algo}_mujoco.py")
    p.add_argument(
        "--script", action="append", metavar="BASE=PATH", help="use PATH as the script for BASE (repeatable), e.g. for testing"
    )
    p.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    opts.extra = extra
    if opts.ablations:
        opts.algos = list(dict.fromkeys(list(opts.algos) + ["vaco", *ABLATIONS]))
    if opts.workers < 1:
        p.error("--workers must be >= 1")
    if any(k < 0 for k in opts.lags):
        p.error("--lags must be >= 0")
    try:
        for s in opts.algos:
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
