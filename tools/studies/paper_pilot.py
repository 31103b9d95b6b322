#!/usr/bin/env python
"""The paper-shape pilot: PPO and VACO at the paper's 500 envs x 1,000 steps for 100M steps on Hopper-v5, lags 0
and 8, seeds 1 and 2 (the design, written before the first run: docs/paper_pilot.md).

    git worktree add ../pilot PINNED_COMMIT                          # the commit docs/paper_pilot.md names
    cd ../pilot && python -m tools.studies.paper_pilot --repo ../main --note "what else runs on the machine"

The 8 runs go one after another in seed-major order (seed 1 of the four cells first), each from the scripts of the
checkout this module is in (so the work on `--repo` cannot change a run midway) into `--repo`/runs/paper_pilot/, with
`--auto-resume`. A run outlasts the machine it starts on: every `--carry-minutes` of a run, and when a signal stops
the runner, its folder (checkpoint, TensorBoard files, run.json, args.json; not checkpoint.prev.pt) is committed to
`--repo` as results/records/paper_pilot/in_progress/<name>.tar.gz, one file per run replaced each time; the same
command on a fresh machine unpacks it and resumes the run from that checkpoint. A finished run's compact record
(results/records/README.md's format, plus a `pilot` entry: the commit, every start's wall and CPU time and the load
beside it, the per-iteration rollout and update seconds) is committed in the same commit that removes its carried
folder. A run whose record is committed is skipped.

EnvPool's envs cannot be checkpointed (ppo_mujoco.py, EnvPoolEnvs.get_state): after a resume the episodes in
progress restart, so a resumed run is not bit-identical to an uninterrupted one; each start is in the record.

SIGINT and SIGTERM go to the training run, which checkpoints; the runner then carries the folder and exits 130 or
143. Exit 1 if a run fails (the tail of its log is printed), 0 when all 8 records are committed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from tools.grid.run_records import read_record, record_from_run_dir, tensorboard_events, write_record

HERE = Path(__file__).resolve().parents[2]  # the checkout whose scripts run
TASK = "Hopper-v5"
SEEDS = (1, 2)
LAGS = (0, 8)
ALGOS = ("ppo", "vaco")
# The paper's shape and budget; the rest of the defaults are the paper's too (10 epochs x 32 minibatches, PPO's
# clip 0.2, VACO's delta 0.2). --torch-threads 2: the same bits run to run (its speed against one thread:
# docs/throughput.md#threads); a resume keeps it. Checkpoints every 2 iterations.
FLAGS = (
    f"--env-id {TASK} --num-envs 500 --num-steps 1000 --total-timesteps 100000000 --lag-mode uniform"
    " --eval-episodes 10 --env-backend envpool --env-threads 2 --torch-threads 2 --checkpoint-every 2"
).split()
RECORDS = Path("results/records/paper_pilot")
CARRIED = ("checkpoint.pt", "run.json", "args.json")  # plus events.out.tfevents.* (the rest is not needed to resume)


def cells(seeds=SEEDS):
    """(name, script, flags) of each run, seed-major; within a seed lag 0 then 8, PPO then VACO."""
    return [
        (
            f"{TASK}__{algo}__lag{lag}__s{seed}",
            f"{algo}_mujoco.py",
            ["--exp-name", algo, "--seed", str(seed), "--lag", str(lag)],
        )
        for seed in seeds
        for lag in LAGS
        for algo in ALGOS
    ]


def finished_record(path: Path) -> bool:
    """True if `path` is a readable record of a finished run; a damaged one is reported and the run redone."""
    if not path.exists():
        return False
    try:
        return bool(read_record(path)["finished"])
    except (OSError, ValueError, EOFError, KeyError) as e:
        print(f"warning: {path} is not a readable record ({type(e).__name__}: {e}); the run is redone", flush=True)
        return False


def git(repo: Path, *cmd) -> str | None:
    """Run git in `repo`; None, or why it failed (the index may be locked by other work: retried for a minute)."""
    for _ in range(12):
        proc = subprocess.run(["git", "-C", str(repo), *cmd], capture_output=True, text=True)
        if proc.returncode == 0:
            return None
        text = (proc.stderr or proc.stdout).strip()
        if "index.lock" not in text:
            return text.splitlines()[-1] if text else f"exit code {proc.returncode}"
        time.sleep(5)
    return "the index stayed locked"


def commit(repo: Path, paths: list[Path], message: str) -> None:
    """Commit exactly `paths` (added, changed or removed) to `repo`'s current branch; other staged work stays out.
    Nothing to commit is not an error: a record written but not committed (the index was busy) is committed later."""
    rel = [str(p.relative_to(repo)) for p in paths]
    status = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain", "-uall", "--", *rel], capture_output=True, text=True
    )
    rel = [r for r in rel if any(line.endswith(" " + r) for line in status.stdout.splitlines())]
    if not rel:
        return
    why = git(repo, "add", "-A", "--", *rel) or git(repo, "commit", "-q", "--only", "-m", message, "--", *rel)
    print(f"committed {', '.join(rel)}" if why is None else f"warning: could not commit {', '.join(rel)}: {why}", flush=True)


def pack(run_dir: Path, sidecar: Path, out: Path) -> None:
    """The run folder's resumable part and the runner's notes as a tar.gz, written atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    names = [n for n in CARRIED if (run_dir / n).is_file()] + sorted(p.name for p in run_dir.glob("events.out.tfevents.*"))
    with tarfile.open(tmp, "w:gz") as tar:
        for name in names:
            tar.add(run_dir / name, arcname=f"{run_dir.name}/{name}")
        tar.add(sidecar, arcname=sidecar.name)
    tmp.replace(out)


def unpack(archive: Path, runs: Path) -> None:
    """Unpack a carried run into `runs`: regular files only, each under the run's own folder or the notes file."""
    name = archive.name[: -len(".tar.gz")]
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for m in members:
            parts = Path(m.name).parts
            ok = m.isfile() and (parts == (f"{name}.pilot.json",) or (len(parts) == 2 and parts[0] == name))
            if not ok or ".." in parts:
                raise SystemExit(f"error: {archive}: unexpected member {m.name!r}; not unpacked")
        tar.extractall(runs, members=members, filter="data")


def load_average() -> float:
    return os.getloadavg()[0]


def run_cell(name, script, flags, opts, repo: Path, runs: Path, stop: list) -> int:
    """Run (or resume) one cell to its end or to a signal; returns the training process's exit code."""
    run_dir, sidecar = runs / name, runs / f"{name}.pilot.json"
    carried = repo / RECORDS / "in_progress" / f"{name}.tar.gz"
    if not run_dir.exists() and carried.exists():
        unpack(carried, runs)
        print(f"{name}: unpacked the committed folder of its last start", flush=True)
    notes = json.loads(sidecar.read_text()) if sidecar.exists() else {"starts": []}
    cmd = [sys.executable, str(HERE / script), *FLAGS, *flags, "--run-dir", str(run_dir), "--auto-resume"]
    start = {"host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "note": opts.note}
    notes["starts"].append(start)
    print(f"{name}: starting ({len(notes['starts'])}. start)", flush=True)
    t0, cpu0, loads = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN), []
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    with open(runs / f"{name}.log", "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=HERE)
        last_carry, carried_mtime = time.time(), None
        while proc.poll() is None:
            if stop and stop[-1] != "sent":
                os.killpg(proc.pid, stop[0])
                stop.append("sent")
            time.sleep(1 if stop else 10)
            if int(time.time()) % 60 < 10:
                loads.append(load_average())
            ckpt = run_dir / "checkpoint.pt"
            due = time.time() - last_carry >= opts.carry_minutes * 60
            if due and ckpt.exists() and ckpt.stat().st_mtime != carried_mtime and not stop:
                carried_mtime, last_carry = ckpt.stat().st_mtime, time.time()
                save_start(notes, start, t0, cpu0, loads, None, sidecar)
                pack(run_dir, sidecar, carried)
                commit(repo, [carried], f"Paper-shape pilot: {name}, the folder of the run in progress (resumable)")
    save_start(notes, start, t0, cpu0, loads, proc.returncode, sidecar)
    finished = (run_dir / "summary.json").exists() and not json.loads((run_dir / "summary.json").read_text()).get(
        "interrupted", False
    )
    if proc.returncode == 0 and finished:
        record = record_from_run_dir(run_dir)
        events = tensorboard_events(run_dir)
        perf = {k: [round(v, 3) for _, v in events.get(f"perf/{k}", [])] for k in ("rollout_seconds", "update_seconds")}
        record["pilot"] = {"commit": revision(), **notes, "perf": perf}
        path = write_record(record, repo / RECORDS / f"{name}.json.gz")
        carried.unlink(missing_ok=True)  # the record replaces it
        commit(repo, [path, carried], f"Paper-shape pilot: the record of {name}")
    elif (run_dir / "checkpoint.pt").exists():
        pack(run_dir, sidecar, carried)
        commit(repo, [carried], f"Paper-shape pilot: {name}, the folder of the run in progress (resumable)")
    return proc.returncode


def save_start(notes, start, t0, cpu0, loads, exit_code, sidecar: Path) -> None:
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start["wall_seconds"] = round(time.time() - t0, 1)
    start["cpu_seconds"] = round(cpu.ru_utime + cpu.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1)  # waited-for only
    start["mean_load"] = round(sum(loads) / len(loads), 2) if loads else None
    start["exit_code"] = exit_code
    tmp = sidecar.with_name(sidecar.name + ".tmp")
    tmp.write_text(json.dumps(notes, indent=1))
    tmp.replace(sidecar)


def revision() -> str:
    out = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=HERE, help="the repository the records are committed to")
    p.add_argument("--note", default="", help="what else runs on the machine beside the pilot (kept in the record)")
    p.add_argument("--carry-minutes", type=float, default=30, help="how often a run's folder is committed")
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many runs have finished")
    opts = p.parse_args(argv)
    repo = opts.repo.resolve()
    if not (repo / ".git").exists():
        print(f"error: --repo {opts.repo}: not a git repository", file=sys.stderr)
        return 2
    runs = repo / "runs" / "paper_pilot"
    runs.mkdir(parents=True, exist_ok=True)
    stop: list = []

    def handler(signum, frame):
        if not stop:
            stop.append(signum)
            print(f"signal {signum}: stopping the run at its checkpoint", flush=True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    done = 0
    for name, script, flags in cells():
        record = repo / RECORDS / f"{name}.json.gz"
        if finished_record(record):
            commit(
                repo, [record, repo / RECORDS / "in_progress" / f"{name}.tar.gz"], f"Paper-shape pilot: the record of {name}"
            )
            continue
        if opts.max_runs is not None and done >= opts.max_runs:
            break
        code = run_cell(name, script, flags, opts, repo, runs, stop)
        if stop:
            return 128 + stop[0]
        if code != 0:
            log = (runs / f"{name}.log").read_text(errors="replace").splitlines()
            print(f"{name} failed (exit code {code}); the end of its log:\n" + "\n".join(log[-20:]), flush=True)
            return 1
        done += 1
    left = [n for n, _, _ in cells() if not finished_record(repo / RECORDS / f"{n}.json.gz")]
    print(
        f"{len(cells()) - len(left)} of {len(cells())} records committed" + (f"; next: {left[0]}" if left else ""), flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
