"""The documentation: every `§N` / `§N.M` reference points at a heading of the spec (docs/method.md), no file points
outside the repository, every relative link of the README and the site's pages resolves, the README stays one page
and quotes the current diff counts and CI's test command, and the site builds with `mkdocs build --strict`."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "method.md"
# Sections the scripts and the README cite; they must keep these numbers.
REQUIRED_SECTIONS = ["1", "2", "3", "3.1", "3.2", "3.3", "3.4", "4", "4.1", "5", "6", "7"]
HEADING_RE = re.compile(r"^#{2,3}[ \t]+(\d+(?:\.\d+)?)\.?[ \t]", re.MULTILINE)
REFERENCE_RE = re.compile(r"§[ \t]?(\d+(?:\.\d+)*)")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".csv", ".sh", ""}
SKIPPED_DIRS = {".git", ".venv", "runs", "wandb", "__pycache__"}
# Internal material that a reader of the repository cannot see (assembled so this file does not match itself).
FORBIDDEN = [
    re.compile("shared" + r"[ \t]+notes", re.IGNORECASE),
    re.compile(r"\.\./" + "shared"),
    re.compile(r"(?<![\w.~-])/" + r"work/"),
]


def repository_files():
    """Files tracked by git plus untracked ones it does not ignore; without git, every file outside SKIPPED_DIRS."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in ROOT.rglob("*") if not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in paths if p.is_file() and p.suffix in TEXT_SUFFIXES)


def read_text(path):
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def spec_sections(text):
    return set(HEADING_RE.findall(text))


def bad_references(text, sections):
    """(line number, reference) for every `§N` / `§N.M` that names no heading of the spec."""
    return [
        (text.count("\n", 0, m.start()) + 1, f"§{m.group(1)}")
        for m in REFERENCE_RE.finditer(text)
        if m.group(1) not in sections
    ]


def forbidden_mentions(text):
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for pattern in FORBIDDEN for m in pattern.finditer(text)]


def test_spec_has_the_cited_sections():
    sections = spec_sections(SPEC.read_text(encoding="utf-8"))
    missing = [s for s in REQUIRED_SECTIONS if s not in sections]
    assert not missing, f"docs/method.md lacks the headings {missing}"


def test_every_section_reference_points_at_a_heading():
    sections = spec_sections(SPEC.read_text(encoding="utf-8"))
    problems, references = [], 0
    for path in repository_files():
        text = read_text(path)
        if text is None:
            continue
        references += len(REFERENCE_RE.findall(text))
        problems += [f"{path.relative_to(ROOT)}:{line}: {ref}" for line, ref in bad_references(text, sections)]
    assert references > 0, "no section references found: the scan is broken"
    assert not problems, "references to headings that docs/method.md does not have:\n" + "\n".join(problems)


def test_no_file_points_outside_the_repository():
    problems = []
    for path in repository_files():
        text = read_text(path)
        if text is not None:
            problems += [f"{path.relative_to(ROOT)}:{line}: {hit!r}" for line, hit in forbidden_mentions(text)]
    assert not problems, "mentions of material outside the repository:\n" + "\n".join(problems)


# The section sign is spelled S here, so that the repository scan does not read these examples as references.
@pytest.mark.parametrize(
    "text, expected",
    [
        ("see docs/method.md S3.4 and S4", []),
        ("Spec: docs/method.md S1-S3.1.", []),
        ("see docs/method.md S3.5", [(1, "S3.5")]),
        ("ok S2\nwrong S 8", [(2, "S8")]),
        ("S4.1.2 is too deep", [(1, "S4.1.2")]),
    ],
)
def test_bad_references_are_found(text, expected):
    sections = spec_sections("## 1. A\n## 2. B\n### 3.1 C\n## 4. D\n### 3.4 E\n### 4.1 F\n")
    assert sections == {"1", "2", "3.1", "3.4", "4", "4.1"}
    sign = "\N{SECTION SIGN}"
    found = bad_references(text.replace("S", sign), sections)
    assert found == [(line, ref.replace("S", sign)) for line, ref in expected]


def test_forbidden_mentions_are_found():
    hits = ["shared" + " notes", ".." + "/shared", "/" + "work/"]  # split, as in FORBIDDEN
    outside = f"see the {hits[0]}, or {hits[1]}/docs, or {hits[2]}main/x.py"
    assert [hit for _, hit in forbidden_mentions(outside)] == hits
    assert forbidden_mentions("runs/x, ./work/y, network/work/z, `../` in code") == []


# ---- The README and the site's pages ----

README = ROOT / "README.md"
README_MAX_LINES = 220
# A markdown link or image, `[text](target)` / `![alt](target)`, with an optional title after the target.
LINK_RE = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE_RE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN_RE = re.compile(r"`[^`\n]*`")
DIFF_COUNT_RE = re.compile(
    r"`diff ppo_mujoco\.py (\w+)\.py`(?: is)? (\d+) lines\s+\((\d+) (?:of PPO's )?removed, (\d+) added\)"
)


def documentation_pages():
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def relative_links(text):
    """(line number, target) of every link in `text` outside code, except web, mail and same-page links."""
    text = FENCE_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    text = CODE_SPAN_RE.sub(lambda m: " " * len(m.group(0)), text)
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1))
        for m in LINK_RE.finditer(text)
        if not re.match(r"[a-z][a-z0-9+.-]*:", m.group(1)) and not m.group(1).startswith("#")
    ]


def heading_anchors(text):
    """The anchors GitHub and mkdocs give the headings of a markdown file (lowercase; punctuation dropped)."""
    text = FENCE_RE.sub("", text)
    headings = re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", text, flags=re.MULTILINE)
    return {re.sub(r"[ \t]+", "-", re.sub(r"[^\w\- \t]", "", h.replace("`", "")).strip().lower()) for h in headings}


def broken_link(page, target, root=ROOT):
    """Why `target`, linked from `page`, does not resolve within `root`, or None."""
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve()
    if not resolved.exists():
        return "no such file"
    if root.resolve() not in [resolved, *resolved.parents]:
        return "outside the repository"
    if anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved.read_text(encoding="utf-8")):
        return f"no heading #{anchor}"
    return None


def test_every_relative_link_resolves():
    problems, links = [], 0
    for page in documentation_pages():
        for line, target in relative_links(page.read_text(encoding="utf-8")):
            links += 1
            why = broken_link(page, target)
            if why:
                problems.append(f"{page.relative_to(ROOT)}:{line}: {target} ({why})")
    assert links > 20, "hardly any links found: the scan is broken"
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_link_scan_finds_and_judges_links(tmp_path):
    text = 'See [a](b.md#two), ![fig](../x.png "t"), [web](https://e.org), [top](#one).\n`[no](code.md)`\n```\n[no](x)\n```\n'
    assert relative_links(text) == [(1, "b.md#two"), (1, "../x.png")]
    (tmp_path / "b.md").write_text("# One\n## 2. Two `things`\n")
    page = tmp_path / "a.md"
    assert heading_anchors((tmp_path / "b.md").read_text()) == {"one", "2-two-things"}
    assert broken_link(page, "b.md#2-two-things", root=tmp_path) is None
    assert broken_link(page, "b.md#three", root=tmp_path) == "no heading #three"
    assert broken_link(page, "c.md", root=tmp_path) == "no such file"
    assert broken_link(page, "b.md", root=tmp_path / "sub") == "outside the repository"


def test_readme_is_one_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the depth belongs on the site (docs/)"


def test_readme_runs_the_tests_as_ci_does():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    (command,) = [line for line in ci.splitlines() if "pytest" in line]
    assert command in README.read_text(encoding="utf-8").splitlines()


@pytest.mark.skipif(shutil.which("diff") is None, reason="needs diff")
def test_quoted_diff_counts_are_current():
    quoted = []
    for page in documentation_pages():
        for m in DIFF_COUNT_RE.finditer(page.read_text(encoding="utf-8")):
            quoted.append((page.relative_to(ROOT), m.group(1), *map(int, m.group(2, 3, 4))))
    assert {q[1] for q in quoted if q[0] == Path("README.md")} == {"vaco_mujoco", "spo_mujoco", "impala_mujoco"}
    problems = []
    for page, script, total, removed, added in quoted:
        out = subprocess.run(["diff", "ppo_mujoco.py", f"{script}.py"], cwd=ROOT, capture_output=True, text=True).stdout
        lines = out.splitlines()
        removed_now, added_now = sum(x.startswith("<") for x in lines), sum(x.startswith(">") for x in lines)
        now = (removed_now + added_now, removed_now, added_now)
        if (total, removed, added) != now:
            problems.append(f"{page}: {script} quoted {total} ({removed} removed, {added} added), now {now}")
    assert not problems, "stale diff counts:\n" + "\n".join(problems)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (requirements-docs.txt)")
def test_site_builds_strictly(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "method" / "index.html").exists()


# ---- Every number a results page quotes is in a committed results file ----

RESULTS = ROOT / "results"
# (page, the first heading of its results part or None for the whole page, the heading after it or None). The
# criteria page (docs/evidence_round2.md) is left out: it was written before the runs and is not changed after.
RESULT_PARTS = [
    ("README.md", "## The verdict", "## Quick start"),
    ("docs/index.md", "## What we found", "## The scripts"),
    ("docs/results.md", None, None),
    ("docs/evidence_round2_results.md", None, None),
    ("docs/ppo_mujoco.md", "## Results", None),
    ("docs/vaco_mujoco.md", "## Results", None),
    ("docs/spo_mujoco.md", "## Results", None),
    ("docs/impala_mujoco.md", "## Results", None),
    ("docs/gsm8k.md", "## Forward lag on a model that learns", None),
    ("docs/gsm8k.md", "## A real pretrained model on CPU", "## Stopping and resuming a GSM8k run"),
    ("docs/gsm8k_forward_lag.md", None, "## GPU check"),
]
# A decimal number with 3 or 4 decimals (signed, the minus sign as − or -), not part of a longer token.
QUOTED_RE = re.compile(r"(?<![\w.,])([+−-]?\d+\.\d{3,4})(?![\w.%])")
# An interval "[low, high]", optionally after its estimate "x [low, high]".
INTERVAL_RE = re.compile(r"(?:([+−-]?\d+\.\d{3,4})\s+)?\[([+−-]?\d+\.\d{3,4}), ([+−-]?\d+\.\d{3,4})\]")
# An interval of returns, "x [low, high]" with signed integers (e.g. a difference in degradation of raw returns).
RETURN_INTERVAL_RE = re.compile(r"([+−-]\d+)\s+\[([+−-]\d+), ([+−-]\d+)\]")
SOURCE_NUMBER_RE = re.compile(r"[+−-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")


def canonical(token, decimals):
    """The number as the pages print it at `decimals` places, with '-' for the minus sign and no '+'."""
    text = f"{float(token.replace('−', '-')):.{decimals}f}"
    return "0." + "0" * decimals if text == "-0." + "0" * decimals else text


def result_sources():
    """The numbers of each line of every committed results file (CSV, JSON and generated markdown under results/,
    not the hand-written READMEs, not the run records), printed at 0, 3 and 4 decimals: {decimals: [row, ...]}."""
    rows = []
    for path in repository_files():
        rel = path.relative_to(ROOT).parts
        if rel[0] != "results" or path.suffix not in {".csv", ".json", ".md"} or path.name == "README.md":
            continue
        if "records" in rel:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            numbers = SOURCE_NUMBER_RE.findall(line.replace("−", "-"))
            if numbers:
                rows.append(numbers)
    return {d: [[canonical(n, d) for n in row] for row in rows] for d in (0, 3, 4)}


def results_part(page, start, end):
    text = (ROOT / page).read_text(encoding="utf-8")
    if start:
        assert start in text, f"{page}: no heading {start!r}"
        text = text[text.index(start) :]
    if end:
        assert end in text, f"{page}: no heading {end!r}"
        text = text[: text.index(end)]
    text = FENCE_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN_RE.sub(lambda m: " " * len(m.group(0)), text)


def holds_in_a_row(parts, rows):
    """Whether some row holds the printed numbers `parts` one after the other (an estimate and its interval are
    adjacent columns of a CSV, or adjacent in a generated table's cell)."""
    digits = [len(p.split(".")[1]) if "." in p else 0 for p in parts]
    wanted = [canonical(p, d) for p, d in zip(parts, digits)]
    for r, row in enumerate(rows[digits[0]]):
        for i in (i for i, v in enumerate(row[: len(row) - len(parts) + 1]) if v == wanted[0]):
            if all(rows[d][r][i + j] == w for j, (d, w) in enumerate(zip(digits, wanted))):
                return True
    return False


def unsourced_numbers(text, rows):
    """(line, what) for each quoted number no results row holds, and each interval whose estimate and ends no row
    holds side by side."""
    every = {v for d in (3, 4) for row in rows[d] for v in row}
    line_of = lambda m: text.count("\n", 0, m.start()) + 1  # noqa: E731
    problems = []
    for m in QUOTED_RE.finditer(text):
        decimals = len(m.group(1).split(".")[1])
        if canonical(m.group(1), decimals) not in every and canonical(m.group(1).lstrip("+−-"), decimals) not in every:
            problems.append((line_of(m), m.group(1)))
    for m in [*INTERVAL_RE.finditer(text), *RETURN_INTERVAL_RE.finditer(text)]:
        if not holds_in_a_row([p for p in m.groups() if p], rows):
            problems.append((line_of(m), m.group(0)))
    return problems


def test_every_quoted_result_is_in_a_committed_file():
    rows = result_sources()
    assert len(rows[3]) > 1000, "hardly any rows of results found: the scan is broken"
    problems, quoted = [], 0
    for page, start, end in RESULT_PARTS:
        text = results_part(page, start, end)
        quoted += len(QUOTED_RE.findall(text))
        problems += [f"{page} (results part), line {line}: {what}" for line, what in unsourced_numbers(text, rows)]
    assert quoted > 200, "hardly any quoted numbers found: the scan is broken"
    assert not problems, "numbers that no committed results file holds:\n" + "\n".join(problems)


def as_rows(*rows):
    return {d: [[canonical(str(v), d) for v in row] for row in rows] for d in (0, 3, 4)}


def test_unsourced_numbers_are_found():
    rows = as_rows([0.0403, -0.1046, 0.1872, 0.04], [0.49, 0.428, 0.547], [1.0, 0.429, 9.0, 0.548])
    assert unsourced_numbers("D +0.040 [−0.105, +0.187] and 0.490 [0.428, 0.547]", rows) == []
    assert unsourced_numbers("the IQM 0.490 [0.429, 0.548]", rows) == [(1, "0.490 [0.429, 0.548]")]
    assert unsourced_numbers("\n+0.040 [0.428, 0.547]", rows) == [(2, "+0.040 [0.428, 0.547]")]
    assert unsourced_numbers("0.167, 3.5%, 1,131, 2026.", rows) == [(1, "0.167")]
    assert unsourced_numbers("D = +328\n[+57, +604]", as_rows([328.17, 57.34, 604.21])) == []
    assert unsourced_numbers("D = +328 [+62, +610]", as_rows([328.17, 57.34, 604.21])) == [(1, "+328 [+62, +610]")]
