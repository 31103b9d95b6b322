#!/usr/bin/env python
"""Run a grid on a SLURM cluster: one array task per cell of a sweep file, requeued until its run has finished.

    python -m tools.grid.slurm submit sweeps/ppo_grid.yaml --out runs/ppo_grid --cpus 2 --mem 8G --time 24:00:00
    python -m tools.grid.slurm submit sweeps/ppo_grid.yaml --out runs/ppo_grid --where env_id=Hopper-v5 --where seed=1,2
    python -m tools.grid.slurm status runs/ppo_grid     # each cell's state, starts and requeues
    python -m tools.grid.aggregate runs/ppo_grid        # once every cell has finished

The grid is the sweep file's (sweeps/*.yaml, `method: grid`; tools/grid/sweeps.py names its cells); `--where KEY=V[,V]`
keeps the cells whose parameter KEY takes one of the values (repeatable: all conditions). `submit` writes into
`--out`: `slurm/cells.tsv` (every cell of the grid: task i runs line i + 1, the cell's run folder name, a tab, its
command), the job script `slurm/job.sh` (plain sbatch: read it, edit it, submit it yourself if you like), and submits
one job array of the chosen cells that have not finished. Each cell's run goes to `{out}/{cell}`, its output to
`{out}/logs/{cell}.log` (appended at every start), the events of its tasks to `{out}/slurm/history/{cell}.tsv`.
Flags after `--` go to every run, in place of the sweep's fixed (or the launcher's) value of the same flag; not a
parameter the sweep lists values for, nor --exp-name, --run-dir or --auto-resume.

Every task runs its cell's command with `--auto-resume --run-dir {out}/{cell}`: the same command starts the run or
continues it from its checkpoint, so a task may be requeued any number of times. Requeueing:
* time limit: SLURM sends the job script SIGUSR1 `--signal-seconds` before the limit (`--signal=B:USR1@N`); the
  script asks the run to stop (SIGTERM: it finishes its iteration and writes its checkpoint) and requeues the task
  (`scontrol requeue`), unless this start wrote no new checkpoint (requeued, it would only do the same again) or the
  task has been requeued at the time limit `--max-requeues` times in this submission: `status` shows it as timeout.
  N must cover an iteration and the checkpoint (the default, 300 s, covers the paper's shape on slow nodes), and
  `--time` must leave a start as long again before the signal, which SLURM may send up to 60 s early: `--time` below
  2 N + 60 s is refused.
* preemption (a partition with `PreemptMode=REQUEUE`), node failure, `scontrol requeue`: SLURM sends SIGTERM to the
  run, which checkpoints within the cluster's KillWait / GraceTime if its iteration ends in time (otherwise it
  continues from its last periodic checkpoint), and requeues the task itself (`#SBATCH --requeue`).
* `scancel` also sends SIGTERM: the run checkpoints and the task ends; `status` shows it as cancelled; `submit`
  again to continue.
A run that exits otherwise (bad input: exit 2; a fault: exit 1) is not requeued: `status` shows it as failed with
its log's tail. Submitting the same command again submits the chosen cells that have not finished (none if all
have), and is refused while one of them is still queued or running.

With `--gpus N` a task is one SLURM task with N GPUs and `--cpus` / N CPUs per GPU (`--ntasks=1 --gpus-per-task=N
--cpus-per-gpu=C`), and the run is started as a job step (`srun`), which binds the task to its GPUs and CPUs.

Plain sbatch arrays rather than submitit: no new dependency, a job script that a cluster's users and admins can
read, and a test that drives SLURM itself (tests/tools/grid/test_slurm.py runs it on a one-node cluster).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.grid.run_records import is_finished
from tools.grid.sweeps import read_sweep, select, split_at_dashes

REPO = Path(__file__).resolve().parents[2]
# squeue's states of a task that is not over (https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES).
PENDING_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"}
# A cell's states in the status view, in its order.
STATES = ("finished", "running", "pending", "timeout", "cancelled", "failed", "unsubmitted")
# SLURM may send --signal's signal up to 60 s before the time asked for (sbatch's manual, --signal), and takes at
# most 65535 s (sig_time is 16 bits).
EARLY_SIGNAL_SECONDS = 60
MAX_SIGNAL_SECONDS = 65535
# Set by the launcher for each task: not to be given after `--`.
TASK_FLAGS = {"auto_resume", "run_dir"}

JOB_SCRIPT = """#!/bin/bash
#SBATCH --job-name={job_name}
{resources}#SBATCH --mem={mem}
#SBATCH --time={time}
#SBATCH --output={out_path}/slurm/%A_%a.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@{signal_seconds}
{extra}# One array task per grid cell: task i runs line i + 1 of cells.tsv (the run folder's name, a tab, the command).
# The command carries --auto-resume: a requeued task reruns it and the run continues from its checkpoint.
# USR1 (the time limit is near): the run is asked to stop (SIGTERM: it ends its iteration and checkpoints), then the
# task is requeued, unless this start wrote no new checkpoint or the task was already requeued at the time limit
# {max_requeues} times (--max-requeues). SIGTERM (preemption, scontrol requeue, scancel) reaches the run from SLURM
# itself: this shell only records it, as a second SIGTERM would stop the run before its checkpoint.
# slurm/history/<cell>.tsv: a line per event of the cell's tasks (time, task, event, detail), read by `status`.
set -u
cd {repo}
out={out}
IFS=$'\\t' read -r name command < <(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$out/slurm/cells.tsv")
task=${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}
history=$out/slurm/history/$name.tsv
record() {{ printf '%s\\t%s\\t%s\\t%s\\n' "$(date -u +%FT%TZ)" "$task" "$1" "${{2:-}}" >>"$history"; }}
checkpoint() {{ stat -c '%i %s %y' "$out/$name/checkpoint.pt" 2>/dev/null; }}
starts=$(cut -f3 "$history" 2>/dev/null | grep -cx start)
exec >>"$out/logs/$name.log" 2>&1
echo "=== $(date -u '+%F %T') UTC: task $task on $(hostname), start $((starts + 1))"
before=$(checkpoint)
stopping=0
trap 'stopping=1; record signal "time limit"; {stop}' USR1
trap 'record signal SIGTERM' TERM
{launch} &
run=$!
record start
while true; do
  wait "$run"
  status=$?
  kill -0 "$run" 2>/dev/null || break
done
record exit "$status"
if [ "$stopping" = 1 ] && [ "$status" = 143 ]; then
  requeues=$(cut -f2,3 "$history" | grep -cxF "$task"$'\\t'requeue)
  if [ "$(checkpoint)" = "$before" ]; then
    reason="this start wrote no new checkpoint"
  elif [ "$requeues" -ge {max_requeues} ]; then
    reason="its requeues at the time limit reached --max-requeues {max_requeues}"
  else
    reason=
  fi
  if [ -n "$reason" ]; then
    record timeout "$reason"
    echo "=== time limit: not requeued: $reason"
  else
    trap '' TERM  # the requeue ends this task with SIGTERM: nothing to record
    record requeue "time limit"
    echo "=== time limit: requeued"
    scontrol requeue "$SLURM_JOB_ID"
  fi
fi
exit "$status"
"""
# How the job script starts the run and asks it to stop: on the CPU, the run is this shell's child; with GPUs, a job
# step (srun). srun answers SIGTERM by killing its step at once, so the step is sent SIGTERM by scancel, which
# signals the job's steps and not srun itself in the batch step.
CPU_LAUNCH, CPU_STOP = 'eval "exec $command"', 'kill -TERM "$run"'
GPU_LAUNCH, GPU_STOP = 'eval "exec srun --ntasks=1 --gpus-per-task={gpus} --cpus-per-gpu={cpus_per_gpu} $command"', (
    'scancel --signal=TERM "$SLURM_JOB_ID"'
)


def time_limit_seconds(text: str) -> int | None:
    """sbatch's --time in seconds, None for no limit (0, INFINITE, UNLIMITED); ValueError if sbatch would not take it.
    Its forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds.
    """
    if text.strip().upper() in ("INFINITE", "UNLIMITED"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise ValueError(f"--time {text}: not a SLURM time (minutes, hours:minutes:seconds or days-hours:minutes:seconds)")
    days, *parts = match.groups()
    numbers = [int(part) for part in parts if part is not None]
    if days is not None:  # days-hours[:minutes[:seconds]]
        numbers += [0] * (3 - len(numbers))
        seconds = int(days) * 86400 + numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    elif len(numbers) == 3:
        seconds = numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    else:  # minutes[:seconds]
        seconds = numbers[0] * 60 + (numbers[1] if len(numbers) == 2 else 0)
    return seconds or None


def clock(seconds: int) -> str:
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


def check_time(time: str, signal_seconds: int):
    """ValueError unless a task of `time` has room for a start before the time-limit signal and for the run's last
    iteration and checkpoint after it: twice `signal_seconds`, and the minute by which SLURM may send it early."""
    seconds = time_limit_seconds(time)
    least = 2 * signal_seconds + EARLY_SIGNAL_SECONDS
    if seconds is not None and seconds < least:
        raise ValueError(
            f"--time {time} ({clock(seconds)}) is too short for --signal-seconds {signal_seconds}: a task needs at least "
            f"{clock(least)} (--signal-seconds to run an iteration before the time-limit signal, as long to end it and "
            f"checkpoint after it, and {EARLY_SIGNAL_SECONDS} s as SLURM may send the signal early)"
        )


def flag_name(token: str) -> str:
    """The parameter a command-line flag sets: `--num-envs=4`, `--num_envs` -> num_envs; `--no-track` -> track."""
    name = token[2:].split("=", 1)[0].replace("-", "_")
    return name.removeprefix("no_")


def flags_after_dashes(tokens: list[str]) -> list[list[str]]:
    """The flags after `--`, each with its values ([["--num-envs", "4"], ["--no-track"]]); ValueError for a value
    before any flag, a flag given twice, or a flag the launcher sets for each task."""
    flags = []
    for token in tokens:
        if token.startswith("--") and len(token) > 2:
            flags.append([token])
        elif flags:
            flags[-1].append(token)
        else:
            raise ValueError(f"after --: {token} is not a flag (a flag starts with --)")
    names = [flag_name(flag[0]) for flag in flags]
    for flag, name in zip(flags, names):
        if name in TASK_FLAGS:
            raise ValueError(f"after --: {flag[0]} is the launcher's (each task runs --auto-resume --run-dir OUT/CELL)")
        if names.count(name) > 1:
            raise ValueError(f"after --: --{name.replace('_', '-')} is given twice")
    return flags


def cell_command(cell, out: Path, cpus: int, gpus: int, extra: list[list[str]]) -> str:
    """A cell's command line: the sweep's flags, the launcher's (--env-threads, --cuda with GPUs), the flags after
    `--` (each in place of the sweep's or the launcher's value of the same parameter), --auto-resume and --run-dir."""
    given = {flag_name(flag[0]) for flag in extra}
    flags = [flag for flag in cell.flags() if flag_name(flag) not in given]
    flags += [] if "env_threads" in given else [f"--env-threads={cpus}"]
    flags += ["--cuda"] if gpus and "cuda" not in given else []
    flags += [token for flag in extra for token in flag]
    return shlex.join([sys.executable, str(REPO / cell.program), *flags, "--auto-resume", "--run-dir", str(out / cell.name)])


def grid_cells(sweep, where: list[str]):
    """(every cell of the sweep, the names of those --where chooses)."""
    cells = read_sweep(sweep)
    for cell in cells:
        if not (REPO / cell.program).is_file():
            raise ValueError(f"{sweep}: program {cell.program} is not in {REPO}")
    return cells, {cell.name for cell in select(cells, where)}


def array_spec(indices: list[int]) -> str:
    """sbatch's --array for a sorted list of task ids: ranges where they are consecutive (0-3,7,9-10)."""
    spans, start = [], None
    for i, index in enumerate(indices):
        if start is None:
            start = index
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            spans.append(f"{start}" if start == index else f"{start}-{index}")
            start = None
    return ",".join(spans)


def job_script(args, out: Path) -> str:
    """The text of slurm/job.sh."""
    if args.gpus:
        cpus_per_gpu = args.cpus // args.gpus
        resources = f"#SBATCH --ntasks=1\n#SBATCH --gpus-per-task={args.gpus}\n#SBATCH --cpus-per-gpu={cpus_per_gpu}\n"
        launch, stop = GPU_LAUNCH.format(gpus=args.gpus, cpus_per_gpu=cpus_per_gpu), GPU_STOP
    else:
        resources, launch, stop = f"#SBATCH --cpus-per-task={args.cpus}\n", CPU_LAUNCH, CPU_STOP
    extra = "".join(f"#SBATCH {option}\n" for option in args.sbatch_option)
    extra += f"#SBATCH --partition={args.partition}\n" if args.partition else ""
    extra += f"#SBATCH --account={args.account}\n" if args.account else ""
    return JOB_SCRIPT.format(
        job_name=args.job_name or Path(args.sweep).stem,
        resources=resources,
        mem=args.mem,
        time=args.time,
        signal_seconds=args.signal_seconds,
        extra=extra,
        max_requeues=args.max_requeues,
        repo=shlex.quote(str(REPO)),
        out=shlex.quote(str(out)),
        out_path=out,
        launch=launch,
        stop=stop,
    )


def read_cells(out: Path) -> list[tuple[str, str]]:
    path = out / "slurm" / "cells.tsv"
    if not path.is_file():
        raise ValueError(f"{out} holds no grid submitted to SLURM (no slurm/cells.tsv)")
    return [tuple(line.split("\t", 1)) for line in path.read_text().splitlines()]


def read_jobs(out: Path) -> list[dict]:
    """The arrays submitted for this grid, oldest first: {"job_id", "tasks": the cells' indices}."""
    path = out / "slurm" / "jobs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def read_history(out: Path, name: str) -> list[tuple[str, str, str]]:
    """The events the job script recorded for a cell, oldest first: (task, event, detail)."""
    path = out / "slurm" / "history" / f"{name}.tsv"
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return [tuple((line.split("\t") + ["", "", "", ""])[1:4]) for line in lines]


def queue_states(job_ids: list[str]) -> dict[tuple[str, int], str]:
    """{(array job id, task id): state} of the tasks that squeue still lists."""
    if not job_ids:
        return {}
    if not shutil.which("squeue"):
        raise ValueError("squeue is not on PATH: run this on a SLURM login node")
    proc = subprocess.run(
        ["squeue", "--noheader", "--array", "--jobs", ",".join(job_ids), "--format", "%F %K %T"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:  # squeue forgets jobs that are long over
        raise ValueError(f"squeue failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    states = {}
    for line in proc.stdout.splitlines():
        job_id, task, state = line.split()
        if task.isdigit():
            states[(job_id, int(task))] = state
    return states


def ended_state(events: list[tuple[str, str]] | None, started: bool) -> tuple[str, str]:
    """(timeout | cancelled | failed, why) of a cell that has not finished and whose latest task is no longer queued,
    from the (event, detail) pairs that task recorded after its last start (None: it recorded no start), `started`
    telling whether SLURM started the task at all."""
    if events is None:
        if started:
            return "failed", "the task recorded no start (see its SLURM output, slurm/<job>_<task>.out)"
        return "cancelled", "before it started"
    kinds, details = [event for event, _ in events], dict(events)
    if "timeout" in kinds:
        return "timeout", f"stopped at the time limit and not requeued: {details['timeout']}"
    if "requeue" in kinds:
        return "cancelled", "while waiting to restart after the time limit"
    if ("signal", "time limit") in events:
        return "timeout", "the run did not end its iteration and checkpoint within --signal-seconds of the signal"
    if ("signal", "SIGTERM") in events:
        return "cancelled", "stopped by SIGTERM and not requeued"
    if "exit" in kinds:
        return "failed", f"exit {details['exit']}"
    return "failed", "the task ended without recording its run's exit (killed, or its node failed)"


@dataclass
class CellState:
    name: str
    state: str  # one of STATES
    why: str  # what ended a timeout, cancelled or failed cell
    starts: int  # of the cell's tasks, over every submission
    requeues: int  # starts that were not a submission's first
    time_limit_requeues: int  # of them, the job script's at the time limit


def cell_states(out: Path) -> list[CellState]:
    """Each cell's state, in the grid's order."""
    cells, jobs = read_cells(out), read_jobs(out)
    queued = queue_states([job["job_id"] for job in jobs])
    latest = {}  # each cell's latest array (a resubmission takes the chosen cells that had not finished)
    for job in jobs:
        for index in job["tasks"]:
            latest[index] = job["job_id"]
    states = []
    for index, (name, _) in enumerate(cells):
        history = read_history(out, name)
        starts = [task for task, event, _ in history if event == "start"]
        counts = (len(starts), len(starts) - len(set(starts)), sum(event == "requeue" for _, event, _ in history))
        task = f"{latest.get(index)}_{index}"
        queue_state = queued.get((latest.get(index), index))
        if is_finished(out / name):
            state, why = "finished", ""
        elif index not in latest:
            state, why = "unsubmitted", ""
        elif queue_state in RUNNING_STATES:
            state, why = "running", ""
        elif queue_state in PENDING_STATES:
            state, why = "pending", ""
        else:
            mine = [(event, detail) for t, event, detail in history if t == task]
            last_start = max((i for i, (event, _) in enumerate(mine) if event == "start"), default=None)
            events = mine[last_start + 1 :] if last_start is not None else None
            # SLURM writes the task's output file when it starts the task.
            state, why = ended_state(events, (out / "slurm" / f"{task}.out").exists())
        states.append(CellState(name, state, why, *counts))
    return states


def submit(args) -> int:
    out = Path(args.out).resolve()
    cells, chosen = grid_cells(args.sweep, args.where)
    extra = flags_after_dashes(args.script_args)
    for flag in extra:  # a cell's own value replaced would leave its folder and label naming another run
        if flag_name(flag[0]) in {"exp_name", *cells[0].varied}:
            raise ValueError(f"after --: {flag[0]} is each cell's own (its label, or a parameter the sweep lists values for)")
    commands = [(cell.name, cell_command(cell, out, args.cpus, args.gpus, extra)) for cell in cells]
    cells_text = "".join(f"{name}\t{command}\n" for name, command in commands)
    script = job_script(args, out)
    cells_path = out / "slurm" / "cells.tsv"
    if cells_path.exists() and cells_path.read_text() != cells_text:
        raise ValueError(f"{out} holds another grid (slurm/cells.tsv differs): choose another --out")
    if cells_path.exists() and (shutil.which("squeue") or not args.dry_run):
        queued = [f"{c.name} ({c.state})" for c in cell_states(out) if c.name in chosen and c.state in ("running", "pending")]
        if queued:
            raise ValueError(f"{len(queued)} cells of {out} are still queued or running ({queued[0]}, ...): wait for them")
    todo = [index for index, (name, _) in enumerate(commands) if name in chosen and not is_finished(out / name)]
    what = f"{len(todo)} of {len(commands)} cells" + (f", --where chose {len(chosen)}" if args.where else "")
    if not todo:
        print(f"every {'chosen ' if args.where else ''}cell of {out} has finished: python -m tools.grid.aggregate {out}")
        return 0
    sbatch = ["sbatch", "--parsable", f"--array={array_spec(todo)}" + (f"%{args.max_running}" if args.max_running else "")]
    if args.dry_run:
        print(script, end="")
        print(f"# {shlex.join(sbatch)} {out}/slurm/job.sh   ({what})")
        for index in todo:
            print(f"# task {index}: {commands[index][0]}\n{commands[index][1]}")
        return 0
    if not shutil.which("sbatch"):
        raise ValueError("sbatch is not on PATH: submit from a SLURM login node")
    # The tasks read cells.tsv when they start, so it is written before sbatch; if sbatch fails, what this call
    # wrote is taken back (the folders it made, cells.tsv if new, job.sh as it was).
    job_path = out / "slurm" / "job.sh"
    folders = [*reversed(out.parents), out, out / "slurm", out / "slurm" / "history", out / "logs"]
    made = [folder for folder in folders if not folder.exists()]
    before = {path: path.read_text() if path.exists() else None for path in (cells_path, job_path)}
    for folder in made:
        folder.mkdir()
    cells_path.write_text(cells_text)
    job_path.write_text(script)
    proc = subprocess.run([*sbatch, str(job_path)], capture_output=True, text=True)
    if proc.returncode != 0:
        for path, text in before.items():
            path.write_text(text) if text is not None else path.unlink()
        for folder in reversed(made):
            folder.rmdir()
        raise ValueError(f"sbatch failed: {' '.join(proc.stderr.split())}")
    job_id = proc.stdout.strip().split(";")[0]
    with open(out / "slurm" / "jobs.jsonl", "a") as f:
        f.write(json.dumps({"job_id": job_id, "tasks": todo}) + "\n")
    print(f"submitted job {job_id}: {what}; python -m tools.grid.slurm status {args.out}")
    return 0


def log_tail(path: Path, lines: int = 5) -> list[str]:
    if not path.exists():
        return ["(no log: the task never started)"]
    text = path.read_text(errors="replace").splitlines()
    return [line for line in text if line.strip()][-lines:]


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def requeues(n: int, at_time_limit: int) -> str:
    return f"{plural(n, 'requeue')} ({at_time_limit} at the time limit)"


def status(args) -> int:
    out = Path(args.out).resolve()
    states = cell_states(out)
    width = max(len(c.name) for c in states)
    for c in states:
        if args.all or c.state != "finished":
            print(
                f"{c.name:<{width}}  {c.state:<11}  {plural(c.starts, 'start')}, {requeues(c.requeues, c.time_limit_requeues)}"
            )
            if c.why:
                print(f"    {c.why}")
            if c.state in ("timeout", "failed"):
                for line in log_tail(out / "logs" / f"{c.name}.log", args.tail):
                    print(f"    | {line}")
    counts = {state: sum(c.state == state for c in states) for state in STATES}
    shown = [f"{n} {state}" for state, n in counts.items() if n or state == "finished"]
    total = requeues(sum(c.requeues for c in states), sum(c.time_limit_requeues for c in states))
    print(f"{', '.join(shown)} (of {len(states)} cells); {total}")
    if counts["finished"] == len(states):
        print(f"every cell has finished: python -m tools.grid.aggregate {args.out}")
    elif counts["timeout"] + counts["cancelled"] + counts["failed"]:
        print("the same submit command again submits the cells that have not finished")
    return 0


def check_submit_args(args):
    """ValueError (one line) for a submit command that sbatch or the runs would refuse, or that could not progress."""
    if args.cpus < 1 or args.gpus < 0 or args.max_running < 0 or args.max_requeues < 0:
        raise ValueError("--cpus must be >= 1; --gpus, --max-running and --max-requeues >= 0")
    if not 1 <= args.signal_seconds <= MAX_SIGNAL_SECONDS:
        raise ValueError(f"--signal-seconds must be in [1, {MAX_SIGNAL_SECONDS}] (sbatch --signal's range)")
    if args.gpus and args.cpus % args.gpus:
        raise ValueError(f"--cpus {args.cpus} is not a multiple of --gpus {args.gpus} (each GPU gets --cpus / --gpus CPUs)")
    check_time(args.time, args.signal_seconds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser(
        "submit", help="submit the cells of a grid sweep file that have not finished; flags after `--` go to every run"
    )
    p.add_argument("sweep", help="a sweep file with `method: grid` (sweeps/*.yaml)")
    p.add_argument("--out", required=True, help="the grid's folder: a run folder per cell, logs/, slurm/")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=V[,V]",
        help="only the cells whose parameter KEY is one of the values (e.g. env_id=Hopper-v5, seed=1,2); repeatable",
    )
    p.add_argument("--cpus", type=int, default=2, help="CPUs per task (also each run's --env-threads)")
    p.add_argument("--mem", default="8G", help="memory per task (sbatch --mem)")
    p.add_argument("--time", default="24:00:00", help="time limit per task; a run that needs more is requeued")
    p.add_argument(
        "--gpus", type=int, default=0, help="GPUs per task (--gpus-per-task, --cpus-per-gpu=CPUS/N, srun; the runs get --cuda)"
    )
    p.add_argument("--partition", help="sbatch --partition")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument("--max-running", type=int, default=0, help="at most this many tasks at once (--array=...%%N)")
    p.add_argument("--signal-seconds", type=int, default=300, help="SIGUSR1 this long before the time limit")
    p.add_argument(
        "--max-requeues", type=int, default=10, help="requeues of a task at the time limit per submission (then: timeout)"
    )
    p.add_argument("--job-name", help="the job's name (default: the sweep file's)")
    p.add_argument("--sbatch-option", action="append", default=[], help="another #SBATCH line, e.g. --constraint=x")
    p.add_argument("--dry-run", action="store_true", help="print the job script, the sbatch command and each cell's command")
    s = commands.add_parser("status", help="each cell's state, starts and requeues; a failed cell's log tail")
    s.add_argument("out", help="the grid's folder (submit's --out)")
    s.add_argument("--all", action="store_true", help="list the finished cells too")
    s.add_argument("--tail", type=int, default=5, help="lines of a failed cell's log")
    # Flags after `--` go to every run (argparse's subcommands do not take them through a positional argument).
    argv, script_args = split_at_dashes(argv)
    args = parser.parse_args(argv)
    args.script_args = script_args
    try:
        if args.command == "submit":
            check_submit_args(args)
            return submit(args)
        return status(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
