"""Cost per 1,000,000 predictions as a curve over traffic, and the level it settles to.

Lesson 5 plots, for one :class:`~course_lib.cost.ServingOption`, what a million predictions cost when
the fleet is sized for a peak and the bill is shared over the predictions served at the mean
(``mean = peak / peak_to_mean``). At high traffic the curve settles into a sawtooth around

    cost per 1M at full use x (1 + headroom) x peak_to_mean / target_utilization

because each replica then carries ``1 / (1 + headroom)`` of its capacity at the peak, times
``target_utilization``, and the mean is ``1 / peak_to_mean`` of the peak. Every argument is passed
in: nothing (headroom, peak-to-mean ratio) is fixed here.

References
----------
course_lib.cost: replicas_needed, plan_serving, cost_per_million_at_full_use.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from course_lib.core.checks import number
from course_lib.cost import ServingOption, cost_per_million_at_full_use, plan_serving
from course_lib.cost.inputs import check_headroom, check_utilization

__all__ = ["cost_per_million_curve", "full_use_level_per_million"]


def cost_per_million_curve(
    option: ServingOption,
    peaks_rps: Iterable[float],
    *,
    peak_to_mean: float,
    headroom: float,
    target_utilization: float = 1.0,
) -> np.ndarray:
    """Cost per 1,000,000 predictions of ``option`` at each peak traffic, in the option's currency.

    Parameters
    ----------
    option : ServingOption
    peaks_rps : iterable of float > 0, shape (n,)
        Peak traffic the fleet is sized for, requests per second.
    peak_to_mean : float >= 1
        Peak traffic divided by the month's mean traffic (2.0: the mean is half the peak).
    headroom : float
        Fraction of spare capacity above the peak (0.3 for 30%); see ``replicas_needed``.
    target_utilization : float in (0, 1]

    Returns
    -------
    ndarray of float, shape (n,)

    Raises
    ------
    ValueError
        For ``peak_to_mean`` < 1 or any value ``plan_serving`` refuses (a percentage passed as
        headroom, a non-positive peak).
    """
    ratio = number("peak_to_mean", peak_to_mean, min=1, unit="peak traffic / mean traffic")
    return np.array(
        [
            plan_serving(
                option,
                peak_rps=p,
                mean_rps=p / ratio,
                headroom=headroom,
                target_utilization=target_utilization,
            ).cost_per_million
            for p in peaks_rps
        ],
        dtype=float,
    )


def full_use_level_per_million(
    option: ServingOption, *, peak_to_mean: float, headroom: float, target_utilization: float = 1.0
) -> float:
    """The level ``cost_per_million_curve`` settles to at high traffic (the sawtooth's lower envelope).

    ``cost per 1M at full use x (1 + headroom) x peak_to_mean / target_utilization``, in the option's
    currency.

    Raises
    ------
    ValueError
        For ``peak_to_mean`` < 1, negative ``headroom`` or ``target_utilization`` outside (0, 1].
    """
    ratio = number("peak_to_mean", peak_to_mean, min=1, unit="peak traffic / mean traffic")
    grow = 1 + float(check_headroom(headroom))
    utilization = float(check_utilization(target_utilization))
    full_use = cost_per_million_at_full_use(option.hourly_price, option.rps_per_replica)
    return full_use * grow * ratio / utilization
