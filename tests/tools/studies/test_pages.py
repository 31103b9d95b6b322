"""The pages' readings blocks (tools/studies/pages.py): written from the committed result files by the one rule, and
up to date on every page."""

import re

import pytest

from tools import readings as R
from tools.studies import pages as P


def test_every_block_on_the_pages_is_what_the_committed_files_give():
    stale, blocks = [], 0
    for page, (now, new) in P.pages().items():
        blocks += len(P.BLOCK_RE.findall(now))
        if now != new:
            stale.append(page)
    assert blocks >= 30, f"only {blocks} readings blocks found on the pages: the scan is broken"
    assert not stale, f"readings blocks out of date in {stale}: run python -m tools.studies.pages"


def test_every_block_is_used_and_every_page_block_is_known():
    used = set()
    for page in P.PAGES:
        used |= set(re.findall(r"<!-- readings: ([\w-]+) -->", (P.REPO / page).read_text(encoding="utf-8")))
    assert used == set(P.BLOCKS), f"unused: {set(P.BLOCKS) - used}, unknown: {used - set(P.BLOCKS)}"


def measure(estimate, boot, welch=(None, None)):
    return P.Measure({"estimate": estimate, "ci_low": boot[0], "ci_high": boot[1], "t_low": welch[0], "t_high": welch[1]})


def test_a_difference_of_means_reads_a_direction_only_when_both_intervals_agree():
    # Walker2d-v5's D against PPO with ε = 0.3: bootstrap below 0, Welch across 0
    assert P.loses_less(measure(-0.224, (-0.426, -0.024), (-0.456, 0.009))) == R.NOT_SHOWN
    assert P.loses_less(measure(0.254, (0.048, 0.465), (0.028, 0.480))) == "VACO loses less"
    # an IQM difference has no Welch interval: its bootstrap interval alone
    assert P.scores(measure(0.158, (0.119, 0.193))) == "VACO higher"
    assert P.scores(measure(0.049, (-0.052, 0.127))) == R.NOT_SHOWN


def test_render_rewrites_only_the_blocks():
    class Fake:
        pass

    text = "a <!-- readings: rise -->old<!-- end --> b\n<!-- readings: rise -->\nx\n<!-- end -->"
    saved = P.BLOCKS["rise"]
    P.BLOCKS["rise"] = lambda s: "NEW"
    try:
        out, found = P.render(text, Fake(), {})
    finally:
        P.BLOCKS["rise"] = saved
    assert out == "a <!-- readings: rise -->NEW<!-- end --> b\n<!-- readings: rise -->NEW<!-- end -->"
    assert found == ["rise", "rise"]
    with pytest.raises(SystemExit, match="unknown readings block"):
        P.render("<!-- readings: nothing -->x<!-- end -->", Fake(), {})


def test_the_headline_names_its_comparison_and_its_control():
    text = P.headline(P.Sources())
    assert "PPO with ε = 0.2" in text and "PPO with ε = 0.3" in text


def test_no_inline_block_starts_a_line():
    # A line that starts with an HTML comment is a raw HTML block to GitHub's renderer: its markdown would show raw.
    for page in P.PAGES:
        text = (P.REPO / page).read_text(encoding="utf-8")
        starts = re.findall(r"^ *<!-- readings: ([\w-]+) -->(?!\n)", text, re.M)
        assert not starts, f"{page}: blocks {starts} start a line; put them after text or on lines of their own"
