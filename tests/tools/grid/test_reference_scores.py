"""tools/grid/reference_scores.py: the committed reference table, and a random policy's return measured into a new one."""

from __future__ import annotations

import numpy as np
import pytest

from tools.grid import reference_scores


def test_reference_table_committed():
    ref = reference_scores.load_reference(reference_scores.DEFAULT_REFERENCE)
    for task in ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5"):
        lo, hi = ref.loc[task, ["random_return", "reference_return"]]
        assert np.isfinite(lo) and np.isfinite(hi) and hi > lo + 100, task
    assert ref.loc["Hopper-v5", "reference_return"] == pytest.approx(2741.42)


def test_measure_random(tmp_path):
    measured = reference_scores.measure_random(["InvertedPendulum-v5"], episodes=2, seed=0)
    table = reference_scores.write_reference(measured, tmp_path / "ref.csv")
    assert table.loc[0, "reference_return"] == pytest.approx(888.83)
    again = reference_scores.load_reference(tmp_path / "ref.csv")
    assert 0 < again.loc["InvertedPendulum-v5", "random_return"] < 100  # a random policy drops the pole fast
    assert (tmp_path / "ref.csv").read_text().startswith("# Reference returns")
