#!/usr/bin/env python
"""The readings on the results pages, written from the committed result files by the one reading rule
(tools/readings.py).

    python -m tools.studies.pages           # rewrite every generated block of README.md and docs/*.md
    python -m tools.studies.pages --check   # exit 1 naming each block that is not what the files give

A generated block is the text between `<!-- readings: NAME -->` and the next `<!-- end -->` of a page; the text
around it explains and states no effect of its own. Sources: results/evidence_grid_500k (degradation.csv,
ablation.csv, deciles_d.csv, rise_9_to_10.csv), results/evidence_round2 (measures.csv, measures_deciles.csv,
rise_9_to_10.csv, verdict.md), results/gsm8k_forward_lag/summary.md and results/smollm2_cpu/summary.md (whose
readings tools/studies/gsm8k_forward_lag.py and smollm2_cpu.py write with the same rule); regenerate those first
(docs/results.md, docs/evidence_round2_results.md, docs/gsm8k_forward_lag.md).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from tools import readings as R

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    "README.md",
    "docs/index.md",
    "docs/results.md",
    "docs/evidence_round2_results.md",
    "docs/gsm8k_forward_lag.md",
    "docs/vaco_mujoco.md",
    "docs/spo_mujoco.md",
    "docs/impala_mujoco.md",
    "docs/ppo_mujoco.md",
    "docs/gsm8k.md",
]
BLOCK_RE = re.compile(r"(<!-- readings: ([\w-]+) -->)(.*?)(<!-- end -->)", re.S)
TASKS = ("Hopper-v5", "Walker2d-v5")
DECILES_SHOWN = (1, 3, 5, 7, 9, 10)
MARGIN = 0.1  # the margin of "no effect", question 4's pre-registered margin (docs/evidence_round2.md)


class Measure:
    """An estimate with its bootstrap interval and, for a difference of means, its Welch t interval."""

    def __init__(self, row):
        self.estimate = float(row["estimate"])
        self.boot = (float(row["ci_low"]), float(row["ci_high"]))
        welch = (row.get("t_low"), row.get("t_high"))
        self.welch = tuple(map(float, welch)) if all(pd.notna(v) for v in welch) else None
        self.intervals = [self.boot] + ([self.welch] if self.welch else [])

    def said(self, higher="higher", lower="lower", none=R.NOT_SHOWN) -> str:
        return R.reading(self.estimate, *self.intervals, higher=higher, lower=lower, none=none)

    def value(self, digits=3) -> str:
        return R.value(self.estimate, *self.boot, digits)

    def welch_text(self) -> str:
        return R.interval(*self.welch) if self.welch else "–"

    def both(self) -> str:
        """'est [boot]' and, where there is one, '(Welch t [...])'."""
        return self.value() + (f" (Welch t {R.interval(*self.welch)})" if self.welch else "")


def read_csv(path) -> pd.DataFrame:
    return pd.read_csv(path, comment="#")


def one(frame, **where) -> Measure:
    sel = frame
    for k, v in where.items():
        sel = sel[sel[k] == v]
    if len(sel) != 1:
        raise SystemExit(f"error: {len(sel)} rows for {where} (expected one): regenerate the results first")
    return Measure(sel.iloc[0])


def markdown_table(summary: str, caption_start: str) -> list[list[str]]:
    """The rows (cells) of the table that follows the paragraph starting with `caption_start` in `summary`."""
    text = summary[summary.index(caption_start) :]
    rows = [line for line in text.split("\n\n", 2)[1].splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def numbers(ks) -> str:
    ks = [str(k) for k in ks]
    return ", ".join(ks[:-1]) + " and " + ks[-1] if len(ks) > 1 else "".join(ks) or "none"


class Sources:
    """The committed result files the readings are written from."""

    def __init__(self, root=REPO):
        res = Path(root) / "results"
        grid, r2 = res / "evidence_grid_500k", res / "evidence_round2"
        self.deg = read_csv(grid / "degradation.csv")
        self.abl = read_csv(grid / "ablation.csv")
        self.dec = read_csv(grid / "deciles_d.csv")
        self.rise1 = read_csv(grid / "rise_9_to_10.csv")
        self.deg300k = read_csv(res / "ppo_vs_vaco_hopper_300k" / "degradation.csv")
        self.m = read_csv(r2 / "measures.csv")
        self.mdec = read_csv(r2 / "measures_deciles.csv")
        self.rise2 = read_csv(r2 / "rise_9_to_10.csv")
        self.answers = dict(re.findall(r"^- Question (\d+) \(.*\): \*\*(.+)\*\*$", (r2 / "verdict.md").read_text(), re.M))
        summary = (res / "gsm8k_forward_lag" / "summary.md").read_text()
        self.gain = markdown_table(summary, "Late − start, read")
        self.paired = markdown_table(summary, "VACO − PPO-clip, paired by seed")
        self.smollm2 = (res / "smollm2_cpu" / "summary.md").read_text()

    # --- the measures, by name
    def d(self, task="pooled", algo="vaco"):
        return one(self.deg, measure="degradation_difference", algo=algo, task=task)

    def r2(self, measure, task="pooled"):
        return one(self.m, measure=measure, task=task)

    def ablation(self, algo, task="pooled"):
        return one(self.abl, algo=algo, task=task)


# ---------------------------------------------------------------------------------------------- the blocks


def loses_less(m: Measure, who="VACO") -> str:
    return m.said(higher=f"{who} loses less", lower=f"{who} loses more")


def scores(m: Measure, who="VACO") -> str:
    return m.said(higher=f"{who} higher", lower=f"{who} lower")


def gsm8k_accuracy(s: Sources) -> tuple[list, list]:
    """The K of the paired late-accuracy differences, and those whose reading shows a direction."""
    ks = [row[0] for row in s.paired]
    return ks, [row[0] for row in s.paired if row[3] != R.NOT_SHOWN]


def headline(s: Sources) -> str:
    iqm8, iqm8_matched = s.r2("ΔIQM_8(vaco, ppo), 3 tasks"), s.r2("ΔIQM_8(vaco, ppo-clip0.3)")
    d, d_matched = s.d(), s.r2("D(vaco, ppo-clip0.3)")
    lead = {
        "VACO higher": "VACO scores higher than PPO with ε = 0.2 at lag 8",
        "VACO lower": "VACO scores lower than PPO with ε = 0.2 at lag 8",
        R.NOT_SHOWN: "a difference between VACO's and PPO's (ε = 0.2) scores at lag 8 is not shown",
    }[scores(iqm8)]
    matched = {
        "VACO higher": "VACO scores higher",
        "VACO lower": "VACO scores lower",
        R.NOT_SHOWN: "a difference in score is not shown",
    }[scores(iqm8_matched)]
    claim = [loses_less(x).replace("VACO loses", "shown: VACO loses") for x in (d, d_matched)]
    ks, shown = gsm8k_accuracy(s)
    gsm = f"shown at K = {numbers(shown)}" if shown else f"not shown at any of K = {numbers(ks)}"
    return (
        f"**At 0.5M environment steps, {lead} (ΔIQM_8 over three tasks {iqm8.value()}); against PPO with ε = 0.3, "
        f"which moves as far per update, {matched} (ΔIQM_8 {iqm8_matched.value()}). That VACO loses less of its "
        f"score than PPO as the lag grows, the paper's claim: {claim[0]} against ε = 0.2 (pooled D {d.value()}), "
        f"{claim[1]} against ε = 0.3 (D {d_matched.value()}); on the GSM8k proxy a difference in late accuracy "
        f"between VACO and PPO-clip is {gsm}.**"
    )


def rise(s: Sources) -> str:
    cells = s.rise2[s.rise2.algo.isin(["ppo", "ppo-clip0.3", "vaco"])]
    up = R.count_above(zip(cells.t_low, cells.t_high))
    return (
        f"the return is shown to rise over the last tenth of the run (decile 9 to decile 10, its 95% t interval above 0) "
        f"in {up} of the {len(cells)} PPO (ε = 0.2 and 0.3) and VACO cells of both rounds (`rise_9_to_10.csv`)"
    )


def verdict_table(s: Sources) -> str:
    rows = [  # (measure, one Measure or several shown in one row, the words)
        ("D against PPO, Hopper-v5 and Walker2d-v5 (pre-registered)", s.d(), loses_less),
        ("D on Hopper-v5 / on Walker2d-v5", [s.d("Hopper-v5"), s.d("Walker2d-v5")], loses_less),
        ("D against PPO, three tasks (with HalfCheetah-v5)", s.r2("D(vaco, ppo), 3 tasks"), loses_less),
        (
            "ΔIQM_0 / ΔIQM_4 / ΔIQM_8 against PPO, two tasks",
            [s.r2(f"ΔIQM_{k}(vaco, ppo), two tasks") for k in (0, 4, 8)],
            scores,
        ),
        ("ΔIQM_8 against PPO, three tasks", s.r2("ΔIQM_8(vaco, ppo), 3 tasks"), scores),
        ("D against PPO with ε = 0.3, which moves as far per update as VACO", s.r2("D(vaco, ppo-clip0.3)"), loses_less),
        ("ΔIQM_8 against PPO with ε = 0.3", s.r2("ΔIQM_8(vaco, ppo-clip0.3)"), scores),
        ("D against IMPALA run with one pass", s.r2("D(vaco, impala-1pass)"), loses_less),
        ("ΔIQM_8 against IMPALA run with one pass", s.r2("ΔIQM_8(vaco, impala-1pass)"), scores),
        ("VACO without the realignment (`--no-realign`) − VACO, lag 8", s.ablation("vaco-norealign"), R.reading),
        ("VACO without the filter (`--no-filter`) − VACO, lag 8", s.ablation("vaco-nofilter"), R.reading),
        ("δ = 0.1 − δ = 0.2 (VACO, lag 8)", s.r2("E(0.1) = VACO(δ=0.1) − VACO(δ=0.2) at lag 8"), R.reading),
        ("δ = 0.4 − δ = 0.2 (VACO, lag 8)", s.r2("E(0.4) = VACO(δ=0.4) − VACO(δ=0.2) at lag 8"), R.reading),
    ]
    lines = ["| measure | value [95% bootstrap interval] | 95% Welch t interval | reading |", "|---|---|---|---|"]
    for name, ms, words in rows:
        ms = ms if isinstance(ms, list) else [ms]
        cells = [" / ".join(f(m) for m in ms) for f in (Measure.value, Measure.welch_text, lambda m: said_by(m, words))]
        cells[1] = cells[1] if any(m.welch for m in ms) else "–"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    ks, shown = gsm8k_accuracy(s)
    said = f"VACO differs at K = {numbers(shown)}" if shown else R.NOT_SHOWN + " at any K"
    lines.append(f"| GSM8k proxy: VACO − PPO-clip in late accuracy, K = {numbers(ks)} (paired t, 3 seeds) | – | – | {said} |")
    return "\n" + "\n".join(lines) + "\n"


def gsm8k_k1(s: Sources) -> str:
    row = next(r for r in s.gain if r[0] == "ppo-clip" and r[1] == "1")
    return f"K = 1's own gain in late accuracy over 128 steps: {row[4]}, {row[3]}"


def grid_headline(s: Sources) -> str:
    d = s.d()
    leads = [(k, s.r2(f"ΔIQM_{k}(vaco, ppo), two tasks")) for k in (0, 4, 8)]
    parts = [f"{scores(m).replace('VACO ', '')} at lag {k} ({m.value()})" for k, m in leads]
    return (
        f"**That VACO loses less of its score than PPO as the lag grows: {loses_less(d).replace('VACO', 'shown: VACO')}"
        f", the pre-registered D {d.both()}. VACO's IQM against PPO's (ΔIQM, two tasks): {'; '.join(parts)}.**"
    )


def grid_degradation(s: Sources) -> str:
    out = []
    for algo, name in (("ppo", "PPO"), ("vaco", "VACO")):
        m = one(s.deg, measure="degradation", algo=algo, task="pooled")
        out.append(f"{name} {m.said(higher='gains', lower='loses')}, {m.both()}")
    return "from lag 0 to lag 8, pooled: " + "; ".join(out)


def grid_d_per_task(s: Sources) -> str:
    parts = [f"{t}: {loses_less(s.d(t))}, D {s.d(t).both()}" for t in TASKS]
    return "; ".join(parts) + f"; pooled: {loses_less(s.d())}, D {s.d().both()}"


def spo_d(s: Sources) -> str:
    return "; ".join(f"{t}: {loses_less(s.d(t, 'spo'), 'SPO')}, D {s.d(t, 'spo').both()}" for t in (*TASKS, "pooled"))


def hopper_300k(s: Sources) -> str:
    m = one(s.deg300k, measure="degradation_difference", algo="vaco[fixed]", task="Hopper-v5")
    boot, welch = R.value(m.estimate, *m.boot, digits=0), R.interval(*m.welch, digits=0)
    return f"D = {boot} (Welch t {welch}): {loses_less(m)}"


def lag0_lead(s: Sources) -> str:
    parts = []
    for t in (*TASKS, "pooled"):
        m = s.r2("mean_0(vaco) − mean_0(ppo)", t)
        parts.append(f"{t}: {scores(m)}, {m.both()}")
    return "; ".join(parts)


def decile_runs(frame, higher, lower, **where) -> str:
    """Which deciles read in each direction, by both intervals."""
    sel = frame
    for k, v in where.items():
        sel = sel[sel[k] == v]
    said = {int(r.decile): Measure(r._asdict()).said(higher=higher, lower=lower) for r in sel.itertuples()}
    at = {w: sorted(d for d, v in said.items() if v == w) for w in (higher, lower)}
    out = [f"{w} at decile{'s' * (len(at[w]) > 1)} {numbers(at[w])}" for w in (higher, lower)]
    shown = [o for o, w in zip(out, (higher, lower)) if w in said.values()]
    return ", ".join(shown) if shown else f"{R.NOT_SHOWN} at any decile"


def grid_deciles(s: Sources) -> str:
    lines = ["| decile | Hopper-v5 | Walker2d-v5 | pooled |", "|---|---|---|---|"]
    for dec in DECILES_SHOWN:
        cells = []
        for t in (*TASKS, "pooled"):
            m = one(s.dec, decile=dec, task=t)
            cells.append(f"{m.value()}, t {m.welch_text()}: {loses_less(m)}")
        lines.append(f"| {dec} | " + " | ".join(cells) + " |")
    text = (
        "\n".join(lines)
        + "\n\nBy both intervals, over all ten deciles: "
        + "; ".join(f"{t}: " + decile_runs(s.dec, "VACO loses less", "VACO loses more", task=t) for t in (*TASKS, "pooled"))
    )
    return "\n" + text + ".\n"


def grid_rises(s: Sources) -> str:
    lines = ["| algorithm | task | lag | rise, decile 9 → 10 [95% t interval] | reading |", "|---|---|---|---|---|"]
    for r in s.rise1[s.rise1.algo.isin(["ppo", "vaco"]) & (s.rise1.lag > 0)].itertuples():
        said = R.reading(r.rise, (r.t_low, r.t_high), higher="rises", lower="falls")
        lines.append(f"| {r.algo.upper()} | {r.task} | {r.lag} | {R.value(r.rise, r.t_low, r.t_high)} | {said} |")
    return "\n" + "\n".join(lines) + "\n"


def ablation(s: Sources) -> str:
    lines = ["| ablation − VACO, lag 8 | task | value [95% bootstrap] | 95% Welch t | reading |", "|---|---|---|---|---|"]
    for algo, name in (("vaco-norealign", "`--no-realign`"), ("vaco-nofilter", "`--no-filter`")):
        for t in (*TASKS, "pooled"):
            m = s.ablation(algo, t)
            no_effect = R.equivalence(m.estimate, *m.intervals, margin=MARGIN, same="no effect", none="")
            said = m.said() + (f"; {no_effect} (both intervals)" if no_effect else "")
            lines.append(f"| {name} | {t} | {m.value()} | {m.welch_text()} | {said} |")
    return "\n" + "\n".join(lines) + "\n"


QUESTIONS = [  # (question, its measures: (label, measure name, words))
    (1, [("D", "D(vaco, ppo-clip0.3)", loses_less), ("ΔIQM_8", "ΔIQM_8(vaco, ppo-clip0.3)", scores)]),
    (2, [("D", "D(vaco, impala-1pass)", loses_less), ("ΔIQM_8", "ΔIQM_8(vaco, impala-1pass)", scores)]),
    (3, [("three-task D", "D(vaco, ppo), 3 tasks", loses_less), ("ΔIQM_8", "ΔIQM_8(vaco, ppo), 3 tasks", scores)]),
    (
        4,
        [
            ("E(0.1)", "E(0.1) = VACO(δ=0.1) − VACO(δ=0.2) at lag 8", R.reading),
            ("E(0.4)", "E(0.4) = VACO(δ=0.4) − VACO(δ=0.2) at lag 8", R.reading),
        ],
    ),
]
QUESTION_LINKS = {
    1: "[1. VACO against a PPO that moves as far (ε = 0.3)](evidence_round2_results.md#question-1-a-ppo-that-moves-as-far-as-vaco)",
    2: "[2. IMPALA as it is used (one pass)](evidence_round2_results.md#question-2-impala-as-it-is-used)",
    3: "[3. HalfCheetah-v5 as a third task](evidence_round2_results.md#question-3-halfcheetah-v5-as-a-third-task)",
    4: "[4. δ halved and doubled](evidence_round2_results.md#question-4-vacos-tv-threshold)",
}


def said_by(m, words):
    return m.said() if words is R.reading else words(m)


def round2_questions(s: Sources) -> str:
    lines = ["| question | pre-registered answer | what the intervals show |", "|---|---|---|"]
    for q, measures in QUESTIONS:
        parts = [f"{label} {s.r2(name).both()}: {said_by(s.r2(name), words)}" for label, name, words in measures]
        lines.append(f"| {QUESTION_LINKS[q]} | {s.answers[str(q)]} | {'; '.join(parts)} |")
    return "\n" + "\n".join(lines) + "\n"


def round2_q1(s: Sources) -> str:
    lines = ["| measure | value, 95% bootstrap interval | Welch t interval | reading |", "|---|---|---|---|"]
    for t in ("pooled", *TASKS):
        m = s.r2("D(vaco, ppo-clip0.3)", t)
        lines.append(f"| D(VACO, PPO ε = 0.3), {t} | {m.value()} | {m.welch_text()} | {loses_less(m)} |")
    for k in (8, 0):
        m = s.r2(f"ΔIQM_{k}(vaco, ppo-clip0.3)")
        lines.append(f"| ΔIQM_{k}(VACO, PPO ε = 0.3) | {m.value()} | – | {scores(m)} |")
    for k in (8, 0):
        m = s.r2(f"ΔIQM_{k}(vaco, ppo), two tasks")
        lines.append(f"| ΔIQM_{k}(VACO, PPO ε = 0.2), the first grid | {m.value()} | – | {scores(m)} |")
    return "\n" + "\n".join(lines) + "\n"


def d_halfcheetah(s: Sources) -> str:
    m = s.r2("D_HC(vaco, ppo)", "HalfCheetah-v5")
    return f"D_HC {m.both()}: {loses_less(m)}"


def impala_1pass(s: Sources) -> str:
    d, iqm8 = s.r2("D(vaco, impala-1pass)"), s.r2("ΔIQM_8(vaco, impala-1pass)")
    return f"D(VACO, IMPALA) {d.both()}: {loses_less(d)}; ΔIQM_8(VACO, IMPALA) {iqm8.value()}: {scores(iqm8)}"


def d_matched(s: Sources) -> str:
    m = s.r2("D(vaco, ppo-clip0.3)")
    return f"D(VACO, PPO ε = 0.3) {m.both()}: {loses_less(m)}"


def round2_q4(s: Sources) -> str:
    parts = []
    for delta in ("0.1", "0.4"):
        name = f"E({delta}) = VACO(δ={delta}) − VACO(δ=0.2) at lag 8"
        per = ", ".join(f"{t} {s.r2(name, t).both()}: {s.r2(name, t).said()}" for t in TASKS)
        parts.append(f"E({delta}) pooled {s.r2(name).both()}: {s.r2(name).said()} ({per})")
    return "; ".join(parts)


def round2_deciles(s: Sources) -> str:
    names = [
        ("D(VACO, PPO ε = 0.3), pooled", "D(vaco, ppo-clip0.3)", loses_less),
        ("ΔIQM_8(VACO, PPO ε = 0.3)", "ΔIQM_8(vaco, ppo-clip0.3)", scores),
        ("D(VACO, IMPALA one pass), pooled", "D(vaco, impala-1pass)", loses_less),
        ("ΔIQM_8(VACO, IMPALA one pass)", "ΔIQM_8(vaco, impala-1pass)", scores),
        ("D(VACO, PPO), three tasks", "D(vaco, ppo), 3 tasks", loses_less),
        ("E(0.4)", "E(0.4)", R.reading),
    ]
    lines = ["| decile | " + " | ".join(t for t, _, _ in names) + " |", "|---" * (len(names) + 1) + "|"]
    for dec in DECILES_SHOWN:
        cells = []
        for _, name, words in names:
            m = one(s.mdec, measure=name, task="pooled", decile=dec)
            cells.append(f"{m.value()}: {said_by(m, words)}")
        lines.append(f"| {dec} | " + " | ".join(cells) + " |")
    runs = []
    for title, name, words in names:
        higher, lower = ("higher", "lower") if words is R.reading else said_by_words(words)
        runs.append(f"{title}: " + decile_runs(s.mdec, higher, lower, measure=name, task="pooled"))
    return "\n" + "\n".join(lines) + "\n\nBy every interval of the measure, over all ten deciles: " + "; ".join(runs) + ".\n"


def said_by_words(words) -> tuple[str, str]:
    return {loses_less: ("VACO loses less", "VACO loses more"), scores: ("VACO higher", "VACO lower")}[words]


def gsm8k_gain_table(s: Sources) -> str:
    lines = ["| loss | K | seeds | late − start [95% t interval] | reading |", "|---|---:|---:|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in s.gain]
    return "\n" + "\n".join(lines) + "\n"


def gsm8k_paired_table(s: Sources) -> str:
    lines = [
        "| K | seeds | VACO − PPO-clip, late accuracy | reading | VACO − PPO-clip, final TV | reading |",
        "|---:|---:|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in s.paired]
    return "\n" + "\n".join(lines) + "\n"


def gsm8k_readings(s: Sources) -> str:
    ks, shown = gsm8k_accuracy(s)
    acc = f"shown at K = {numbers(shown)}" if shown else f"{R.NOT_SHOWN} at any of K = {numbers(ks)}"
    tv = {w: [r[0] for r in s.paired if r[5] == w] for w in ("VACO higher", "VACO lower", R.NOT_SHOWN)}
    tv_text = "; ".join(f"{w} at K = {numbers(k)}" for w, k in tv.items() if k)
    gains = {w: [f"{r[0]} K = {r[1]}" for r in s.gain if r[4] == w] for w in ("gains", "loses")}
    gain_text = "; ".join(f"{w}: {numbers(k)}" for w, k in gains.items() if k) or R.NOT_SHOWN
    return (
        f"VACO − PPO-clip in late accuracy (paired t): {acc}. VACO − PPO-clip in final TV (paired t): {tv_text}. "
        f"Late − start by its t interval: {gain_text}; {R.NOT_SHOWN} in every other (loss, K)"
    )


def smollm2_accuracy(s: Sources) -> str:
    """The held-out accuracy's change and its reading, as summary.md (tools/studies/smollm2_cpu.py) wrote them with
    the rule."""
    change = re.search(r"^\| accuracy \(100 problems\) \| ([\d.]+) \| ([\d.]+) \| (.+?) \|$", s.smollm2, re.M)
    said = re.search(r"The change is (.+)\.$", s.smollm2, re.M).group(1)
    return f"greedy accuracy {change.group(1)} before, {change.group(2)} after, {change.group(3)}: {said}"


def smollm2_reward(s: Sources) -> str:
    m = re.search(r"last − first (\S+ \[.+?\]) \(95% Welch t-interval over iterations\), (.+?)\.$", s.smollm2, re.M)
    return f"last − first {m.group(1).replace('-', '−')}: {m.group(2)}"


BLOCKS = {
    "headline": headline,
    "rise": rise,
    "verdict-table": verdict_table,
    "gsm8k-k1": gsm8k_k1,
    "grid-headline": grid_headline,
    "grid-degradation": grid_degradation,
    "grid-d-per-task": grid_d_per_task,
    "lag0-lead": lag0_lead,
    "spo-d": spo_d,
    "hopper-300k": hopper_300k,
    "grid-deciles": grid_deciles,
    "grid-rises": grid_rises,
    "ablation": ablation,
    "round2-questions": round2_questions,
    "round2-q1": round2_q1,
    "round2-q4": round2_q4,
    "d-matched": d_matched,
    "smollm2-accuracy": smollm2_accuracy,
    "smollm2-reward": smollm2_reward,
    "impala-1pass": impala_1pass,
    "d-halfcheetah": d_halfcheetah,
    "round2-deciles": round2_deciles,
    "gsm8k-gain-table": gsm8k_gain_table,
    "gsm8k-paired-table": gsm8k_paired_table,
    "gsm8k-readings": gsm8k_readings,
}


def render(text: str, s: Sources, cache: dict) -> tuple[str, list[str]]:
    """`text` with every generated block rewritten; the names of the blocks it holds."""
    found = []

    def fill(m):
        name = m.group(2)
        if name not in BLOCKS:
            raise SystemExit(f"error: unknown readings block {name!r}")
        found.append(name)
        if name not in cache:
            cache[name] = BLOCKS[name](s)
        return m.group(1) + cache[name] + m.group(4)

    return BLOCK_RE.sub(fill, text), found


def pages(root=REPO) -> dict[str, tuple[str, str]]:
    """{page: (its text now, its text with every block rewritten)}."""
    s, cache, out = Sources(root), {}, {}
    for page in PAGES:
        now = (Path(root) / page).read_text(encoding="utf-8")
        out[page] = (now, render(now, s, cache)[0])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only report blocks that differ (exit 1); write nothing")
    opts = p.parse_args(argv)
    stale = [page for page, (now, new) in pages().items() if now != new]
    if opts.check:
        for page in stale:
            print(f"{page}: its readings blocks differ from what the result files give")
        return 1 if stale else 0
    for page, (now, new) in pages().items():
        if now != new:
            (REPO / page).write_text(new, encoding="utf-8")
    print(f"rewrote {', '.join(stale) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
