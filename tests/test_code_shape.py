"""The shape the scripts promise their readers: `diff ppo_mujoco.py X_mujoco.py` shows only what X changes, within
a line budget; the training loops (main) differ only in the algorithm's lines; PPO's script is short outside the
plumbing; vaco_gsm8k.py's method comes first."""

import ast
import difflib
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIFF_BUDGETS = {"spo_mujoco": 20, "impala_mujoco": 70, "vaco_mujoco": 80}
# What PPO's loop has that another algorithm may replace: the GAE call, the clipped loss, the clip fractions.
PPO_ONLY = ("compute_gae", "clip", "ratios", "policy_loss")


def changed_lines(a: str, b: str) -> int:
    """Lines that `diff a b` marks with < or > (GNU diff's own count, as a reader sees it)."""
    out = subprocess.run(["diff", a, b], capture_output=True, text=True, cwd=ROOT).stdout
    return sum(line[:2] in ("< ", "> ") or line in ("<", ">") for line in out.splitlines())


def function_source(path: Path, name: str) -> tuple[list[str], int, int]:
    """A top-level function's lines and its first and last line numbers."""
    text = path.read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, node).splitlines(), node.lineno, node.end_lineno


def main_diff(script: str) -> tuple[list[str], list[str]]:
    """The lines of ppo_mujoco.main that `script`'s main drops, and the lines it adds."""
    ppo, _, _ = function_source(ROOT / "ppo_mujoco.py", "main")
    other, _, _ = function_source(ROOT / f"{script}.py", "main")
    diff = [d for d in difflib.unified_diff(ppo, other, lineterm="", n=0) if not d.startswith(("---", "+++", "@@"))]
    return [d[1:] for d in diff if d.startswith("-")], [d[1:] for d in diff if d.startswith("+")]


@pytest.mark.parametrize("script", sorted(DIFF_BUDGETS))
def test_diff_against_ppo_within_budget(script):
    assert changed_lines("ppo_mujoco.py", f"{script}.py") <= DIFF_BUDGETS[script]


def test_diff_count_sees_an_added_line(tmp_path):
    changed = tmp_path / "changed.py"
    changed.write_text((ROOT / "ppo_mujoco.py").read_text().replace("\n\n", "\n\nx = 1\n", 1))
    assert changed_lines("ppo_mujoco.py", "ppo_mujoco.py") == 0
    assert changed_lines("ppo_mujoco.py", str(changed)) == 1


@pytest.mark.parametrize("script", sorted(DIFF_BUDGETS))
def test_main_differs_from_ppo_only_in_the_algorithm(script):
    """Every line of PPO's loop that another script drops is PPO's algorithm (GAE, the clipped loss and its
    statistics); the loop around them (rollout, minibatches, optimiser, logging, checkpoints) is the same."""
    dropped, added = main_diff(script)
    assert all(any(word in line for word in PPO_ONLY) for line in dropped), dropped
    assert len(dropped) + len(added) <= 30


def test_ppo_is_short_outside_the_plumbing():
    # 732 = 450 + 282 lines that came above the plumbing with what shapes main's data and logs: the section of the
    # environments and the rollout (270 lines: 219 moved from the plumbing, namely make_env 10, GymnasiumEnvs 47,
    # EnvPoolEnvs 33, make_envs 5, EpisodeStats 21, Rollouts 31, rollout_state 8, Progress 19, log_iteration 19,
    # hours_minutes_seconds 3, load_agent 6, evaluate 17; their 4 imports; initial_state 6, restore's fresh start;
    # its banners 9; blank lines 32) and main's 12 (the seeding and the device, 8 lines from start_run; 3 to call
    # initial_state, then restore_checkpoint on resume; 1 of docstring). 759 = 732 + 27 with the two choices that were
    # left below: auto's choice of backend (choose_backend 5, ENVPOOL_FROM_NUM_ENVS 3, 4 blank) and the evaluation's
    # seeds and log (evaluate_at_end 10, 2 blank; main's 2 lines to call it and save_model), and 1 line of banner.
    lines = (ROOT / "ppo_mujoco.py").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# The run's plumbing"))
    end = next(i for i, line in enumerate(lines) if line.startswith("# End of the run's plumbing."))
    assert len(lines) - (end - start + 1) <= 759


@pytest.mark.parametrize(
    "name",
    ["grpo_advantages", "ppo_clip_loss", "vaco_loss", "completion_logprobs", "iterate"]
    + ["rewards_and_advantages", "behaviour_logprobs", "update", "final_divergence"],
)
def test_gsm8k_method_within_its_first_600_lines(name):
    _, _, last = function_source(ROOT / "vaco_gsm8k.py", name)
    assert last <= 600, f"vaco_gsm8k.{name} ends at line {last}"
