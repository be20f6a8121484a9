"""Replicas and cost, small: the three formulas of Lesson 5 in plain floats, without hardening.

:func:`replicas_needed`, :func:`cost_per_million` and :func:`break_even_rps` in
:mod:`course_lib.cost` are the hardened versions (tested against these on shared vectors).

References
----------
Source lesson 001, "Inference Optimisation and Scaling", section "CPU or GPU"; source lesson 000,
"Cost per prediction modeling".
"""

from __future__ import annotations

import itertools
import math

__all__ = ["break_even_peak_rps", "fleet_cost_per_million", "replicas_for_peak"]


def replicas_for_peak(peak_rps: float, rps_per_replica: float, headroom: float, min_replicas: int) -> int:
    """Replicas for the peak plus headroom: ``max(min_replicas, ceil(peak x (1 + headroom) / per_replica))``.

    Parameters
    ----------
    peak_rps : peak traffic, requests per second.
    rps_per_replica : requests per second one replica sustains within the latency limit (its knee).
    headroom : spare capacity above the peak as a fraction (0.3 = 30%).
    min_replicas : the floor kept for reliability.

    References
    ----------
    Source lesson 001, "CPU or GPU": 278 req/s x 1.3 / 50 req/s = 7.2, so 8 CPU replicas.
    """
    return max(min_replicas, math.ceil(peak_rps * (1 + headroom) / rps_per_replica))


def fleet_cost_per_million(hourly_price: float, replicas: int, mean_rps: float) -> float:
    """Cost of 1,000,000 predictions: ``hourly_price x replicas / (mean_rps x 3600) x 1e6``.

    The fleet is paid every hour, busy or idle; the predictions it serves come from the *mean* rate.
    """
    return hourly_price * replicas / (mean_rps * 3600) * 1e6


def break_even_peak_rps(
    cheap: tuple[float, float], big: tuple[float, float], headroom: float, min_replicas: int, max_rps: float
) -> float | None:
    """The peak above which ``big`` (price per hour, req/s per replica) costs less per hour than ``cheap``.

    Both bills are steps: constant between the peaks where either fleet adds a replica. Check every
    step up to ``max_rps`` at its midpoint and return the left edge of the last run of steps on which
    ``big`` is cheaper (``None`` if it is not cheaper on the last step).
    """
    edges = {0.0, max_rps}
    for _price, rps in (cheap, big):
        cover = rps / (1 + headroom)  # the peak one replica covers
        edges |= {k * cover for k in range(1, int(max_rps / cover) + 1)}
    steps = sorted(edges)
    answer = None  # left edge of the current run of steps on which big is cheaper
    for low, high in itertools.pairwise(steps):
        peak = (low + high) / 2
        bill_cheap, bill_big = (
            p * replicas_for_peak(peak, r, headroom, min_replicas) for p, r in (cheap, big)
        )
        if bill_big >= bill_cheap:
            answer = None
        elif answer is None:
            answer = low
    return answer
