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
