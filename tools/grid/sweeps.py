"""The grids of sweeps/*.yaml (wandb sweep files, `method: grid`) as cells: one run each, with its label, its folder
name and its command line. wandb reads the same files; the SLURM launcher (tools/grid/slurm.py) and the local runner
(tools/grid/run_grid.py, whose tiers are lists of these files) read the grids from here.

A cell's label is what tools/grid/aggregate.py groups its runs by (the run's `--exp-name`): the file's `exp_name` if it
fixes one, else the script's name without `_mujoco`; then, for every other parameter the grid lists under `values`
(env_id, lag and seed aside), `-{short}{value}`, or `-no{short}` for `false` and nothing for `true`. `short` is the
parameter's name without underscores, or its name in the method's notation where it has one (SHORT):
`vaco` with `tv_threshold: {values: [0.1]}` is `vaco-delta0.1`; with `realign: {values: [false]}`, `vaco-norealign`.
Numbers are written as `{:g}` writes them (2.0 is `2`). A cell's folder is `{env_id}__{label}__lag{lag}__s{seed}`
(`Hopper-v5__vaco-delta0.1__lag8__s1`), the name of its record in results/records/. Parameters the grid fixes
(`value:`) are in every command line.

`select(cells, where)` keeps the cells whose parameters take the given values (`env_id=Hopper-v5`, `seed=1,2`: one of
the listed values; several conditions: all of them), as the launcher's `--where` asks.
"""

from __future__ import annotations

import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
# The parameters that name a cell's folder on their own (the rest a grid varies go into its label).
NAMED = ("env_id", "lag", "seed")
# A parameter's name in a label, where the method's notation has one (the rest: the name without underscores).
SHORT = {"tv_threshold": "delta", "rho_bar": "rhobar", "clip_coef": "clip", "update_epochs": "epochs"}


@dataclass
class Cell:
    name: str  # the run folder's name
    label: str  # what the aggregator groups the run by: its --exp-name
    program: str  # the script, relative to the repository root
    params: dict  # {flag (underscores): value}, the fixed parameters included
    varied: tuple = ()  # the parameters the grid lists `values` for (each cell's own)

    def flags(self, **override) -> list[str]:
        """The command-line flags of the cell, as wandb renders them (`--param=value`; the scripts take both forms),
        `--exp_name` first (the label, unless the file sets it); `override` replaces or adds parameters."""
        params = {"exp_name": self.label, **self.params, **override}
        return [f"--{key}={value}" for key, value in params.items()]  # booleans: True / False, as wandb's


def label_part(key: str, value) -> str:
    """What a varied parameter adds to a cell's label (the module docstring gives the rule)."""
    short = SHORT.get(key, key.replace("_", ""))
    if isinstance(value, bool):
        return "" if value else f"-no{short}"
    return f"-{short}{value:g}" if isinstance(value, float) else f"-{short}{value}"


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
        base = str(fixed.get("exp_name", algorithm))
        label = base + "".join(label_part(key, value) for key, value in chosen.items() if key not in NAMED)
        parts = [str(params["env_id"])] if "env_id" in params else []
        parts.append(label)
        parts += [f"lag{params['lag']}"] if "lag" in params else []
        parts += [f"s{params['seed']}"] if "seed" in params else []
        name = re.sub(r"[^\w.=+-]", "-", "__".join(parts))
        cells.append(Cell(name, label, program, params, tuple(varied)))
    names = [cell.name for cell in cells]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: two cells would share a run folder name")
    return cells


def parse_value(text: str):
    """A value from the command line as YAML reads it in a sweep file (1 is a number, false a boolean)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def same_value(given, value) -> bool:
    """`given` (from the command line) equals a sweep's value; a boolean matches only a boolean (True == 1 in Python)."""
    return isinstance(given, bool) == isinstance(value, bool) and given == value


def select(cells: list[Cell], where: list[str]) -> list[Cell]:
    """The cells whose parameters match every `key=value[,value...]` of `where` (the key with `_` or `-`); ValueError
    with a one-line message for a condition that is not `key=value`, a key the sweep does not have, or a value that
    none of its cells takes."""
    chosen = cells
    for condition in where:
        key, sep, values = condition.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not values:
            raise ValueError(f"--where {condition}: expected key=value or key=value1,value2")
        if key not in cells[0].params:
            raise ValueError(f"--where {condition}: the sweep has no parameter {key} (it has {', '.join(cells[0].params)})")
        taken = []  # the sweep's values of key, in its order (a value may be a list: no set)
        for cell in cells:
            taken += [] if cell.params[key] in taken else [cell.params[key]]
        wanted = [parse_value(value) for value in values.split(",")]
        for text, given in zip(values.split(","), wanted):
            if not any(same_value(given, value) for value in taken):
                listed = ", ".join(map(str, taken))
                raise ValueError(f"--where {condition}: {key} is never {text} in the sweep (its values: {listed})")
        chosen = [cell for cell in chosen if any(same_value(given, cell.params[key]) for given in wanted)]
    return chosen


def sweep_values(stem: str, key: str) -> list:
    """The values a sweep file gives a parameter (`values`, or `[value]`)."""
    spec = yaml.safe_load((SWEEPS / f"{stem}.yaml").read_text())["parameters"][key]
    return list(spec["values"]) if "values" in spec else [spec["value"]]


def split_at_dashes(argv=None) -> tuple[list[str], list[str]]:
    """(a launcher's own arguments, the flags after `--` that go to every training run it starts): the command-line
    convention of the grid runner, the SLURM launcher and the studies that start runs."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]
