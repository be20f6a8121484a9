"""Percentiles the way latency SLAs use them, with the method always named.

``nearest-rank`` (the default) returns an observed sample: the smallest value with at least q% of
the samples at or below it, i.e. the value at 1-based rank ceil(q/100 x n) of the sorted samples
(q = 0 gives the minimum). It equals numpy's ``method="inverted_cdf"``, except where q/100 x n is a
whole number that binary floating point nudges upward: there numpy goes one rank too high (p7 of
100 samples gives the 8th smallest) and this function keeps the exact rank. ``linear`` is numpy's
default interpolation, kept for comparison: it can report a latency no request ever had.

References
----------
Hyndman, R. J. and Fan, Y. (1996), "Sample quantiles in statistical packages", The American
Statistician 50(4): definition 1 (inverted CDF = nearest rank) and definition 7 (linear).
numpy.percentile documentation, ``method`` parameter.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Literal

import numpy as np

from course_lib.core import checks
from course_lib.core.checks import integer, number, one_of

__all__ = [
    "METHODS",
    "fanout_tail_probability",
    "nearest_rank",
    "nearest_rank_position",
    "percentile",
    "percentiles",
    "rank_from_slowest",
    "samples_needed",
]

Method = Literal["nearest-rank", "linear"]
METHODS: tuple[str, ...] = ("nearest-rank", "linear")


def _as_samples(samples: Iterable[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(list(samples) if not isinstance(samples, np.ndarray) else samples, dtype=float)
    if arr.ndim != 1:
        arr = arr.ravel()
    if arr.size == 0:
        raise ValueError("samples is empty: a percentile needs at least one latency sample")
    if np.isnan(arr).any():
        raise ValueError(
            f"samples holds {int(np.isnan(arr).sum())} NaN values; drop or fix them first "
            "(a failed request is not a latency)"
        )
    return arr


def _check_q(q: float, name: str = "q") -> float:
    """q as a percentage in [0, 100]; a fraction such as 0.99 is refused, q == 1 warns."""
    q = number(name, q, min=0, max=100)
    if 0 < q < 1:
        raise ValueError(
            f"{name}={q!r} looks like a fraction, but {name} is a percentage in [0, 100]: "
            f"did you mean {100 * float(q):g}? (pass {name}=99 for p99)"
        )
    if q == 1:
        warnings.warn(
            f"{name}=1 asks for the 1st percentile; if you meant all samples (a fraction of 1.0), pass "
            f"{name}=100",
            UserWarning,
            stacklevel=3,
        )
    return q


def _nearest_rank(q: float, n: int) -> int:
    """1-based rank ceil(q/100 x n), at least 1 (the tolerance keeps exact ranks exact)."""
    return max(1, math.ceil(q * n / 100.0 - 1e-9))


def nearest_rank(n: int, q: float) -> int:
    """The 1-based rank of the nearest-rank q-th percentile among ``n`` sorted samples: ceil(q/100 x n), >= 1.

    Raises
    ------
    ValueError
        For ``n`` < 1, q outside [0, 100] or a fraction in (0, 1).

    Examples
    --------
    >>> nearest_rank(100, 99), nearest_rank(1060, 99), nearest_rank(10, 0)
    (99, 1050, 1)
    """
    return _nearest_rank(_check_q(q), checks.integer("n", n, min=1))


def rank_from_slowest(n: int, q: float) -> int:
    """Which of ``n`` samples, counted from the slowest (1 = the slowest), is the nearest-rank q-th percentile.

    ``n - nearest_rank(n, q) + 1``: how few slow answers a p99 rests on (of 1,000 requests, the 11th
    slowest; of 150, the 2nd slowest).

    Raises
    ------
    ValueError
        As :func:`nearest_rank`.

    Examples
    --------
    >>> rank_from_slowest(1000, 99), rank_from_slowest(150, 99), rank_from_slowest(10, 99)
    (11, 2, 1)
    """
    return n - nearest_rank(n, q) + 1


def percentile(samples: Iterable[float] | np.ndarray, q: float, method: Method = "nearest-rank") -> float:
    """The q-th percentile of ``samples``.

    Parameters
    ----------
    samples : 1-D array-like of float, shape (n,), n >= 1, e.g. latencies in ms.
    q : float in [0, 100]
        99 for p99. A fraction such as 0.99 raises ``ValueError`` ("did you mean 99?"); q == 1 warns.
    method : {"nearest-rank", "linear"}
        ``nearest-rank`` returns an observed value (numpy's ``inverted_cdf``); ``linear`` interpolates
        between neighbours (numpy's default).

    Returns
    -------
    float, in the units of ``samples``.

    Raises
    ------
    ValueError
        Empty samples, NaN samples, q outside [0, 100], q in (0, 1) (a fraction), or an unknown method.
    """
    arr = _as_samples(samples)
    qf = _check_q(q)
    if method == "nearest-rank":
        ordered = np.sort(arr)
        return float(ordered[_nearest_rank(qf, len(ordered)) - 1])
    one_of("method", method, METHODS)
    return float(np.percentile(arr, qf, method="linear"))


def percentiles(
    samples: Iterable[float] | np.ndarray, qs: Iterable[float] = (50, 95, 99), method: Method = "nearest-rank"
) -> dict[str, float]:
    """Several percentiles at once, keyed ``p50``, ``p95``, ``p99`` (``p99.9`` for 99.9)."""
    arr = _as_samples(samples)
    return {f"p{q:g}": percentile(arr, q, method) for q in qs}


def nearest_rank_position(samples: Iterable[float] | np.ndarray, q: float) -> int:
    """Position in ``samples`` (0-based, original order) of the sample that is the nearest-rank p_q.

    Use it to ask *which* request sits at the p99 (a cache miss? a slow stage?): the sample at that
    position equals ``percentile(samples, q)``. Ties keep the original order (a stable sort), so the
    answer is deterministic.

    Parameters
    ----------
    samples : 1-D array-like of float, shape (n,), n >= 1.
    q : float in [0, 100], 99 for p99 (a fraction such as 0.99 is refused).

    Returns
    -------
    int in [0, n)

    Raises
    ------
    ValueError
        As :func:`percentile`.
    """
    arr = _as_samples(samples)
    qf = _check_q(q)
    return int(np.argsort(arr, kind="stable")[_nearest_rank(qf, len(arr)) - 1])


def samples_needed(q: float) -> int:
    """The fewest samples for which the q-th percentile has at least ten samples above it: 10 / (1 - q/100).

    With fewer, a p99 is one of the few slowest samples, or the maximum itself, and moves with any single
    outlier. The course sizes every experiment that reports a percentile by this rule: 20 samples for a
    median, 200 for a p95, 1,000 for a p99, 10,000 for a p99.9.

    Parameters
    ----------
    q : float in [0, 100)
        The percentile, 99 for p99 (a fraction such as 0.99 is refused, as in :func:`percentile`).

    Returns
    -------
    int >= 10

    Raises
    ------
    ValueError
        For q outside [0, 100) (no sample count resolves the maximum) or a fraction in (0, 1).

    Examples
    --------
    >>> samples_needed(50), samples_needed(95), samples_needed(99), samples_needed(99.9)
    (20, 200, 1000, 10000)
    """
    qf = _check_q(q)
    if qf >= 100:
        raise ValueError(
            f"q must be below 100 (no sample count puts ten samples above the maximum), got {q!r}"
        )
    return math.ceil(10.0 / (1.0 - qf / 100.0) - 1e-6)  # the tolerance absorbs binary rounding of q


def fanout_tail_probability(k: int, q: float = 99.0) -> float:
    """Chance that at least one of ``k`` independent parallel calls is slower than its q-th percentile.

    Each call is slower than its p_q with probability (1 - q/100), so the page is slowed with
    probability 1 - (q/100)**k: 3.94% for k = 4 at p99, 63.4% for k = 100.

    Raises
    ------
    ValueError
        If ``k`` is not an integer >= 1, ``q`` is outside [0, 100], or ``q`` is a fraction in (0, 1)
        such as 0.99 ("did you mean 99?"). q == 1 warns.
    """
    k = integer("k", k, min=1)
    return 1.0 - (_check_q(q) / 100.0) ** k
