#!/usr/bin/env python
"""Round 2 of the evidence grid: each reviewer's question's measures with their intervals, and the answer against
the criteria written before the runs (docs/evidence_round2.md).

    python -m tools.studies.aggregate_round2 --out results/evidence_round2   # every table, figure and verdict.md

Sources: the committed records of the first grid (results/records/tier1, tier3: PPO, VACO, SPO and the 10-epoch
IMPALA) and of round 2 (tier5: the TV-matched PPO, tier6: IMPALA with one pass, tier7: HalfCheetah-v5, tier8: δ).
Tier 4 (the calibration, seeds 101-103) chose ε and measures nothing: `python -m tools.grid.run_grid --tier 5 --dry-run`
prints it. The standard tables and figures (tools/grid/aggregate.py) are written for every label; verdict.md is this
round's. Definitions (final score, D, IQM, ΔIQM, window TV, intervals): the criteria page; in short, D and ΔIQM
intervals come from rliable's stratified bootstrap with each (algorithm, task, lag) cell resampled on its own.
A question whose cells hold fewer runs than planned is answered **provisionally**.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from rliable import metrics

from tools.grid import aggregate
from tools.grid.calibration import TV_WINDOW, calibrate
from tools.grid.measures import score_matrix
from tools.stats import bootstrap, t_interval

REPO = Path(__file__).resolve().parents[2]
RECORDS = REPO / "results" / "records"
SOURCES = [RECORDS / f"tier{i}" for i in (1, 3, 5, 6, 7, 8)]
TASKS2 = ("Hopper-v5", "Walker2d-v5")
CHEETAH = "HalfCheetah-v5"
MATCH_TOLERANCE = 0.25  # question 1's precondition: the matched PPO's window TV within +-25% of VACO's
LEARNED = 0.1  # questions 2 and 3: "learns" = the interval's lower end above 0.1 normalised
MARGIN = 0.1  # question 4: the margin of "needs no tuning"
IMPALA1 = "impala-1pass"
PLANNED = {1: 10, 2: 10, 3: 10, 4: 5}  # runs per cell of each question


def window_tv_table(final: pd.DataFrame, runs: pd.DataFrame, window=TV_WINDOW) -> pd.DataFrame:
    """final with a `window_tv` column: each run's mean lag/final_tv over logged steps in (lo T, hi T]."""
    if "final_tv" not in runs:
        return final.assign(window_tv=np.nan)
    r = runs.merge(final[["source", "last_step"]], on="source")
    keep = (r.step > window[0] * r.last_step) & (r.step <= window[1] * r.last_step)
    per_run = r[keep].groupby("source")["final_tv"].mean()
    return final.assign(window_tv=final.source.map(per_run))


def cell(final, algo, lag, tasks):
    return final[(final.algo == algo) & (final.lag == lag) & final.task.isin(tasks)].dropna(subset=["normalized_score"])


def runs_in(final, cells, tasks) -> int:
    """The fewest runs in any (algorithm, lag, task) of `cells` [(algo, lag), ...] over `tasks`."""
    return min(len(cell(final, a, k, [t])) for a, k in cells for t in tasks)


def iqm_difference(final, x, y, lag, tasks, reps, seed) -> dict | None:
    """ΔIQM = IQM(x) − IQM(y) at `lag` over `tasks` pooled (equal runs per task), with the 95% interval of rliable's
    bootstrap applied jointly: each (algorithm, task) cell resampled on its own, both IQMs recomputed."""
    cx, cy = cell(final, x, lag, tasks), cell(final, y, lag, tasks)
    if set(cx.task) != set(tasks) or set(cy.task) != set(tasks):
        return None
    mats = [score_matrix(c, tasks=list(tasks))[0] for c in (cx, cy)]
    point, ci = bootstrap(
        {"d": mats}, lambda a, b: np.array([metrics.aggregate_iqm(a) - metrics.aggregate_iqm(b)]), reps, seed
    )
    return {
        "estimate": point["d"][0],
        "ci_low": ci["d"][0, 0],
        "ci_high": ci["d"][1, 0],
        "runs": min(len(m) for m in mats),
    }


def iqm(final, algo, lag, tasks, reps, seed) -> dict | None:
    c = cell(final, algo, lag, tasks)
    if set(c.task) != set(tasks):
        return None
    x = score_matrix(c, tasks=list(tasks))[0]
    point, ci = bootstrap({"i": x}, lambda a: np.array([metrics.aggregate_iqm(a)]), reps, seed)
    return {"estimate": point["i"][0], "ci_low": ci["i"][0, 0], "ci_high": ci["i"][1, 0], "runs": len(x)}


def difference(final, terms, tasks, reps, seed) -> dict:
    """{task or "pooled": row} of aggregate.difference_table over `tasks` only ({} if a cell is missing)."""
    rows = aggregate.difference_table(final[final.task.isin(tasks)], terms, "d", reps, seed)
    if {r["task"] for r in rows} < {*tasks, "pooled"}:
        return {}
    keep = ("estimate", "ci_low", "ci_high", "t_low", "t_high")
    return {r["task"]: {k: r[k] for k in keep} | {"runs": r["min_runs_per_cell"]} for r in rows}


def degradation(final, x, y, tasks, reps, seed) -> dict:
    """D(x, y) = (x[8] − x[0]) − (y[8] − y[0]) per task and pooled."""
    return difference(final, [(1, x, 8), (-1, x, 0), (-1, y, 8), (1, y, 0)], tasks, reps, seed)


def cell_window_tv(final, algo, lag, task) -> float:
    """The mean window TV of the runs of one (algorithm, lag, task) cell."""
    v = cell(final, algo, lag, [task]).window_tv.dropna()
    return float(v.mean()) if len(v) else float("nan")


def holds(r, predicate):
    """None while the measure `r` is missing, else whether `predicate(r)` holds."""
    return None if not r else bool(predicate(r))


def ci(r, sign="+") -> str:
    return "missing runs" if r is None else f"{r['estimate']:{sign}.3f} [{r['ci_low']:{sign}.3f}, {r['ci_high']:{sign}.3f}]"


class Question:
    """One question's measures (rows of measures.csv), criteria (rows of its markdown table) and answer."""

    def __init__(self, number, title, planned_runs, runs):
        self.number, self.title, self.rows, self.criteria, self.notes = number, title, [], [], []
        self.provisional = runs < planned_runs
        self.runs, self.planned = runs, planned_runs

    def measure(self, name, r, task="pooled"):
        if r is not None:
            self.rows.append({"question": self.number, "measure": name, "task": task, **r})
        return r

    def criterion(self, kind, text, value, holds):
        self.criteria.append((kind, text, value, holds))
        return holds

    def answer(self) -> str:
        """supports: every supporting criterion holds; refutes: a refuting one holds; else inconclusive."""
        sup = [h for k, _, _, h in self.criteria if k == "supporting"]
        ref = [h for k, _, _, h in self.criteria if k == "refuting"]
        if None in sup or None in ref:
            return "not answerable yet (missing runs)"
        return "refutes" if any(ref) else "supports" if all(sup) else "inconclusive"

    def markdown(self, answer) -> list[str]:
        tag = f" (provisional: {self.runs} of the {self.planned} planned runs in its smallest cell)" * self.provisional
        lines = [f"## Question {self.number}: {self.title}", "", f"Answer: **{answer}**{tag}", ""]
        lines += ["| kind | criterion | value | holds |", "|---|---|---|---|"]
        lines += [f"| {k} | {t} | {v} | {'n/a' if h is None else 'yes' if h else 'no'} |" for k, t, v, h in self.criteria]
        return lines + [""] + [f"- {n}" for n in self.notes] + ([""] if self.notes else [])


def is_vacos_gain_a_larger_step(final, reps, seed, clip: str | None) -> tuple[Question, str]:
    """Question 1: VACO against a PPO that moves as far (its TV matched at lag 0). `clip`: the TV-matched PPO's
    --clip-coef (None while the calibration is incomplete)."""
    p = f"ppo-clip{clip}" if clip else None
    cells = [("vaco", k) for k in (0, 4, 8)] + [(p, k) for k in (0, 4, 8)]
    q = Question(1, "is VACO's gain robustness to lag, or a larger step?", PLANNED[1], runs_in(final, cells, TASKS2))
    if p is None:
        return q, "not answerable yet (the calibration is incomplete)"
    matched = []
    for t in TASKS2:
        v, m = cell_window_tv(final, "vaco", 0, t), cell_window_tv(final, p, 0, t)
        matched.append(bool(abs(m - v) <= MATCH_TOLERANCE * v) if np.isfinite(m) else None)
        q.rows.append({"question": 1, "measure": f"window TV at lag 0: {p} / vaco", "task": t, "estimate": m / v})
        q.criterion(
            "precondition", f"{p}'s window TV at lag 0 within ±25% of VACO's ({t})", f"{m:.4f} vs {v:.4f}", matched[-1]
        )
    d = degradation(final, "vaco", p, TASKS2, reps, seed)
    for t, r in d.items():
        q.measure(f"D(vaco, {p})", r, t)
    d8 = q.measure(f"ΔIQM_8(vaco, {p})", iqm_difference(final, "vaco", p, 8, TASKS2, reps, seed))
    d0 = q.measure(f"ΔIQM_0(vaco, {p})", iqm_difference(final, "vaco", p, 0, TASKS2, reps, seed))
    for a in ("vaco", p, "ppo"):
        for k in (0, 4, 8):
            q.measure(f"IQM_{k}({a}), two tasks", iqm(final, a, k, TASKS2, reps, seed))
    for k in (0, 4, 8):  # against the first grid's PPO (ε = 0.2) at every lag, on its two tasks: not criteria
        q.measure(f"ΔIQM_{k}(vaco, ppo), two tasks", iqm_difference(final, "vaco", "ppo", k, TASKS2, reps, seed))
        for t, r in difference(final, [(1, "vaco", k), (-1, "ppo", k)], TASKS2, reps, seed).items():
            q.measure(f"mean_{k}(vaco) − mean_{k}(ppo)", r, t)
    pooled = d.get("pooled")
    q.criterion("supporting", "pooled D_TV: 95% interval above 0", ci(pooled), holds(pooled, lambda r: r["ci_low"] > 0))
    per_task = ", ".join(f"{t} {ci(d.get(t))}" for t in TASKS2)
    q.criterion(
        "supporting", "D_TV > 0 on both tasks", per_task, holds(d, lambda d: all(d[t]["estimate"] > 0 for t in TASKS2))
    )
    q.criterion("supporting", "ΔIQM_8: 95% interval above 0", ci(d8), holds(d8, lambda r: r["ci_low"] > 0))
    q.criterion("refuting", "pooled D_TV ≤ 0", ci(pooled), holds(pooled, lambda r: r["estimate"] <= 0))
    q.criterion("refuting", "ΔIQM_8 ≤ 0", ci(d8), holds(d8, lambda r: r["estimate"] <= 0))
    q.notes.append(f"ΔIQM_0 (VACO's lead at lag 0 over the matched PPO, not a criterion): {ci(d0)}")
    q.notes.append(f"TV-matched PPO: {p} (`--clip-coef {clip}`), chosen on tier 4 by the calibration rule")
    answer = q.answer()
    if not answer.startswith("not") and not all(m is True for m in matched):
        answer += " (TV not matched)"
    return q, answer


def does_vaco_beat_impala_as_used(final, reps, seed) -> tuple[Question, str]:
    """Question 2: VACO against IMPALA as it is used (one pass over each batch), once IMPALA learns."""
    cells = [(IMPALA1, 0), (IMPALA1, 8), ("vaco", 0), ("vaco", 8)]
    q = Question(2, "IMPALA as it is used (one pass over each batch)", PLANNED[2], runs_in(final, cells, TASKS2))
    learn = q.measure(f"IQM_0({IMPALA1}), two tasks", iqm(final, IMPALA1, 0, TASKS2, reps, seed))
    q.measure(f"IQM_8({IMPALA1}), two tasks", iqm(final, IMPALA1, 8, TASKS2, reps, seed))
    for k in (0, 8):
        q.measure(f"IQM_{k}(impala, 10 epochs × 32 minibatches), two tasks", iqm(final, "impala", k, TASKS2, reps, seed))
    d = degradation(final, "vaco", IMPALA1, TASKS2, reps, seed)
    for t, r in d.items():
        q.measure(f"D(vaco, {IMPALA1})", r, t)
    for t, r in degradation(final, IMPALA1, "ppo", TASKS2, reps, seed).items():
        q.measure(f"D({IMPALA1}, ppo)", r, t)
    d8 = q.measure(f"ΔIQM_8(vaco, {IMPALA1})", iqm_difference(final, "vaco", IMPALA1, 8, TASKS2, reps, seed))
    pooled = d.get("pooled")
    ok = q.criterion(
        "L",
        f"{IMPALA1}'s lag-0 IQM: 95% interval above {LEARNED}",
        ci(learn, ""),
        holds(learn, lambda r: r["ci_low"] > LEARNED),
    )
    q.criterion("supporting", "ΔIQM_8(VACO, IMPALA): 95% interval above 0", ci(d8), holds(d8, lambda r: r["ci_low"] > 0))
    q.criterion(
        "supporting",
        "pooled D(VACO, IMPALA): 95% interval above 0",
        ci(pooled),
        holds(pooled, lambda r: r["ci_low"] > 0),
    )
    q.criterion("refuting", "ΔIQM_8(VACO, IMPALA) ≤ 0", ci(d8), holds(d8, lambda r: r["estimate"] <= 0))
    q.criterion("refuting", "pooled D(VACO, IMPALA) ≤ 0", ci(pooled), holds(pooled, lambda r: r["estimate"] <= 0))
    for t in TASKS2:
        tv = ", ".join(f"lag {k} {cell_window_tv(final, IMPALA1, k, t):.3f}" for k in (0, 8))
        q.notes.append(f"{IMPALA1} window TV, {t}: {tv}")
    if ok is False:
        return q, f"L fails: {IMPALA1} does not learn as a baseline here; the comparisons are not evidence about VACO"
    return q, q.answer() if ok else "not answerable yet (missing runs)"


def does_vaco_hold_on_halfcheetah(final, reps, seed) -> tuple[Question, str]:
    """Question 3: VACO against PPO with HalfCheetah-v5 as a third task: D and ΔIQM_8 over three tasks once both
    learn it."""
    cells = [(a, k) for a in ("ppo", "vaco") for k in (0, 4, 8)]
    q = Question(3, "HalfCheetah-v5 as a third task", PLANNED[3], runs_in(final, cells, [CHEETAH]))
    learned = []
    for a in ("ppo", "vaco"):
        mean, half, n = t_interval(cell(final, a, 0, [CHEETAH]).normalized_score)
        r = {"estimate": mean, "ci_low": mean - half, "ci_high": mean + half} if n >= 2 else None
        q.measure(f"mean normalised score of {a} at lag 0 (t-interval)", r, CHEETAH)
        learned.append(
            q.criterion(
                "L3",
                f"{a} on {CHEETAH} at lag 0: 95% t-interval above {LEARNED}",
                ci(r, ""),
                holds(r, lambda r: r["ci_low"] > LEARNED),
            )
        )
    l3 = all(learned)
    d_hc = degradation(final, "vaco", "ppo", [CHEETAH], reps, seed).get(CHEETAH)
    q.measure("D_HC(vaco, ppo)", d_hc, CHEETAH)
    tasks3 = [*TASKS2, CHEETAH] if l3 else list(TASKS2)
    d = degradation(final, "vaco", "ppo", tasks3, reps, seed)
    for t, r in d.items():
        q.measure(f"D(vaco, ppo), {len(tasks3)} tasks", r, t)
    d8 = q.measure(f"ΔIQM_8(vaco, ppo), {len(tasks3)} tasks", iqm_difference(final, "vaco", "ppo", 8, tasks3, reps, seed))
    pooled = d.get("pooled")
    q.criterion(
        "supporting",
        f"{len(tasks3)}-task pooled D: 95% interval above 0",
        ci(pooled),
        holds(pooled, lambda r: r["ci_low"] > 0),
    )
    q.criterion(
        "supporting",
        "D > 0 on each task",
        ", ".join(f"{t} {d[t]['estimate']:+.3f}" for t in tasks3 if t in d),
        holds(d, lambda d: all(d[t]["estimate"] > 0 for t in tasks3)),
    )
    q.criterion("supporting", f"{len(tasks3)}-task ΔIQM_8: 95% interval above 0", ci(d8), holds(d8, lambda r: r["ci_low"] > 0))
    tvs = {k: cell_window_tv(final, "vaco", k, CHEETAH) for k in (4, 8)}
    q.criterion(
        "supporting",
        f"VACO's window TV on {CHEETAH} within 0.075–0.125 at lags 4, 8",
        ", ".join(f"lag {k} {v:.3f}" for k, v in tvs.items()),
        all(abs(v - 0.1) <= 0.025 for v in tvs.values()) if all(map(np.isfinite, tvs.values())) else None,
    )
    q.criterion("refuting", f"{len(tasks3)}-task pooled D ≤ 0", ci(pooled), holds(pooled, lambda r: r["estimate"] <= 0))
    q.criterion("refuting", f"{len(tasks3)}-task ΔIQM_8 ≤ 0", ci(d8), holds(d8, lambda r: r["estimate"] <= 0))
    if d_hc is not None:
        side = "Hopper-v5 (VACO degrades less)" if d_hc["ci_low"] > 0 else "Walker2d-v5 (VACO degrades more)"
        q.notes.append(
            f"D_HC {ci(d_hc)}: "
            + (
                f"sides with {side}"
                if d_hc["ci_low"] > 0 or d_hc["ci_high"] < 0
                else "across 0, decides nothing between the first grid's tasks"
            )
        )
    if None in learned:
        return q, "not answerable yet (missing runs)"
    if not l3:
        q.notes.append(f"{CHEETAH} not learned at this budget (L3 fails): left out of the three-task measures")
        return q, f"L3 fails: {CHEETAH} not learned at this budget"
    return q, q.answer()


def does_delta_need_tuning(final, reps, seed) -> tuple[Question, str]:
    """Question 4: VACO's TV threshold δ halved and doubled at lag 8, against the margin of "needs no tuning"."""
    labels = {0.1: "vaco-delta0.1", 0.4: "vaco-delta0.4"}
    cells = [(a, 8) for a in labels.values()]
    q = Question(4, "how much does VACO's TV threshold δ matter?", PLANNED[4], runs_in(final, cells, TASKS2))
    effects = {}
    for delta, a in labels.items():
        e = difference(final, [(1, a, 8), (-1, "vaco", 8)], TASKS2, reps, seed)
        for t, r in e.items():
            q.measure(
                f"E({delta:g}) = VACO(δ={delta:g}) − VACO(δ=0.2) at lag 8",
                r,
                t,
            )
        effects[delta] = e.get("pooled")
    every = effects if all(effects.values()) else None
    text = "; ".join(f"E({d:g}) {ci(e)}" for d, e in effects.items())
    q.criterion(
        "supporting",
        f"both pooled intervals inside [−{MARGIN}, +{MARGIN}]",
        text,
        holds(every, lambda es: all(-MARGIN <= e["ci_low"] and e["ci_high"] <= MARGIN for e in es.values())),
    )
    q.criterion(
        "refuting",
        f"a pooled interval entirely outside ±{MARGIN}",
        text,
        holds(every, lambda es: any(e["ci_low"] > MARGIN or e["ci_high"] < -MARGIN for e in es.values())),
    )
    held = []
    for delta, a in {**labels, 0.2: "vaco"}.items():
        for t in TASKS2:
            v = cell_window_tv(final, a, 8, t)
            held.append(bool(abs(v - delta / 2) <= 0.25 * delta / 2) if np.isfinite(v) else None)
            q.criterion(
                "mechanism",
                f"window TV at lag 8 within ±25% of δ/2 = {delta / 2:g} ({t}, δ = {delta:g})",
                f"{v:.3f}",
                held[-1],
            )
    return q, q.answer()


def decile_trajectories(scores: pd.DataFrame, clip: str | None, reps, seed) -> pd.DataFrame:
    """Post hoc: each question's primary measures per training decile (`scores`: aggregate.decile_scores, one row
    per run and decile); decile 10 is the final-score window, where the criteria are read."""
    rows = []
    for d in range(1, 11):
        f = scores[scores.decile == d]
        measures = []
        if clip:
            p = f"ppo-clip{clip}"
            measures += [(1, f"D(vaco, {p})", degradation(f, "vaco", p, TASKS2, reps, seed))]
            measures += [(1, f"ΔIQM_8(vaco, {p})", {"pooled": iqm_difference(f, "vaco", p, 8, TASKS2, reps, seed)})]
        measures += [(2, f"D(vaco, {IMPALA1})", degradation(f, "vaco", IMPALA1, TASKS2, reps, seed))]
        measures += [(2, f"ΔIQM_8(vaco, {IMPALA1})", {"pooled": iqm_difference(f, "vaco", IMPALA1, 8, TASKS2, reps, seed)})]
        tasks3 = [*TASKS2, CHEETAH]
        measures += [(3, "D(vaco, ppo), 3 tasks", degradation(f, "vaco", "ppo", tasks3, reps, seed))]
        measures += [(3, "ΔIQM_8(vaco, ppo), 3 tasks", {"pooled": iqm_difference(f, "vaco", "ppo", 8, tasks3, reps, seed)})]
        for delta in (0.1, 0.4):
            e = difference(f, [(1, f"vaco-delta{delta:g}", 8), (-1, "vaco", 8)], TASKS2, reps, seed)
            measures += [(4, f"E({delta:g})", e)]
        for question, name, per_task in measures:
            rows += [
                {"question": question, "measure": name, "task": t, "decile": d, **r}
                for t, r in (per_task or {}).items()
                if r is not None
            ]
    return pd.DataFrame(rows)


def round2(sources, out, reps=5000, curve_reps=500, seed=0, plots=True, log=print) -> dict:
    res = aggregate.aggregate(
        sources, out, reps=reps, curve_reps=curve_reps, seed=seed, plots=plots, log=log, label="Evidence round 2"
    )
    final = window_tv_table(res["final"], res["runs"])
    answers = [
        is_vacos_gain_a_larger_step(final, reps, seed, calibrate(RECORDS).clip),
        does_vaco_beat_impala_as_used(final, reps, seed),
        does_vaco_hold_on_halfcheetah(final, reps, seed),
        does_delta_need_tuning(final, reps, seed),
    ]
    measures = pd.DataFrame([row for q, _ in answers for row in q.rows])
    out = Path(out)
    clip = calibrate(RECORDS).clip
    scores = res["decile_scores"]
    trajectories = decile_trajectories(scores, clip, reps, seed)
    aggregate.write_csv(
        trajectories,
        out / "measures_deciles.csv",
        [
            "POST HOC, not pre-registered: each question's primary measures computed on each run's normalised mean",
            "training return in training decile d (10 = the final-score window, where the criteria are read);",
            f"rliable's stratified bootstrap ({reps} resamples, seed {seed}); t_low, t_high: Welch t interval",
        ],
    )

    aggregate.write_csv(
        measures,
        out / "measures.csv",
        [
            "round 2's measures per question (docs/evidence_round2.md); estimate and 95% interval: D and IQM differences",
            f"from rliable's stratified bootstrap ({reps} resamples, seed {seed}), t-intervals where the row says so",
        ],
    )
    cols = ["algo", "task", "lag", "seed", "normalized_score", "window_tv", "final_tv"]
    aggregate.write_csv(
        final[[c for c in cols if c in final]],
        out / "window_tv.csv",
        [
            f"window TV: each run's mean lag/final_tv over logged steps in ({TV_WINDOW[0]:g} T, {TV_WINDOW[1]:g} T];",
            "final_tv: the last-10% mean (the annealed regime)",
        ],
    )
    lines = [
        "# Evidence, round 2: the answers against the criteria written first",
        "",
        "The criteria, as written before the runs: docs/evidence_round2.md. Summary:",
        "",
    ]
    lines += [f"- Question {q.number} ({q.title}): **{a}**" for q, a in answers] + [""]
    for q, a in answers:
        lines += q.markdown(a)
    marked = aggregate.not_learned(res["aggregate"])
    lines += ["## All cells (every label, tasks pooled as run)", ""]
    lines += [
        aggregate.results_markdown(res["aggregate"], res["degradation"], res["ablation"], res["per_task"], marked=marked)
    ]
    md = "\n".join(lines) + "\n"
    (out / "verdict.md").write_text(md)
    if plots and len(measures):
        from tools.grid import aggregate_figures

        forest = measures[measures.measure.str.startswith(("D(", "D_HC", "ΔIQM", "E("))].rename(columns={"measure": "algo"})
        aggregate_figures.plot_forest(
            out / "measures.png",
            "The questions' measures",
            forest.drop(columns="question"),
            {},
            "normalised score; > 0: the first algorithm named is ahead",
        )
    return {"answers": answers, "measures": measures, "trajectories": trajectories, "verdict_md": md, **res}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="*", help="record folders (default: results/records/tier1, 3, 5-8)")
    p.add_argument("--out", default="runs/evidence_round2")
    p.add_argument("--reps", type=int, default=5000, help="bootstrap resamples for the measures and tables")
    p.add_argument("--curve-reps", type=int, default=500, help="bootstrap resamples for curves and profiles")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plots", action="store_true")
    opts = p.parse_args(argv)
    res = round2(
        opts.sources or [s for s in SOURCES if s.exists()],
        opts.out,
        opts.reps,
        opts.curve_reps,
        opts.seed,
        not opts.no_plots,
    )
    print("\n".join(f"question {q.number}: {a}" for q, a in res["answers"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
