"""tools/grid/aggregate_figures.py: one colour per algorithm whatever the order, its variants in shades of it, and the
panels worth drawing (tests/tools/grid/test_aggregate.py checks the figures the aggregation writes)."""

import pandas as pd

from tools.grid import aggregate_figures


def test_colors():
    colors = aggregate_figures.colors_for(["impala", "vaco", "ppo", "spo", "vaco-nofilter", "mine", "ppo[fixed]"])
    assert colors["vaco"] == aggregate_figures.COLORS["vaco"] != colors["impala"] and colors["ppo[fixed]"] == colors["ppo"]
    assert len({colors[k] for k in ("impala", "vaco", "ppo", "spo", "vaco-nofilter", "mine")}) == 6
    assert colors == aggregate_figures.colors_for(
        ["ppo[fixed]", "mine", "vaco-nofilter", "spo", "ppo", "vaco", "impala"]
    )  # order-free


def test_meaningful_metrics():
    final = pd.DataFrame({"normalized_score": [0.2, 0.5, 0.9]})
    # 2 tasks, no score at the reference: no median panel (= mean), no optimality gap (= 1 - mean)
    assert aggregate_figures.meaningful_metrics(final, 2) == ["iqm", "mean"]
    assert aggregate_figures.meaningful_metrics(final.assign(normalized_score=1.2), 3) == [
        "iqm",
        "mean",
        "median",
        "optimality_gap",
    ]
