"""Seeded traffic: the arrival times and request mixes every simulation and load test is driven by.

* ``poisson_arrivals_ms``: open-loop arrivals, exponential gaps (the load generator, the batching
  simulator and the knee ladders all draw from here);
* ``spike_schedule``: Poisson traffic at a base rate, a spike, then the base rate again (Lesson 6);
* ``poisson_arrival_times_s``: sparse arrivals over hours, for scale to zero (Lesson 10);
* ``zipf_weights`` / ``zipf_trace``: customer popularity following a Zipf law over a finite population
  (the k-th most popular customer is requested with probability proportional to ``k**-s``; ``s = 0`` is
  uniform), with popularity ranks spread over the customer ids by a seeded permutation (Lesson 8);
* ``TrafficDay``: a day of traffic, second by second, that an autoscaler has to follow (Lesson 10). Its
  shape is an *assumption*, stated by its parameters: a quiet night, a lunchtime rise, an evening rush
  that peaks at ``peak_rps`` and one sudden spike (a push notification, say) that multiplies the
  traffic for a few minutes. Source 001 gives Kirana Kart's ranker a peak of 278 requests a second and
  runs it at 4 replicas overnight and up to 12 in the evening rush; the defaults follow that story.
  Arrivals in each second are Poisson with the curve's rate, drawn from one seeded generator.

The same seed always gives the same times.

References
----------
Poisson arrivals: exponential inter-arrival gaps (Harchol-Balter, "Performance Modeling and Design of
Computer Systems", 2013, ch. 11). Zipf traffic: Breslau et al. (1999), "Web caching and Zipf-like
distributions", INFOCOM. Source lesson 001, "Inference Optimisation and Scaling", sections "CPU or
GPU" (278 req/s peak) and "Autoscaling" (4 replicas overnight, up to 12 at the evening rush).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_lib.core.checks import InvalidArgumentError, integer, number, positive_number

__all__ = [
    "SECONDS_PER_DAY",
    "TrafficDay",
    "arrivals_per_second",
    "poisson_arrival_times_s",
    "poisson_arrivals_ms",
    "rate_per_second",
    "spike_schedule",
    "zipf_trace",
    "zipf_weights",
]

SECONDS_PER_DAY = 86_400

#: Hour of day -> fraction of the evening peak; linear in between. An assumption, not a measurement.
DEFAULT_SHAPE: tuple[tuple[float, float], ...] = (
    (0, 0.22), (3, 0.15), (6, 0.25), (9, 0.5), (12, 0.68), (14, 0.6),
    (17, 0.75), (19, 0.95), (20, 1.0), (21, 0.85), (23, 0.4), (24, 0.22),
)  # fmt: skip


@dataclass(frozen=True)
class TrafficDay:
    """Parameters of the day.

    Parameters
    ----------
    peak_rps : float > 0
        Rate at the top of the evening rush, requests per second (spike excluded).
    shape : tuple of (hour, fraction of peak)
        Anchor points from hour 0 to hour 24, interpolated linearly.
    spike_start_s : int
        Second of the day the spike starts (default 18:30).
    spike_duration_s : int >= 0
        How long it lasts; 0 for no spike.
    spike_factor : float >= 1
        The traffic is multiplied by this during the spike.
    wobble : float in [0, 0.5)
        Minute-to-minute multiplicative noise (standard deviation of a seeded lognormal factor).
    """

    peak_rps: float = 278.0
    shape: tuple[tuple[float, float], ...] = DEFAULT_SHAPE
    spike_start_s: int = 18 * 3600 + 30 * 60
    spike_duration_s: int = 600
    spike_factor: float = 1.5
    wobble: float = 0.05

    def __post_init__(self) -> None:
        positive_number("peak_rps", self.peak_rps)
        hours = [h for h, _ in self.shape]
        if hours[0] != 0 or hours[-1] != 24 or hours != sorted(hours):
            raise InvalidArgumentError(f"shape must run from hour 0 to hour 24 in order, got hours {hours}")
        if any(not 0 <= f <= 10 for _, f in self.shape):
            raise InvalidArgumentError(
                "shape fractions must be in [0, 10] (fractions of peak_rps, not percentages)"
            )
        number("spike_start_s", self.spike_start_s, min=0, max=SECONDS_PER_DAY, max_open=True)
        positive_number("spike_duration_s", self.spike_duration_s, allow_zero=True)
        number("spike_factor", self.spike_factor, min=1)
        number("wobble", self.wobble, min=0, max=0.5, max_open=True)


def rate_per_second(day: TrafficDay, *, seed: int = 0) -> np.ndarray:
    """The day's expected request rate for each second, shape ``(86400,)``, requests per second.

    The minute-to-minute wobble is drawn from ``numpy.random.default_rng(seed)``.
    """
    hours, fractions = zip(*day.shape, strict=True)
    t_h = np.arange(SECONDS_PER_DAY) / 3600.0
    rate = day.peak_rps * np.interp(t_h, hours, fractions)
    if day.wobble:
        rng = np.random.default_rng(seed)
        per_minute = rng.lognormal(-0.5 * day.wobble**2, day.wobble, SECONDS_PER_DAY // 60)
        rate = rate * np.repeat(per_minute, 60)
    end = min(SECONDS_PER_DAY, day.spike_start_s + day.spike_duration_s)
    rate[day.spike_start_s : end] *= day.spike_factor
    return rate


def arrivals_per_second(day: TrafficDay, *, seed: int = 0) -> np.ndarray:
    """Poisson arrivals in each second of the day, shape ``(86400,)``, int64 requests.

    Uses ``seed`` for the wobble and ``seed + 1`` for the Poisson draws, so a day is reproducible.
    """
    rate = rate_per_second(day, seed=seed)
    return np.random.default_rng(seed + 1).poisson(rate).astype(np.int64)


def poisson_arrivals_ms(rate_rps: float, n: int, seed: int) -> np.ndarray:
    """Arrival times of a Poisson process: exponential gaps with mean 1000 / rate_rps ms.

    Parameters
    ----------
    rate_rps : float > 0
        Offered load, requests per second.
    n : int >= 1
        Number of arrivals.
    seed : int
        Seed of ``numpy.random.default_rng``; the same seed gives the same times.

    Returns
    -------
    ndarray of float, shape (n,): increasing arrival times in ms, the first one gap after t = 0.

    Raises
    ------
    ValueError
        For a rate that is not a finite number > 0, or n < 1.
    """
    rate_rps = positive_number("rate_rps", rate_rps)
    n = integer("n", n, min=1)
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1000.0 / rate_rps, size=int(n)))


def zipf_weights(n_items: int, s: float) -> np.ndarray:
    """Request probability of the k-th most popular of ``n_items`` (k = 1..n): ``k**-s`` normalised.

    Parameters
    ----------
    n_items : int >= 1
    s : float >= 0
        Zipf exponent (skew); 0 gives uniform popularity.

    Returns
    -------
    numpy.ndarray of float64, shape (n_items,), decreasing, summing to 1.

    Raises
    ------
    ValueError
        If ``n_items`` < 1 or ``s`` is negative or not finite.
    """
    n = integer("n_items", n_items, min=1)
    s = number("s", s, min=0)
    weights = np.arange(1, n + 1, dtype=np.float64) ** -float(s)
    return weights / weights.sum()


def zipf_trace(n_requests: int, s: float, *, n_customers: int = 1_000_000, seed: int = 0) -> np.ndarray:
    """Customer numbers (1-based, as in ``FeatureStore.customer_id``) of ``n_requests`` requests.

    Each request picks a customer independently, the popularity rank with probability
    ``zipf_weights(n_customers, s)``; rank r is customer ``permutation[r]`` of a permutation drawn
    from ``seed`` first, so the same seed gives the same popular customers for every ``s``.

    Returns
    -------
    numpy.ndarray of int64, shape (n_requests,), values in 1..n_customers.

    Raises
    ------
    ValueError
        For a non-positive count, a negative seed or an invalid ``s``.
    """
    n = integer("n_requests", n_requests, min=1)
    seed = integer("seed", seed, min=0)
    cdf = np.cumsum(zipf_weights(n_customers, s))
    rng = np.random.default_rng(seed)
    customers = rng.permutation(int(n_customers)) + 1
    ranks = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
    return customers[np.minimum(ranks, len(cdf) - 1)].astype(np.int64)


def spike_schedule(
    *, base_rps: float, spike_rps: float, before_s: float, spike_s: float, after_s: float, seed: int = 0
) -> np.ndarray:
    """Intended send times (ms) of Poisson traffic at ``base_rps``, then ``spike_rps``, then ``base_rps``.

    Returns
    -------
    ndarray of float, increasing, from 0 to before_s + spike_s + after_s seconds (in ms). The spike
    covers [before_s, before_s + spike_s) seconds.
    """
    phases = [
        (base_rps, 0.0, before_s),
        (spike_rps, before_s, spike_s),
        (base_rps, before_s + spike_s, after_s),
    ]
    parts = []
    for k, (rate, t0, length) in enumerate(phases):
        positive_number("rate", rate)
        if length <= 0:
            continue
        n = int(rate * length * 2) + 20
        times = poisson_arrivals_ms(rate, n, seed + k)
        parts.append(1000.0 * t0 + times[times < 1000.0 * length])
    out = np.concatenate(parts)
    return out - out[0] if out.size and out[0] < 0 else out


def poisson_arrival_times_s(rate_per_hour: float, hours: float, *, seed: int) -> np.ndarray:
    """Sorted Poisson arrival times in seconds over ``hours`` at ``rate_per_hour``, seeded.

    Raises ``ValueError`` for a rate or duration that is not finite and > 0.
    """
    rate_per_hour = positive_number("rate_per_hour", rate_per_hour)
    hours = positive_number("hours", hours)
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate_per_hour * hours)
    return np.sort(rng.uniform(0.0, hours * 3600.0, n))
