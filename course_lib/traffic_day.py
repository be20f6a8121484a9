"""A seeded day of traffic: the request rate, second by second, that an autoscaler has to follow.

The shape is an *assumption*, stated by its parameters: a quiet night, a lunchtime rise, an evening rush
that peaks at ``peak_rps`` and one sudden spike (a push notification, say) that multiplies the traffic
for a few minutes. Seed 001 gives Kirana Kart's ranker a peak of 278 requests a second and runs it at
4 replicas overnight and up to 12 in the evening rush; the defaults below follow that story. Arrivals
in each second are Poisson with the curve's rate, drawn from one seeded generator, so the same seed
always gives the same day.

References
----------
Source lesson 001, "Inference Optimisation and Scaling", sections "CPU or GPU" (278 req/s peak) and
"Autoscaling" (4 replicas overnight, up to 12 at the evening rush).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["SECONDS_PER_DAY", "TrafficDay", "arrivals_per_second", "rate_per_second"]

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
        if not math.isfinite(self.peak_rps) or self.peak_rps <= 0:
            raise ValueError(f"peak_rps must be finite and > 0 requests per second, got {self.peak_rps!r}")
        hours = [h for h, _ in self.shape]
        if hours[0] != 0 or hours[-1] != 24 or hours != sorted(hours):
            raise ValueError(f"shape must run from hour 0 to hour 24 in order, got hours {hours}")
        if any(not 0 <= f <= 10 for _, f in self.shape):
            raise ValueError("shape fractions must be in [0, 10] (fractions of peak_rps, not percentages)")
        if not 0 <= self.spike_start_s < SECONDS_PER_DAY or self.spike_duration_s < 0:
            raise ValueError(
                f"spike_start_s must be in [0, 86400) and spike_duration_s >= 0, "
                f"got {self.spike_start_s!r}, {self.spike_duration_s!r}"
            )
        if not self.spike_factor >= 1:
            raise ValueError(f"spike_factor must be >= 1 (a multiplier), got {self.spike_factor!r}")
        if not 0 <= self.wobble < 0.5:
            raise ValueError(f"wobble must be in [0, 0.5), got {self.wobble!r}")


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
