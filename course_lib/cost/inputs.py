"""Checked, exact inputs for the cost model: every error names the parameter, the value and what is allowed.

Each number is read as the decimal it prints as (``str(float(x))``) and returned as a
:class:`fractions.Fraction`, so the formulas in :mod:`course_lib.cost.fleet`,
:mod:`course_lib.cost.options` and :mod:`course_lib.cost.break_even` are exact on the decimals typed
(100 req/s x 1.1 / 10 req/s is exactly 11 replicas, not 11.000000000000002).
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction

__all__ = [
    "HOURS_PER_MONTH",
    "MAX_HOURS_PER_YEAR",
    "SECONDS_PER_HOUR",
    "check_at_most",
    "check_currency",
    "check_headroom",
    "check_hours_per_month",
    "check_min_replicas",
    "check_non_negative",
    "check_number",
    "check_positive",
    "check_utilization",
]

#: The sources' billing month: 30 days x 24 hours. A calendar month has 672 to 744 hours.
HOURS_PER_MONTH = 720.0
SECONDS_PER_HOUR = 3600
_MAX_HOURS_PER_MONTH = 31 * 24
MAX_HOURS_PER_YEAR = 366 * 24
_MAX_HEADROOM = 10.0
_CURRENCY = re.compile(r"^[A-Z]{3}$")


def check_number(name: str, value: object, unit: str) -> Fraction:
    """``value`` as an exact Fraction of its printed decimal.

    Parameters
    ----------
    name : str
        The caller's parameter name, quoted in errors.
    value : real number (int, float, numpy number); not bool, not a string.
    unit : str
        What the number counts, quoted in errors (e.g. "requests per second").

    Raises
    ------
    TypeError
        If ``value`` is not a real number.
    ValueError
        If it is not finite.

    Examples
    --------
    >>> check_number("price", 0.17, "currency per hour")
    Fraction(17, 100)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a number in {unit}, got {value!r} ({type(value).__name__}); "
            "pass the number alone, the unit is part of the parameter's name"
        )
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ValueError(f"{name} must be a finite number in {unit}, got {value!r}")
    return Fraction(str(as_float))


def check_positive(name: str, value: object, unit: str) -> Fraction:
    exact = check_number(name, value, unit)
    if exact <= 0:
        raise ValueError(f"{name} must be > 0 ({unit}), got {value!r}")
    return exact


def check_non_negative(name: str, value: object, unit: str) -> Fraction:
    exact = check_number(name, value, unit)
    if exact < 0:
        raise ValueError(f"{name} must be >= 0 ({unit}), got {value!r}")
    return exact


def check_at_most(name: str, exact: Fraction, value: object, limit: float, why: str) -> Fraction:
    if exact > limit:
        raise ValueError(f"{name} must be <= {limit:g} ({why}), got {value!r}")
    return exact


def check_headroom(value: object) -> Fraction:
    exact = check_non_negative("headroom", value, "a fraction of peak traffic, 0.3 for 30%")
    if exact > _MAX_HEADROOM:
        raise ValueError(
            f"headroom must be a fraction between 0 and {_MAX_HEADROOM:g} (0.3 means 30% above peak), "
            f"got {value!r}; did you pass a percentage?"
        )
    return exact


def check_utilization(value: object) -> Fraction:
    exact = check_number("target_utilization", value, "a fraction of one replica's capacity")
    if not 0 < exact <= 1:
        raise ValueError(
            f"target_utilization must be in (0, 1] (0.7 means run replicas at 70% of their measured "
            f"capacity), got {value!r}"
        )
    return exact


def check_min_replicas(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"min_replicas must be a whole number (int) >= 1, got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise ValueError(f"min_replicas must be >= 1 (a service needs a replica to answer), got {value!r}")
    return int(value)


def check_hours_per_month(value: object) -> Fraction:
    exact = check_positive("hours_per_month", value, "hours billed per month, 720 for 30 days")
    return check_at_most(
        "hours_per_month", exact, value, _MAX_HOURS_PER_MONTH, "a month has at most 744 hours"
    )


def check_currency(value: object) -> str:
    """An ISO 4217 code (three capital letters, e.g. "USD", "INR"); ValueError naming the value otherwise."""
    if not isinstance(value, str) or not _CURRENCY.match(value):
        raise ValueError(f"currency must be an ISO 4217 code such as 'USD' or 'INR', got {value!r}")
    return value
