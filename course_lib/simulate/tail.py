"""A deterministic simulation of hedged requests and fan-out on a service time with a slow tail.

Service time model: a lognormal body (median ``median_ms``, log-space spread ``sigma``) plus, with
probability ``slow_fraction``, an extra ``slow_ms`` (a stalled replica: a pause, a slow disk, a noisy
neighbour). Every draw comes from ``numpy.random.default_rng(seed)``, so a seed fixes every number.

Hedging (Dean and Barroso 2013): send the request to one replica; if it has not answered after
``hedge_after_ms``, send a copy to another replica and keep the first answer. With independent
replicas the request takes ``min(T1, hedge_after_ms + T2)`` and a copy is sent exactly when
``T1 > hedge_after_ms``, so hedging at the p95 of T1 sends 5 % extra requests.

References
----------
Dean, J. and Barroso, L. A. (2013), "The Tail at Scale", Communications of the ACM 56(2): 74-80
(hedged requests deferred to the 95th-percentile expected latency add about 5 % load; fan-out:
1 - (1 - p)^k of pages meet a slow call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from course_lib.core.checks import InvalidArgumentError, integer, number, positive_number
from course_lib.core.percentiles import percentile

__all__ = [
    "HedgingSimulation",
    "events_per_minute",
    "fanout_page_latency_ms",
    "implied_rate_rps",
    "lognormal_from_percentiles",
    "service_times_ms",
    "simulate_hedging",
    "tail_survival",
]


def service_times_ms(
    n: int,
    *,
    seed: int,
    median_ms: float = 2.0,
    sigma: float = 0.4,
    slow_fraction: float = 0.01,
    slow_ms: float = 50.0,
) -> np.ndarray:
    """``n`` service times: lognormal body plus ``slow_ms`` for a ``slow_fraction`` of them.

    Parameters
    ----------
    n : int >= 1
    seed : int
        Seed of ``numpy.random.default_rng``.
    median_ms, sigma : float > 0
        Median and log-space standard deviation of the lognormal body.
    slow_fraction : float in [0, 1]
        Probability that a request is stalled.
    slow_ms : float >= 0
        Extra time of a stalled request.

    Returns
    -------
    ndarray of float, shape (n,), in ms.

    Raises
    ------
    ValueError
        For n < 1 or a parameter outside its range.
    """
    n = integer("n", n, min=1)
    median_ms = positive_number("median_ms", median_ms)
    sigma = positive_number("sigma", sigma)
    slow_fraction = number("slow_fraction", slow_fraction, min=0, max=1)
    slow_ms = positive_number("slow_ms", slow_ms, allow_zero=True)
    rng = np.random.default_rng(seed)
    body = median_ms * np.exp(sigma * rng.standard_normal(int(n)))
    return body + slow_ms * (rng.random(int(n)) < slow_fraction)


def lognormal_from_percentiles(p50_ms: float, p99_ms: float) -> tuple[float, float]:
    """``(median_ms, sigma)`` of the lognormal whose median and 99th percentile are the given ones.

    A lognormal's q-th percentile is ``median * exp(sigma * z_q)``, ``z_q`` the standard normal's
    (2.326 for q = 99), so ``sigma = ln(p99 / p50) / z_0.99``: the body of ``service_times_ms`` fitted to a
    replica's measured p50 and p99 (without stalls), for a simulation of the same service.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        Unless 0 < p50_ms < p99_ms.

    Examples
    --------
    >>> median, sigma = lognormal_from_percentiles(2.0, 2.0 * math.exp(0.4 * 2.3263478740408408))
    >>> round(median, 6), round(sigma, 6)
    (2.0, 0.4)
    """
    p50_ms = positive_number("p50_ms", p50_ms)
    p99_ms = positive_number("p99_ms", p99_ms)
    if p99_ms <= p50_ms:
        raise InvalidArgumentError(f"p99_ms must be above p50_ms={p50_ms:g}, got {p99_ms!r}")
    return p50_ms, math.log(p99_ms / p50_ms) / NormalDist().inv_cdf(0.99)


def tail_survival(
    x_ms: float,
    *,
    median_ms: float = 2.0,
    sigma: float = 0.4,
    slow_fraction: float = 0.01,
    slow_ms: float = 50.0,
) -> float:
    """P(T > x_ms) for the service time of ``service_times_ms`` (exact, from the lognormal CDF)."""

    def body_sf(x: float) -> float:
        if x <= 0:
            return 1.0
        z = math.log(x / median_ms) / sigma
        return 0.5 * math.erfc(z / math.sqrt(2.0))

    return (1 - slow_fraction) * body_sf(x_ms) + slow_fraction * body_sf(x_ms - slow_ms)


@dataclass(frozen=True)
class HedgingSimulation:
    """One simulated run.

    Attributes
    ----------
    primary_ms, backup_ms : ndarray, shape (n,)
        Service time at the first replica and at the replica a hedge would go to.
    hedge_after_ms : float
        The hedge delay (``inf`` = no hedging).
    latency_ms : ndarray, shape (n,)
        What the client waited: ``min(primary, hedge_after + backup)`` for hedged requests.
    hedged : ndarray of bool, shape (n,)
        Requests for which a copy was sent.
    """

    primary_ms: np.ndarray
    backup_ms: np.ndarray
    hedge_after_ms: float
    latency_ms: np.ndarray
    hedged: np.ndarray

    @property
    def extra_request_fraction(self) -> float:
        """Copies sent / requests (0.05 = 5 % more requests)."""
        return float(self.hedged.mean())

    def summary(self) -> dict[str, float]:
        """p50, p99, p99.9 of the latency (nearest rank, ms) and the extra request fraction."""
        lat = self.latency_ms
        return {
            "hedge_after_ms": self.hedge_after_ms,
            "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99),
            "p99.9_ms": percentile(lat, 99.9),
            "extra_requests": self.extra_request_fraction,
        }


def simulate_hedging(
    n: int, *, hedge_after_ms: float | None, seed: int, **service: float
) -> HedgingSimulation:
    """Simulate ``n`` requests with a hedge after ``hedge_after_ms`` (None: never hedge).

    The two replicas draw independent service times (seeds ``seed`` and ``seed + 1``); a hedge is
    sent when the first has not answered after ``hedge_after_ms`` (strictly later), and the client
    keeps whichever answer comes first. ``**service`` are the ``service_times_ms`` parameters.

    Raises
    ------
    ValueError
        For a negative ``hedge_after_ms`` or bad service-time parameters.
    """
    primary = service_times_ms(n, seed=seed, **service)
    backup = service_times_ms(n, seed=seed + 1, **service)
    delay = (
        math.inf
        if hedge_after_ms is None
        else positive_number("hedge_after_ms", hedge_after_ms, allow_zero=True)
    )
    hedged = primary > delay
    latency = np.where(hedged, np.minimum(primary, delay + backup), primary)
    return HedgingSimulation(primary, backup, delay, latency, hedged)


def fanout_page_latency_ms(call_latency_ms: np.ndarray, k: int) -> np.ndarray:
    """Latency of pages that each wait for ``k`` parallel calls: the slowest of each group of k.

    Parameters
    ----------
    call_latency_ms : ndarray, shape (n,)
        Per-call latencies; the first ``(n // k) * k`` are grouped into pages in order.
    k : int >= 1

    Returns
    -------
    ndarray, shape (n // k,)

    Raises
    ------
    ValueError
        If k < 1 or there are fewer than k calls.
    """
    arr = np.asarray(call_latency_ms, dtype=float).ravel()
    k = integer("k", k, min=1)
    if arr.size < k:
        raise ValueError(f"call_latency_ms holds {arr.size} calls, fewer than one page of k={k}")
    pages = arr.size // k
    return arr[: pages * k].reshape(pages, k).max(axis=1)


def events_per_minute(rate_rps: float, one_in: float) -> float:
    """How often a 1-in-``one_in`` event happens at ``rate_rps`` requests a second, per minute."""
    return positive_number("rate_rps", rate_rps) * 60.0 / positive_number("one_in", one_in)


def implied_rate_rps(per_minute: float, one_in: float) -> float:
    """The request rate at which a 1-in-``one_in`` event happens ``per_minute`` times a minute."""
    return positive_number("per_minute", per_minute) * positive_number("one_in", one_in) / 60.0
