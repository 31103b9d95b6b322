"""Tracking without internet: real wandb in offline mode (no network). A tiny run with --track is stopped by SIGTERM
(its wandb run is marked preempting and exits 143), killed by SIGKILL after a checkpoint, and resumed to its end;
tools/grid/wandb_from_tb.py then writes its one complete offline wandb run, read back here from the .wandb file:
every iteration once, `_step` continuous, values equal to TensorBoard's, the run's config and id.

    .venv/bin/python -m pytest -q tests/test_wandb_offline.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from conftest import assert_wandb_holds_tensorboard
from tools.grid import wandb_from_tb
from tools.grid.run_records import tensorboard_events

REPO = Path(__file__).resolve().parent.parent
ITERATIONS = 8
RUN = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1", "--eval-episodes", "0"]
RUN += ["--checkpoint-every", "2", "--env-backend", "gymnasium", "--env-id", "Hopper-v5", "--lag", "2", "--seed", "1"]
RUN += ["--total-timesteps", str(ITERATIONS * 64), "--torch-threads", "1", "--track", "--auto-resume"]


def offline_env(tmp_path) -> dict:
    """wandb offline, its settings and caches in tmp_path: nothing outside the test's folders, no network."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", PYTHONUNBUFFERED="1")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        env[name] = str(tmp_path / "wandb-home")
    return env


def start(run_dir, env, stop_after=None, sig=None) -> int:
    """One start of the run (`--auto-resume`); `sig` is sent once the line of iteration `stop_after` is printed."""
    cmd = [sys.executable, str(REPO / "ppo_mujoco.py"), *RUN, "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=run_dir.parent)
    output = []
    for line in proc.stdout:
        output.append(line)
        if stop_after and line.startswith(f"[{stop_after}/{ITERATIONS}]"):
            proc.send_signal(sig)
            stop_after = None
    rc = proc.wait()
    assert stop_after is None, "".join(output)
    return rc


def test_iterations_keep_the_last_write(tmp_path):
    """A step logged again after a resume (TensorBoard's purge_step) counts once, with its last value."""
    first = SummaryWriter(str(tmp_path))
    for step in range(1, 6):
        first.add_scalar("a", 1.0, step)
    first.close()
    second = SummaryWriter(str(tmp_path), purge_step=4)  # resumed from the checkpoint of step 3
    for step in range(4, 7):
        second.add_scalar("a", 2.0, step)
        second.add_scalar("b", float(step), step)
    second.close()
    rows = wandb_from_tb.iterations(tmp_path)
    assert [row["global_step"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert [row["a"] for row in rows] == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    assert [row.get("b") for row in rows] == [None, None, None, 4.0, 5.0, 6.0]


def test_stopped_killed_resumed_run_gives_one_complete_offline_run(tmp_path, capsys, monkeypatch):
    env = offline_env(tmp_path)
    for name in ("WANDB_MODE", "WANDB_SILENT", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, env[name])  # for the tool, which runs in this process
    run_dir = tmp_path / "Hopper-v5__ppo__lag2__s1"
    assert start(run_dir, env, 3, signal.SIGTERM) == 143  # stops after its iteration 4, with a checkpoint
    assert start(run_dir, env, 7, signal.SIGKILL) == -signal.SIGKILL  # killed after iteration 7; checkpoint at 6
    assert start(run_dir, env) == 0
    segments = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(segments) == 3
    stopped = wandb_from_tb.read_offline_run(segments[0])
    assert stopped["preempting"] and stopped["exit_code"] == 143  # a sweep's agent would requeue it
    assert wandb_from_tb.read_offline_run(segments[2])["exit_code"] == 0

    assert wandb_from_tb.main([str(run_dir)]) == 0
    (folder,) = set((run_dir / "wandb").glob("offline-run-*")) - set(segments)
    assert re.search(r"^wrote .*offline-run-.*; sync it with: wandb sync ", capsys.readouterr().out)
    run = wandb_from_tb.read_offline_run(folder)
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    args = json.loads((run_dir / "args.json").read_text())
    assert run["id"] == run_id and run["tags"] == [wandb_from_tb.TAG] and run["exit_code"] == 0
    assert {key: run["config"][key] for key in args} == args
    history = run["history"]
    assert [row["_step"] for row in history] == [row["global_step"] for row in history]
    assert [row["global_step"] for row in history] == [64 * (i + 1) for i in range(ITERATIONS)]
    events = tensorboard_events(run_dir)
    assert events and all(len({step for step, _ in values}) == len(values) for values in events.values())
    for tag, values in events.items():
        for step, value in values:
            (row,) = [row for row in history if row["global_step"] == step]
            assert row[tag] == value, (tag, step)
    # Called again (a requeued job's end): nothing new.
    assert wandb_from_tb.main([str(run_dir)]) == 0
    assert capsys.readouterr().out.startswith("already written:")
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 4
    # The run folder is still one the script accepts: resuming the finished run has nothing to do.
    done = subprocess.run([sys.executable, str(REPO / "ppo_mujoco.py"), *RUN, "--run-dir", str(run_dir)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "nothing to do" in done.stdout, done.stdout + done.stderr


def test_refuses_a_folder_without_a_run_or_without_events(tmp_path, capsys):
    assert wandb_from_tb.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path} holds no run")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "run.json").write_text('{"run_id": "abc"}')
    (tmp_path / "args.json").write_text('{"track": false}')
    assert wandb_from_tb.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path} holds no TensorBoard event files")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["args.json", "run.json"]


# ------------------------------------------------------------------ what wandb's own files hold, as a user meets them


def busy_loops(count):
    """Processes that keep the cores busy beside a run, as other jobs on a shared node do."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def start_group(cmd, env, cwd, stops=()) -> tuple[int, str]:
    """One start in its own process group; each (iteration, signal) of `stops` is sent to the whole group (the run and
    wandb's process: what slurmstepd does on scancel, requeue and preemption) once that iteration's line is printed."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                            start_new_session=True)  # fmt: skip
    stops, output = dict(stops), []
    for line in proc.stdout:
        output.append(line)
        match = re.match(r"\[(\d+)/", line)
        if match and int(match.group(1)) in stops:
            os.killpg(proc.pid, stops.pop(int(match.group(1))))
    return proc.wait(), "".join(output)


def assert_no_nested_links(run_dir):
    """wandb's own links only (latest-run and its debug logs), none inside a linked folder: no chain of links."""
    links = [p for p in Path(run_dir).rglob("*") if p.is_symlink()]
    assert {p.name for p in links} <= {"latest-run", "debug.log", "debug-internal.log", "debug-core.log"}, links
    assert max(len(p.relative_to(run_dir).parts) for p in Path(run_dir).rglob("*")) <= 5


def test_a_tracked_run_on_a_busy_machine_holds_every_iteration_in_wandb(tmp_path):
    iterations = 30
    run_dir = tmp_path / "busy"
    cmd = [sys.executable, str(REPO / "ppo_mujoco.py"), *RUN, "--run-dir", str(run_dir)]
    cmd += ["--total-timesteps", str(iterations * 64), "--eval-episodes", "1"]
    loops = busy_loops(4)
    try:
        code, output = start_group(cmd, offline_env(tmp_path), tmp_path)
    finally:
        for loop in loops:
            loop.kill()
    assert code == 0 and "device: cpu" in output, output
    (folder,) = (run_dir / "wandb").glob("offline-run-*")
    history = assert_wandb_holds_tensorboard(run_dir, folder)
    assert len(history) == iterations and "eval/episodic_return" in history[-1]
    assert json.loads((run_dir / "run.json").read_text())["wandb_id"] == wandb_from_tb.read_offline_run(folder)["id"]
    assert_no_nested_links(run_dir)


def test_a_run_preempted_three_times_is_one_wandb_run_with_each_iteration_once(tmp_path):
    """SIGTERM to the job's processes, SIGKILL, SIGTERM again, then to the end: each stop by SIGTERM exits 143 with
    no traceback; every start continues the same wandb run, and the last start's files hold the whole run (what
    `wandb sync` of the latest offline folder makes the run: a later sync of a run id replaces the earlier)."""
    run_dir, env = tmp_path / "preempted", offline_env(tmp_path)
    cmd = [sys.executable, str(REPO / "ppo_mujoco.py"), *RUN, "--run-dir", str(run_dir), "--total-timesteps", "896"]
    codes, outputs = [], []
    for stops in ({3: signal.SIGTERM}, {7: signal.SIGKILL}, {9: signal.SIGTERM}, {}):
        code, output = start_group(cmd, env, tmp_path, stops.items())
        codes.append(code)
        outputs.append(output)
    assert codes == [143, -signal.SIGKILL, 143, 0], outputs
    assert not any("Traceback" in output for output in outputs), outputs
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    wandb_id = json.loads((run_dir / "run.json").read_text())["wandb_id"]
    assert len(folders) == 4 and all(folder.name.endswith(f"-{wandb_id}") for folder in folders)
    assert len(assert_wandb_holds_tensorboard(run_dir, folders[-1])) == 14
    assert_no_nested_links(run_dir)


def test_a_sweep_agents_run_keeps_its_wandb_files_and_records_their_id(tmp_path):
    """Under a sweep's agent wandb takes the agent's run id (WANDB_RUN_ID), not the script's: the first start keeps
    that run's files, run.json names the id, and the agent's rerun after a preemption continues that wandb run."""
    env = {**offline_env(tmp_path), "WANDB_SWEEP_ID": "sweep1", "WANDB_RUN_ID": "agentrun1"}
    cmd = [sys.executable, str(REPO / "ppo_mujoco.py"), *RUN, "--total-timesteps", "512"]
    assert start_group(cmd, env, tmp_path, {3: signal.SIGTERM}.items())[0] == 143
    run_dir = tmp_path / "runs/sweep-sweep1/agentrun1"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["wandb_id"] == "agentrun1" != record["run_id"]
    assert len(list((run_dir / "wandb").glob("offline-run-*-agentrun1"))) == 1
    assert start_group(cmd, env, tmp_path)[0] == 0
    folders = sorted((run_dir / "wandb").glob("offline-run-*-agentrun1"))
    assert len(folders) == 2 and len(assert_wandb_holds_tensorboard(run_dir, folders[-1])) == 8


def test_cuda_without_a_device_is_refused(tmp_path):
    cmd = [sys.executable, str(REPO / "ppo_mujoco.py"), *RUN, "--run-dir", str(tmp_path / "r"), "--cuda"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=offline_env(tmp_path), timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)"
    ], proc.stderr
    assert not (tmp_path / "r").exists()
