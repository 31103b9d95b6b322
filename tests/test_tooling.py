"""Tests of the experiment tooling: wandb sweep configs, tools/run_grid.py and tools/aggregate.py.

    .venv/bin/python -m pytest tests/test_tooling.py -q

The grid runner is exercised on a tiny fake training script written into tmp_path; aggregation on
synthetic TensorBoard logs with known answers. The sweep test renders each sweep's command lines with
wandb's own agent code (no server) and feeds them to the real scripts' `parse_args` (skipped for a script
that does not exist yet).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import aggregate  # noqa: E402
import run_grid  # noqa: E402

SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
SCRIPTS = ("ppo_mujoco.py", "vaco_mujoco.py", "spo_mujoco.py", "impala_mujoco.py")
_modules: dict[str, object] = {}


def script_module(name: str):
    """Import a training script as a module (its training code sits under `if __name__ == "__main__"`)."""
    path = REPO / name
    if not path.exists():
        pytest.skip(f"{name} does not exist yet")
    if name not in _modules:
        spec = importlib.util.spec_from_file_location(f"_tooling_test_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # tyro reads the Args docstrings through the module
        spec.loader.exec_module(module)
        _modules[name] = module
    return _modules[name]


# ------------------------------------------------------------------------------------------ wandb sweeps


def expand_grid(config: dict) -> list[dict]:
    """All parameter combinations of a `method: grid` sweep (what the wandb grid search enumerates)."""
    names, choices = [], []
    for name, spec in config["parameters"].items():
        names.append(name)
        choices.append(spec["values"] if "values" in spec else [spec["value"]])
    return [dict(zip(names, combo)) for combo in itertools.product(*choices)]


def covering_subset(config: dict) -> list[dict]:
    """A few combinations that together use every value of every parameter at least once."""
    params = config["parameters"]
    width = max(len(s.get("values", [None])) for s in params.values())
    out = []
    for i in range(width):
        out.append({n: (s["values"][i % len(s["values"])] if "values" in s else s["value"]) for n, s in params.items()})
    return out


def render_with_wandb_agent(config: dict, params: dict, tmp_path, monkeypatch) -> list[str]:
    """The argv `wandb agent` would execute for one run of this sweep, produced by wandb's Agent code."""
    import wandb.wandb_agent as wandb_agent

    for var in ("WANDB_DIR", "WANDB_RUN_ID", "WANDB_SWEEP_ID", "WANDB_SWEEP_PARAM_PATH"):
        monkeypatch.setenv(var, str(tmp_path) if var == "WANDB_DIR" else "x")
    captured = {}

    class Recorder:
        def __init__(self, command=None, env=None, **kwargs):
            captured["command"] = command

    monkeypatch.setattr(wandb_agent, "AgentProcess", Recorder)
    agent = wandb_agent.Agent(api=None, queue=None, sweep_id="test")
    agent._sweep_command = list(config.get("command") or [])
    agent._command_run(
        {"type": "run", "run_id": "run0", "program": config["program"], "args": {k: {"value": v} for k, v in params.items()}}
    )
    return captured["command"]


def test_sweep_files_present():
    names = {p.name for p in SWEEPS}
    for algo in ("ppo", "vaco", "spo", "impala"):
        assert f"{algo}_grid.yaml" in names
    assert {"vaco_ablation_delta.yaml", "vaco_ablation_rho_bar.yaml", "vaco_ablation_components.yaml"} <= names


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.stem)
def test_sweep_renders_and_script_accepts(sweep, tmp_path, monkeypatch):
    from wandb.sdk.launch.sweeps.utils import load_sweep_config

    config = load_sweep_config(str(sweep))
    assert config["method"] == "grid" and config["program"] in SCRIPTS
    grid = expand_grid(config)
    assert {"env_id", "lag", "seed"} <= set(config["parameters"])
    assert len(config["parameters"]["lag"]["values"]) == 5  # five degrees of asynchronicity
    n_runs = int(next(line for line in sweep.read_text().splitlines() if line.startswith("# Runs:")).split()[2].rstrip("."))
    assert len(grid) == n_runs  # the header's run count is right
    subset = covering_subset(config)
    rendered = [render_with_wandb_agent(config, p, tmp_path, monkeypatch) for p in subset]
    for argv, params in zip(rendered, subset):
        assert argv[:3] == ["/usr/bin/env", "python", config["program"]]
        assert any(a.startswith("--lag=") for a in argv)
        if "track" in params:
            assert f"--track={params['track']}" in argv  # wandb's boolean style
    module = script_module(config["program"])  # skips if the script is not written yet
    for argv, params in zip(rendered, subset):
        args = module.parse_args(argv[3:])
        for name, value in params.items():
            got = getattr(args, name)
            assert math.isclose(got, value) if isinstance(value, float) else got == value, (name, got, value)


@pytest.mark.parametrize("label", ["ppo", "spo", "impala", "vaco", *run_grid.ABLATIONS])
def test_runner_command_lines_accepted_by_scripts(label, tmp_path):
    opts = run_grid.parse_args(
        [
            "--algos",
            label,
            "--envs",
            "Hopper-v5",
            "--lags",
            "2",
            "--seeds",
            "3",
            "--lag-modes",
            "fixed",
            "--total-timesteps",
            "500000",
            "--out",
            str(tmp_path),
            "--",
            "--num-envs",
            "4",
            "--num-steps",
            "64",
        ]
    )
    (run,) = run_grid.build_runs(opts)
    module = script_module(Path(run.cmd[1]).name)
    args = module.parse_args(run.cmd[2:])
    assert (args.exp_name, args.env_id, args.lag, args.lag_mode, args.seed) == (label, "Hopper-v5", 2, "fixed", 3)
    assert (args.torch_threads, args.run_dir, args.num_envs) == (1, str(run.run_dir), 4)
    if label.startswith("vaco"):
        assert args.filter == ("nofilter" not in label) and args.realign == ("norealign" not in label)
        if "delta" in label:
            assert math.isclose(args.tv_threshold, aggregate._num_key(label))
        if "rhobar" in label:
            assert math.isclose(args.rho_bar, aggregate._num_key(label))
    # aggregate.py labels the run the same way whether it came from the runner (exp_name = label) or from a
    # wandb sweep (exp_name = the script's default, ablation read from the flags)
    parsed = dataclasses.asdict(args)
    assert aggregate.algo_label(parsed) == f"{label}[fixed]"
    assert aggregate.algo_label(dict(parsed, exp_name=Path(run.cmd[1]).stem)) == f"{label}[fixed]"


# ------------------------------------------------------------------------------------------ grid runner

FAKE_SCRIPT = r"""
import argparse, json, os, sys, time
t0 = time.time()
p = argparse.ArgumentParser()
for flag in ("exp-name", "env-id", "run-dir", "lag-mode"):
    p.add_argument("--" + flag, "--" + flag.replace("-", "_"), dest=flag.replace("-", "_"))
for flag in ("seed", "lag", "total-timesteps", "torch-threads"):
    p.add_argument("--" + flag, "--" + flag.replace("-", "_"), dest=flag.replace("-", "_"), type=int)
p.add_argument("--tv-threshold", type=float, default=0.2)
p.add_argument("--filter", dest="filter", action="store_true", default=True)
p.add_argument("--no-filter", dest="filter", action="store_false")
p.add_argument("--fail", action="store_true")
p.add_argument("--sleep", type=float, default=0.0)
args, unknown = p.parse_known_args()
args.lag_mode = args.lag_mode or "uniform"
os.makedirs(args.run_dir, exist_ok=True)
record = dict(vars(args), argv=sys.argv[1:], omp=os.environ.get("OMP_NUM_THREADS"))
json.dump(record, open(os.path.join(args.run_dir, "args.json"), "w"))
print("fake training", args.exp_name, args.seed, flush=True)
if args.fail:
    print("Traceback (most recent call last):\nRuntimeError: boom, fake failure", file=sys.stderr)
    sys.exit(3)
time.sleep(args.sleep)
# TensorBoard's own event writer (what torch's SummaryWriter wraps), to spare each run the torch import
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter
w = EventFileWriter(args.run_dir)
def add_scalar(tag, value, step):
    w.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)])))
T = args.total_timesteps
base = 100.0 * args.seed + 10.0 * args.lag + (5.0 if args.exp_name.startswith("vaco") else 0.0)
for step in range(T // 10, T + 1, T // 10):
    add_scalar("charts/episodic_return", base if step > 0.9 * T else -1000.0, step)
    add_scalar("lag/final_tv", 0.1 + 0.01 * args.lag, step)
time.sleep(0.5)  # long enough for the two workers' runs to overlap
w.close()
json.dump({"global_step": T, "final_return": base, "start": t0, "end": time.time()},
          open(os.path.join(args.run_dir, "summary.json"), "w"))
"""


def run_runner(argv, timeout=120):
    cmd = [sys.executable, str(REPO / "tools" / "run_grid.py"), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_run_grid_fake_script(tmp_path):
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_SCRIPT)
    out = tmp_path / "grid"
    argv = [
        "--algos",
        "ppo",
        "vaco-nofilter",
        "bad=spo --fail",
        "--envs",
        "Hopper-v5",
        "--lags",
        "2",
        "--seeds",
        "1",
        "2",
        "--total-timesteps",
        "1000",
        "--workers",
        "2",
        "--out",
        str(out),
        "--poll",
        "0.1",
    ]
    for base in ("ppo", "vaco", "spo"):
        argv += ["--script", f"{base}={fake}"]
    extra = ["--", "--num-envs", "3"]

    dry = run_runner(argv + ["--dry-run"] + extra)
    assert dry.returncode == 0 and not out.exists()
    lines = dry.stdout.strip().splitlines()
    assert len(lines) == 6 and all(line.startswith("OMP_NUM_THREADS=1 ") for line in lines)

    argv += extra
    first = run_runner(argv)
    assert first.returncode == 1, first.stdout + first.stderr
    good = sorted(p.parent.name for p in out.glob("*/summary.json"))
    assert good == [
        "Hopper-v5__ppo__lag2__s1",
        "Hopper-v5__ppo__lag2__s2",
        "Hopper-v5__vaco-nofilter__lag2__s1",
        "Hopper-v5__vaco-nofilter__lag2__s2",
    ]
    assert "4 finished" in first.stdout and "2 failed" in first.stdout
    assert "2 FAILED run(s)" in first.stdout and "RuntimeError: boom, fake failure" in first.stdout
    assert "Hopper-v5__bad__lag2__s1 (exit code 3" in first.stdout
    rec = json.loads((out / "Hopper-v5__vaco-nofilter__lag2__s2" / "args.json").read_text())
    assert rec["omp"] == "1" and rec["torch_threads"] == 1 and rec["filter"] is False
    assert rec["exp_name"] == "vaco-nofilter" and rec["run_dir"] == str(out / "Hopper-v5__vaco-nofilter__lag2__s2")
    assert rec["argv"][-2:] == ["--num-envs", "3"]
    assert (out / "Hopper-v5__ppo__lag2__s1" / "train.log").read_text().count("fake training") == 1
    spans = [json.loads(p.read_text()) for p in out.glob("*/summary.json")]
    assert any(
        a["start"] < b["end"] and b["start"] < a["end"] for a, b in itertools.combinations(spans, 2)
    ), "two workers should overlap"

    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("*/summary.json")}
    second = run_runner(argv)  # resume: finished runs are skipped, the failed ones are retried (and fail again)
    assert second.returncode == 1
    assert "4 already finished, 2 to run" in second.stdout and "2 failed" in second.stdout
    assert mtimes == {p: p.stat().st_mtime_ns for p in out.glob("*/summary.json")}

    ok_only = [a for a in argv if a != "bad=spo --fail"]
    third = run_runner(ok_only)
    assert third.returncode == 0 and "4 skipped" in third.stdout and "0 failed" in third.stdout

    # the runner's output aggregates: final score = mean over the last 10% of steps
    ref = tmp_path / "ref.csv"
    ref.write_text("env_id,random_return,reference_return\nHopper-v5,0,1000\n")
    res = aggregate.aggregate(
        [out], tmp_path / "res", reference=ref, reps=50, curve_reps=20, curve_points=10, plots=False, log=lambda m: None
    )
    final = res["final"].set_index(["algo", "seed"])
    assert final.loc[("ppo", 2), "final_return"] == pytest.approx(220.0)
    assert final.loc[("vaco-nofilter", 1), "final_return"] == pytest.approx(125.0)
    assert final.loc[("vaco-nofilter", 1), "normalized_score"] == pytest.approx(0.125)
    assert final.loc[("ppo", 1), "final_tv"] == pytest.approx(0.12)


def test_run_grid_interrupt(tmp_path):
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_SCRIPT)
    out = tmp_path / "grid"
    cmd = [
        sys.executable,
        str(REPO / "tools" / "run_grid.py"),
        "--algos",
        "ppo",
        "--envs",
        "Hopper-v5",
        "--lags",
        "0",
        "--seeds",
        "1",
        "2",
        "3",
        "--total-timesteps",
        "100",
        "--workers",
        "2",
        "--out",
        str(out),
        "--poll",
        "0.1",
        "--script",
        f"ppo={fake}",
        "--",
        "--sleep",
        "60",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    while len(list(out.glob("*/args.json"))) < 2 and time.time() < deadline:  # both workers' runs have started
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, stdout
    assert "interrupted" in stdout and "2 stopped and 1 not started" in stdout
    assert not list(out.glob("*/summary.json"))


def test_run_grid_labels_and_errors():
    assert run_grid.parse_variant("vaco-norealign-nofilter").flags == ["--no-realign", "--no-filter"]
    assert run_grid.parse_variant("vaco-delta0.05").flags == ["--tv-threshold", "0.05"]
    v = run_grid.parse_variant("impala-l9=impala --vtrace-lambda 0.9")
    assert (v.label, v.base, v.flags) == ("impala-l9", "impala", ["--vtrace-lambda", "0.9"])
    for bad in ("dqn", "vaco-nonsense", "x=dqn --a"):
        with pytest.raises(ValueError):
            run_grid.parse_variant(bad)
    opts = run_grid.parse_args(
        ["--algos", "ppo", "--ablations", "--envs", "A-v0", "B-v0", "--lags", "0", "8", "--seeds", "1", "2", "--shard", "1/3"]
    )
    assert opts.algos[:2] == ["ppo", "vaco"] and len(opts.algos) == 2 + len(run_grid.ABLATIONS)
    full = run_grid.build_runs(
        run_grid.parse_args(
            ["--algos", "ppo", "--ablations", "--envs", "A-v0", "B-v0", "--lags", "0", "8", "--seeds", "1", "2"]
        )
    )
    assert len(full) == len(opts.algos) * 2 * 2 * 2
    assert [r.run_dir for r in run_grid.build_runs(opts)] == [r.run_dir for r in full[1::3]]
    assert full[0].seed == 1 and full[-1].seed == 2  # seed-major order


# ------------------------------------------------------------------------------------------ aggregation

REF = {"TaskA-v0": (0.0, 100.0), "TaskB-v0": (-100.0, 100.0)}  # random, reference
# normalised final scores (seed-major rows, task columns) per (algo, lag); 4 seeds x 2 tasks
SCORES = {
    ("ppo", 0): [[0.1, 0.5], [0.2, 0.9], [0.8, 0.3], [1.2, 0.4]],
    ("ppo", 4): [[0.0, 0.1], [0.1, 0.2], [0.3, 0.2], [0.2, 0.0]],
    ("vaco", 0): [[0.5, 0.6], [0.7, 0.8], [0.9, 1.0], [1.1, 1.3]],
    ("vaco", 4): [[0.4, 0.5], [0.6, 0.7], [0.8, 0.9], [1.0, 1.1]],
    ("vaco-nofilter", 0): [[0.3, 0.3], [0.3, 0.3], [0.3, 0.3], [0.3, 0.3]],
    ("vaco-nofilter", 4): [[0.2, 0.2], [0.2, 0.2], [0.2, 0.2], [0.2, 0.2]],
}
T = 1000


def write_synthetic_run(root: Path, algo: str, task: str, lag: int, seed: int, score: float, finished=True):
    from torch.utils.tensorboard import SummaryWriter

    lo, hi = REF[task]
    final = lo + score * (hi - lo)
    d = root / f"{task}__{algo}__lag{lag}__s{seed}"
    d.mkdir(parents=True)
    args = {
        "exp_name": "vaco_mujoco" if algo.startswith("vaco") else f"{algo}_mujoco",
        "env_id": task,
        "lag": lag,
        "lag_mode": "uniform",
        "seed": seed,
        "total_timesteps": T,
    }
    if algo.startswith("vaco"):
        args.update(tv_threshold=0.2, rho_bar=1.0, realign=True, filter=algo != "vaco-nofilter")
    (d / "args.json").write_text(json.dumps(args))
    w = SummaryWriter(str(d))
    for step in range(100, 901, 100):  # outside the last 10%: must not count
        w.add_scalar("charts/episodic_return", -500.0, step)
        w.add_scalar("lag/final_tv", 5.0, step)
    w.add_scalar("charts/episodic_return", final + 10.0, 960)
    w.add_scalar("charts/episodic_return", final - 10.0, 1000)
    w.add_scalar("lag/final_tv", 0.05 + 0.01 * lag, 1000)
    w.add_scalar("lag/backward_tv", 0.02 * lag, 1000)
    w.add_scalar("charts/SPS", 1234.0, 1000)
    for i, r in enumerate([1.0, 2.0, 6.0]):
        w.add_scalar("eval/episodic_return", r, i)
    w.close()
    if finished:
        (d / "summary.json").write_text(json.dumps({"global_step": T, "final_return": final}))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for (algo, lag), matrix in SCORES.items():
        for seed_idx, row in enumerate(matrix):
            for task, score in zip(sorted(REF), row):
                write_synthetic_run(root, algo, task, lag, seed_idx + 1, score)
    write_synthetic_run(root, "ppo", "TaskA-v0", 0, 7, 99.0, finished=False)  # unfinished: ignored
    ref = root.parent / "reference.csv"
    ref.write_text(
        "# test table\nenv_id,random_return,reference_return\n" + "".join(f"{k},{lo},{hi}\n" for k, (lo, hi) in REF.items())
    )
    out = root.parent / "results"
    res = aggregate.aggregate([root], out, reference=ref, reps=200, curve_reps=50, curve_points=20, seed=0, log=lambda m: None)
    return root, out, res


def test_normalise():
    ref = pd.DataFrame(
        {"random_return": [0.0, -100.0], "reference_return": [100.0, 100.0]},
        index=pd.Index(["TaskA-v0", "TaskB-v0"], name="env_id"),
    )
    assert np.allclose(aggregate.normalise([50.0, 0.0, 300.0], ["TaskA-v0", "TaskB-v0", "TaskB-v0"], ref), [0.5, 0.5, 2.0])


def test_metrics_match_rliable():
    from rliable import metrics

    rs = np.random.RandomState(0)
    for shape in [(4, 2), (5, 3), (10, 5), (7, 1), (3, 4)]:
        x = rs.randn(*shape)
        expected = [
            metrics.aggregate_median(x),
            metrics.aggregate_iqm(x),
            metrics.aggregate_mean(x),
            metrics.aggregate_optimality_gap(x),
        ]
        assert np.allclose(aggregate.aggregate_metrics(x), expected)
        y = rs.randn(*shape, 6)
        assert np.allclose(aggregate.iqm_per_point(y), [metrics.aggregate_iqm(y[..., t]) for t in range(6)])


def test_aggregate_known_answers(synthetic):
    _, out, res = synthetic
    agg = pd.read_csv(out / "aggregate.csv")
    get = lambda algo, lag, m: agg[(agg.algo == algo) & (agg.lag == lag) & (agg.metric == m)].iloc[0]  # noqa: E731
    # ppo lag 0: values 0.1 .5 .2 .9 .8 .3 1.2 .4 -> sorted .1 .2 .3 .4 .5 .8 .9 1.2; IQM drops 2 each end
    assert get("ppo", 0, "iqm").estimate == pytest.approx((0.3 + 0.4 + 0.5 + 0.8) / 4)
    assert get("ppo", 0, "mean").estimate == pytest.approx(4.4 / 8)
    # median over tasks of per-task means: TaskA 2.3/4, TaskB 2.1/4 -> median of two = their mean
    assert get("ppo", 0, "median").estimate == pytest.approx((2.3 / 4 + 2.1 / 4) / 2)
    # optimality gap: 1 - mean(min(x, 1)) = 1 - (4.4 - 0.2) / 8
    assert get("ppo", 0, "optimality_gap").estimate == pytest.approx(1 - 4.2 / 8)
    assert get("vaco", 4, "iqm").estimate == pytest.approx((0.6 + 0.7 + 0.8 + 0.9) / 4)
    nf = get("vaco-nofilter", 0, "iqm")
    assert nf.estimate == pytest.approx(0.3) and nf.ci_low == pytest.approx(0.3) and nf.ci_high == pytest.approx(0.3)
    for _, r in agg.iterrows():
        assert r.ci_low <= r.ci_high and r.n_tasks == 2 and r.runs_per_task == 4
        if r.metric in ("iqm", "mean"):
            assert r.ci_low - 1e-9 <= r.estimate <= r.ci_high + 1e-9
    assert set(agg.metric) == {"median", "iqm", "mean", "optimality_gap", "auc_iqm"}
    # fixed random state: the CIs are reproducible
    again = aggregate.aggregate_table(res["final"], reps=200, seed=0, log=lambda m: None)
    assert np.allclose(again.ci_low.to_numpy(), res["aggregate"].ci_low.to_numpy())


def test_aggregate_csv_contents(synthetic):
    root, out, _ = synthetic
    final = pd.read_csv(out / "final.csv")
    assert len(final) == 6 * 4 * 2 and not final["run_dir"].str.contains("s7").any()  # unfinished left out
    assert set(final.algo) == {"ppo", "vaco", "vaco-nofilter"}  # labels derived from exp_name + ablation flags
    row = final[(final.algo == "ppo") & (final.task == "TaskB-v0") & (final.lag == 0) & (final.seed == 2)].iloc[0]
    assert row.final_return == pytest.approx(-100 + 0.9 * 200)  # mean of the two points after 90% of training
    assert row.normalized_score == pytest.approx(0.9)
    assert row.final_tv == pytest.approx(0.05) and row.eval_return == pytest.approx(3.0)
    assert final[final.lag == 4].backward_tv.to_numpy() == pytest.approx(0.08)
    runs = pd.read_csv(out / "runs.csv")
    assert {
        "run_dir",
        "algo",
        "task",
        "lag",
        "lag_mode",
        "seed",
        "step",
        "episodic_return",
        "final_tv",
        "backward_tv",
        "sps",
    } <= set(runs.columns)
    assert len(runs) == len(final) * 11  # steps 100..900, 960, 1000
    one = runs[(runs.algo == "vaco") & (runs.task == "TaskA-v0") & (runs.lag == 4) & (runs.seed == 3)]
    assert one.step.tolist() == [100, 200, 300, 400, 500, 600, 700, 800, 900, 960, 1000]
    assert one.episodic_return.iloc[-1] == pytest.approx(0.8 * 100 - 10)
    curves = pd.read_csv(out / "iqm_curves.csv")
    first = curves[(curves.algo == "ppo") & (curves.lag == 0)].iloc[0]
    # at the first grid point every run is at -500: TaskA -> -5, TaskB -> -2; IQM of four of each = -3.5
    assert first.step == pytest.approx(T / 20) and first.iqm == pytest.approx(-3.5)
    per_task = pd.read_csv(out / "per_task.csv")
    assert per_task[(per_task.algo == "vaco") & (per_task.lag == 0)].runs.tolist() == [4, 4]


def test_plots_written(synthetic):
    _, out, res = synthetic
    for name in (
        "aggregate_vs_lag.png",
        "aggregate_intervals.png",
        "iqm_curves.png",
        "task_curves.png",
        "final_tv.png",
        "ablation_components.png",
    ):
        assert name in res["written"]
        assert (out / name).stat().st_size > 10_000, name
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_algo_labels():
    base = {"exp_name": "vaco_mujoco", "tv_threshold": 0.2, "rho_bar": 1.0, "realign": True, "filter": True}
    assert aggregate.algo_label(base) == "vaco"
    assert aggregate.algo_label(dict(base, realign=False, filter=False)) == "vaco-norealign-nofilter"
    assert aggregate.algo_label(dict(base, tv_threshold=0.05)) == "vaco-delta0.05"
    assert aggregate.algo_label(dict(base, rho_bar=2.0, lag_mode="fixed")) == "vaco-rhobar2[fixed]"
    assert aggregate.algo_label({"exp_name": "spo_mujoco"}) == "spo"
    assert aggregate.algo_label({"exp_name": "my-variant"}) == "my-variant"
    fams = aggregate.ablation_families(["vaco", "vaco-delta0.1", "vaco-nofilter", "vaco-rhobar2", "ppo"])
    assert fams == {"components": ["vaco-nofilter"], "delta": ["vaco-delta0.1"], "rhobar": ["vaco-rhobar2"]}


def test_reference_table_committed():
    ref = aggregate.load_reference(aggregate.DEFAULT_REFERENCE)
    for task in ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5"):
        lo, hi = ref.loc[task, ["random_return", "reference_return"]]
        assert np.isfinite(lo) and np.isfinite(hi) and hi > lo + 100, task
    assert ref.loc["Hopper-v5", "reference_return"] == pytest.approx(2741.42)


def test_measure_random(tmp_path):
    measured = aggregate.measure_random(["InvertedPendulum-v5"], episodes=2, seed=0)
    table = aggregate.write_reference(measured, tmp_path / "ref.csv")
    assert table.loc[0, "reference_return"] == pytest.approx(888.83)
    again = aggregate.load_reference(tmp_path / "ref.csv")
    assert 0 < again.loc["InvertedPendulum-v5", "random_return"] < 100  # a random policy drops the pole fast
    assert (tmp_path / "ref.csv").read_text().startswith("# Reference returns")
