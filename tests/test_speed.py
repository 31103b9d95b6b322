"""The speed work keeps the arithmetic: a tiny run logs exactly the numbers it logged before it."""

import pytest

from conftest import TINY, existing_scripts, read_scalars, run_script

# Logged by each script (TINY, --lag 1, seed 1) before the rollout and update were made faster; every change
# since kept the arithmetic, so the values must match to the last bit (same machine type, one torch thread).
PINNED = {
    "ppo_mujoco": {
        "charts/episodic_return": [14.278326034545898, 21.73508644104004],
        "losses/value_loss": [4.506672382354736, 0.27058231830596924],
        "losses/policy_loss": [-0.007953165099024773, 0.0020011086016893387],
    },
    "vaco_mujoco": {
        "charts/episodic_return": [14.278326034545898, 21.73508644104004],
        "losses/value_loss": [4.506672382354736, 0.2620490789413452],
        "losses/policy_loss": [-0.007953159511089325, 0.001793455332517624],
    },
    "spo_mujoco": {
        "charts/episodic_return": [14.278326034545898, 21.730436325073242],
        "losses/value_loss": [4.50659704208374, 0.27106475830078125],
        "losses/policy_loss": [-0.005930224433541298, 0.002589806914329529],
    },
    "impala_mujoco": {
        "charts/episodic_return": [14.278326034545898, 21.744638442993164],
        "losses/value_loss": [7.355711460113525, 0.4594293534755707],
        "losses/policy_loss": [0.0804489478468895, -0.28501245379447937],
    },
}


@pytest.mark.parametrize("script", existing_scripts())
def test_tiny_run_logs_the_pinned_numbers(script, tmp_path):
    run_script(script, *TINY, "--lag", "1", "--run-dir", tmp_path)
    scalars = read_scalars(tmp_path)
    for tag, expected in PINNED[script].items():
        assert [v for _, v in scalars[tag]] == expected, tag
