"""The hedging simulation against exact figures: extra load at the p95, the tail, fan-out, rates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from course_lib.core.percentiles import fanout_tail_probability, percentile
from course_lib.simulate.tail import (
    events_per_minute,
    fanout_page_latency_ms,
    implied_rate_rps,
    service_times_ms,
    simulate_hedging,
    tail_survival,
)

N = 20_000
SEED = 7


def test_service_times_are_seeded_lognormal_with_the_asked_slow_fraction():
    t = service_times_ms(N, seed=SEED)
    assert np.array_equal(t, service_times_ms(N, seed=SEED))
    stalled = t > 25.0  # body: median 2 ms, sigma 0.4, so P(body > 25 ms) is about 1e-10
    assert abs(stalled.mean() - 0.01) < 0.003  # binomial sd 0.0007
    assert abs(np.median(t[~stalled]) - 2.0) < 0.05


def test_hedging_at_the_p95_sends_exactly_5_percent_more_requests():
    primary = service_times_ms(N, seed=SEED)
    p95 = percentile(primary, 95)
    sim = simulate_hedging(N, hedge_after_ms=p95, seed=SEED)
    # nearest rank: p95 is the 19,000th smallest of 20,000 distinct values, so exactly 1,000 are later
    assert sim.hedged.sum() == N - math.ceil(0.95 * N) == 1_000
    assert sim.extra_request_fraction == 0.05


def test_hedged_latency_is_the_first_of_the_two_answers_request_by_request():
    sim = simulate_hedging(N, hedge_after_ms=3.0, seed=SEED)
    expected = np.where(sim.primary_ms > 3.0, np.minimum(sim.primary_ms, 3.0 + sim.backup_ms), sim.primary_ms)
    assert np.array_equal(sim.latency_ms, expected)
    assert (sim.latency_ms <= sim.primary_ms).all()
    assert simulate_hedging(N, hedge_after_ms=None, seed=SEED).extra_request_fraction == 0.0


def test_simulated_tail_matches_the_exact_distribution():
    """P(L > x) = P(T1 > x) for x <= d, and P(T1 > x) * P(T2 > x - d) beyond (independent replicas)."""
    d = 3.5
    sim = simulate_hedging(200_000, hedge_after_ms=d, seed=SEED)

    def hedged_sf(x):
        return tail_survival(x) * (tail_survival(x - d) if x > d else 1.0)

    for q in (99.0, 99.9):
        exact = brentq(lambda x, q=q: hedged_sf(x) - (1 - q / 100), 0.01, 200.0)
        assert percentile(sim.latency_ms, q) == pytest.approx(exact, rel=0.03)
    unhedged_p999 = brentq(lambda x: tail_survival(x) - 0.001, 0.01, 200.0)
    assert unhedged_p999 > 50  # the stalls own the unhedged p99.9
    assert percentile(sim.latency_ms, 99.9) < unhedged_p999 / 5


def test_fanout_pages_take_the_slowest_call_and_follow_one_minus_q_to_the_k():
    calls = np.arange(12.0)
    assert fanout_page_latency_ms(calls, 4).tolist() == [3.0, 7.0, 11.0]
    t = service_times_ms(200_000, seed=SEED)
    threshold = percentile(t, 99)
    for k in (5, 20):
        pages = fanout_page_latency_ms(t, k)
        measured = (pages > threshold).mean()
        assert measured == pytest.approx(fanout_tail_probability(k, 99), abs=4 * math.sqrt(0.25 / pages.size))
    with pytest.raises(ValueError, match="k must be"):
        fanout_page_latency_ms(calls, 0)


def test_seventeen_a_minute_at_one_in_a_thousand_means_about_283_requests_a_second():
    assert implied_rate_rps(17, 1_000) == pytest.approx(283.333, abs=1e-3)
    assert events_per_minute(278, 1_000) == pytest.approx(16.68)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"slow_fraction": 2.0}, "slow_fraction"), ({"sigma": 0}, "sigma"), ({"slow_ms": -1}, "slow_ms")],
)
def test_bad_simulation_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        service_times_ms(10, seed=0, **kwargs)


def test_lognormal_fitted_to_a_p50_and_a_p99_has_them():
    from course_lib.core.percentiles import percentile
    from course_lib.simulate.tail import lognormal_from_percentiles, service_times_ms

    median, sigma = lognormal_from_percentiles(2.5, 9.0)
    body = service_times_ms(200_000, seed=3, median_ms=median, sigma=sigma, slow_fraction=0.0)
    assert percentile(body, 50) == pytest.approx(2.5, rel=0.01)
    assert percentile(body, 99) == pytest.approx(9.0, rel=0.02)
    with pytest.raises(ValueError, match="p99_ms must be above p50_ms=3"):
        lognormal_from_percentiles(3.0, 2.0)
