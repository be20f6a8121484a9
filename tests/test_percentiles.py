"""Percentiles the way SLAs use them: the issue's vectors, error handling and properties vs numpy."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from course_lib.core.percentiles import (
    fanout_tail_probability,
    nearest_rank_position,
    percentile,
    percentiles,
)

latencies_ms = st.lists(
    st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False), min_size=1, max_size=300
)
# 0 < q <= 1 is refused or warned about (a fraction passed for a percentage); tested separately below.
q_any = st.one_of(st.just(0.0), st.floats(min_value=1.0, max_value=100.0, exclude_min=True, allow_nan=False))


def source_vector_ms() -> list[float]:
    """90 requests of 30 ms, 8 of 70 ms, 2 of 150 ms (source 000's unit test)."""
    return [30.0] * 90 + [70.0] * 8 + [150.0] * 2


def test_source_vector_nearest_rank_p50_is_30_and_p99_is_150():
    samples = source_vector_ms()
    assert percentile(samples, 50) == 30.0
    assert percentile(samples, 95) == 70.0
    assert percentile(samples, 99) == 150.0
    assert percentiles(samples) == {"p50": 30.0, "p95": 70.0, "p99": 150.0}


def test_one_huge_outlier_in_1001_samples_leaves_nearest_rank_p99_at_1():
    samples = [1.0] * 1000 + [10_000_000.0]
    assert percentile(samples, 99) == 1.0


def test_numpy_linear_p99_reports_a_latency_no_request_had():
    samples = [1.0] * 99 + [10_000_000.0]
    linear = percentile(samples, 99, method="linear")
    assert linear == pytest.approx(100_000.99, rel=1e-12)
    assert linear not in samples
    assert percentile(samples, 99) == 1.0  # nearest rank: rank ceil(0.99 x 100) = 99 is a 1 ms request
    assert linear == pytest.approx(float(np.percentile(samples, 99)))


def test_fanout_of_4_calls_is_slowed_3_94_percent_of_the_time():
    assert fanout_tail_probability(4) == pytest.approx(1 - 0.99**4)
    assert round(100 * fanout_tail_probability(4), 2) == 3.94


def test_fanout_of_100_calls_is_slowed_63_4_percent_of_the_time():
    assert round(100 * fanout_tail_probability(100), 1) == 63.4


def test_fanout_of_one_call_is_the_tail_itself():
    assert fanout_tail_probability(1, q=95) == pytest.approx(0.05)


@pytest.mark.parametrize("k", [0, -3, 2.5, True, "4"])
def test_fanout_rejects_a_non_positive_or_non_integer_k(k):
    with pytest.raises(ValueError, match="k must be"):
        fanout_tail_probability(k)


def test_empty_samples_raise_a_clear_error():
    with pytest.raises(ValueError, match="samples is empty"):
        percentile([], 50)


def test_nan_samples_raise_and_say_how_many():
    with pytest.raises(ValueError, match="1 NaN"):
        percentile([1.0, float("nan"), 3.0], 50)


@pytest.mark.parametrize("q", [-0.1, 100.5, float("nan"), "99", None, True])
def test_q_outside_0_100_or_not_a_number_is_rejected(q):
    with pytest.raises(ValueError, match="q must be a finite number >= 0 and <= 100"):
        percentile([1.0, 2.0], q)


def test_unknown_method_is_rejected_with_the_allowed_ones():
    with pytest.raises(ValueError, match="nearest-rank"):
        percentile([1.0, 2.0], 50, method="midpoint")


def test_q_0_and_100_are_min_and_max():
    samples = [5.0, 1.0, 9.0, 3.0]
    assert percentile(samples, 0) == 1.0
    assert percentile(samples, 100) == 9.0


def test_percentiles_keys_name_the_quantile():
    assert list(percentiles([1.0, 2.0, 3.0], qs=(50, 99.9))) == ["p50", "p99.9"]


@settings(max_examples=200, deadline=None)
@given(samples=latencies_ms, q1=q_any, q2=q_any)
def test_percentile_is_monotone_in_q(samples, q1, q2):
    lo, hi = sorted((q1, q2))
    for method in ("nearest-rank", "linear"):
        assert percentile(samples, lo, method) <= percentile(samples, hi, method)


@settings(max_examples=200, deadline=None)
@given(samples=latencies_ms, q=q_any)
def test_percentile_lies_within_min_and_max(samples, q):
    for method in ("nearest-rank", "linear"):
        value = percentile(samples, q, method)
        assert min(samples) <= value <= max(samples)


@settings(max_examples=200, deadline=None)
@given(samples=latencies_ms, q=q_any, data=st.data())
def test_percentile_does_not_depend_on_sample_order(samples, q, data):
    shuffled = data.draw(st.permutations(samples))
    assert percentile(shuffled, q) == percentile(samples, q)
    assert percentile(shuffled, q, "linear") == pytest.approx(percentile(samples, q, "linear"))


@settings(max_examples=200, deadline=None)
@given(samples=latencies_ms, q=q_any)
def test_nearest_rank_is_always_an_observed_sample(samples, q):
    assert percentile(samples, q) in samples


@settings(max_examples=300, deadline=None)
@given(samples=latencies_ms, q=q_any)
def test_nearest_rank_equals_numpy_inverted_cdf(samples, q):
    # Away from exact ranks both compute ceil(q/100 x n); at an exact rank numpy's q/100 in binary
    # floating point can tip it one rank up (next test), so those q are checked against exact arithmetic.
    position = q * len(samples) / 100
    assume(abs(position - round(position)) > 1e-6)
    assert percentile(samples, q) == float(np.percentile(samples, q, method="inverted_cdf"))


@settings(max_examples=300, deadline=None)
@given(samples=latencies_ms, q=st.integers(min_value=0, max_value=100).filter(lambda q: q != 1))  # q=1 warns
def test_nearest_rank_matches_exact_rank_arithmetic(samples, q):
    rank = max(1, math.ceil(Fraction(q * len(samples), 100)))
    assert percentile(samples, q) == sorted(samples)[rank - 1]


def test_p7_of_100_samples_is_the_7th_smallest():
    # Exactly 7 % of 100 samples are at or below the 7th smallest. numpy 2.4's inverted_cdf returns the
    # 8th here, because 0.07 x 100 is 7.000000000000001 in floating point.
    assert percentile(np.arange(1, 101, dtype=float), 7) == 7.0


@settings(max_examples=200, deadline=None)
@given(samples=latencies_ms, q=q_any)
def test_linear_equals_numpy_default(samples, q):
    assert percentile(samples, q, "linear") == pytest.approx(float(np.percentile(samples, q)))


def test_fractional_q_uses_the_exact_rank_not_a_rounding_artefact():
    # 99.9 % of 1000 samples is exactly 999 of them: the 999th smallest, not the maximum. numpy's
    # inverted_cdf gets the maximum here because 0.999 x 1000 is 999.0000000000001 in floating point.
    samples = np.arange(1, 1001, dtype=float)
    assert percentile(samples, 99.9) == 999.0


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99, 0.999])
def test_a_fraction_is_refused_with_the_percentage_it_probably_meant(q):
    with pytest.raises(ValueError, match=f"did you mean {100 * q:g}"):
        percentile([1.0, 2.0, 3.0], q)
    with pytest.raises(ValueError, match=f"did you mean {100 * q:g}"):
        fanout_tail_probability(4, q)
    with pytest.raises(ValueError, match="did you mean"):
        nearest_rank_position([1.0, 2.0], q)


def test_q_of_one_warns_that_it_is_the_first_percentile():
    with pytest.warns(UserWarning, match="1st percentile"):
        assert percentile([3.0, 1.0, 2.0], 1) == 1.0
    with pytest.warns(UserWarning, match="pass q=100"):
        fanout_tail_probability(2, 1)


def test_q_zero_and_percentages_above_one_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert percentile([3.0, 1.0, 2.0], 0) == 1.0
        assert percentile([3.0, 1.0, 2.0], 1.5) == 1.0
        assert fanout_tail_probability(4, 99) == pytest.approx(1 - 0.99**4)


def test_nearest_rank_position_points_at_the_sample_that_is_the_percentile():
    rng = np.random.default_rng(0)
    for n in (1, 7, 100, 1000):
        samples = rng.exponential(size=n)
        for q in (0, 50, 95, 99, 100):
            assert samples[nearest_rank_position(samples, q)] == percentile(samples, q)


def test_nearest_rank_position_breaks_ties_by_original_order():
    samples = [5.0, 1.0, 5.0, 5.0]  # p50 of 4 is rank 2: the first 5.0 in original order
    assert nearest_rank_position(samples, 50) == 0
    assert nearest_rank_position(samples, 100) == 3
    samples = [1.0] * 99 + [10_000_000.0]
    assert nearest_rank_position(samples, 99) == 98
