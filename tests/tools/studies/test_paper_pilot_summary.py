"""The paper-shape pilot's summary (tools/studies/paper_pilot_summary.py) on made-up records of the 8 runs: the
per-run reading, D and its Welch interval against a computation written out here, the seeds a test would need,
and the same bytes from the same records."""

import numpy as np
from scipy import stats

from tools.grid.run_records import make_record, write_record
from tools.studies import paper_pilot_summary as summary

RANDOM, REFERENCE = summary.reference()


def made_up_records(folder):
    """Two seeds of four cells, 200 iterations each; the last 10 training returns of each run are `level`."""
    levels = {("ppo", 0, 1): 2000, ("ppo", 0, 2): 2200, ("ppo", 8, 1): 1500, ("ppo", 8, 2): 1900,
              ("vaco", 0, 1): 2100, ("vaco", 0, 2): 2300, ("vaco", 8, 1): 2000, ("vaco", 8, 2): 2050}  # fmt: skip
    for (algo, lag, seed), level in levels.items():
        steps = {s * 500_000: 100.0 for s in range(1, 191)} | {s * 500_000: float(level) for s in range(191, 201)}
        scalars = {"episodic_return": steps}
        if algo == "vaco":
            scalars |= {"vaco_over_budget_frac": {s: 0.25 for s in steps}, "vaco_filter_frac": {s: 0.01 for s in steps}}
        args = {"exp_name": algo, "env_id": "Hopper-v5", "lag": lag, "seed": seed, "lag_mode": "uniform"}
        record = make_record(f"Hopper-v5__{algo}__lag{lag}__s{seed}", args, {"eval_return": level + 10.0}, scalars, [])
        starts = [{"cpu_seconds": 3600.0, "wall_seconds": 1800.0}, {"cpu_seconds": 3600.0, "wall_seconds": 1800.0}]
        record["pilot"] = {
            "commit": "abc",
            "starts": starts,
            # The scripts log perf/* as running totals (Progress): iterations of 20, 24 and 30 s; one of 16 s.
            "perf": {"rollout_seconds": [20, 44, 74], "update_seconds": [16]},
        }
        write_record(record, folder / f"{record['name']}.json.gz")
    return levels


def test_summary_of_made_up_runs(tmp_path):
    levels = made_up_records(tmp_path / "records")
    out = tmp_path / "out"
    assert summary.main(["--records", str(tmp_path / "records"), "--out", str(out)]) == 0
    text = (out / "summary.md").read_text()
    assert "8 of 8 runs finished." in text

    norm = lambda r: (r - RANDOM) / (REFERENCE - RANDOM)  # noqa: E731
    cells = {c: np.array([norm(levels[(*c, s)]) for s in (1, 2)]) for c in [("vaco", 8), ("vaco", 0), ("ppo", 8), ("ppo", 0)]}
    d = cells["vaco", 8].mean() - cells["vaco", 0].mean() - cells["ppo", 8].mean() + cells["ppo", 0].mean()
    v = [x.var(ddof=1) / 2 for x in cells.values()]
    dof = sum(v) ** 2 / sum(vi**2 / 1 for vi in v)
    half = stats.t.ppf(0.975, dof) * np.sqrt(sum(v))
    minus = lambda x: f"{x:+.3f}".replace("-", "\u2212")  # noqa: E731
    assert f"{minus(d)} [{minus(d - half)}, {minus(d + half)}] (95% Welch t): not shown" in text

    sd = np.sqrt(np.mean([x.var(ddof=1) for x in cells.values()]))
    n_interval, n_power = int(np.ceil((1.96 * 2 * sd / 0.1) ** 2)), int(np.ceil(4 * sd**2 * (1.96 + 0.8416) ** 2 / 0.01))
    assert f"±0.1: {n_interval}; for 80% power against D = 0.1: {n_power}, that is {4 * n_power} runs" in text
    assert f"about {4 * n_power * 2:.0f} CPU-hours at 2.0 per run" in text

    row = "| vaco | 0 | 2 | {:.3f} (sd {:.3f}) |".format(cells["vaco", 0].mean(), cells["vaco", 0].std(ddof=1))
    assert row in text and "| 0.250 / 0.010 |" in text and "| 24.0 / 16.0 | 2.00 |" in text

    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert summary.main(["--records", str(tmp_path / "records"), "--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    assert sorted(first) == ["curves.png", "curves.svg", "runs.csv", "summary.md"]


def test_no_records_is_one_line(tmp_path, capsys):
    assert summary.main(["--records", str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0 and not (tmp_path / "out").exists()
