"""Checks of numeric arguments shared by the load-testing and simulation modules.

One rule, one message: a parameter that must be a finite number above (or at least) zero is refused
with a ``ValueError`` that names it, says what is allowed and shows the value given.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["positive_number"]


def positive_number(name: str, value: object, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a float if it is a finite number > 0 (>= 0 with ``allow_zero``).

    Raises
    ------
    ValueError
        For a bool, a non-number, NaN or an infinity ("``name`` must be a finite number > 0, got
        ..."), or a number out of range ("``name`` must be > 0, got ...").

    >>> positive_number("rate_rps", 5)
    5.0
    >>> positive_number("delay_ms", 0, allow_zero=True)
    0.0
    """
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return float(value)
