"""histogram_quantile and rate against Prometheus's own test data and documented behaviour."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.operate.prom_quantile import (
    SLO_BUCKETS_S,
    SLO_P95_S,
    SOURCE004_BUCKETS_S,
    bucket_error_table,
    bucket_quantile,
    cumulative_buckets,
    extrapolated_rate,
    histogram_quantile,
)

INF = math.inf
# prometheus/prometheus promql/promqltest/testdata/histograms.test, values at "50m" (10 steps of the load).
POSITIVE = [(0.1, 50), (0.2, 70), (1.0, 110), (INF, 120)]
NEGATIVE = [(-0.2, 10), (-0.1, 20), (0.3, 20), (INF, 30)]
THIRD_POSITIVE = [(0, 0), (0.1, 50), (0.2, 70), (1.0, 110), (INF, 110)]
THIRD_NEGATIVE = [(-0.25, 0), (-0.2, 10), (-0.1, 20), (0.3, 20), (INF, 20)]


@pytest.mark.parametrize(
    ("q", "positive", "negative"),
    [(0, 0, -0.2), (1, 1, 0.3), (0.2, 0.048, -0.2), (0.5, 0.15, -0.15), (0.8, 0.72, 0.3)],
)
def test_matches_prometheus_testhistogram(q, positive, negative):
    assert histogram_quantile(q, POSITIVE) == pytest.approx(positive)
    assert histogram_quantile(q, NEGATIVE) == pytest.approx(negative)


@pytest.mark.parametrize(
    ("q", "positive", "negative"),
    [(0, 0, -0.25), (0.25, 0.055, -0.225), (0.5, 0.125, -0.2), (0.75, 0.45, -0.15), (1, 1, -0.1)],
)
def test_matches_prometheus_testhistogram3(q, positive, negative):
    assert histogram_quantile(q, THIRD_POSITIVE) == pytest.approx(positive)
    assert histogram_quantile(q, THIRD_NEGATIVE) == pytest.approx(negative)


def test_middle_of_bucket_and_aggregated_examples():
    second = [(0, 0), (2, 1), (4, 2), (6, 3), (INF, 3)]
    assert [histogram_quantile(q, second) for q in (1 / 6, 0.5, 5 / 6)] == pytest.approx([1, 3, 5])
    # sum by (le) of the four request_duration_seconds histograms (increments per step).
    summed = [(0.1, 10), (0.2, 19), (INF, 25)]
    assert histogram_quantile(0.3, summed) == pytest.approx(0.075)
    assert histogram_quantile(0.5, summed) == pytest.approx(0.1277777777777778)


def test_special_cases_as_documented():
    assert histogram_quantile(-0.1, POSITIVE) == -INF
    assert histogram_quantile(1.01, POSITIVE) == INF
    assert math.isnan(histogram_quantile(math.nan, POSITIVE))
    assert math.isnan(histogram_quantile(0.5, [(0.1, 1), (0.2, 2)]))  # no +Inf bucket
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0), (INF, 0)]))  # no observations
    assert math.isnan(histogram_quantile(0.5, [(INF, 5)]))  # fewer than two buckets
    # rank in the +Inf bucket: the largest finite bound; order of the input does not matter.
    assert histogram_quantile(0.99, [(INF, 100), (0.1, 50)]) == 0.1
    # non-monotonic counts are forced monotonic; equal bounds are merged.
    assert histogram_quantile(0.5, [(0.1, 4), (0.1, 6), (INF, 20)]) == pytest.approx(0.1)


def test_estimate_can_exceed_the_largest_observation():
    samples = np.array([0.011, 0.012, 0.013, 0.014])  # all in source 004's (0.01, 0.05] bucket
    buckets = cumulative_buckets(samples, SOURCE004_BUCKETS_S)
    estimate = histogram_quantile(0.95, buckets)
    assert estimate == pytest.approx(0.01 + 0.04 * 0.95)
    assert estimate > samples.max()


def test_slo_buckets_answer_the_slo_question_exactly_source_buckets_do_not():
    rng = np.random.default_rng(0)
    samples = rng.lognormal(np.log(0.008), 0.45, 20_000)
    table = bucket_error_table(samples, {"source 004": SOURCE004_BUCKETS_S, "slo": SLO_BUCKETS_S}, qs=(0.95,))
    assert abs(table.loc[("slo", 0.95), "error_ms"]) < abs(table.loc[("source 004", 0.95), "error_ms"])
    # 20 ms is a bound of the SLO buckets: the share of requests within the SLO is read, not estimated.
    share = dict(cumulative_buckets(samples, SLO_BUCKETS_S))[SLO_P95_S] / len(samples)
    assert share == pytest.approx(np.mean(samples <= SLO_P95_S))


def test_cumulative_buckets_validates_bounds():
    with pytest.raises(ValueError, match="strictly increasing"):
        cumulative_buckets([0.1], [0.2, 0.1])
    with pytest.raises(ValueError, match="non-empty"):
        cumulative_buckets([0.1], [])


def test_rate_of_a_steady_counter_and_a_reset():
    t = np.arange(0, 601, 15.0)
    values = 1000 + 3 * t  # 3 per second
    assert extrapolated_rate(t, values, 600, 300) == pytest.approx(3.0)
    assert extrapolated_rate(t, values, 600, 300, left_open=True) == pytest.approx(3.0)
    reset = np.where(t < 450, values, 3 * (t - 450))  # process restarted at 450 s
    assert extrapolated_rate(t, reset, 600, 300) == pytest.approx(3.0, rel=0.06)
    assert math.isnan(extrapolated_rate(t, values, 600, 10))  # fewer than two samples in range


def test_rate_does_not_extrapolate_below_zero():
    t = np.array([60.0, 75.0, 90.0])
    values = np.array([0.0, 15.0, 30.0])  # counter born at 60 s
    # increase 30 over 30 s; extrapolating to the range start would need negative counts.
    assert extrapolated_rate(t, values, 90, 300) * 300 == pytest.approx(30.0)


def test_non_monotonic_counts_are_forced_monotonic():
    # The 0.2 bucket (5) is below the 0.1 bucket (10): Prometheus treats it as 10, so the median
    # (rank 10) is the 0.1 bound; a binary search on the raw counts would land in the 0.4 bucket.
    assert histogram_quantile(0.5, [(0.1, 10), (0.2, 5), (0.4, 20), (INF, 20)]) == pytest.approx(0.1)


def test_core_on_the_lesson_example_by_hand():
    """le = 0.1, 0.2, +Inf with 50, 90, 100: p50 0.1, p75 0.1625, p90 0.2, p95 in +Inf -> 0.2."""
    buckets = [(0.1, 50), (0.2, 90), (INF, 100)]
    for q, expected in ((0.5, 0.1), (0.25, 0.05), (0.75, 0.1625), (0.9, 0.2), (0.95, 0.2)):
        assert bucket_quantile(q, buckets) == pytest.approx(expected)
        assert histogram_quantile(q, buckets) == pytest.approx(expected)


@pytest.mark.parametrize("q", [0.2, 0.5, 0.8, 1.0])
def test_core_matches_the_port_on_prometheus_own_positive_histograms(q):
    for buckets in (POSITIVE, THIRD_POSITIVE[1:]):
        assert bucket_quantile(q, buckets) == pytest.approx(histogram_quantile(q, buckets))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.001, 100.0), min_size=1, max_size=8, unique=True),
    st.lists(st.integers(0, 50), min_size=9, max_size=9),
    st.floats(0.001, 1.0),
)
def test_core_matches_the_port_on_sorted_cumulative_buckets(bounds, increments, q):
    """On what a real histogram exports (sorted, cumulative, positive bounds) the core and the port agree."""
    bounds = [*sorted(bounds), INF]
    counts = np.cumsum(increments[: len(bounds)]).tolist()
    if counts[-1] == 0:
        counts[-1] = 1
    buckets = list(zip(bounds, counts, strict=True))
    assert bucket_quantile(q, buckets) == pytest.approx(histogram_quantile(q, buckets))
