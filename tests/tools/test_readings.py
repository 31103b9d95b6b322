"""The reading rule (tools/readings.py) against hand-made cases, edges included."""

import pytest

from tools import readings as R


@pytest.mark.parametrize(
    "interval, expected",
    [
        ((0.01, 0.2), 1),
        ((-0.2, -0.01), -1),
        ((-0.1, 0.1), 0),
        ((0.0, 0.2), 0),  # an end exactly at 0 shows nothing
        ((-0.2, 0.0), 0),
        ((-0.2, -0.00013), -1),  # just below 0 is below
        ((0.0, 0.0), 0),
    ],
)
def test_side(interval, expected):
    assert R.side(interval) == expected


def test_one_interval_reads_in_its_direction_or_not_shown():
    assert R.reading(0.158, (0.119, 0.193), higher="VACO higher") == "VACO higher"
    assert R.reading(-0.374, (-0.421, -0.323), (-0.427, -0.321)) == "lower"
    assert R.reading(0.049, (-0.052, 0.127), higher="VACO higher") == "not shown"
    assert R.reading(0.1, (0.0, 0.2)) == "not shown"
    assert R.reading(-0.1, (-0.2, 0.0), lower="lost") == "not shown"


def test_two_intervals_must_both_exclude_0():
    # Walker2d-v5's D against PPO with ε = 0.3: the bootstrap interval below 0, the Welch interval across it
    assert R.reading(-0.224, (-0.426, -0.024), (-0.456, 0.009)) == "not shown"
    # Hopper-v5's D against PPO: both above 0
    assert R.reading(0.254, (0.048, 0.465), (0.028, 0.480), higher="VACO loses less") == "VACO loses less"
    # two intervals on opposite sides show nothing
    assert R.direction((0.1, 0.2), (-0.2, -0.1)) == 0
    assert R.direction((0.1, 0.2), (0.05, 0.3)) == 1


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="outside"):
        R.reading(0.5, (0.1, 0.2))
    with pytest.raises(ValueError, match="not an interval"):
        R.side((0.2, 0.1))
    with pytest.raises(ValueError, match="not an interval"):
        R.side((float("nan"), 0.1))
    with pytest.raises(ValueError, match="no interval"):
        R.direction()
    with pytest.raises(ValueError, match="margin"):
        R.within((-0.01, 0.01), 0)


def test_counts_count_by_the_interval_not_the_point_estimate():
    cells = [(0.01, 0.1), (-0.01, 0.2), (0.0, 0.1), (0.02, 0.03), (-0.1, -0.01)]
    assert R.count_above(cells) == 2


def test_equivalence_needs_the_whole_interval_inside_the_margin():
    assert R.within((-0.04, 0.04), 0.05)
    assert not R.within((-0.04, 0.05), 0.05)  # an end on the margin is not inside
    assert not R.within((-0.082, 0.024), 0.05)
    assert R.equivalence(0.0, (-0.04, 0.04), margin=0.05) == "the same within ±0.050"
    assert R.equivalence(-0.031, (-0.082, 0.024), margin=0.05) == "not shown"
    # both intervals of a measure must lie inside the margin
    assert R.equivalence(-0.031, (-0.082, 0.024), (-0.089, 0.028), margin=0.1, same="no effect") == "no effect within ±0.100"
    assert R.equivalence(-0.031, (-0.082, 0.024), (-0.101, 0.028), margin=0.1) == "not shown"


def test_numbers_as_the_pages_print_them():
    assert R.number(0.158) == "+0.158"
    assert R.number(-0.0761) == "−0.076"
    assert R.number(-0.00013) == "−0.000"  # the sign of an end just below 0 is kept
    assert R.number(0.49, sign=False) == "0.490"
    assert R.value(0.04, -0.1046, 0.1872) == "+0.040 [−0.105, +0.187]"
    assert R.interval(0.428, 0.547, sign=False) == "[0.428, 0.547]"
