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


@dataclass(frozen=True)
class _Steps:
    """One option's hourly cost as a step function of peak traffic, in exact fractions.

    ``cover`` is the peak traffic one replica covers once headroom and utilization are applied, so the
    cost at peak p is ``price x max(floor, ceil(p / cover))``.
    """

    price: Fraction
    cover: Fraction
    floor: int

    @classmethod
    def of(cls, option: ServingOption, grow: Fraction, util: Fraction) -> _Steps:
        """``option``'s steps with headroom ``grow - 1`` and target utilization ``util``."""
        return cls(
            price=Fraction(str(float(option.hourly_price))),
            cover=Fraction(str(float(option.rps_per_replica))) * util / grow,
            floor=option.min_replicas,
        )

    @property
    def slope(self) -> Fraction:
        """Cost per req/s of peak traffic above the floor (price per unit of capacity)."""
        return self.price / self.cover

    def cost_after(self, k: int) -> Fraction:
        """Cost on (k x cover, (k + 1) x cover], where ``ceil`` gives k + 1 replicas."""
        return self.price * max(self.floor, k + 1)


def _settled_rps(a: _Steps, b: _Steps) -> Fraction:
    """Traffic beyond which the cheaper of the two options can no longer change.

    B is cheaper forever once ``slope_a x p > max(price_b x min_b, slope_b x p + price_b)`` (and
    symmetrically for A); with equal slopes the steps keep alternating, so a long stretch is checked.
    """
    floors = max(a.floor * a.cover, b.floor * b.cover)
    if a.slope > b.slope:
        return max(b.price * b.floor / a.slope, b.price / (a.slope - b.slope), floors)
    if b.slope > a.slope:
        return max(a.price * a.floor / b.slope, a.price / (b.slope - a.slope), floors)
    return floors + 1000 * max(a.cover, b.cover)


def _check_step_count(name_a: str, name_b: str, a: _Steps, b: _Steps, settled: Fraction) -> None:
    """Refuse (ValueError) a walk to ``settled`` of more than ``_MAX_BREAK_EVEN_STEPS`` replica steps."""
    steps = settled / a.cover + settled / b.cover
    if steps > _MAX_BREAK_EVEN_STEPS:
        raise ValueError(
            f"{name_a!r} and {name_b!r} cost almost the same per unit of capacity "
            f"(slopes {float(a.slope):.6g} and {float(b.slope):.6g} per req/s); finding the exact "
            f"break-even would need about {float(steps):,.0f} replica steps. Use the continuous estimate "
            "or round the inputs."
        )


def _cheaper_ranges(a: _Steps, b: _Steps, settled: Fraction) -> tuple[list[list[Fraction]], Fraction]:
    """Every range [low, high] up to ``settled`` where B costs strictly less, and where the walk stopped.

    Walks the intervals (low, high] on which both replica counts are constant, merging adjacent ones.
    """
    ranges: list[list[Fraction]] = []
    k_a = k_b = 0  # replica steps passed
    low = Fraction(0)
    while low < settled:
        high = min((k_a + 1) * a.cover, (k_b + 1) * b.cover)
        if b.cost_after(k_b) < a.cost_after(k_a):
            if ranges and ranges[-1][1] == low:
                ranges[-1][1] = high
            else:
                ranges.append([low, high])
        if (k_a + 1) * a.cover == high:
            k_a += 1
        if (k_b + 1) * b.cover == high:
            k_b += 1
        low = high
    return ranges, low


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
    can no longer change (B cheaper forever once
    ``slope_a x p > max(price_b x min_b, slope_b x p + price_b)``, with
    ``slope = price x (1 + headroom) / (rps_per_replica x utilization)``), so near-ties caused by the
    steps are reported, not smoothed away.

    The hardened form of :func:`course_lib.cost.core.break_even_peak_rps` (same answer on shared
    vectors). It adds: exact fractions at the step edges, its own scan limit (no ``max_rps`` to
    guess), every range on which B is cheaper, the smooth estimate, a target utilization, and a
    refusal to compare two currencies.

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
    a, b = _Steps.of(option_a, grow, util), _Steps.of(option_b, grow, util)
    settled = _settled_rps(a, b)
    _check_step_count(option_a.name, option_b.name, a, b, settled)
    ranges, scanned = _cheaper_ranges(a, b, settled)
    stays: Fraction | None = None
    if a.slope > b.slope:  # beyond `scanned` B is cheaper at every traffic
        if ranges and ranges[-1][1] == scanned:
            stays = ranges[-1][0]
        else:
            ranges.append([scanned, scanned])
            stays = scanned
    out_ranges = tuple(
        (float(lo), math.inf if stays is not None and lo == stays else float(hi)) for lo, hi in ranges
    )
    continuous = _continuous_threshold(a.price, a.cover, a.floor, b.price, b.cover, b.floor)
    return BreakEven(
        option_a=option_a.name,
        option_b=option_b.name,
        rps=float(ranges[0][0]) if ranges else None,
        continuous_rps=float(continuous) if continuous is not None else None,
        stays_cheaper_above_rps=float(stays) if stays is not None else None,
        cheaper_ranges_rps=out_ranges,
        scanned_to_rps=float(scanned),
    )
