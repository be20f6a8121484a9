"""Break-even traffic: the peak requests/s above which one serving option costs less per month than another.

Each option's monthly cost is a step function of peak traffic (whole replicas, a ``min_replicas``
floor); :func:`break_even_rps` walks every step exactly and also reports the smooth approximation.

References
----------
Source lesson 001, "CPU or GPU" (where a GPU replica starts to pay for itself).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

from course_lib.core.checks import instance_of
from course_lib.cost.inputs import check_headroom, check_utilization
from course_lib.cost.options import ServingOption, check_same_currency

__all__ = ["BreakEven", "break_even_rps"]

_MAX_BREAK_EVEN_STEPS = 250_000


@dataclass(frozen=True)
class BreakEven:
    """Where option B becomes cheaper than option A, as peak traffic in requests per second.

    Attributes
    ----------
    option_a, option_b : str
        Names of the two options.
    rps : float or None
        Lowest peak traffic above which B is strictly cheaper per month (B is cheaper just above it);
        0.0 if B is cheaper from the first request, None if B is never cheaper.
    continuous_rps : float or None
        The same threshold for the smooth approximation that ignores the whole-replica steps
        (``price x max(min_replicas, peak x (1 + headroom) / (rps_per_replica x utilization))``).
    stays_cheaper_above_rps : float or None
        Traffic above which B is cheaper at every higher traffic; None if B is not cheaper for all
        large traffic (it costs more per unit of capacity, or the same).
    cheaper_ranges_rps : tuple of (low, high)
        Every range (low, high] of peak traffic up to ``scanned_to_rps`` where B is strictly cheaper;
        ``high`` is ``math.inf`` for the range that never ends.
    scanned_to_rps : float
        Traffic up to which every replica step was checked exactly.
    """

    option_a: str
    option_b: str
    rps: float | None
    continuous_rps: float | None
    stays_cheaper_above_rps: float | None
    cheaper_ranges_rps: tuple[tuple[float, float], ...]
    scanned_to_rps: float


def _continuous_threshold(
    price_a: Fraction, cover_a: Fraction, min_a: int, price_b: Fraction, cover_b: Fraction, min_b: int
) -> Fraction | None:
    """Infimum of {p >= 0 : cost_b(p) < cost_a(p)} for cost(p) = price x max(min, p / cover)."""

    def cost(price: Fraction, cover: Fraction, floor: int, p: Fraction) -> Fraction:
        return price * max(Fraction(floor), p / cover)

    def gap(p: Fraction) -> Fraction:  # > 0 where B is cheaper
        return cost(price_a, cover_a, min_a, p) - cost(price_b, cover_b, min_b, p)

    if gap(Fraction(0)) > 0:
        return Fraction(0)
    # Between knots both costs are linear, so the gap is linear; it is <= 0 at each piece's start
    # (otherwise an earlier piece would have ended positive). Find the first piece where it rises above 0.
    knots = sorted({Fraction(0), min_a * cover_a, min_b * cover_b})
    for low, high in [*itertools.pairwise(knots), (knots[-1], None)]:
        probe = high if high is not None else low + 1
        slope = (gap(probe) - gap(low)) / (probe - low)
        if (high is not None and gap(high) > 0) or (high is None and slope > 0):
            return low - gap(low) / slope
    return None


def break_even_rps(
    option_a: ServingOption,
    option_b: ServingOption,
    *,
    headroom: float = 0.3,
    target_utilization: float = 1.0,
) -> BreakEven:
    """Peak traffic at which option B (e.g. GPU) starts to cost less per month than option A (e.g. CPU).

    Each option's monthly cost is ``hourly_price x replicas_needed(peak) x hours``, a step function
    of the peak that starts at the ``min_replicas`` floor. Hours and the mean traffic cancel out (both
    options serve the same predictions), so the break-even point is the same per month and per
    prediction. Every replica step is checked exactly up to the traffic beyond which the cheaper option
    can no longer change (B cheaper forever once ``slope_a x p > max(price_b x min_b, slope_b x p + price_b)``,
    with ``slope = price x (1 + headroom) / (rps_per_replica x utilization)``), so
    near-ties caused by the steps are reported, not smoothed away.

    Parameters
    ----------
    option_a, option_b : ServingOption
        The incumbent and the challenger; same currency.
    headroom, target_utilization : see :func:`replicas_needed`.

    Returns
    -------
    BreakEven

    Raises
    ------
    TypeError
        If an option is not a ServingOption.
    ValueError
        For mixed currencies, an invalid ``headroom``/``target_utilization``, or options so close in
        cost per unit of capacity that more than 250,000 replica steps would have to be checked.
    """
    instance_of("option_a", option_a, ServingOption)
    instance_of("option_b", option_b, ServingOption)
    check_same_currency([option_a, option_b])
    grow = 1 + check_headroom(headroom)
    util = check_utilization(target_utilization)
    price_a = Fraction(str(float(option_a.hourly_price)))
    price_b = Fraction(str(float(option_b.hourly_price)))
    # Peak traffic one replica covers once headroom and utilization are applied.
    cover_a = Fraction(str(float(option_a.rps_per_replica))) * util / grow
    cover_b = Fraction(str(float(option_b.rps_per_replica))) * util / grow
    min_a, min_b = option_a.min_replicas, option_b.min_replicas
    slope_a, slope_b = price_a / cover_a, price_b / cover_b

    floors = max(min_a * cover_a, min_b * cover_b)
    if slope_a > slope_b:
        settled = max(price_b * min_b / slope_a, price_b / (slope_a - slope_b), floors)
    elif slope_b > slope_a:
        settled = max(price_a * min_a / slope_b, price_a / (slope_b - slope_a), floors)
    else:  # equal cost per unit of capacity: the steps keep alternating; check a long stretch
        settled = floors + 1000 * max(cover_a, cover_b)
    steps = settled / cover_a + settled / cover_b
    if steps > _MAX_BREAK_EVEN_STEPS:
        raise ValueError(
            f"{option_a.name!r} and {option_b.name!r} cost almost the same per unit of capacity "
            f"(slopes {float(slope_a):.6g} and {float(slope_b):.6g} per req/s); finding the exact "
            f"break-even would need about {float(steps):,.0f} replica steps. Use the continuous estimate "
            "or round the inputs."
        )

    # Walk the intervals (low, high] on which both replica counts are constant.
    ranges: list[list[Fraction]] = []
    k_a = k_b = 0  # replica steps passed: on (k x cover, (k + 1) x cover] ceil() gives k + 1
    low = Fraction(0)
    while low < settled:
        high = min((k_a + 1) * cover_a, (k_b + 1) * cover_b)
        cost_a = price_a * max(min_a, k_a + 1)
        cost_b = price_b * max(min_b, k_b + 1)
        if cost_b < cost_a:
            if ranges and ranges[-1][1] == low:
                ranges[-1][1] = high
            else:
                ranges.append([low, high])
        if (k_a + 1) * cover_a == high:
            k_a += 1
        if (k_b + 1) * cover_b == high:
            k_b += 1
        low = high
    stays: Fraction | None = None
    if slope_a > slope_b:  # beyond `low` B is cheaper at every traffic
        if ranges and ranges[-1][1] == low:
            stays = ranges[-1][0]
        else:
            ranges.append([low, low])
            stays = low
    out_ranges = tuple(
        (float(a), math.inf if stays is not None and a == stays else float(b)) for a, b in ranges
    )
    continuous = _continuous_threshold(price_a, cover_a, min_a, price_b, cover_b, min_b)
    return BreakEven(
        option_a=option_a.name,
        option_b=option_b.name,
        rps=float(ranges[0][0]) if ranges else None,
        continuous_rps=float(continuous) if continuous is not None else None,
        stays_cheaper_above_rps=float(stays) if stays is not None else None,
        cheaper_ranges_rps=out_ranges,
        scanned_to_rps=float(low),
    )
