#!/usr/bin/env python
"""Run a grid on a SLURM cluster: one array task per cell of a sweep file, requeued until its run has finished.

    python -m tools.grid.slurm submit sweeps/ppo_grid.yaml --out runs/ppo_grid --cpus 2 --mem 8G --time 24:00:00
    python -m tools.grid.slurm status runs/ppo_grid     # each cell: finished, running, pending or failed (log's tail)
    python -m tools.grid.aggregate runs/ppo_grid        # once every cell has finished

The grid is the sweep file's (sweeps/*.yaml, `method: grid`; tools/grid/sweeps.py names its cells). `submit` writes
into `--out`: `slurm/cells.tsv` (task i runs line i + 1: the cell's run folder name, a tab, its command), the job
script `slurm/job.sh` (plain sbatch: read it, edit it, submit it yourself if you like), and submits one job array
of the cells that have not finished. Each cell's run goes to `{out}/{cell}`, its output to `{out}/logs/{cell}.log`
(appended at every start). Flags after `--` go to every run.

Every task runs its cell's command with `--auto-resume --run-dir {out}/{cell}`: the same command starts the run or
continues it from its checkpoint, so a task may be requeued any number of times. Requeueing:
* time limit: SLURM sends the job script SIGUSR1 `--signal-seconds` before the limit (`--signal=B:USR1@N`); the
  script asks the run to stop (SIGTERM: it finishes its iteration and writes its checkpoint) and requeues the task
  (`scontrol requeue`). N must cover an iteration and the checkpoint (the default, 300 s, covers the paper's shape
  on slow nodes; SLURM may send the signal up to a minute early).
* preemption (a partition with `PreemptMode=REQUEUE`), node failure, `scontrol requeue`: SLURM sends SIGTERM to the
  run, which checkpoints within the cluster's KillWait / GraceTime if its iteration ends in time (otherwise it
  continues from its last periodic checkpoint), and requeues the task itself (`#SBATCH --requeue`).
* `scancel` also sends SIGTERM: the run checkpoints and the task ends; `submit` again to continue.
A run that exits otherwise (bad input: exit 2; a fault: exit 1) is not requeued: `status` shows it as failed with
its log's tail. Submitting the same command again submits the cells that have not finished (none if all have), and
is refused while a job of this grid is still queued or running.

Plain sbatch arrays rather than submitit: no new dependency, a job script that a cluster's users and admins can
read, and a test that drives SLURM itself (tests/test_slurm.py runs it on a one-node cluster).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tools.grid.run_records import is_finished
from tools.grid.sweeps import read_sweep

REPO = Path(__file__).resolve().parents[2]
# squeue's states of a task that is not over (https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES).
PENDING_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"}

JOB_SCRIPT = """#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --cpus-per-task={cpus}
#SBATCH --mem={mem}
#SBATCH --time={time}
#SBATCH --output={out_path}/slurm/%A_%a.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@{signal_seconds}
{extra}# One array task per grid cell: task i runs line i + 1 of cells.tsv (the run folder's name, a tab, the command).
# The command carries --auto-resume: a requeued task reruns it and the run continues from its checkpoint.
# USR1 (the time limit is near): the run is asked to stop (SIGTERM: it ends its iteration and checkpoints), then the
# task is requeued. SIGTERM (preemption, scontrol requeue, scancel) reaches the run from SLURM itself: this shell
# only waits for it, as a second SIGTERM would stop the run before its checkpoint.
set -u
cd {repo}
out={out}
IFS=$'\\t' read -r name command < <(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$out/slurm/cells.tsv")
exec >>"$out/logs/$name.log" 2>&1
echo "=== $(date -u '+%F %T') UTC: task ${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}} on $(hostname), start $((${{SLURM_RESTART_COUNT:-0}} + 1))"
stopping=0
trap 'stopping=1; kill -TERM "$run"' USR1
trap ':' TERM
eval "exec $command" &
run=$!
while true; do
  wait "$run"
  status=$?
  kill -0 "$run" 2>/dev/null || break
done
if [ "$stopping" = 1 ] && [ "$status" = 143 ]; then
  echo "=== time limit: requeued"
  scontrol requeue "$SLURM_JOB_ID"
fi
# Offline, each start of the run wrote its own wandb folder: once the run has finished, write its one complete
# offline wandb run from its TensorBoard files, the one to sync (a run without --track gets none).
if [ "$status" = 0 ] && [ "${{WANDB_MODE:-}}" = offline ]; then
  {python} -m tools.grid.wandb_from_tb --tracked-only "$out/$name" || echo "=== no complete offline wandb run"
fi
exit "$status"
"""


def cell_commands(sweep, out: Path, cpus: int, gpus: int, extra: list[str]):
    """[(cell name, its command line)] of the sweep's cells."""
    cells = read_sweep(sweep)
    for cell in cells:
        if not (REPO / cell.program).is_file():
            raise ValueError(f"{sweep}: program {cell.program} is not in {REPO}")
    commands = []
    for cell in cells:
        argv = [sys.executable, str(REPO / cell.program), *cell.flags(), f"--env-threads={cpus}"]
        argv += ["--cuda"] if gpus else []
        argv += [*extra, "--auto-resume", "--run-dir", str(out / cell.name)]
        commands.append((cell.name, shlex.join(argv)))
    return commands


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


def read_cells(out: Path) -> list[tuple[str, str]]:
    path = out / "slurm" / "cells.tsv"
    if not path.is_file():
        raise ValueError(f"{out} holds no grid submitted to SLURM (no slurm/cells.tsv)")
    return [tuple(line.split("\t", 1)) for line in path.read_text().splitlines()]


def read_jobs(out: Path) -> list[dict]:
    """The arrays submitted for this grid, oldest first: {"job_id", "tasks": the cells' indices}."""
    path = out / "slurm" / "jobs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def queue_states(job_ids: list[str]) -> dict[tuple[str, int], str]:
    """{(array job id, task id): state} of the tasks that squeue still lists."""
    if not job_ids:
        return {}
    if not shutil.which("squeue"):
        raise ValueError("squeue is not on PATH: run the status view on a SLURM login node")
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


def log_tail(path: Path, lines: int = 5) -> list[str]:
    if not path.exists():
        return ["(no log: the task never started)"]
    text = path.read_text(errors="replace").splitlines()
    return [line for line in text if line.strip()][-lines:]


def cell_states(out: Path) -> list[tuple[str, str]]:
    """[(cell name, finished | running | pending | failed)] in the grid's order."""
    cells, jobs = read_cells(out), read_jobs(out)
    queued = queue_states([job["job_id"] for job in jobs])
    # Each cell's latest array (a resubmission takes the cells that had not finished).
    latest = {}
    for job in jobs:
        for index in job["tasks"]:
            latest[index] = job["job_id"]
    states = []
    for index, (name, _) in enumerate(cells):
        state = queued.get((latest.get(index), index))
        if is_finished(out / name):
            states.append((name, "finished"))
        elif state in RUNNING_STATES:
            states.append((name, "running"))
        elif state in PENDING_STATES:
            states.append((name, "pending"))
        else:
            states.append((name, "failed"))
    return states


def submit(args) -> int:
    out = Path(args.out).resolve()
    commands = cell_commands(args.sweep, out, args.cpus, args.gpus, args.script_args)
    cells_text = "".join(f"{name}\t{command}\n" for name, command in commands)
    extra = "".join(f"#SBATCH {option}\n" for option in args.sbatch_option)
    extra += f"#SBATCH --gres=gpu:{args.gpus}\n" if args.gpus else ""
    extra += f"#SBATCH --partition={args.partition}\n" if args.partition else ""
    extra += f"#SBATCH --account={args.account}\n" if args.account else ""
    script = JOB_SCRIPT.format(
        job_name=args.job_name or Path(args.sweep).stem,
        cpus=args.cpus,
        mem=args.mem,
        time=args.time,
        signal_seconds=args.signal_seconds,
        extra=extra,
        repo=shlex.quote(str(REPO)),
        python=shlex.quote(sys.executable),
        out=shlex.quote(str(out)),
        out_path=out,
    )
    cells_path = out / "slurm" / "cells.tsv"
    if cells_path.exists() and cells_path.read_text() != cells_text:
        raise ValueError(f"{out} holds another grid (slurm/cells.tsv differs): choose another --out")
    if (out / "slurm" / "cells.tsv").exists():
        running = [f"{name} ({state})" for name, state in cell_states(out) if state in ("running", "pending")]
        if running:
            raise ValueError(f"{len(running)} cells of {out} are still queued or running ({running[0]}, ...): wait for them")
    todo = [index for index, (name, _) in enumerate(commands) if not is_finished(out / name)]
    if not todo:
        print(f"every cell of {out} has finished: python -m tools.grid.aggregate {out}")
        return 0
    sbatch = ["sbatch", "--parsable", f"--array={array_spec(todo)}" + (f"%{args.max_running}" if args.max_running else "")]
    if args.dry_run:
        print(script, end="")
        print(f"# {shlex.join(sbatch)} {out}/slurm/job.sh   ({len(todo)} of {len(commands)} cells)")
        return 0
    if not shutil.which("sbatch"):
        raise ValueError("sbatch is not on PATH: submit from a SLURM login node")
    (out / "slurm").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    cells_path.write_text(cells_text)
    (out / "slurm" / "job.sh").write_text(script)
    proc = subprocess.run([*sbatch, str(out / "slurm" / "job.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"sbatch failed: {' '.join(proc.stderr.split())}")
    job_id = proc.stdout.strip().split(";")[0]
    with open(out / "slurm" / "jobs.jsonl", "a") as f:
        f.write(json.dumps({"job_id": job_id, "tasks": todo}) + "\n")
    print(f"submitted job {job_id}: {len(todo)} of {len(commands)} cells; python -m tools.grid.slurm status {args.out}")
    return 0


def status(args) -> int:
    out = Path(args.out).resolve()
    states = cell_states(out)
    counts = {state: sum(1 for _, s in states if s == state) for state in ("finished", "running", "pending", "failed")}
    width = max(len(name) for name, _ in states)
    for name, state in states:
        if args.all or state != "finished":
            print(f"{name:<{width}}  {state}")
            if state == "failed":
                for line in log_tail(out / "logs" / f"{name}.log", args.tail):
                    print(f"    | {line}")
    print(", ".join(f"{n} {state}" for state, n in counts.items()) + f" (of {len(states)} cells)")
    if counts["finished"] == len(states):
        print(f"every cell has finished: python -m tools.grid.aggregate {args.out}")
    elif counts["failed"]:
        print("the same submit command again submits the cells that have not finished")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser(
        "submit", help="submit the cells of a grid sweep file that have not finished; flags after `--` go to every run"
    )
    p.add_argument("sweep", help="a sweep file with `method: grid` (sweeps/*.yaml)")
    p.add_argument("--out", required=True, help="the grid's folder: a run folder per cell, logs/, slurm/")
    p.add_argument("--cpus", type=int, default=2, help="CPUs per task (also each run's --env-threads)")
    p.add_argument("--mem", default="8G", help="memory per task (sbatch --mem)")
    p.add_argument("--time", default="24:00:00", help="time limit per task; a run that needs more is requeued")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per task (--gres=gpu:N; the runs get --cuda)")
    p.add_argument("--partition", help="sbatch --partition")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument("--max-running", type=int, default=0, help="at most this many tasks at once (--array=...%%N)")
    p.add_argument("--signal-seconds", type=int, default=300, help="SIGUSR1 this long before the time limit")
    p.add_argument("--job-name", help="the job's name (default: the sweep file's)")
    p.add_argument("--sbatch-option", action="append", default=[], help="another #SBATCH line, e.g. --constraint=x")
    p.add_argument("--dry-run", action="store_true", help="print the job script and the sbatch command only")
    s = commands.add_parser("status", help="each cell's state; a failed cell's log tail")
    s.add_argument("out", help="the grid's folder (submit's --out)")
    s.add_argument("--all", action="store_true", help="list the finished cells too")
    s.add_argument("--tail", type=int, default=5, help="lines of a failed cell's log")
    argv = sys.argv[1:] if argv is None else list(argv)
    # Flags after `--` go to every run (argparse's subcommands do not take them through a positional argument).
    script_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.script_args = script_args
    try:
        if args.command == "submit":
            for name in ("cpus", "signal_seconds"):
                if getattr(args, name) < 1:
                    raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
            if args.gpus < 0 or args.max_running < 0:
                raise ValueError("--gpus and --max-running must be >= 0")
            return submit(args)
        return status(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
