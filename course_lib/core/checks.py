"""Argument checks: one vocabulary, one error type and one wording for every public function.

Every check returns the value, converted (``integer`` -> ``int``, ``number`` -> ``float``), or raises
:class:`InvalidArgumentError` with a message of one shape::

    <name> must be <what is allowed>, got <value!r>

The checks: :func:`integer` (and :func:`integers` for a sequence of them), :func:`number` (and its
common case :func:`positive_number`), :func:`one_of`, :func:`callable_`, :func:`non_empty`,
:func:`distinct` and :func:`instance_of`. A rule that relates an argument to another one or to the
object's state (``min_calls <= max_calls``) is written where it applies, raising
``InvalidArgumentError`` too; ``tests/test_checks.py`` fails on a new hand-written single-argument
check anywhere else in ``course_lib``. A long value is shown cut to 80 characters.

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
from collections.abc import Callable, Iterable, Sized
from typing import Any, TypeVar

__all__ = [
    "InvalidArgumentError",
    "callable_",
    "distinct",
    "instance_of",
    "integer",
    "integers",
    "non_empty",
    "number",
    "one_of",
    "positive_number",
]

T = TypeVar("T")
S = TypeVar("S", bound=Sized)

#: Longest ``repr`` of a value a message shows; longer ones are cut with "..." (a 10,000-row array
#: passed as a count must not flood the traceback).
_SHOWN_CHARS = 80


class InvalidArgumentError(ValueError, TypeError):
    """An argument outside what a function accepts; the message names it, the rule and the value."""


def _shown(value: object) -> str:
    """``repr(value)``, cut to :data:`_SHOWN_CHARS` characters."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _bound(x: float) -> str:
    """A bound as written: 1000000 not 1e+06, 0.5 as 0.5, 1e-07 as 1e-07."""
    if isinstance(x, numbers.Integral) or (math.isfinite(x) and float(x) == int(x) and abs(x) < 1e15):
        return str(int(x))
    return f"{x:g}" if float(f"{x:g}") == x else repr(float(x))


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """The allowed range in words: " >= 1", " > 0 and <= 1", or "" when unbounded."""
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {_bound(low)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {_bound(high)}")
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
        or ((min is not None and int(value) < min) or (max is not None and int(value) > max))
    ):
        raise InvalidArgumentError(
            f"{name} must be an integer{_bounds(min, max, False, False)}, got {_shown(value)}"
        )
    return int(value)


def integers(
    name: str,
    values: Iterable[object],
    *,
    min: int | None = None,
    max: int | None = None,
    allow_empty: bool = False,
) -> list[int]:
    """Return ``values`` as a list of ``int`` if every item passes :func:`integer` (and there is one).

    For a list of batch sizes, cache sizes or tree counts. The message names the first bad item by
    its position, ``name[i]``.

    Raises
    ------
    InvalidArgumentError
        "``name`` must be non-empty, got an empty list" (unless ``allow_empty``),
        "``name[2]`` must be an integer >= 1, got 0", or "``name`` must be a sequence of integers, got 3".

    >>> integers("batch_sizes", (1, 8, 64), min=1)
    [1, 8, 64]
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidArgumentError(f"{name} must be a sequence of integers, got {_shown(values)}")
    items = list(values)
    if not items and not allow_empty:
        raise InvalidArgumentError(f"{name} must be non-empty, got an empty {type(values).__name__}")
    return [integer(f"{name}[{i}]", v, min=min, max=max) for i, v in enumerate(items)]


def number(
    name: str,
    value: object,
    *,
    min: float | None = None,
    max: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
    finite: bool = True,
    unit: str | None = None,
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
    unit : str, optional
        What the number counts, for a name that does not say it ("USD per replica-hour"); shown in
        brackets after the rule.

    Raises
    ------
    InvalidArgumentError
        "``name`` must be a finite number > 0, got nan" (the bounds as given; with ``unit``,
        "... > 0 (USD per replica-hour), got -1").

    >>> number("p99_limit_ms", 25, min=0, min_open=True)
    25.0
    >>> number("q", 0.99, min=0, max=1)
    0.99
    """
    rule = f"{'a finite number' if finite else 'a number'}{_bounds(min, max, min_open, max_open)}"
    message = f"{name} must be {rule}{f' ({unit})' if unit else ''}, got {_shown(value)}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(message)
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)):
        raise InvalidArgumentError(message)
    if (min is not None and (v < min or (min_open and v == min))) or (
        max is not None and (v > max or (max_open and v == max))
    ):
        raise InvalidArgumentError(message)
    return v


def positive_number(name: str, value: object, *, allow_zero: bool = False, unit: str | None = None) -> float:
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
    return number(name, value, min=0, min_open=not allow_zero, unit=unit)


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
        raise InvalidArgumentError(f"{name} must be one of {listed}, got {_shown(value)}")
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
        raise InvalidArgumentError(f"{name} must be callable, got {_shown(value)}")
    return value


def non_empty(name: str, value: S, *, min_items: int = 1) -> S:
    """Return ``value`` if it holds at least ``min_items`` items (one by default).

    For a sequence, mapping, set, array or DataFrame argument that the function cannot work without
    (no candidates to time, no rows to score, fewer than two replicas to hedge between). Check the
    items themselves with the other checks.

    Raises
    ------
    InvalidArgumentError
        "``name`` must be non-empty, got an empty list"; "``name`` must hold at least 2 items, got 1";
        "``name`` must be a sized collection, got 3" when ``value`` has no length.

    >>> non_empty("batch_sizes", [1, 8])
    [1, 8]
    """
    if not isinstance(value, Sized):
        raise InvalidArgumentError(f"{name} must be a sized collection, got {_shown(value)}")
    if len(value) == 0 and min_items <= 1:
        raise InvalidArgumentError(f"{name} must be non-empty, got an empty {type(value).__name__}")
    if len(value) < min_items:
        raise InvalidArgumentError(f"{name} must hold at least {min_items} items, got {len(value)}")
    return value


def distinct(name: str, values: Iterable[T], *, key: Callable[[T], Any] | None = None) -> list[T]:
    """Return ``values`` as a list if no item appears twice (compared with ``==`` and ``hash``).

    For names that key a table, replicas to hedge between, batch sizes to time once each. ``key``
    compares ``key(item)`` instead (``repr`` for unhashable items).

    Raises
    ------
    InvalidArgumentError
        "``name`` must not repeat an item, got 'a' twice".

    >>> distinct("replica_urls", ["http://a", "http://b"])
    ['http://a', 'http://b']
    """
    items = list(values)
    seen: set[Any] = set()
    for item in items:
        k = item if key is None else key(item)
        if k in seen:
            raise InvalidArgumentError(f"{name} must not repeat an item, got {_shown(item)} twice")
        seen.add(k)
    return items


def instance_of(name: str, value: object, types: type[T] | tuple[type, ...]) -> T:
    """Return ``value`` if it is an instance of ``types`` (one class or a tuple of classes).

    For arguments of a library type (a ``str`` path, an ``onnx.ModelProto``, a ``pandas.DataFrame``);
    use :func:`integer` and :func:`number` for numbers (they refuse ``bool`` and accept numpy scalars).

    Raises
    ------
    InvalidArgumentError
        "``name`` must be a str, got 3 (int)" (the class names as written, the value and its type).

    >>> instance_of("model_path", "churn.onnx", str)
    'churn.onnx'
    """
    classes = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, classes):
        names = " or ".join(_class_name(c) for c in classes)
        raise InvalidArgumentError(
            f"{name} must be {_article(names)} {names}, got {_shown(value)} ({type(value).__name__})"
        )
    return value  # type: ignore[return-value]


def _class_name(cls: type) -> str:
    """``str``, ``pathlib.Path``, ``pandas.DataFrame``: builtins and the course's own classes bare,
    a library's with its package."""
    if cls.__module__ == "builtins" or cls.__module__.startswith("course_lib."):
        return cls.__qualname__
    return f"{cls.__module__.split('.')[0]}.{cls.__qualname__}"


def _article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"
