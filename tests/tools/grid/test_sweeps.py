"""tools/grid/sweeps.py and the sweep files it reads (sweeps/*.yaml): each file renders with wandb's own agent code (no
server) into command lines the real scripts' `parse_args` accept; the label rule on files written here; and the `--`
split of a launcher's command line."""

from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, import_script

SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))
SCRIPTS = ("ppo_mujoco.py", "vaco_mujoco.py", "spo_mujoco.py", "impala_mujoco.py")


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
    # the evidence grid's lags (tests/tools/grid/test_run_grid.py checks its cells)
    if sweep.stem.startswith(("round1_", "round2_")):
        assert set(config["parameters"]["lag"]["values"]) <= {0, 4, 8}
    else:
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
    module = import_script(config["program"].removesuffix(".py"))
    for argv, params in zip(rendered, subset):
        args = module.parse_args(argv[3:])
        for name, value in params.items():
            got = getattr(args, name)
            assert math.isclose(got, value) if isinstance(value, float) else got == value, (name, got, value)


def test_split_at_dashes():
    from tools.grid.sweeps import split_at_dashes

    assert split_at_dashes(["--tier", "1", "--", "--num-envs", "4", "--", "x"]) == (
        ["--tier", "1"],
        ["--num-envs", "4", "--", "x"],
    )
    assert split_at_dashes(["--tier", "1"]) == (["--tier", "1"], [])
    assert split_at_dashes(["--"]) == ([], [])


def test_sweep_labels():
    """The label rule of tools/grid/sweeps.py, on a file written here: exp_name, or the script's name, then the varied
    parameters (short names; `no` for false; numbers as :g writes them); folder names from it; collisions refused."""
    from tools.grid.sweeps import read_sweep

    def cells(tmp, params):
        path = Path(tmp) / "s.yaml"
        path.write_text(yaml.safe_dump({"program": "vaco_mujoco.py", "method": "grid", "parameters": params}))
        return read_sweep(path)

    with tempfile.TemporaryDirectory() as tmp:
        got = cells(tmp, {"env_id": {"values": ["Hopper-v5"]}, "realign": {"values": [True, False]},
                          "rho_bar": {"values": [2.0]}, "lag": {"values": [8]}, "seed": {"values": [3]}})  # fmt: skip
        assert [(c.name, c.label) for c in got] == [
            ("Hopper-v5__vaco-rhobar2__lag8__s3", "vaco-rhobar2"),
            ("Hopper-v5__vaco-norealign-rhobar2__lag8__s3", "vaco-norealign-rhobar2"),
        ]
        assert got[1].flags()[:2] == ["--exp_name=vaco-norealign-rhobar2", "--env_id=Hopper-v5"]
        named = cells(tmp, {"exp_name": {"value": "mine"}, "env_id": {"values": ["A-v0"]}, "lag": {"values": [0]}})
        assert [c.name for c in named] == ["A-v0__mine__lag0"] and named[0].flags() == [
            "--exp_name=mine",
            "--env_id=A-v0",
            "--lag=0",
        ]
        with pytest.raises(ValueError, match="share a run folder"):
            cells(tmp, {"a": {"values": ["1", 1]}, "lag": {"values": [0]}})  # both are -a1
