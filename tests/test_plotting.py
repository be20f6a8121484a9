"""Readable tick labels on log axes."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from course_lib.core.plotting import log_ticks, set_log_ticks, tick_label


def test_wide_range_uses_one_two_five():
    assert log_ticks(0.04, 60) == [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50]


def test_narrow_range_is_refined_to_at_least_four_labels():
    ticks = log_ticks(0.55, 2.2)
    assert ticks == [0.7, 1, 1.5, 2] and len(ticks) >= 4


def test_a_range_too_narrow_for_round_values_falls_back_to_its_ends():
    assert log_ticks(1.01, 1.02) == [1.01, 1.02]


@pytest.mark.parametrize(("low", "high"), [(0, 1), (-1, 1), (2, 1), (1, float("inf"))])
def test_bad_ranges_are_refused(low, high):
    with pytest.raises(ValueError, match="low <= high"):
        log_ticks(low, high)


def test_set_log_ticks_labels_the_axis_with_plain_numbers():
    plt.switch_backend("Agg")
    fig, ax = plt.subplots()
    ax.plot([0.6, 2.1], [1, 2])
    ax.set_xscale("log")
    ticks = set_log_ticks(ax, 0.6, 2.1)
    assert [t.get_text() for t in ax.get_xticklabels()] == [tick_label(t) for t in ticks]
    with pytest.raises(ValueError, match="axis"):
        set_log_ticks(ax, 1, 2, axis="z")
    plt.close(fig)


def test_a_wide_range_is_thinned_to_at_most_max_ticks():
    assert len(log_ticks(100, 1_000_000)) == 13  # 1-2-5 over four decades: too many for one axis
    assert log_ticks(100, 1_000_000, max_ticks=9) == [
        100,
        300,
        1000,
        3000,
        10_000,
        30_000,
        100_000,
        300_000,
        1e6,
    ]
    assert log_ticks(100, 1_000_000, max_ticks=7) == [100, 1000, 10_000, 100_000, 1e6]
    assert log_ticks(0.04, 60, max_ticks=10) == log_ticks(0.04, 60)  # within the limit: unchanged
    assert log_ticks(0.55, 2.2, max_ticks=2) == [0.7, 1, 1.5, 2]  # thinner would leave one label
    with pytest.raises(ValueError, match="max_ticks"):
        log_ticks(1, 10, max_ticks=1)


def test_tick_labels_are_plain_numbers_with_thousands_separators():
    assert [tick_label(v) for v in (0.05, 1, 500, 5000, 10_000, 1e6, 2.5e6)] == [
        "0.05", "1", "500", "5000", "10,000", "1,000,000", "2,500,000"
    ]  # fmt: skip
