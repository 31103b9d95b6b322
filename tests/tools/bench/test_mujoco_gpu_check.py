"""tools/bench/mujoco_gpu_check.py on the CPU: its refusals of bad input, and its dry path (throughput rows, and an
agreement of the CPU with itself that is exact, against a reference that is not)."""

import json

import pytest


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--iterations", "1"], "--iterations must be at least 2"),
        (["--num-envs", "0"], "--num-envs and --num-steps must be positive"),
        (["--factor", "nan"], "--factor must be a positive number"),
        (["--out", "/nonexistent-folder/x.json"], "--out: no such folder"),
        (["--device", "cuda"], "CUDA is not available here"),  # the tests' torch is the CPU build
    ],
)
def test_mujoco_gpu_check_refuses_bad_input(argv, error, capsys):
    from tools.bench import mujoco_gpu_check

    with pytest.raises(SystemExit) as exit:
        mujoco_gpu_check.main(argv)
    assert exit.value.code == 2 and capsys.readouterr().err.startswith(f"error: {error}")


def test_mujoco_gpu_check_dry_path_on_cpu(tmp_path):
    """The check's machinery on the CPU: throughput rows with their split, and an agreement of the CPU with itself
    that is exact, against a reference (noise scaled by 1 + 1e-6) that is not."""
    from tools.bench import mujoco_gpu_check

    out = tmp_path / "check.json"
    argv = ["--device", "cpu", "--num-envs", "4", "--num-steps", "32", "--scripts", "ppo_mujoco", "--out", str(out)]
    assert mujoco_gpu_check.main(argv) == 0
    result = json.loads(out.read_text())
    assert [r["update_on"] for r in result["throughput"]] == ["cpu", f"cpu, {mujoco_gpu_check.cores()} threads"]
    for r in result["throughput"]:
        assert r["sps"] > 0 and r["rollout_seconds"] > 0 and r["update_seconds"] > 0
    (agreement,) = result["agreement"]
    assert agreement["device"] == {"losses": 0.0, "weights": 0.0} and agreement["passes"]
    assert agreement["reference"]["losses"] > 0 and agreement["reference"]["weights"] > 0
