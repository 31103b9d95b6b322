"""The GSM8k forward-lag runner (tools/studies/gsm8k_forward_lag.py) on tiny models in seconds."""

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tools.studies import gsm8k_forward_lag as FL  # noqa: E402
from tools.tiny_gsm8k import write_gsm8k_jsonl, write_tiny_model  # noqa: E402

torch.set_num_threads(1)


# ---------------------------------------------------------------- forward-lag runner


def synthetic_record(loss="vaco", k=2, seed=1):
    spec = {"loss": loss, "K": k, "seed": seed, "learning_rate": 3e-4, "tv_threshold": 0.02, "total_steps": 4}
    return {
        "spec": spec,
        "seconds": 1,
        "steps": {
            "position": [1, 2, 1, 2],
            "tv": [0.0, 0.02, 0.0, 0.005],
            "dropped_fraction": [0.0, 0.3, 0.0, 0.0],
            "over_budget": [0, 1, 0, 0],
            "filtered_completion_fraction": [0.0, 0.75, 0.0, 0.0],
        },
        "iterations": {"reward": [0.1, 0.2], "tv_final": [0.01, 0.03]},
        "evals": [{"step": 0, "accuracy": 0.3}, {"step": 2, "accuracy": 0.4}, {"step": 4, "accuracy": 0.5}],
    }


def test_run_row_by_hand():
    row = FL.run_row(synthetic_record())
    assert row["over_budget_fraction"] == 0.25  # 1 of 4 minibatches
    assert row["tokens_filtered_when_over"] == pytest.approx(0.3)
    assert row["completions_filtered_when_over"] == pytest.approx(0.75)
    assert row["dropped_fraction"] == pytest.approx(0.075)
    assert row["D_mean_lagged"] == pytest.approx(0.0125)  # the two position-2 minibatches
    assert row["D_max"] == pytest.approx(0.02)
    assert row["tv_final"] == pytest.approx(0.02)
    assert row["accuracy_late"] == pytest.approx(0.45)  # evaluations at steps >= 2
    ppo = FL.run_row(synthetic_record(loss="ppo-clip"))
    assert ppo["over_budget_fraction"] == ""


@pytest.fixture
def tiny_start(tmp_path, monkeypatch):
    model = write_tiny_model(tmp_path / "model", "llama")
    data = write_gsm8k_jsonl(tmp_path / "train.jsonl")
    monkeypatch.setattr(FL, "start_model", lambda work: (model, data, data, {"sft_accuracy": 0.0}))
    monkeypatch.setattr(FL, "MAX_NEW_TOKENS", 6)
    return tmp_path


def test_table_runs_records_shares_k1_and_resumes(tiny_start, monkeypatch):
    out = tiny_start / "out"
    argv = ["table", "--out", str(out), "--work", str(tiny_start / "work"), "--lags", "1", "2", "--seeds", "1"]
    argv += ["--total-steps", "2", "--eval-every", "2", "--eval-size", "3", "--prompts-per-step", "2"]
    argv += ["--num-generations", "4", "--learning-rates", "1e-2", "--tv-threshold", "0.01"]
    FL.main(argv)
    records = FL.load_records(str(out / "records"))
    assert sorted(records) == sorted(
        f"{loss}_K{k}_s1_lr0.01_d0.01" for loss in ["ppo-clip", "vaco"] for k in [1, 2]
    )  # fmt: skip
    shared, source = records["vaco_K1_s1_lr0.01_d0.01"], records["ppo-clip_K1_s1_lr0.01_d0.01"]
    assert shared["same_as"] == "ppo-clip_K1_s1_lr0.01_d0.01" and shared["spec"]["loss"] == "vaco"
    assert shared["steps"] == source["steps"] and shared["evals"] == source["evals"]
    assert records["vaco_K2_s1_lr0.01_d0.01"]["steps"]["position"] == [1, 2]
    for name in ["summary.md", "runs.csv", "curves.csv", "forward_lag.png"]:
        assert (out / name).stat().st_size > 0, name
    summary = (out / "summary.md").read_text()
    # each loss: its two rows of the table and of the late − start readings (one seed: no interval to read)
    assert summary.count("| vaco | ") == 4 and summary.count("| ppo-clip | ") == 4
    assert summary.count("no interval (one seed)") == 6  # 4 late − start rows, 2 paired differences at K = 2

    # Everything is recorded: a second call trains nothing and rewrites the same outputs.
    monkeypatch.setattr(FL, "run_spec", lambda *a: pytest.fail("a recorded run was run again"))
    before = (out / "runs.csv").read_text()
    FL.main(argv)
    assert (out / "runs.csv").read_text() == before
    # A changed setting is a different run: it is not taken from the records.
    with pytest.raises(pytest.fail.Exception):
        FL.main([*argv[:-2], "--tv-threshold", "0.02"])


def test_sweep_summary_counts_minibatches_over_each_budget(tmp_path):
    record = synthetic_record(loss="ppo-clip", k=16)
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "a.json").write_text(json.dumps(record))
    FL.sweep_report(str(tmp_path))(FL.load_records(str(tmp_path / "records")))
    row = [line for line in (tmp_path / "summary.md").read_text().splitlines() if line.startswith("| 0.0003 | 16")]
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    # D values 0, 0.02, 0, 0.005 against delta/2 = 0.005, 0.01, 0.015, 0.025: strictly over.
    assert cells[8:12] == ["0.250", "0.250", "0.250", "0.000"]


@pytest.mark.parametrize("argv", [["table", "--lags", "3"], ["table", "--tv-threshold", "0"], ["sweep", "--workers", "0"]])
def test_runner_bad_arguments(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        FL.main([*argv, "--out", str(tmp_path)])
    assert stop.value.code == 2 and "error:" in capsys.readouterr().err
