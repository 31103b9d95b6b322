"""The SLURM launcher (tools/grid/slurm.py) on a real SLURM: Debian's slurm-wlm and munge, started here as a one-node
cluster on localhost (munged, slurmctld, slurmd) in a temporary folder, with its own ports and munge socket.

A grid of tiny runs goes through the launcher; one task is requeued while it runs (`scontrol requeue`). Every cell
must finish, bit-identical to the same run uninterrupted, and the requeued one must continue from its checkpoint.
Where SLURM cannot start (not installed, not root, a daemon that does not come up) the test fails and says why."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, SUBPROCESS_ENV, read_scalars, run_script
from tools.grid.slurm import array_spec, main
from tools.grid.sweeps import read_sweep

# Tiny runs that last long enough to be requeued in the middle: 24 iterations of 4 envs x 64 steps.
RUN = ["--num-envs", "4", "--num-steps", "64", "--num-minibatches", "4", "--update-epochs", "2"]
RUN += ["--eval-episodes", "0", "--checkpoint-every", "2", "--save-model", "--env-backend", "gymnasium"]
ITERATIONS = 24
SWEEP = f"""program: ppo_mujoco.py
method: grid
parameters:
  env_id:
    value: Hopper-v5
  lag:
    value: 2
  seed:
    values: [1, 2, 3]
  total_timesteps:
    value: {ITERATIONS * 256}
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
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN
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


def squeue(env, job_id):
    proc = subprocess.run(["squeue", "-h", "-r", "-j", job_id, "-o", "%K %T"], env=env, capture_output=True, text=True)
    return dict(line.split() for line in proc.stdout.splitlines())


def test_grid_on_slurm_requeued_mid_run_finishes_bit_identical(slurm, tmp_path):
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(SWEEP)
    out = tmp_path / "grid"
    started = time.time()
    offline = {**slurm, "WANDB_MODE": "offline"}  # sbatch passes it on: the job script's end runs wandb_from_tb
    submitted = launcher(offline, "submit", sweep, "--out", out, "--cpus", "1", "--mem", "100M", "--time", "10", "--", *RUN)
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.search(r"submitted job (\d+): 3 of 3 cells", submitted.stdout).group(1)
    cells = [cell.name for cell in read_sweep(sweep)]
    assert cells == [f"Hopper-v5__ppo__lag2__s{seed}" for seed in (1, 2, 3)]

    # Once the first two cells have a checkpoint, and before they end: requeue the first (as preemption does: SIGTERM
    # to the run, SLURM requeues the task), and send the second's job script SIGUSR1, as `--signal=B:USR1@N` does
    # before the time limit (the script stops the run, which checkpoints, and requeues the task itself).
    deadline = time.time() + 120
    for cell in cells[:2]:
        while not (out / cell / "checkpoint.pt").exists():
            assert time.time() < deadline, f"{cell} wrote no checkpoint in 120 s{logs(out / 'logs')}"
            time.sleep(0.1)
    for command in (["scontrol", "requeue", f"{job_id}_0"], ["scancel", "--batch", "--signal=USR1", f"{job_id}_1"]):
        proc = subprocess.run(command, env=slurm, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert not any((out / cell / "summary.json").exists() for cell in cells[:2]), "a cell ended before it was stopped"
    status = launcher(slurm, "status", out)
    assert status.returncode == 0 and "(of 3 cells)" in status.stdout, status.stderr

    # The uninterrupted runs, here, while SLURM runs the rest of the grid.
    reference = tmp_path / "reference"
    for seed in (1, 2, 3):
        run_script("ppo_mujoco", *RUN, "--exp-name", "ppo", "--env-id", "Hopper-v5", "--lag", "2", "--seed", seed,
                   "--total-timesteps", ITERATIONS * 256, "--run-dir", reference / cells[seed - 1])  # fmt: skip

    deadline = time.time() + 150
    while squeue(slurm, job_id):
        assert time.time() < deadline, f"the grid did not end within 150 s: {squeue(slurm, job_id)}{logs(out / 'logs')}"
        time.sleep(1)
    status = launcher(slurm, "status", out)
    assert status.stdout.splitlines()[-2:] == [
        "3 finished, 0 running, 0 pending, 0 failed (of 3 cells)",
        f"every cell has finished: python -m tools.grid.aggregate {out}",
    ], status.stdout

    for cell in cells:
        log = (out / "logs" / f"{cell}.log").read_text()
        starts = re.split(r"^=== .* UTC: task ", log, flags=re.MULTILINE)[1:]  # the job script's line at each start
        if cell in cells[:2]:  # requeued: stopped by SIGTERM after a checkpoint, continued from it
            assert len(starts) == 2 and "start 2" in starts[1], log
            assert "SIGTERM: stopping after this iteration" in starts[0], log
            assert ("=== time limit: requeued" in starts[0]) == (cell == cells[1]), log
            first_line = re.search(r"\[(\d+)/24\]", starts[1])
            assert first_line and int(first_line.group(1)) > 1, log  # not restarted from scratch
        else:
            assert len(starts) == 1 and "[24/24]" in log, log
        assert log.rstrip().endswith("a run without --track; no wandb run written"), log  # once, at the end
        assert log.count("no wandb run written") == 1, log
        whole, parts = read_scalars(reference / cell), read_scalars(out / cell)
        assert set(whole) == set(parts)
        for tag in set(whole) - TIMING:
            assert whole[tag] == parts[tag], (cell, tag)
        models = [torch.load(d / cell / "ppo.cleanrl_model", weights_only=True)["agent"] for d in (reference, out)]
        for key in models[0]:
            assert torch.equal(models[0][key], models[1][key]), (cell, key)
    # Submitted again: nothing left to do.
    again = launcher(slurm, "submit", sweep, "--out", out, "--cpus", "1", "--mem", "100M", "--time", "10", "--", *RUN)
    assert again.returncode == 0 and again.stdout.startswith("every cell of"), again.stderr
    print(f"grid on SLURM: {time.time() - started:.0f} s")


def test_submit_refuses_bad_input_before_writing(tmp_path, capsys):
    grid = tmp_path / "grid"
    (tmp_path / "random.yaml").write_text("program: ppo_mujoco.py\nmethod: random\nparameters:\n  lag:\n    values: [0]\n")
    assert main(["submit", str(tmp_path / "random.yaml"), "--out", str(grid)]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {tmp_path}/random.yaml: only `method: grid` sweeps have cells (this one is 'random')\n"
    )
    assert main(["submit", str(tmp_path / "none.yaml"), "--out", str(grid)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}/none.yaml cannot be read")
    assert main(["status", str(grid)]) == 2
    assert capsys.readouterr().err == f"error: {grid} holds no grid submitted to SLURM (no slurm/cells.tsv)\n"
    assert not grid.exists()


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
