"""Shared helpers for the tests: run a script (in a subprocess or in-process) and read what it logged."""

import hashlib
import importlib
import io
import json
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)

MUJOCO_SCRIPTS = ["ppo_mujoco", "vaco_mujoco", "spo_mujoco", "impala_mujoco"]
# A tiny budget: 2 iterations of 4 envs x 64 steps, 2 epochs of 4 minibatches, no evaluation; on gymnasium's
# SyncVectorEnv (exact resume, video, registered test envs; a later --env-backend overrides it).
TINY = [
    "--env-backend",
    "gymnasium",
    "--env-id",
    "Hopper-v5",
    "--num-envs",
    "4",
    "--num-steps",
    "64",
    "--total-timesteps",
    "512",
    "--num-minibatches",
    "4",
    "--update-epochs",
    "2",
    "--eval-episodes",
    "0",
]
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": "egl", "WANDB_MODE": "disabled"}


def import_script(script):
    """The script as a module (its __main__ block does not run)."""
    return importlib.import_module(script)


def existing_scripts():
    return [pytest.param(s, id=s) for s in MUJOCO_SCRIPTS if (ROOT / f"{s}.py").exists()]


def run_script(script, *args, env=None, timeout=600, check=True):
    """Run `python <script>.py args...` from the repository root and return the CompletedProcess."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / f"{script}.py"), *map(str, args)],
        cwd=ROOT,
        env={**SUBPROCESS_ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
    return proc


def run_in_process(script, *args):
    """Run `python <script>.py args...` in this process and return the local variables of the script's main() as it
    returned (the last iteration's buffers), read from its frame."""
    path, captured = str(ROOT / f"{script}.py"), {}

    def in_main(frame, event, arg):
        if event == "return":
            captured.update(frame.f_locals)
        return in_main

    def on_call(frame, event, arg):  # traces main's return only: no line events, the other calls untraced
        if frame.f_code.co_name != "main" or frame.f_code.co_filename != path:
            return None
        frame.f_trace_lines = False
        return in_main

    argv, handlers = sys.argv, {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    sys.argv = [path, *map(str, args)]
    sys.settrace(on_call)
    try:
        runpy.run_path(path, run_name="__main__")
        return captured
    finally:
        sys.settrace(None)
        sys.argv = argv
        for s, handler in handlers.items():  # the script installs its own
            signal.signal(s, handler)
        torch.set_num_threads(1)


def read_scalars(run_dir):
    """{tag: [(step, value), ...]} from the TensorBoard events in run_dir."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_checkpoint_file(path):
    """A MuJoCo script's checkpoint, read as its format says (a 256-byte JSON header line, then torch.save's bytes,
    whose SHA-256 the header gives), independently of the scripts' own reader."""
    data = Path(path).read_bytes()
    header = json.loads(data[:256])
    assert data[255:256] == b"\n" and hashlib.sha256(data[256:]).hexdigest() == header["sha256"], path
    return torch.load(io.BytesIO(data[256:]), weights_only=True)


def assert_wandb_holds_tensorboard(run_dir, folder):
    """The offline run in `folder` holds every step TensorBoard holds, once, with TensorBoard's values (which are
    float32) and the wall-clock time of each row; its x axis is the environment step."""
    from tools.grid.run_records import tensorboard_events
    from tools.grid.wandb_from_tb import read_offline_run

    history = read_offline_run(folder)["history"]
    steps = [row["_step"] for row in history]
    rows = {}
    for tag, values in tensorboard_events(run_dir).items():
        for step, value in values:
            rows.setdefault(step, {})[tag] = value
    assert steps == sorted(rows), (steps, sorted(rows))
    for row in history:
        assert row["global_step"] == row["_step"] and row["_timestamp"] > 1e9 and row["_runtime"] >= 0
        for tag, value in rows[row["_step"]].items():
            assert np.float32(row[tag]) == np.float32(value), (tag, row["_step"])
    return history
