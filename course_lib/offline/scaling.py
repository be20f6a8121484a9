"""Did more workers help? Paired, alternating runs and a distribution-free interval for the speed-up.

One concept: comparing two configurations of a job on a noisy machine without fooling yourself. The
run that goes first is often slower (cold caches, a worker still importing) or faster (a quiet spell),
so :func:`alternating_pairs` warms both configurations, then runs them in pairs whose order alternates
(A B, B A, A B, ...). Each pair gives one ratio; :func:`median_ratio` reports their median and an
interval that holds the true median ratio with a stated confidence, from order statistics alone (no
assumption about how the timings are distributed): with ``n`` ratios sorted, ``[x_(k), x_(n+1-k)]``
covers the median with probability ``1 - 2 P(B <= k - 1)``, ``B ~ Binomial(n, 1/2)``.
:meth:`MedianRatio.verdict` puts a direction word only on an interval that excludes 1.

References
----------
W. J. Conover (1999), *Practical Nonparametric Statistics*, 3rd ed., section 3.2 (confidence interval
for a quantile from order statistics).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from course_lib.core.checks import integer, number

__all__ = ["MedianRatio", "alternating_pairs", "median_ratio"]


@dataclass(frozen=True)
class MedianRatio:
    """The median of paired ratios and the order-statistics interval around it.

    ``confidence`` is the interval's exact coverage (at least the one asked for, where ``n`` allows).
    """

    ratios: tuple[float, ...]
    median: float
    low: float
    high: float
    confidence: float

    def verdict(self, *, more: str = "faster", less: str = "slower", what: str = "B against A") -> str:
        """One sentence, with ``more``/``less`` only when the interval lies wholly above/below 1."""
        interval = (
            f"{self.confidence:.0%} interval [{self.low:.2f}x, {self.high:.2f}x], {len(self.ratios)} pairs"
        )
        if self.low > 1:
            return f"{what}: {self.median:.2f}x {more} ({interval})"
        if self.high < 1:
            return f"{what}: {1 / self.median:.2f}x {less} ({interval})"
        return (
            f"{what}: no difference this run can resolve (median {self.median:.2f}x, {interval} includes 1)"
        )


def median_ratio(ratios: Sequence[float], *, confidence: float = 0.9) -> MedianRatio:
    """Median of ``ratios`` with the widest-needed order-statistics interval of at least ``confidence``.

    Raises
    ------
    ValueError
        For fewer than 2 ratios, a ratio that is not a positive finite number, or a ``confidence``
        outside (0, 1). With too few ratios for ``confidence`` the interval is the full range and its
        (lower) coverage is reported.
    """
    values = np.sort(np.asarray(ratios, dtype=float))
    if len(values) < 2 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(f"ratios must be at least 2 positive finite numbers, got {list(ratios)!r}")
    confidence = number("confidence", confidence, min=0, max=1, min_open=True, max_open=True)
    n = len(values)

    def coverage(k: int) -> float:  # P(x_(k) <= median <= x_(n+1-k))
        return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return MedianRatio(tuple(float(v) for v in ratios), float(np.median(values)), float(values[k - 1]),
                       float(values[n - k]), coverage(k))  # fmt: skip


def alternating_pairs(
    run_a: Callable[[], float], run_b: Callable[[], float], *, repeats: int = 5, warmup: bool = True
) -> pd.DataFrame:
    """Time two configurations in pairs whose order alternates, after one untimed run of each.

    Parameters
    ----------
    run_a, run_b : callable () -> float
        Run one configuration once and return its time in seconds.
    repeats : int >= 2
        Pairs; pair ``i`` runs A first when ``i`` is even, B first when it is odd.
    warmup : bool
        Run each once, untimed, before the first pair.

    Returns
    -------
    DataFrame, one row per pair: ``a_s``, ``b_s``, ``first`` ("a" or "b") and ``a_over_b``.
    """
    repeats = integer("repeats", repeats, min=2)
    if warmup:
        run_a()
        run_b()
    rows = []
    for i in range(repeats):
        if i % 2 == 0:
            a, b = run_a(), run_b()
        else:
            b, a = run_b(), run_a()
        rows.append({"a_s": a, "b_s": b, "first": "ab"[i % 2], "a_over_b": a / b})
    table = pd.DataFrame(rows)
    table.index.name = "pair"
    return table
