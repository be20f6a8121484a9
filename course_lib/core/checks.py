"""Argument checks: one vocabulary, one error type and one wording for every public function.

Every check returns the value, converted (``integer`` -> ``int``, ``number`` -> ``float``), or raises
:class:`InvalidArgumentError` with a message of one shape::

    <name> must be <what is allowed>, got <value!r>

``InvalidArgumentError`` subclasses both ``ValueError`` and ``TypeError`` (scikit-learn's
``InvalidParameterError`` does the same), so callers that catch either keep working whether the value
had the wrong type or the wrong size. Integers are ``numbers.Integral`` (``int``, ``numpy.int64``, ...)
and numbers are ``numbers.Real`` (``float``, ``numpy.float32``, ...); ``bool`` is refused by both,
because ``True`` passed for a count or a rate is a bug, not a 1.

References
----------
scikit-learn, ``sklearn/utils/_param_validation.py`` (``InvalidParameterError``, ``Interval``,
``StrOptions``); Python documentation, :mod:`numbers` (the numeric tower numpy registers with).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = [
    "InvalidArgumentError",
    "callable_",
    "integer",
    "number",
    "one_of",
    "positive_number",
]

T = TypeVar("T")


class InvalidArgumentError(ValueError, TypeError):
    """An argument outside what a function accepts; the message names it, the rule and the value."""


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """The allowed range in words: " >= 1", " > 0 and <= 1", or "" when unbounded."""
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return (" " + " and ".join(parts)) if parts else ""


def integer(name: str, value: object, *, min: int | None = None, max: int | None = None) -> int:
    """Return ``value`` as an ``int`` if it is an integer (not a bool) within ``[min, max]``.

    Parameters
    ----------
    name : str
        The parameter's name, as the caller spells it (used in the message).
    value : object
        What the caller passed.
    min, max : int, optional
        Inclusive bounds; ``None`` leaves that side open.

    Raises
    ------
    InvalidArgumentError
        "``name`` must be an integer >= 1, got 0" (the bounds as given).

    >>> integer("n_requests", 5, min=1)
    5
    >>> import numpy as np; integer("seed", np.int64(3), min=0)
    3
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or ((min is not None and value < min) or (max is not None and value > max))
    ):
        raise InvalidArgumentError(
            f"{name} must be an integer{_bounds(min, max, False, False)}, got {value!r}"
        )
    return int(value)


def number(
    name: str,
    value: object,
    *,
    min: float | None = None,
    max: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
    finite: bool = True,
) -> float:
    """Return ``value`` as a ``float`` if it is a real number (not a bool) within the bounds.

    Parameters
    ----------
    name : str
        The parameter's name (used in the message).
    value : object
        What the caller passed.
    min, max : float, optional
        Bounds; ``None`` leaves that side open. Inclusive unless ``min_open`` / ``max_open``.
    finite : bool
        Refuse NaN and infinities (default). With ``finite=False`` an infinity is allowed when the
        bounds allow it; NaN is always refused.

    Raises
    ------
    InvalidArgumentError
        "``name`` must be a finite number > 0, got nan" (the bounds as given).

    >>> number("p99_limit_ms", 25, min=0, min_open=True)
    25.0
    >>> number("q", 0.99, min=0, max=1)
    0.99
    """
    what = "a finite number" if finite else "a number"
    bounds = _bounds(min, max, min_open, max_open)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be {what}{bounds}, got {value!r}")
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)):
        raise InvalidArgumentError(f"{name} must be {what}{bounds}, got {value!r}")
    if (min is not None and (v < min or (min_open and v == min))) or (
        max is not None and (v > max or (max_open and v == max))
    ):
        raise InvalidArgumentError(f"{name} must be {what}{bounds}, got {value!r}")
    return v


def positive_number(name: str, value: object, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a float if it is a finite number > 0 (>= 0 with ``allow_zero``).

    The common case of :func:`number`.

    Raises
    ------
    InvalidArgumentError
        "``name`` must be a finite number > 0, got ..." (">= 0" with ``allow_zero``).

    >>> positive_number("rate_rps", 5)
    5.0
    >>> positive_number("delay_ms", 0, allow_zero=True)
    0.0
    """
    return number(name, value, min=0, min_open=not allow_zero)


def one_of(name: str, value: T, allowed: Iterable[T]) -> T:
    """Return ``value`` if it is one of ``allowed`` (compared with ``==``; types must match exactly).

    Raises
    ------
    InvalidArgumentError
        "``name`` must be one of 'a', 'b', got 'c'".

    >>> one_of("method", "nearest-rank", ("nearest-rank", "linear"))
    'nearest-rank'
    """
    options = tuple(allowed)
    if not any(type(value) is type(option) and value == option for option in options):
        listed = ", ".join(repr(o) for o in options)
        raise InvalidArgumentError(f"{name} must be one of {listed}, got {value!r}")
    return value


def callable_(name: str, value: Any) -> Callable[..., Any]:
    """Return ``value`` if it is callable.

    Raises
    ------
    InvalidArgumentError
        "``name`` must be callable, got 3".

    >>> callable_("send", print) is print
    True
    """
    if not callable(value):
        raise InvalidArgumentError(f"{name} must be callable, got {value!r}")
    return value
