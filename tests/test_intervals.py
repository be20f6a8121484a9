"""Intervals for ratios measured in rounds (course_lib.core.intervals) and the harness's round order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from course_lib.core.bench import compare_latency, interleaved_rounds_ns, round_order
from course_lib.core.checks import InvalidArgumentError
from course_lib.core.intervals import (
    UNRESOLVED,
    VERDICTS,
    RatioInterval,
    interval_direction,
    interval_verdict,
    median_interval,
    min_rounds,
    ratio_interval,
    ratio_interval_from_values,
    verdict_words,
)
from course_lib.core.percentiles import percentile, samples_needed


def test_samples_needed_is_ten_over_one_minus_q():
    assert [samples_needed(q) for q in (0, 50, 90, 95, 99, 99.9)] == [10, 20, 100, 200, 1000, 10_000]
    with pytest.raises(ValueError, match="below 100"):
        samples_needed(100)
    with pytest.raises(ValueError, match="did you mean 99"):
        samples_needed(0.99)


@pytest.mark.parametrize(("confidence", "rounds"), [(0.5, 2), (0.9, 5), (0.95, 6), (0.99, 8)])
def test_min_rounds_is_where_the_range_covers_the_median(confidence, rounds):
    assert min_rounds(confidence) == rounds
    assert 1 - 2 / 2**rounds >= confidence > 1 - 2 / 2 ** (rounds - 1)


def test_median_interval_matches_the_binomial_order_statistics():
    # n = 20 at 95 %: P(Bin(20, 1/2) <= 5) = 0.0207 <= 0.025 < P(<= 6): the 6th and 15th smallest.
    low, high, achieved = median_interval(np.arange(20.0, 0.0, -1.0))
    assert (low, high) == (6.0, 15.0)
    below = sum(math.comb(20, i) for i in range(6)) / 2**20
    assert achieved == pytest.approx(1 - 2 * below) and achieved >= 0.95


def test_median_interval_covers_the_median_as_often_as_it_says():
    rng = np.random.default_rng(0)
    trials, n = 4000, 7
    draws = rng.lognormal(0.0, 1.0, size=(trials, n))  # median of a lognormal(0, 1) is exactly 1
    covered = 0
    for row in draws:
        low, high, achieved = median_interval(row)
        covered += low <= 1.0 <= high
    assert achieved == pytest.approx(1 - 2 / 2**7)
    assert abs(covered / trials - achieved) < 0.015  # 3 standard errors of a proportion near 0.98


def test_median_interval_refuses_too_few_repeats_and_nan():
    with pytest.raises(ValueError, match="at least 6 repeats"):
        median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(ValueError, match="NaN"):
        median_interval([1.0, 2.0, float("nan"), 4.0, 5.0, 6.0])
    with pytest.raises(ValueError, match="confidence"):
        median_interval([1.0] * 10, confidence=1.0)


def test_ratio_interval_words_a_direction_only_when_the_interval_excludes_one():
    faster = ratio_interval_from_values([0.50, 0.55, 0.60, 0.52, 0.58, 0.49])
    slower = ratio_interval_from_values([1.2, 1.3, 1.25, 1.4, 1.21, 1.33])
    unclear = ratio_interval_from_values([0.9, 1.1, 0.95, 1.05, 1.0, 0.97])
    assert (faster.direction, slower.direction, unclear.direction) == (-1, 1, 0)
    assert faster.phrase(less="faster", more="slower").startswith(
        "1.87x faster (ratio 0.54x, 97% interval 0.49x to 0.60x over 6 rounds)"
    )
    assert slower.phrase(less="faster", more="slower").startswith("1.27x slower")
    assert unclear.phrase(less="faster", more="slower").startswith(UNRESOLVED)
    assert not unclear.resolved and faster.resolved
    # one round on the other side of 1 with six rounds: the range contains 1, so not resolved
    assert ratio_interval_from_values([0.5, 0.5, 0.5, 0.5, 0.5, 1.01]).direction == 0


def test_ratio_interval_compares_the_percentile_round_by_round():
    rng = np.random.default_rng(1)
    base = rng.exponential(100.0, size=(6, 1000))
    cand = base * 0.8
    result = ratio_interval(cand, base, q=99)
    assert result.ratio == pytest.approx(0.8) and result.low == pytest.approx(0.8)
    assert isinstance(result, RatioInterval) and result.rounds == 6
    # the per-round nearest-rank percentile is what is compared
    assert result.ratio == pytest.approx(percentile(cand[0], 99) / percentile(base[0], 99))


def test_ratio_interval_needs_enough_samples_for_its_percentile_and_matching_rounds():
    base = np.ones((6, 999))
    with pytest.raises(ValueError, match="at least 1000 samples for a p99"):
        ratio_interval(base, base, q=99)
    with pytest.raises(ValueError, match="same rounds"):
        ratio_interval(np.ones((6, 20)), np.ones((7, 20)))
    with pytest.raises(ValueError, match="> 0"):
        ratio_interval(np.ones((6, 20)), np.zeros((6, 20)))


def test_round_order_rotates_so_every_candidate_runs_in_every_position():
    orders = [round_order(["a", "b", "c"], r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for position in range(3):
        assert {o[position] for o in orders} == {"a", "b", "c"}
    assert round_order(["a", "b"], 5, "fixed") == ["a", "b"]
    with pytest.raises(ValueError, match="order"):
        round_order(["a"], 0, "random")


def test_interleaved_rounds_run_in_the_rotated_order():
    log = []
    interleaved_rounds_ns({k: (lambda k=k: log.append(k)) for k in "xyz"}, n_calls=1, rounds=3)
    assert log == list("xyzyzxzxy")
    log.clear()
    interleaved_rounds_ns({k: (lambda k=k: log.append(k)) for k in "xy"}, n_calls=1, rounds=2, order="fixed")
    assert log == list("xyxy")


def test_compare_latency_with_confidence_adds_the_speedup_interval():
    table = compare_latency({"a": lambda: None, "b": lambda: None}, n_calls=20, rounds=6, confidence=0.95)
    assert {"speedup_low", "speedup_high", "resolved"} <= set(table.columns)
    assert table.loc["a", ["speedup", "speedup_low", "speedup_high"]].tolist() == [1.0, 1.0, 1.0]
    assert table.loc["a", "resolved"] == 0
    interval = table.attrs["intervals"]["b"]
    assert table.loc["b", "speedup_low"] == pytest.approx(1 / interval.high)
    assert table.loc["b", "speedup_low"] <= table.loc["b", "speedup"] <= table.loc["b", "speedup_high"]
    with pytest.raises(ValueError, match="at least 6 repeats"):
        compare_latency({"a": lambda: None}, n_calls=20, rounds=5, confidence=0.95)


def test_bound_phrase_says_whether_the_whole_interval_is_on_the_bounds_side():
    inside = RatioInterval(0.0045, 0.004, 0.0049, 0.97, 6)
    assert inside.bound_phrase(at_most=0.1).startswith("holds on this run")
    assert inside.bound_phrase(at_least=0.0045).startswith("not shown on this run")
    straddles = RatioInterval(0.1, 0.08, 0.12, 0.97, 6)
    assert straddles.bound_phrase(at_most=0.1) == (
        "not shown on this run (the interval, 0.08x to 0.12x, reaches above 0.1x)"
    )
    assert straddles.bound_phrase(at_least=0.08).startswith("holds on this run")
    for bad in ({}, {"at_most": 1.0, "at_least": 1.0}, {"at_most": 0.0}, {"at_least": float("nan")}):
        with pytest.raises(InvalidArgumentError, match=r"at_most|at_least"):
            straddles.bound_phrase(**bad)


def test_the_one_verdict_only_when_the_interval_excludes_one():
    assert interval_verdict(1.01, 2.0) == "gain"
    assert interval_verdict(0.2, 0.99) == "loss"
    assert interval_verdict(1.0, 2.0) == "not resolved"  # touching 1 is not excluding it
    assert interval_verdict(0.5, 1.0) == "not resolved"
    assert interval_verdict(1.2, math.inf) == "gain"  # an open end
    for low, high in (
        (1.01, 2.0),
        (0.2, 0.99),
        (1.0, 2.0),
        (0.5, 1.0),
    ):  # RatioInterval's direction is the same
        assert RatioInterval(1.0, low, high, 0.97, 6).direction == interval_direction(low, high)
        assert VERDICTS[interval_direction(low, high)] == interval_verdict(low, high)


def test_verdict_words_say_each_verdict_one_way():
    assert [verdict_words(v) for v in ("gain", "loss", "not resolved")] == [
        "a gain",
        "a loss",
        "not resolved (the interval holds 1)",
    ]
    with pytest.raises(InvalidArgumentError, match="verdict must be one of"):
        verdict_words("win")
