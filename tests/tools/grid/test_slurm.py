"""The SLURM launcher (tools/grid/slurm.py). Without SLURM: what `submit` refuses, the cells `--where` chooses, the
commands and the job script `--dry-run` prints, and how `status` reads a task's recorded events. On a real SLURM:
Debian's slurm-wlm and munge, started here as a one-node cluster on localhost (munged, slurmctld, slurmd) with one
GPU that is not there (`File=/dev/null`: SLURM allocates it, no run uses it), in a temporary folder, with its own ports
and munge socket.

A grid of four tiny runs goes through the launcher: one task is requeued while it runs (`scontrol requeue`), one gets
the time limit's signal twice (requeued, then not: `--max-requeues 1`), one is cancelled (`scancel`), and one gets
the time limit's signal before its run could checkpoint (not requeued: no progress). Submitted again, every cell
must finish, bit-identical to the same run uninterrupted, each stopped one continuing from its checkpoint, the log's
start counter going on. A GPU task runs its cell as a job step (srun) and is stopped and requeued the same way.
Where SLURM cannot start (not installed, not root, a daemon that does not come up) the test fails and says why."""

import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, SUBPROCESS_ENV, assert_wandb_holds_tensorboard, read_scalars, run_script
from tools.grid.run_records import is_finished
from tools.grid.slurm import array_spec, ended_state, main, time_limit_seconds
from tools.grid.sweeps import read_sweep, select

# Tiny runs that last long enough to be requeued in the middle: 16 iterations of 4 envs x 64 steps.
RUN = ["--num-envs", "4", "--num-steps", "64", "--num-minibatches", "4", "--update-epochs", "2"]
RUN += ["--eval-episodes", "0", "--checkpoint-every", "2", "--save-model", "--env-backend", "gymnasium"]
ITERATIONS = 16
SWEEP = f"""program: ppo_mujoco.py
method: grid
parameters:
  env_id:
    value: Hopper-v5
  lag:
    value: 2
  seed:
    values: [1, 2, 3, 4]
  total_timesteps:
    value: {ITERATIONS * 256}
"""
# Imported by every Python process that the tasks start (PYTHONPATH): task 3's run waits here, before it has its
# own signal handlers and so before it can checkpoint, until the test creates the file HOLD_RELEASE names.
HOLD = """import os
import time

if os.environ.get("SLURM_ARRAY_TASK_ID") == "3":
    while not os.path.exists(os.environ["HOLD_RELEASE"]):
        time.sleep(0.1)
"""
TIMING = {"charts/SPS", "perf/rollout_seconds", "perf/update_seconds"}
DAEMONS = ("munged", "slurmctld", "slurmd")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_conf(folder, cpus):
    ctld_port, slurmd_port = free_port(), free_port()
    return f"""ClusterName=test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket={folder}/munge.sock,cred_expire=10
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
GresTypes=gpu
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:1 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def logs(folder):
    return "".join(f"\n--- {p.name}:\n{p.read_text()[-1500:]}" for p in sorted(folder.glob("*.log")))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node SLURM cluster on localhost; yields the environment its clients need (SLURM_CONF)."""
    missing = [name for name in ("mungekey", *DAEMONS, "sbatch", "squeue", "scontrol") if not shutil.which(name)]
    if missing:
        pytest.fail(f"SLURM is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.fail("the SLURM test starts slurmd, which runs jobs as their user: run it as root")
    folder = tmp_path_factory.mktemp("slurm")
    (folder / "state").mkdir()
    (folder / "spool").mkdir()
    (folder / "slurm.conf").write_text(slurm_conf(folder, os.cpu_count()))
    (folder / "gres.conf").write_text("NodeName=localhost Name=gpu File=/dev/null\n")  # slurmd reads it beside slurm.conf
    env = {**SUBPROCESS_ENV, "SLURM_CONF": str(folder / "slurm.conf")}
    commands = [
        ["mungekey", "--create", "--keyfile", f"{folder}/munge.key"],
        ["munged", "--force", f"--socket={folder}/munge.sock", f"--key-file={folder}/munge.key"]
        + [f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log", f"--seed-file={folder}/munge.seed"],
        ["slurmctld", "-i"],
        ["slurmd", "-N", "localhost"],
    ]
    try:
        for command in commands:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                pytest.fail(f"{command[0]} did not start: {proc.stderr.strip()}{logs(folder)}")
        deadline = time.time() + 60
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the node did not come up within 60 s (sinfo: {state!r}){logs(folder)}")
        yield env
    finally:
        subprocess.run(["scancel", "--full", "--partition", "test"], env=env, capture_output=True)
        for daemon in reversed(DAEMONS):  # the daemons this fixture started, by their pid files
            pid_file = folder / f"{daemon}.pid"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass


def launcher(env, *argv):
    """python -m tools.grid.slurm argv..., as a user runs it."""
    command = [sys.executable, "-m", "tools.grid.slurm", *map(str, argv)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def squeue(env, job_id, field="%T"):
    """{task index: field (default: its state)} of the array's tasks that squeue lists."""
    proc = subprocess.run(["squeue", "-h", "-r", "-j", job_id, "-o", f"%K {field}"], env=env, capture_output=True, text=True)
    return dict(line.split() for line in proc.stdout.splitlines())


def own_job_id(env, job_id, index):
    """The job id of a running array task (SLURM_JOB_ID in it)."""
    return squeue(env, job_id, "%A")[str(index)]


def signal_job_script(env, job_id, index, signum):
    """Send the task's job script (the batch shell) a signal, as `--signal=B:USR1@N` does before the time limit.
    Directly: `scancel --batch --signal=USR1 <task>` is sometimes refused while it delivers the signal ("Job can not
    be altered now") and scancel then sends it again, seconds later, to whatever start of the task runs by then."""
    script = f"/job{int(own_job_id(env, job_id, index)):05d}/slurm_script"  # slurmd's copy of it, which bash runs
    shells = [p for p in Path("/proc").iterdir() if p.name.isdigit() and script in read_cmdline(p)]
    assert len(shells) == 1, (job_id, index, shells)
    os.kill(int(shells[0].name), signum)


def read_cmdline(process):
    try:
        return (process / "cmdline").read_bytes().decode(errors="replace")
    except OSError:  # ended meanwhile
        return ""


def task_command(env, job_id, index, *command):
    """Run a SLURM command (scontrol requeue, scancel) on an array task, named `<job>_<index>` (a task's own job id
    may be the array's, which names every task)."""
    proc = subprocess.run([*command, f"{job_id}_{index}"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, (command, proc.stderr)


def events(out, cell):
    """(task, event, detail) of each line the job script recorded for the cell."""
    path = out / "slurm" / "history" / f"{cell}.tsv"
    return [tuple(line.split("\t")[1:]) for line in path.read_text().splitlines()] if path.exists() else []


def checkpoint_id(run_dir):
    path = run_dir / "checkpoint.pt"
    if not path.exists():
        return None
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def starts_of(log):
    """The log's parts, one per start of the task (each opens with the job script's `=== ... UTC: task` line)."""
    return re.split(r"^=== .* UTC: task ", log, flags=re.MULTILINE)[1:]


def first_iteration(start):
    line = re.search(r"\[(\d+)/\d+\]", start)
    return int(line.group(1)) if line else None


def wait_until_gone(env, job_id, seconds, out):
    deadline = time.time() + seconds
    while squeue(env, job_id):
        assert (
            time.time() < deadline
        ), f"job {job_id} did not end within {seconds} s: {squeue(env, job_id)}{logs(out / 'logs')}"
        time.sleep(0.5)


def test_grid_on_slurm_requeued_cancelled_timed_out_and_resubmitted(slurm, tmp_path):
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(SWEEP)
    (tmp_path / "hold").mkdir()
    (tmp_path / "hold" / "sitecustomize.py").write_text(HOLD)
    release = tmp_path / "release"
    out = tmp_path / "grid"
    started = time.time()
    # sbatch passes the environment on: wandb offline, its settings in tmp_path; PYTHONPATH for the hold.
    env = {**slurm, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONPATH": str(tmp_path / "hold")}
    env |= {name: str(tmp_path / "wandb-home") for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}
    env["HOLD_RELEASE"] = str(release)
    submit = ["submit", sweep, "--out", out, "--cpus", "1", "--mem", "100M", "--time", "10", "--signal-seconds", "60"]
    submit += ["--max-requeues", "1", "--", *RUN, "--track"]
    submitted = launcher(env, *submit)
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.search(r"submitted job (\d+): 4 of 4 cells", submitted.stdout).group(1)
    cells = [cell.name for cell in read_sweep(sweep)]
    assert cells == [f"Hopper-v5__ppo__lag2__s{seed}" for seed in (1, 2, 3, 4)]

    # Each task stopped once its run has a checkpoint (task 3: once it has started, held before it can checkpoint):
    # 0 requeued as preemption does (SIGTERM to the run, SLURM requeues the task); 1 and 3 sent SIGUSR1 as
    # `--signal=B:USR1@N` does before the time limit (the job script stops the run, which checkpoints, and requeues the
    # task itself, unless...); 2 cancelled. Task 1 again once its second start has a new checkpoint.
    usr1 = functools.partial(signal_job_script, slurm, job_id, signum=signal.SIGUSR1)
    actions = {
        0: (lambda: checkpoint_id(out / cells[0]), functools.partial(task_command, slurm, job_id, 0, "scontrol", "requeue")),
        1: (lambda: checkpoint_id(out / cells[1]), functools.partial(usr1, 1)),
        2: (lambda: checkpoint_id(out / cells[2]), functools.partial(task_command, slurm, job_id, 2, "scancel")),
        3: (lambda: (f"{job_id}_3", "start", "") in events(out, cells[3]), functools.partial(usr1, 3)),
    }
    requeued_at = None  # task 1's checkpoint when its first start ended
    deadline = time.time() + 240
    while squeue(slurm, job_id) or actions:
        assert time.time() < deadline, f"the grid did not end within 240 s: {sorted(actions)}{logs(out / 'logs')}"
        for index, (ready, act) in list(actions.items()):
            assert not is_finished(out / cells[index]), f"{cells[index]} finished before it was stopped"
            if ready():
                act()
                del actions[index]
        if requeued_at is None and (f"{job_id}_1", "requeue", "time limit") in events(out, cells[1]):
            requeued_at = checkpoint_id(out / cells[1])
            actions[1] = (lambda: checkpoint_id(out / cells[1]) != requeued_at, functools.partial(usr1, 1))
        time.sleep(0.1)

    status = launcher(slurm, "status", out)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert f"{cells[1]}  timeout      2 starts, 1 requeue (1 at the time limit)" in lines, status.stdout
    assert "    stopped at the time limit and not requeued: its requeues at the time limit reached --max-requeues 1" in lines
    assert f"{cells[2]}  cancelled    1 start, 0 requeues (0 at the time limit)" in lines, status.stdout
    assert "    stopped by SIGTERM and not requeued" in lines, status.stdout
    assert f"{cells[3]}  timeout      1 start, 0 requeues (0 at the time limit)" in lines, status.stdout
    assert "    stopped at the time limit and not requeued: this start wrote no new checkpoint" in lines, status.stdout
    assert lines[-2:] == [
        "1 finished, 2 timeout, 1 cancelled (of 4 cells); 2 requeues (1 at the time limit)",
        "the same submit command again submits the cells that have not finished",
    ], status.stdout

    # Submitted again (the hold released): the three cells that have not finished continue.
    release.touch()
    again = launcher(env, *submit)
    assert again.returncode == 0, again.stderr
    second_id = re.search(r"submitted job (\d+): 3 of 4 cells", again.stdout).group(1)

    # The uninterrupted runs, here, while SLURM runs the rest of the grid.
    reference = tmp_path / "reference"
    for seed in (1, 2, 3, 4):
        run_script("ppo_mujoco", *RUN, "--exp-name", "ppo", "--env-id", "Hopper-v5", "--lag", "2", "--seed", seed,
                   "--total-timesteps", ITERATIONS * 256, "--run-dir", reference / cells[seed - 1])  # fmt: skip
    wait_until_gone(slurm, second_id, 150, out)
    status = launcher(slurm, "status", out)
    assert status.stdout.splitlines()[-2:] == [
        "4 finished (of 4 cells); 2 requeues (1 at the time limit)",
        f"every cell has finished: python -m tools.grid.aggregate {out}",
    ], status.stdout

    logs_of = {cell: (out / "logs" / f"{cell}.log").read_text() for cell in cells}
    starts = {cell: starts_of(log) for cell, log in logs_of.items()}
    expected = {cells[0]: [job_id, job_id], cells[1]: [job_id, job_id, second_id], cells[2]: [job_id, second_id]}
    expected[cells[3]] = [job_id, second_id]
    for index, cell in enumerate(cells):  # the start counter goes on over submissions
        assert [s.split(" ")[0] for s in starts[cell]] == [f"{j}_{index}" for j in expected[cell]], logs_of[cell]
        assert [re.search(r"start (\d+)", s.splitlines()[0]).group(1) for s in starts[cell]] == [
            str(n) for n in range(1, len(expected[cell]) + 1)
        ], logs_of[cell]
    for cell in cells[:3]:  # stopped by SIGTERM after a checkpoint, continued from it
        assert "SIGTERM: stopping after this iteration" in starts[cell][0], logs_of[cell]
        assert all(first_iteration(s) > 1 for s in starts[cell][1:]), logs_of[cell]
    assert "=== time limit: requeued" in starts[cells[1]][0], logs_of[cells[1]]
    assert "=== time limit: not requeued: its requeues at the time limit reached --max-requeues 1" in starts[cells[1]][1]
    assert "time limit" not in logs_of[cells[0]] + logs_of[cells[2]]
    # Task 3's first start: its run ended before its first iteration, and the task was not requeued.
    assert first_iteration(starts[cells[3]][0]) is None, logs_of[cells[3]]
    assert "=== time limit: not requeued: this start wrote no new checkpoint" in starts[cells[3]][0], logs_of[cells[3]]
    assert first_iteration(starts[cells[3]][1]) == 1, logs_of[cells[3]]

    for cell in cells:
        # Stopped by SIGTERM to every process of the task, wandb's included: exit 143, no traceback; the last
        # start's offline wandb run holds what TensorBoard holds, each iteration once.
        assert "Traceback" not in logs_of[cell], logs_of[cell]
        folders = sorted((out / cell / "wandb").glob("offline-run-*"))
        assert len(folders) == len(starts[cell]) - (cell == cells[3]), logs_of[cell]  # task 3's first start: no run
        assert len(assert_wandb_holds_tensorboard(out / cell, folders[-1])) == ITERATIONS
        whole, parts = read_scalars(reference / cell), read_scalars(out / cell)
        assert set(whole) == set(parts)
        for tag in set(whole) - TIMING:
            assert whole[tag] == parts[tag], (cell, tag)
        models = [torch.load(d / cell / "ppo.cleanrl_model", weights_only=True)["agent"] for d in (reference, out)]
        for key in models[0]:
            assert torch.equal(models[0][key], models[1][key]), (cell, key)
    # Submitted again: nothing left to do.
    again = launcher(env, *submit)
    assert again.returncode == 0 and again.stdout.startswith("every cell of"), again.stderr
    print(f"grid on SLURM: {time.time() - started:.0f} s")


def test_gpu_task_runs_its_cell_as_a_job_step(slurm, tmp_path):
    """--gpus 1: one SLURM task with the (absent) GPU, the run started by srun; the time limit's signal reaches the run
    through scancel (srun itself would kill its step at once on SIGTERM); requeued, the run continues and finishes.
    The run is told --no-cuda after `--` (no GPU here), in place of the launcher's --cuda."""
    sweep = tmp_path / "one.yaml"
    sweep.write_text(SWEEP.replace("[1, 2, 3, 4]", "[1]"))
    out = tmp_path / "grid"
    submit = ["submit", sweep, "--out", out, "--gpus", "1", "--cpus", "1", "--mem", "100M", "--time", "10"]
    submitted = launcher(slurm, *submit, "--signal-seconds", "60", "--", *RUN, "--no-cuda")
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.search(r"submitted job (\d+): 1 of 1 cells", submitted.stdout).group(1)
    assert "\nsrun --ntasks=1 --gpus-per-task=1 --cpus-per-gpu=1 " in "\n" + (out / "slurm" / "job.sh").read_text().replace(
        'eval "exec ', ""
    )
    cell = read_sweep(sweep)[0].name
    deadline = time.time() + 120
    while not checkpoint_id(out / cell):
        assert time.time() < deadline, f"no checkpoint in 120 s{logs(out / 'logs')}"
        time.sleep(0.1)
    signal_job_script(slurm, job_id, 0, signal.SIGUSR1)
    wait_until_gone(slurm, job_id, 150, out)
    log = (out / "logs" / f"{cell}.log").read_text()
    starts = starts_of(log)
    assert len(starts) == 2 and "=== time limit: requeued" in starts[0] and first_iteration(starts[1]) > 1, log
    assert "SIGTERM: stopping after this iteration" in starts[0], log
    assert "task 0: Exited with exit code 143" in starts[0], log  # srun's report of its step
    assert launcher(slurm, "status", out).stdout.splitlines()[-2] == "1 finished (of 1 cells); 1 requeue (1 at the time limit)"


def test_submit_refuses_bad_input_before_writing(tmp_path, capsys):
    grid = tmp_path / "grid"
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(SWEEP)
    (tmp_path / "random.yaml").write_text("program: ppo_mujoco.py\nmethod: random\nparameters:\n  lag:\n    values: [0]\n")
    refusals = {
        (
            str(tmp_path / "random.yaml"),
        ): f"{tmp_path}/random.yaml: only `method: grid` sweeps have cells (this one is 'random')",
        ("--time", "3"): "--time 3 (0:03:00) is too short for --signal-seconds 300: a task needs at least 0:11:00 "
        "(--signal-seconds to run an iteration before the time-limit signal, as long to end it and checkpoint after it, "
        "and 60 s as SLURM may send the signal early)",
        ("--time", "2:30", "--signal-seconds", "60"): "--time 2:30 (0:02:30) is too short for --signal-seconds 60: a task "
        "needs at least 0:03:00 (--signal-seconds to run an iteration before the time-limit signal, as long to end it "
        "and checkpoint after it, and 60 s as SLURM may send the signal early)",
        ("--time", "1:00:00:00"): "--time 1:00:00:00: not a SLURM time (minutes, hours:minutes:seconds or "
        "days-hours:minutes:seconds)",
        ("--signal-seconds", "65536"): "--signal-seconds must be in [1, 65535] (sbatch --signal's range)",
        ("--signal-seconds", "0"): "--signal-seconds must be in [1, 65535] (sbatch --signal's range)",
        ("--max-requeues", "-1"): "--cpus must be >= 1; --gpus, --max-running and --max-requeues >= 0",
        ("--gpus", "2", "--cpus", "3"): "--cpus 3 is not a multiple of --gpus 2 (each GPU gets --cpus / --gpus CPUs)",
        ("--where", "lr=1"): "--where lr=1: the sweep has no parameter lr (it has env_id, lag, seed, total_timesteps)",
        ("--where", "seed=1,7"): "--where seed=1,7: seed is never 7 in the sweep (its values: 1, 2, 3, 4)",
        ("--where", "env_id=Ant-v5"): "--where env_id=Ant-v5: env_id is never Ant-v5 in the sweep (its values: Hopper-v5)",
        ("--where", "seed"): "--where seed: expected key=value or key=value1,value2",
        ("--", "4"): "after --: 4 is not a flag (a flag starts with --)",
        ("--", "--run-dir", "x"): "after --: --run-dir is the launcher's (each task runs --auto-resume --run-dir OUT/CELL)",
        ("--", "--no-auto-resume"): "after --: --no-auto-resume is the launcher's (each task runs --auto-resume --run-dir "
        "OUT/CELL)",
        ("--", "--seed", "1", "--seed=2"): "after --: --seed is given twice",
        ("--", "--seed=5"): "after --: --seed=5 is each cell's own (its label, or a parameter the sweep lists values for)",
        ("--", "--exp-name", "x"): "after --: --exp-name is each cell's own (its label, or a parameter the sweep lists "
        "values for)",
    }
    for options, message in refusals.items():
        path, options = (options[0], options[1:]) if options[0].endswith(".yaml") else (str(sweep), options)
        assert main(["submit", path, "--out", str(grid), *options]) == 2, options
        assert capsys.readouterr().err == f"error: {message}\n", options
    assert main(["submit", str(tmp_path / "none.yaml"), "--out", str(grid)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}/none.yaml cannot be read")
    assert main(["status", str(grid)]) == 2
    assert capsys.readouterr().err == f"error: {grid} holds no grid submitted to SLURM (no slurm/cells.tsv)\n"
    assert not grid.exists()


def test_a_failed_sbatch_takes_back_what_submit_wrote(tmp_path, capsys, monkeypatch):
    """sbatch and squeue stand-ins: the first submission goes through (job 7), the next ones fail."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    accept = tmp_path / "accept"
    sbatch = f"[ -e {accept} ] && rm {accept} && echo 7 && exit 0\necho 'sbatch: error: Invalid partition name' >&2\nexit 1"
    for name, text in {"sbatch": sbatch, "squeue": "exit 0"}.items():
        (bin_folder / name).write_text(f"#!/bin/sh\n{text}\n")
        (bin_folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_folder}:{os.environ['PATH']}")
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(SWEEP)
    out = tmp_path / "new" / "grid"
    assert main(["submit", str(sweep), "--out", str(out)]) == 2
    assert capsys.readouterr().err == "error: sbatch failed: sbatch: error: Invalid partition name\n"
    assert not (tmp_path / "new").exists()
    accept.touch()
    assert main(["submit", str(sweep), "--out", str(out), "--where", "seed=1"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("submitted job 7: 1 of 4 cells, --where chose 1;")
    written = {path: path.read_text() for path in out.rglob("*") if path.is_file()}
    assert sorted(path.name for path in written) == ["cells.tsv", "job.sh", "jobs.jsonl"]
    assert main(["submit", str(sweep), "--out", str(out), "--time", "2:00:00"]) == 2
    assert capsys.readouterr().err == "error: sbatch failed: sbatch: error: Invalid partition name\n"
    assert {path: path.read_text() for path in out.rglob("*") if path.is_file()} == written
    assert sorted(path.relative_to(out).as_posix() for path in out.rglob("*") if path.is_dir()) == [
        "logs",
        "slurm",
        "slurm/history",
    ]


def dry_run(capsys, *argv):
    assert main(["submit", "--dry-run", *map(str, argv)]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_dry_run_prints_the_chosen_cells_commands_once_with_the_flags_after_dashes_once(tmp_path, capsys):
    sweep = tmp_path / "grid.yaml"
    sweep.write_text(
        SWEEP.replace("value: Hopper-v5", "values: [Hopper-v5, Walker2d-v5]") + "  env_backend:\n    value: envpool\n"
    )
    out = tmp_path / "grid"
    text = dry_run(
        capsys, sweep, "--out", out, "--where", "env_id=Hopper-v5", "--where", "seed=1,2", "--", *RUN, "--env-threads", 1
    )
    cells = read_sweep(sweep)
    assert len(cells) == 8 and [cell.name for cell in cells[:2]] == ["Hopper-v5__ppo__lag2__s1", "Hopper-v5__ppo__lag2__s2"]
    assert f"# sbatch --parsable --array=0-1 {out}/slurm/job.sh   (2 of 8 cells, --where chose 2)\n" in text
    tasks = re.findall(r"^# task (\d+): (\S+)\n(.*)$", text, flags=re.MULTILINE)
    assert [(index, name) for index, name, _ in tasks] == [("0", cells[0].name), ("1", cells[1].name)]
    for index, name, command in tasks:
        argv = command.split()
        flags = [token.split("=")[0].replace("_", "-") for token in argv if token.startswith("--")]
        assert len(flags) == len(set(flags)), command  # each flag once
        assert argv[argv.index("--env-backend") + 1] == "gymnasium" and "--env_backend=envpool" not in argv, command
        assert argv[argv.index("--env-threads") + 1] == "1" and "--env-threads=2" not in argv, command
        assert argv[argv.index("--num-envs") + 1] == "4" and f"--seed={int(index) + 1}" in argv, command
        assert argv[-3:] == ["--auto-resume", "--run-dir", str(out / name)], command
        assert text.count(command) == 1
    assert not out.exists()
    # A cell that has finished is not submitted again.
    (out / cells[0].name).mkdir(parents=True)
    (out / cells[0].name / "summary.json").write_text("{}")
    text = dry_run(
        capsys, sweep, "--out", out, "--where", "env_id=Hopper-v5", "--where", "seed=1,2", "--", *RUN, "--env-threads", 1
    )
    assert f"# sbatch --parsable --array=1 {out}/slurm/job.sh   (1 of 8 cells, --where chose 2)\n" in text
    assert re.findall(r"^# task (\d+): ", text, flags=re.MULTILINE) == ["1"]


def test_job_script_on_the_cpu_and_with_gpus(tmp_path, capsys):
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(SWEEP)
    out = tmp_path / "grid"
    cpu = dry_run(capsys, sweep, "--out", out, "--cpus", 4, "--max-requeues", 3, "--time", "1-00:00", "--partition", "p")
    gpu = dry_run(capsys, sweep, "--out", out, "--cpus", 4, "--gpus", 2, "--signal-seconds", 120)
    for text in (cpu, gpu):  # bash reads it
        script = text[: text.index("\n# sbatch ")]
        proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --cpus-per-task=4\n" in cpu and "#SBATCH --time=1-00:00\n" in cpu and "#SBATCH --partition=p\n" in cpu
    assert "#SBATCH --signal=B:USR1@300\n" in cpu and "reached --max-requeues 3" in cpu and "-ge 3 ]" in cpu
    assert '\neval "exec $command" &\n' in cpu and "srun" not in cpu and "--gpus" not in cpu
    assert '\ntrap \'stopping=1; record signal "time limit"; kill -TERM "$run"\' USR1\n' in cpu
    assert all("--cuda" not in line for line in cpu.splitlines() if "ppo_mujoco.py" in line)
    assert "#SBATCH --ntasks=1\n#SBATCH --gpus-per-task=2\n#SBATCH --cpus-per-gpu=2\n" in gpu
    assert "--cpus-per-task" not in gpu and "#SBATCH --signal=B:USR1@120\n" in gpu and "reached --max-requeues 10" in gpu
    assert '\neval "exec srun --ntasks=1 --gpus-per-task=2 --cpus-per-gpu=2 $command" &\n' in gpu
    assert '\ntrap \'stopping=1; record signal "time limit"; scancel --signal=TERM "$SLURM_JOB_ID"\' USR1\n' in gpu
    commands = [line for line in gpu.splitlines() if "ppo_mujoco.py" in line]
    assert len(commands) == 4 and all(line.split().count("--cuda") == 1 and "--env-threads=4" in line for line in commands)


def test_time_limits_in_slurms_forms():
    forms = {"90": 5400, "5:30": 330, "1:02:03": 3723, "2-3": 2 * 86400 + 3 * 3600, "2-03:04": 183840, "1-0:0:5": 86405}
    for text, seconds in forms.items():
        assert time_limit_seconds(text) == seconds, text
    for text in ("0", "INFINITE", "unlimited"):
        assert time_limit_seconds(text) is None
    for text in ("1h", "1:2:3:4", "-5", ""):
        try:
            time_limit_seconds(text)
        except ValueError as e:
            assert str(e).startswith(f"--time {text}: not a SLURM time"), text
        else:
            raise AssertionError(text)


def test_where_chooses_cells_by_their_parameters_values(tmp_path):
    sweep = tmp_path / "grid.yaml"
    sweep.write_text(SWEEP + "  realign:\n    values: [true, false]\n  tv_threshold:\n    values: [0.1, 0.25]\n")
    cells = read_sweep(sweep)
    assert len(cells) == 16 and select(cells, []) == cells
    chosen = select(cells, ["seed=2,4", "realign=false", "tv-threshold=0.25"])
    assert [(c.params["seed"], c.params["realign"], c.params["tv_threshold"]) for c in chosen] == [
        (2, False, 0.25),
        (4, False, 0.25),
    ]
    assert select(cells, ["realign=False"]) == select(cells, ["realign=false"])  # wandb writes booleans as Python does
    try:
        select(cells, ["seed=true"])  # True == 1 in Python, not in a sweep
    except ValueError as e:
        assert str(e) == "--where seed=true: seed is never true in the sweep (its values: 1, 2, 3, 4)"
    else:
        raise AssertionError("seed=true was taken for seed=1")


def test_status_of_a_task_no_longer_queued_from_its_recorded_events():
    cases = [
        (None, False, ("cancelled", "before it started")),
        (None, True, ("failed", "the task recorded no start (see its SLURM output, slurm/<job>_<task>.out)")),
        ([("signal", "time limit"), ("exit", "143"), ("timeout", "this start wrote no new checkpoint")], True,
         ("timeout", "stopped at the time limit and not requeued: this start wrote no new checkpoint")),
        ([("signal", "time limit"), ("exit", "143"), ("requeue", "time limit")], True,
         ("cancelled", "while waiting to restart after the time limit")),
        ([("signal", "time limit"), ("signal", "SIGTERM")], True,
         ("timeout", "the run did not end its iteration and checkpoint within --signal-seconds of the signal")),
        ([("signal", "SIGTERM"), ("exit", "143")], True, ("cancelled", "stopped by SIGTERM and not requeued")),
        ([("exit", "1")], True, ("failed", "exit 1")),
        ([], True, ("failed", "the task ended without recording its run's exit (killed, or its node failed)")),
    ]  # fmt: skip
    for events, started, expected in cases:
        assert ended_state(events, started) == expected, events


def test_every_sweep_file_is_a_grid_of_distinct_cells():
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        cells = read_sweep(path)
        assert cells and len({cell.name for cell in cells}) == len(cells), path
    cells = read_sweep(ROOT / "sweeps" / "round2_vaco_delta.yaml")
    assert len(cells) == 20 and cells[0].name == "Hopper-v5__vaco-delta0.1__lag8__s1"
    assert cells[0].flags()[0] == "--exp_name=vaco-delta0.1"
    assert "--env_backend=gymnasium" in cells[0].flags() and "--track=True" in cells[0].flags()


def test_array_spec():
    assert array_spec([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10"
    assert array_spec([5]) == "5"
