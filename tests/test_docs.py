"""The repository's spec, docs/method.md: every `§N` / `§N.M` reference points at one of its headings, and no file
points outside the repository."""

import re
import subprocess
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
