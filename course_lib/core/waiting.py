"""Wait for an event instead of sleeping for a guessed time.

Tests and lessons that start servers, batchers or subprocesses must order their steps on *events* ("the
server answers /healthz", "the queue holds two requests"), never on a ``sleep`` long enough on the author's
machine: on a loaded 2-core runner any fixed sleep is eventually too short. ``wait_until`` polls a
predicate until it holds or a deadline passes, and says what it was waiting for when it gives up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from course_lib.core.checks import InvalidArgumentError, positive_number

__all__ = ["async_wait_until", "wait_until"]

T = TypeVar("T")


def _check(timeout_s: float, interval_s: float) -> None:
    positive_number("timeout_s", timeout_s)
    if not 0 < interval_s <= timeout_s:
        raise InvalidArgumentError(
            f"interval_s must be in (0, timeout_s={timeout_s}] seconds, got {interval_s!r}"
        )


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.005,
    what: str = "the condition",
) -> T:
    """Call ``predicate`` until it returns a truthy value; return that value.

    Parameters
    ----------
    predicate : callable () -> T
        Checked immediately, then every ``interval_s`` seconds. Exceptions it raises propagate.
    timeout_s : float, default 10.0
        Give up after this many seconds (a bound for a hung system, not a tuned delay).
    interval_s : float, default 0.005
        Seconds between checks.
    what : str
        Description used in the error message.

    Returns
    -------
    T
        The first truthy value ``predicate`` returned.

    Raises
    ------
    TimeoutError
        If the predicate is still falsy after ``timeout_s`` seconds; the message names ``what``.
    ValueError
        If ``timeout_s`` or ``interval_s`` is not positive, or ``interval_s > timeout_s``.

    Examples
    --------
    >>> calls = iter([0, 0, 3])
    >>> wait_until(lambda: next(calls), timeout_s=1.0, interval_s=0.001)
    3
    """
    _check(timeout_s, interval_s)
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


async def async_wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.001,
    what: str = "the condition",
) -> T:
    """Asyncio version of :func:`wait_until`: yields to the event loop between checks.

    ``predicate`` may be a plain function or return an awaitable. Same parameters, return value and
    errors as :func:`wait_until`.
    """
    _check(timeout_s, interval_s)
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)
