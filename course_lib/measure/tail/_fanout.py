"""Fan-out measured against ``1 - (1 - p)^k``: which calls stalled, slow pages, exact binomial intervals.

A page that waits for ``k`` parallel calls is slow when any of them is. If each call is slow with
probability ``p`` *independently* of the others, a page is slow with probability ``1 - (1 - p)^k``
(Dean and Barroso's fan-out arithmetic). :func:`fanout_check` puts the share of slow pages measured
next to the formula at the share of slow calls measured in the same run, each with the exact
(Clopper-Pearson) interval of a proportion, and counts what would break the independence: slow pages
none of whose calls was stalled (the page's calls queued behind each other on the same replicas or in
the same client). :func:`stalled_calls` says which calls a replica stalled, from the seeded choice
the replica makes (``course_lib.serving.replica.is_slow``).

References
----------
Dean, J. and Barroso, L. A. (2013), "The Tail at Scale", CACM 56(2): 74-80 (fan-out and the tail).
Clopper, C. J. and Pearson, E. S. (1934), "The use of confidence or fiducial limits illustrated in the
case of the binomial", Biometrika 26(4): 404-413; ``scipy.stats.binomtest(...).proportion_ci``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from course_lib.core.checks import integer, number, positive_number
from course_lib.serving.hedging import FanoutRun
from course_lib.serving.replica import is_slow


def stalled_calls(
    request_ids: Sequence[str] | np.ndarray,
    primary: Sequence[int] | np.ndarray,
    *,
    replica: int,
    seed: int,
    slow_fraction: float,
) -> np.ndarray:
    """Which calls went first to ``replica`` and were stalled there (``course_lib.serving.replica.is_slow``).

    Parameters
    ----------
    request_ids, primary : arrays of the same shape
        Each call's ``x-request-id`` and the replica it was sent to first.
    replica : int
        Index of the replica that stalls.
    seed, slow_fraction
        That replica's stall settings.

    Returns
    -------
    ndarray of bool, the shape of ``request_ids``.
    """
    ids = np.asarray(request_ids, dtype=object)
    first = np.asarray(primary)
    if ids.shape != first.shape:
        raise ValueError(
            f"request_ids and primary must have the same shape, got {ids.shape} and {first.shape}"
        )
    slow = np.vectorize(lambda i: is_slow(str(i), seed=seed, slow_fraction=slow_fraction), otypes=[bool])
    return (first == replica) & (slow(ids) if ids.size else np.zeros(ids.shape, dtype=bool))


def binomial_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval for a proportion: ``scipy.stats.binomtest(...).proportion_ci``.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For ``trials`` < 1, ``successes`` outside 0..trials, or a confidence outside (0, 1).

    Examples
    --------
    >>> low, high = binomial_interval(0, 100)
    >>> (low, round(high, 4))
    (0.0, 0.0362)
    """
    from scipy.stats import binomtest  # noqa: PLC0415 (heavy optional dependency)

    trials = integer("trials", trials, min=1)
    successes = integer("successes", successes, min=0, max=trials)
    confidence = number("confidence", confidence, min=0, max=1, min_open=True, max_open=True)
    ci = binomtest(successes, trials).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


@dataclass(frozen=True)
class FanoutCheck:
    """Slow pages measured next to ``1 - (1 - p)^k`` (:func:`fanout_check`); fractions in [0, 1].

    Attributes
    ----------
    k, pages : int
        Calls per page, pages loaded.
    slow_ms : float
        A call or a page slower than this counts as slow.
    p_call, p_call_low, p_call_high : float
        Share of slow calls, with its exact interval.
    predicted, predicted_low, predicted_high : float
        ``1 - (1 - p)^k`` at ``p_call`` and at the ends of its interval.
    slow_pages, slow_pages_low, slow_pages_high : float
        Share of slow pages measured, with its exact interval.
    pages_with_stall : int
        Pages with at least one stalled call.
    slow_without_stall : int
        Slow pages none of whose calls was stalled: slowness the page made itself (its calls queued
        behind each other), which the independence assumption leaves out.
    stalled_not_slow : int
        Pages with a stalled call that were not slow (a hedge answered in time, say).
    confidence : float
    """

    k: int
    pages: int
    slow_ms: float
    p_call: float
    p_call_low: float
    p_call_high: float
    predicted: float
    predicted_low: float
    predicted_high: float
    slow_pages: float
    slow_pages_low: float
    slow_pages_high: float
    pages_with_stall: int
    slow_without_stall: int
    stalled_not_slow: int
    confidence: float

    @property
    def agrees(self) -> bool:
        """True when the formula's value lies inside the measured share's interval."""
        return self.slow_pages_low <= self.predicted <= self.slow_pages_high

    def as_dict(self) -> dict[str, float]:
        """The fields and ``agrees``, for a table row."""
        return {**self.__dict__, "agrees": self.agrees}


def fanout_check(
    run: FanoutRun, stalled: np.ndarray, *, slow_ms: float, confidence: float = 0.95
) -> FanoutCheck:
    """Compare the share of slow pages with ``1 - (1 - p)^k``, p the share of slow calls of the same run.

    Parameters
    ----------
    run : FanoutRun
        Pages of ``k`` calls (``course_lib.serving.hedging.fanout_pages``).
    stalled : ndarray of bool, shape (pages, k)
        Which calls a replica stalled (:func:`stalled_calls`).
    slow_ms : float > 0
        The threshold of a slow call and of a slow page.
    confidence : float in (0, 1)

    Returns
    -------
    FanoutCheck

    Raises
    ------
    ValueError
        If ``stalled`` does not have the shape of ``run.call_ms``, or ``slow_ms`` is not > 0.
    """
    slow_ms = positive_number("slow_ms", slow_ms)
    stalled = np.asarray(stalled, dtype=bool)
    if stalled.shape != run.call_ms.shape:
        raise ValueError(
            f"stalled must have the shape of run.call_ms {run.call_ms.shape}, got {stalled.shape}"
        )
    slow_calls = run.call_ms > slow_ms
    slow_pages = run.page_ms > slow_ms
    any_stall = stalled.any(axis=1)
    n_calls, n_pages = int(slow_calls.size), int(slow_pages.size)
    p = float(slow_calls.mean())
    p_low, p_high = binomial_interval(int(slow_calls.sum()), n_calls, confidence)
    s_low, s_high = binomial_interval(int(slow_pages.sum()), n_pages, confidence)

    def formula(x: float) -> float:
        return 1.0 - (1.0 - x) ** run.k

    return FanoutCheck(
        k=run.k,
        pages=n_pages,
        slow_ms=slow_ms,
        p_call=p,
        p_call_low=p_low,
        p_call_high=p_high,
        predicted=formula(p),
        predicted_low=formula(p_low),
        predicted_high=formula(p_high),
        slow_pages=float(slow_pages.mean()),
        slow_pages_low=s_low,
        slow_pages_high=s_high,
        pages_with_stall=int(any_stall.sum()),
        slow_without_stall=int((slow_pages & ~any_stall).sum()),
        stalled_not_slow=int((any_stall & ~slow_pages).sum()),
        confidence=confidence,
    )
