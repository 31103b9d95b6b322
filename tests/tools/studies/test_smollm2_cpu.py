"""The committed record of SmolLM2-135M-Instruct's CPU run (results/smollm2_cpu, tools/studies/smollm2_cpu.py): its
summary is what the tool writes from the record, its problems are what the tool generates, and its grades are what
the grader gives the recorded completions today."""

import csv
import filecmp
import shutil

import vaco_gsm8k as V
from conftest import ROOT
from tools.studies import smollm2_cpu as S

RECORD = ROOT / "results" / "smollm2_cpu"


def test_summary_is_generated_from_the_record(tmp_path):
    copy = tmp_path / "record"
    shutil.copytree(RECORD, copy)
    (copy / "summary.md").unlink()
    S.summarize(type("Args", (), {"out": str(copy)}))
    assert (copy / "summary.md").read_text() == (RECORD / "summary.md").read_text()


def test_problems_are_the_tools(tmp_path):
    train, heldout = S.write_problems(str(tmp_path), 100)
    assert filecmp.cmp(train, RECORD / "train.jsonl", shallow=False)
    assert filecmp.cmp(heldout, RECORD / "heldout.jsonl", shallow=False)
    train_rows, heldout_rows = V.load_jsonl(train), V.load_jsonl(heldout)
    assert (len(train_rows), len(heldout_rows)) == (125, 100)
    assert not {q for q, _ in train_rows} & {q for q, _ in heldout_rows}


def test_recorded_grades_are_the_graders():
    with open(RECORD / "eval.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 100
    for row in rows:
        for model in ("base", "trained"):
            assert int(row[f"{model}_correct"]) == V.is_correct(row[f"{model}_completion"], float(row["reference"]))
