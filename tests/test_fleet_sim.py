"""The fleet simulator: conservation of requests, determinism, start-up delay, queueing maths."""

from __future__ import annotations

import math

import numpy as np
import pytest

from course_lib.simulate.fleet import FleetConfig, mixture_quantile_s, simulate_day, targets_for_utilization
from course_lib.simulate.traffic import SECONDS_PER_DAY, TrafficDay, arrivals_per_second, rate_per_second


def _hour(rate: float, seconds: int = 3600, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).poisson(rate, seconds).astype(np.int64)


def test_mixture_of_one_exponential_matches_closed_form():
    q = mixture_quantile_s([[0.0]], [[20.0]], [[1]], 0.99)[0]
    assert q == pytest.approx(math.log(100) / 20, abs=1e-6)


def test_mixture_quantile_with_delay_and_weights():
    # Half the mass at 0.5 s + Exp(10): P(T > x) = 0.5 * exp(-10 (x - 0.5)) = 0.01 -> x = 0.5 + ln(50)/10.
    q = mixture_quantile_s([[0.0, 0.5]], [[1e6, 10.0]], [[1, 1]], 0.99)[0]
    assert q == pytest.approx(0.5 + math.log(50) / 10, abs=1e-6)


def test_empty_rows_give_nan_and_bad_q_is_refused():
    assert np.isnan(mixture_quantile_s([[0.0]], [[1.0]], [[0]])[0])
    with pytest.raises(ValueError, match="q must be a finite number > 0 and < 1, got 99"):
        mixture_quantile_s([[0.0]], [[1.0]], [[1]], 99)


@pytest.mark.parametrize("signal", ["cpu", "rps", "queue", "p99"])
def test_requests_are_conserved_and_run_is_deterministic(signal):
    arrivals = np.concatenate([_hour(100, 1200), _hour(400, 600, seed=1), _hour(100, 1200, seed=2)])
    cfg = FleetConfig(signal=signal, target=targets_for_utilization(0.6, 50)[signal], max_replicas=8)
    a, b = simulate_day(cfg, arrivals), simulate_day(cfg, arrivals)
    t = a.totals
    assert t["offered"] == t["served"] + t["shed"] + t["queued_at_end"] == int(arrivals.sum())
    assert t == b.totals
    assert a.per_minute.equals(b.per_minute)


def test_overload_beyond_max_replicas_is_shed_not_lost():
    arrivals = _hour(1000, 600)  # 1,000 req/s against at most 4 x 50 = 200
    result = simulate_day(FleetConfig(min_replicas=1, max_replicas=4, queue_limit_s=1.0), arrivals)
    t = result.totals
    assert t["shed"] > 0
    assert t["offered"] == t["served"] + t["shed"] + t["queued_at_end"]
    assert result.per_second["backlog"].max() <= 4 * 50 * 1.0


def test_replicas_become_ready_exactly_startup_s_after_being_added():
    arrivals = np.concatenate([_hour(50, 300), _hour(400, 600, seed=3)])
    result = simulate_day(FleetConfig(min_replicas=2, max_replicas=12, startup_s=45), arrivals)
    s = result.per_second
    first_up = int(np.argmax(s["replicas"] > 2))
    assert first_up > 300 and first_up % 15 == 0  # the first sync after the step
    assert s["ready"][first_up + 44] == s["ready"][first_up - 1]
    assert s["ready"][first_up + 45] > s["ready"][first_up - 1]


def test_zero_startup_reacts_within_one_sync_period():
    arrivals = np.concatenate([_hour(50, 300), _hour(400, 300, seed=4)])
    s = simulate_day(FleetConfig(min_replicas=2, max_replicas=12, startup_s=0), arrivals).per_second
    assert s["ready"][300 + 15] > 2


def test_cost_is_replica_hours_times_price():
    arrivals = _hour(20)
    result = simulate_day(FleetConfig(min_replicas=3, max_replicas=3, price_per_replica_hour=40), arrivals)
    assert result.totals["replica_hours"] == pytest.approx(3.0)
    assert result.totals["cost"] == pytest.approx(120.0)


def test_targets_for_utilization_are_consistent():
    t = targets_for_utilization(0.5, 40)
    assert t == {"cpu": 50.0, "rps": 20.0, "queue": 0.5, "p99": pytest.approx(1000 * math.log(100) / 20)}
    with pytest.raises(ValueError, match="utilization must be a finite number > 0 and < 1, got 50"):
        targets_for_utilization(50, 40)


@pytest.mark.parametrize(
    ("changes", "match"),
    [({"signal": "gpu"}, "signal"), ({"signal": "cpu", "target": 150}, "percentage"),
     ({"min_replicas": 0}, "min_replicas"), ({"capacity_rps": -1}, "capacity_rps"), ({"startup_s": 1.5}, "startup_s")],
)  # fmt: skip
def test_config_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        FleetConfig(**changes)


def test_traffic_day_is_seeded_and_has_its_spike():
    day = TrafficDay()
    a, b = arrivals_per_second(day, seed=3), arrivals_per_second(day, seed=3)
    assert len(a) == SECONDS_PER_DAY and np.array_equal(a, b)
    rate = rate_per_second(TrafficDay(wobble=0.0))
    s = day.spike_start_s
    assert rate[s] == pytest.approx(1.5 * rate[s - 1], rel=0.01)
    assert rate.max() == pytest.approx(1.5 * rate[s : s + day.spike_duration_s].max() / 1.5, rel=1e-9)
    with pytest.raises(ValueError, match="hour 0"):
        TrafficDay(shape=((1, 0.5), (24, 0.5)))
    with pytest.raises(ValueError, match=r"spike_factor must be a finite number >= 1, got 0\.5"):
        TrafficDay(spike_factor=0.5)
