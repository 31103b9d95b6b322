"""The grids of sweeps/*.yaml (wandb sweep files, `method: grid`) as cells: one run each, with its folder name and
its command line. The SLURM launcher (tools/grid/slurm.py) reads the grids from here; wandb reads the same files.

A cell's folder name is its place in the grid: `{env_id}__{algorithm}__lag{lag}__s{seed}`, where the algorithm is
the script's name without `_mujoco`, followed by `-{flag}{value}` for every other parameter the grid varies
(`Hopper-v5__vaco-tv_threshold0.1__lag8__s1`). Parameters the grid fixes (`value:`) are in every command line.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

# The parameters that name a cell's folder on their own (the rest a grid varies go after the algorithm).
NAMED = ("env_id", "lag", "seed")


@dataclass
class Cell:
    name: str  # the run folder's name
    program: str  # the script, relative to the repository root
    params: dict  # {flag (underscores): value}, the fixed parameters included

    def flags(self) -> list[str]:
        """The command-line flags of the cell, as wandb renders them (`--param=value`; the scripts take both forms)."""
        return [f"--{key}={value}" for key, value in self.params.items()]  # booleans: True / False, as wandb's


def read_sweep(path) -> list[Cell]:
    """The cells of a grid sweep file, in the file's order (the last parameter varying fastest); ValueError with a
    one-line message if the file is not a grid sweep that this reader understands."""
    path = Path(path)
    try:
        sweep = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path} cannot be read: {getattr(e, 'strerror', None) or str(e).splitlines()[0]}")
    if not isinstance(sweep, dict) or not isinstance(sweep.get("parameters"), dict) or "program" not in sweep:
        raise ValueError(f"{path} is not a sweep file (program and parameters)")
    if sweep.get("method") != "grid":
        raise ValueError(f"{path}: only `method: grid` sweeps have cells (this one is {sweep.get('method')!r})")
    fixed, varied = {}, {}
    for key, spec in sweep["parameters"].items():
        if not isinstance(spec, dict) or not ({"value", "values"} & spec.keys()):
            raise ValueError(f"{path}: parameter {key} has neither `value` nor `values`")
        if "values" in spec:
            if not isinstance(spec["values"], list) or not spec["values"]:
                raise ValueError(f"{path}: parameter {key}'s values must be a non-empty list")
            varied[key] = spec["values"]
        else:
            fixed[key] = spec["value"]
    program = str(sweep["program"])
    algorithm = Path(program).stem.removesuffix("_mujoco")
    cells = []
    for combination in itertools.product(*varied.values()):
        chosen = dict(zip(varied, combination))
        params = {key: chosen.get(key, fixed.get(key)) for key in sweep["parameters"]}
        label = algorithm + "".join(f"-{key}{value}" for key, value in chosen.items() if key not in NAMED)
        parts = [str(params["env_id"])] if "env_id" in params else []
        parts.append(label)
        parts += [f"lag{params['lag']}"] if "lag" in params else []
        parts += [f"s{params['seed']}"] if "seed" in params else []
        name = re.sub(r"[^\w.=+-]", "-", "__".join(parts))
        cells.append(Cell(name, program, params))
    names = [cell.name for cell in cells]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: two cells would share a run folder name")
    return cells
