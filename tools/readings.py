"""The rule by which the results pages read an effect from its 95% interval, stated and implemented once.

An effect reads in a direction ("higher", "lower", or the words a caller gives for them) only when its whole
interval lies on that side of 0; an interval that reaches 0, an end exactly at 0 included, reads "not shown", in
either direction. Which interval, by kind of reading:

- a difference of means that has both a stratified-bootstrap and a Welch t interval (D, E, an ablation's effect):
  both intervals, and they must agree (`reading(estimate, bootstrap, welch)`);
- a difference of IQMs, which has no t interval: its stratified-bootstrap interval;
- a mean over runs or seeds (a rise from decile 9 to decile 10, a paired difference): its t interval.

A count of cells ("rises in n of m") counts the cells whose interval lies above 0, never point estimates. "The same"
is read only within a stated margin (the whole interval inside it); "not shown" never means "the same".

Pure functions only: the tools that write the pages' readings (tools/studies/pages.py) call them.
"""

from __future__ import annotations

import math

NOT_SHOWN = "not shown"


def _checked(interval) -> tuple[float, float]:
    low, high = (float(v) for v in interval)
    if math.isnan(low) or math.isnan(high) or low > high:
        raise ValueError(f"not an interval: {interval!r}")
    return low, high


def side(interval) -> int:
    """+1 when the whole interval lies above 0, -1 when below, 0 when it reaches 0 (an end at exactly 0 included)."""
    low, high = _checked(interval)
    return 1 if low > 0 else -1 if high < 0 else 0


def direction(*intervals) -> int:
    """The direction every interval shows (+1 or -1), or 0 when one of them reaches 0 or they disagree."""
    if not intervals:
        raise ValueError("no interval")
    sides = {side(i) for i in intervals}
    return sides.pop() if len(sides) == 1 else 0


def reading(estimate, *intervals, higher="higher", lower="lower", none=NOT_SHOWN) -> str:
    """The words for an effect: `higher` when every interval lies above 0, `lower` when every one lies below,
    `none` otherwise. The estimate must lie inside every interval (a check that the numbers belong together)."""
    for interval in intervals:
        low, high = _checked(interval)
        if not low <= float(estimate) <= high:
            raise ValueError(f"estimate {estimate} outside its interval [{low}, {high}]")
    return {1: higher, -1: lower, 0: none}[direction(*intervals)]


def shown(*intervals) -> bool:
    """Whether the intervals show a direction at all."""
    return direction(*intervals) != 0


def count_above(intervals) -> int:
    """How many of the intervals lie wholly above 0 (e.g. cells whose return still rises, by the interval)."""
    return sum(side(i) == 1 for i in intervals)


def within(interval, margin) -> bool:
    """Whether the whole interval lies strictly inside (-margin, +margin): "the same" within that margin."""
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin!r}")
    low, high = _checked(interval)
    return -margin < low and high < margin


def equivalence(estimate, *intervals, margin, same="the same", none=NOT_SHOWN) -> str:
    """`same` plus the margin when every interval lies inside (-margin, +margin), `none` otherwise."""
    if not intervals:
        raise ValueError("no interval")
    for interval in intervals:
        low, high = _checked(interval)
        if not low <= float(estimate) <= high:
            raise ValueError(f"estimate {estimate} outside its interval [{low}, {high}]")
    inside = all(within(i, margin) for i in intervals)
    return f"{same} within ±{number(margin, sign=False)}" if inside else none


def number(value, digits=3, sign=True) -> str:
    """The pages' way of printing a number: a typographic minus, a '+' on positive values when `sign`; a value that
    rounds to 0 keeps its sign ('−0.000' is an end just below 0)."""
    text = f"{float(value):+.{digits}f}" if sign else f"{float(value):.{digits}f}"
    return text.replace("-", "−")


def interval(low, high, digits=3, sign=True) -> str:
    """'[low, high]' as the pages print it."""
    return f"[{number(low, digits, sign)}, {number(high, digits, sign)}]"


def value(estimate, low, high, digits=3, sign=True) -> str:
    """'estimate [low, high]' as the pages print it."""
    return f"{number(estimate, digits, sign)} {interval(low, high, digits, sign)}"
