"""Checked, exact inputs for the cost model: every error names the parameter, the value and what is allowed.

Each number is read as the decimal it prints as (``str(float(x))``) and returned as a
:class:`fractions.Fraction`, so the formulas in :mod:`course_lib.cost.fleet`,
:mod:`course_lib.cost.options` and :mod:`course_lib.cost.break_even` are exact on the decimals typed
(100 req/s x 1.1 / 10 req/s is exactly 11 replicas, not 11.000000000000002).
"""

from __future__ import annotations

import numbers
import re
from fractions import Fraction

from course_lib.core.checks import InvalidArgumentError, instance_of, integer, number, positive_number

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
    course_lib.core.checks.InvalidArgumentError
        (a TypeError and a ValueError) If ``value`` is not a finite real number; the message names
        ``name``, the value and ``unit``.

    Examples
    --------
    >>> check_number("price", 0.17, "currency per hour")
    Fraction(17, 100)
    """
    return _exact(number(name, value, unit=unit), value)


def _exact(as_float: float, value: object) -> Fraction:
    """An integer exactly; any other real as the decimal it prints as."""
    return Fraction(int(value)) if isinstance(value, numbers.Integral) else Fraction(str(as_float))


def check_positive(name: str, value: object, unit: str) -> Fraction:
    """``value`` > 0 as an exact Fraction (:func:`check_number`)."""
    return _exact(positive_number(name, value, unit=unit), value)


def check_non_negative(name: str, value: object, unit: str) -> Fraction:
    """``value`` >= 0 as an exact Fraction (:func:`check_number`)."""
    return _exact(positive_number(name, value, allow_zero=True, unit=unit), value)


def check_at_most(name: str, exact: Fraction, value: object, limit: float, why: str) -> Fraction:
    """``exact`` (the checked ``value``) if it is <= ``limit``; ``why`` says where the limit comes from."""
    number(name, value, max=limit, unit=why)
    return exact


def check_headroom(value: object) -> Fraction:
    """Spare capacity above the peak as a fraction in [0, 10]: 0.3 for 30 % (a percentage is refused)."""
    return _exact(
        number("headroom", value, min=0, max=_MAX_HEADROOM, unit="a fraction of peak traffic, 0.3 for 30%"),
        value,
    )


def check_utilization(value: object) -> Fraction:
    """The share of a replica's measured capacity it runs at, in (0, 1]: 0.7 for 70 %."""
    return _exact(
        number(
            "target_utilization",
            value,
            min=0,
            max=1,
            min_open=True,
            unit="a fraction of one replica's measured capacity, 0.7 for 70%",
        ),
        value,
    )


def check_min_replicas(value: object) -> int:
    """Replicas that always run: an integer >= 1 (a service needs a replica to answer)."""
    return integer("min_replicas", value, min=1)


def check_hours_per_month(value: object) -> Fraction:
    exact = check_positive("hours_per_month", value, "hours billed per month, 720 for 30 days")
    return check_at_most(
        "hours_per_month", exact, value, _MAX_HOURS_PER_MONTH, "a month has at most 744 hours"
    )


def check_currency(value: object) -> str:
    """An ISO 4217 code (three capital letters, e.g. "USD", "INR"); ValueError naming the value otherwise."""
    value = instance_of("currency", value, str)
    if not _CURRENCY.match(value):
        raise InvalidArgumentError(f"currency must be an ISO 4217 code such as 'USD' or 'INR', got {value!r}")
    return value
