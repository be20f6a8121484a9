"""Intervals for ratios measured in interleaved rounds, which decide when a comparison may use a direction word.

A timing comparison on a shared machine is a paired experiment: the course's harness
(:func:`course_lib.core.bench.interleaved_rounds_ns`) runs every candidate once per round, in turn, so
whatever else the machine does in that round hits all of them. Each round therefore gives one ratio
(candidate's statistic / baseline's statistic), and the rounds are the independent repeats.

:func:`median_interval` is the distribution-free confidence interval for the median of those per-round
ratios, from order statistics (the interval behind the sign test): with ``n`` rounds sorted,
``[x_(k), x_(n+1-k)]`` covers the median with probability ``1 - 2 P(Binomial(n, 1/2) <= k - 1)``, whatever
the distribution. It assumes nothing about normality and needs no resampling; its price is rounds: a
95 % interval needs at least 6 (``min_rounds(0.95)``), where it is the range of the six ratios.

:func:`interval_direction` is the one verdict on a ratio's interval: a direction only when the interval
excludes 1 (no change). :func:`interval_verdict` names it in the course's words for a capacity ratio
("gain", "loss", "not resolved"; the ``verdict`` column of the waterfall's and the peers' records), and
:func:`verdict_words` puts that word in a sentence. :class:`RatioInterval` carries a ratio and its
interval and words the comparison: a direction ("1.4x faster") only when the whole interval lies on one
side of 1, otherwise "not resolved on this run".

References
----------
Conover, W. J. (1999), *Practical Nonparametric Statistics*, 3rd ed., section 3.2 (confidence interval
for a quantile; the sign test). Hollander, Wolfe and Chicken (2014), *Nonparametric Statistical
Methods*, 3rd ed., section 3.6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from course_lib.core import checks
from course_lib.core.percentiles import percentile, samples_needed

__all__ = [
    "UNRESOLVED",
    "VERDICTS",
    "RatioInterval",
    "interval_direction",
    "interval_verdict",
    "median_interval",
    "min_rounds",
    "ratio_interval",
    "ratio_interval_from_values",
    "verdict_words",
]

#: The words for a comparison whose interval contains 1.
UNRESOLVED = "not resolved on this run"
#: The verdict on a ratio's interval, by direction: above 1, below 1, containing 1.
VERDICTS: dict[int, str] = {1: "gain", -1: "loss", 0: "not resolved"}
_VERDICT_WORDS = {"gain": "a gain", "loss": "a loss", "not resolved": "not resolved (the interval holds 1)"}


def interval_direction(low: float, high: float) -> int:
    """-1 when the interval [low, high] lies below 1, +1 when above, 0 when it holds 1 (no change not excluded).

    An end that touches 1 does not exclude it. A NaN end excludes nothing on its side.

    >>> interval_direction(1.01, 2.0), interval_direction(0.2, 0.99), interval_direction(1.0, 2.0)
    (1, -1, 0)
    """
    if high < 1.0:
        return -1
    if low > 1.0:
        return 1
    return 0


def interval_verdict(low: float, high: float) -> str:
    """``"gain"`` if the interval [low, high] of a ratio (candidate / base) lies above 1, ``"loss"`` if below,
    else ``"not resolved"`` (:func:`interval_direction` in words; :data:`VERDICTS`).

    >>> interval_verdict(1.2, 3.0), interval_verdict(0.4, 0.9), interval_verdict(0.8, 1.5)
    ('gain', 'loss', 'not resolved')
    """
    return VERDICTS[interval_direction(low, high)]


def verdict_words(verdict: str) -> str:
    """A verdict of :func:`interval_verdict` for a sentence: "a gain", "a loss", "not resolved (the interval holds 1)".

    Raises
    ------
    InvalidArgumentError
        For a word that is not one of :data:`VERDICTS`.

    >>> verdict_words("not resolved")
    'not resolved (the interval holds 1)'
    """
    checks.one_of("verdict", verdict, tuple(_VERDICT_WORDS))
    return _VERDICT_WORDS[verdict]


def _coverage(n: int, k: int) -> float:
    """P(x_(k) <= median <= x_(n+1-k)) for n draws of a continuous distribution: 1 - 2 P(Bin(n, .5) < k)."""
    below = sum(math.comb(n, i) for i in range(k)) / 2.0**n
    return 1.0 - 2.0 * below


def min_rounds(confidence: float = 0.95) -> int:
    """The fewest rounds for which the range of the per-round values covers the median at ``confidence``.

    ``1 - 2 / 2**n >= confidence``: 5 rounds for 90 %, 6 for 95 %, 8 for 99 %.

    Raises
    ------
    InvalidArgumentError
        Unless 0 < confidence < 1.

    Examples
    --------
    >>> min_rounds(0.95), min_rounds(0.90), min_rounds(0.99)
    (6, 5, 8)
    """
    confidence = checks.number("confidence", confidence, min=0, max=1, min_open=True, max_open=True)
    n = 1
    while _coverage(n, 1) < confidence:
        n += 1
    return n


def median_interval(
    values: Sequence[float] | np.ndarray, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Distribution-free interval for the median of ``values``, from their order statistics.

    Parameters
    ----------
    values : 1-D array-like of float, shape (n,), n >= ``min_rounds(confidence)``
        Independent repeats (e.g. one ratio per interleaved round). NaN is refused.
    confidence : float in (0, 1)
        The coverage wanted; the interval returned covers at least that much.

    Returns
    -------
    (low, high, achieved) : the narrowest order-statistic interval ``[x_(k), x_(n+1-k)]`` whose coverage
    ``achieved`` is at least ``confidence``.

    Raises
    ------
    InvalidArgumentError
        For fewer values than ``min_rounds(confidence)`` (the message says how many are needed), NaN
        values, or a confidence outside (0, 1).

    Examples
    --------
    >>> low, high, achieved = median_interval([1.1, 0.9, 1.3, 1.2, 1.0, 1.4])
    >>> (low, high, round(achieved, 4))
    (0.9, 1.4, 0.9688)
    >>> median_interval(range(1, 21))[:2]  # 20 values: the 6th and 15th smallest
    (6.0, 15.0)
    """
    needed = min_rounds(confidence)
    x = np.sort(np.asarray(values, dtype=float).ravel())
    if np.isnan(x).any():
        raise checks.InvalidArgumentError(f"values must not hold NaN, got {x.tolist()!r}")
    n = len(x)
    if n < needed:
        raise checks.InvalidArgumentError(
            f"values must hold at least {needed} repeats for a {confidence:.0%} interval "
            f"(the range of n values covers the median with probability 1 - 2/2**n), got {n}"
        )
    k = 1
    while k + 1 <= (n + 1) // 2 and _coverage(n, k + 1) >= confidence:
        k += 1
    return float(x[k - 1]), float(x[n - k]), _coverage(n, k)


@dataclass(frozen=True)
class RatioInterval:
    """A ratio (candidate / baseline) from repeated rounds, with an interval for its median.

    Attributes
    ----------
    ratio : float
        Median over rounds of the per-round ratio (e.g. candidate's p50 time / baseline's p50 time;
        below 1 means the candidate took less time).
    low, high : float
        The order-statistic interval for that median (:func:`median_interval`).
    confidence : float
        The interval's achieved coverage (at least what was asked).
    rounds : int
        Rounds the ratio was measured in.
    """

    ratio: float
    low: float
    high: float
    confidence: float
    rounds: int

    @property
    def direction(self) -> int:
        """-1 when the whole interval is below 1, +1 when above, 0 when it contains 1 (:func:`interval_direction`)."""
        return interval_direction(self.low, self.high)

    @property
    def resolved(self) -> bool:
        """True when the interval excludes 1: the run shows a change, and in which direction."""
        return self.direction != 0

    def interval_text(self, digits: int = 2) -> str:
        """``"0.62x, 98% interval 0.58x to 0.70x over 7 rounds"``: the ratio itself, no direction word.

        A resolved interval whose end would print as 1.00x gets more decimals (up to 4), so that the
        printed interval visibly excludes 1: ``1.003x to 1.09x``, not ``1.00x to 1.09x``.

        >>> RatioInterval(1.02, 1.0031, 1.09, 0.97, 6).interval_text()
        '1.02x, 97% interval 1.003x to 1.09x over 6 rounds'
        """
        return (
            f"{_factor(self.ratio, digits)}x, {self.confidence:.0%} interval {self._end(self.low, digits)}x to "
            f"{self._end(self.high, digits)}x over {self.rounds} rounds"
        )

    def _end(self, value: float, digits: int) -> str:
        """One end of the interval, with decimals added (up to 4) while a resolved end would print as 1."""
        while self.resolved and digits < 4 and round(value, digits) == 1.0:
            digits += 1
        return _factor(value, digits)

    def phrase(
        self,
        *,
        less: str = "lower",
        more: str = "higher",
        unresolved: str = UNRESOLVED,
        than: str | None = None,
        digits: int = 2,
    ) -> str:
        """The comparison in words that the run supports.

        Parameters
        ----------
        less, more : str
            The word for a ratio below 1 ("faster" for a time ratio, "lower") and above 1 ("slower").
        unresolved : str
            What to say when the interval contains 1.
        than : str, optional
            The baseline's name, written after the direction word: "1.30x slower than FP32 (...)".
        digits : int
            Decimals of the factors.

        Returns
        -------
        str
            ``"1.61x faster (ratio 0.62x, 98% interval 0.58x to 0.70x over 7 rounds)"`` when the interval
            lies below 1 (the factor is 1 / ratio), ``"1.30x slower (...)"`` when above, and
            ``"not resolved on this run (ratio 0.97x, 98% interval 0.90x to 1.08x over 7 rounds)"``
            otherwise.

        Examples
        --------
        >>> RatioInterval(0.5, 0.4, 0.6, 0.97, 6).phrase(less="faster", more="slower")
        '2.00x faster (ratio 0.50x, 97% interval 0.40x to 0.60x over 6 rounds)'
        >>> RatioInterval(2.0, 1.5, 2.5, 0.97, 6).phrase(more="slower", than="FP32", digits=1)
        '2.0x slower than FP32 (ratio 2.0x, 97% interval 1.5x to 2.5x over 6 rounds)'
        >>> RatioInterval(0.0043, 0.004, 0.0051, 0.97, 6).phrase(less="faster")
        '232.56x faster (ratio 0.0043x, 97% interval 0.004x to 0.0051x over 6 rounds)'
        >>> RatioInterval(1.02, 0.95, 1.1, 0.97, 6).phrase()
        'not resolved on this run (ratio 1.02x, 97% interval 0.95x to 1.10x over 6 rounds)'
        """
        detail = f"ratio {self.interval_text(digits)}"
        against = f" than {than}" if than else ""
        if self.direction < 0:
            return f"{1.0 / self.ratio:.{digits}f}x {less}{against} ({detail})"
        if self.direction > 0:
            return f"{self.ratio:.{digits}f}x {more}{against} ({detail})"
        return f"{unresolved} ({detail})"

    def bound_phrase(self, *, at_most: float | None = None, at_least: float | None = None) -> str:
        """Whether the whole interval lies on the stated side of a bound: a check worded for both outcomes.

        A lesson states a bound ("at least 10x faster", i.e. a time ratio at most 0.1) and prints whether
        this run shows it, instead of asserting a timing ratio that a busy machine could fail.

        Parameters
        ----------
        at_most, at_least : float > 0
            Exactly one: the bound the ratio should stay under (``at_most``) or over (``at_least``).

        Returns
        -------
        str
            ``"holds on this run (the whole interval, 0.004x to 0.0049x, is at most 0.1x)"`` or
            ``"not shown on this run (the interval, 0.08x to 0.12x, reaches above 0.1x)"``.

        Raises
        ------
        InvalidArgumentError
            When neither or both bounds are given, or a bound is not a finite number > 0.

        Examples
        --------
        >>> RatioInterval(0.0045, 0.004, 0.0049, 0.97, 6).bound_phrase(at_most=0.1)
        'holds on this run (the whole interval, 0.004x to 0.0049x, is at most 0.1x)'
        >>> RatioInterval(1.5, 0.9, 2.0, 0.97, 6).bound_phrase(at_least=1.0)
        'not shown on this run (the interval, 0.90x to 2.00x, reaches below 1x)'
        """
        if (at_most is None) == (at_least is None):
            raise checks.InvalidArgumentError(
                f"give exactly one of at_most and at_least, got at_most={at_most!r}, at_least={at_least!r}"
            )
        name, value = ("at_most", at_most) if at_most is not None else ("at_least", at_least)
        bound = checks.positive_number(name, value)
        span = f"{_factor(self.low, 2)}x to {_factor(self.high, 2)}x"
        if at_most is not None:
            if self.high <= bound:
                return f"holds on this run (the whole interval, {span}, is at most {bound:g}x)"
            return f"not shown on this run (the interval, {span}, reaches above {bound:g}x)"
        if self.low >= bound:
            return f"holds on this run (the whole interval, {span}, is at least {bound:g}x)"
        return f"not shown on this run (the interval, {span}, reaches below {bound:g}x)"


def _factor(x: float, digits: int) -> str:
    """``digits`` decimals, or ``digits`` significant digits below 0.1 (a ratio of 0.0043 stays readable)."""
    return f"{x:.{digits}f}" if abs(x) >= 0.1 or x == 0 else f"{x:.{digits}g}"


def ratio_interval_from_values(
    ratios: Sequence[float] | np.ndarray, confidence: float = 0.95
) -> RatioInterval:
    """A :class:`RatioInterval` from per-round ratios already computed (one per round, all > 0).

    Raises
    ------
    InvalidArgumentError
        As :func:`median_interval`, or for a ratio that is not a finite positive number.

    Examples
    --------
    >>> ratio_interval_from_values([0.5, 0.55, 0.6, 0.52, 0.58, 0.49]).direction
    -1
    """
    r = np.asarray(ratios, dtype=float).ravel()
    if not (np.isfinite(r).all() and (r > 0).all()):
        raise checks.InvalidArgumentError(f"ratios must be finite numbers > 0, got {r.tolist()!r}")
    low, high, achieved = median_interval(r, confidence)
    return RatioInterval(float(np.median(r)), low, high, achieved, len(r))


def ratio_interval(
    candidate_rounds: Sequence[Sequence[float] | np.ndarray] | np.ndarray,
    baseline_rounds: Sequence[Sequence[float] | np.ndarray] | np.ndarray,
    *,
    q: float = 50,
    confidence: float = 0.95,
) -> RatioInterval:
    """The candidate's q-th percentile over the baseline's, round by round, with an interval.

    Parameters
    ----------
    candidate_rounds, baseline_rounds : 2-D arrays (rounds, calls) or sequences of 1-D arrays
        Samples (call times in any one unit, e.g. ns from :func:`course_lib.core.bench.interleaved_rounds_ns`)
        for the same rounds; round r of one was measured next to round r of the other.
    q : float in [0, 100)
        The percentile compared in each round (nearest rank): 50 for medians, 99 for p99s. Every round of
        both needs ``samples_needed(q)`` samples (10 / (1 - q/100): 20 for a median, 1,000 for a p99),
        so that at least ten samples lie above the percentile.
    confidence : float in (0, 1)
        Coverage of the interval; needs ``min_rounds(confidence)`` rounds (6 for 95 %).

    Returns
    -------
    RatioInterval
        ``ratio`` < 1 means the candidate's percentile was lower (faster, for times).

    Raises
    ------
    InvalidArgumentError
        For a different number of rounds on the two sides, too few rounds, a round with fewer than
        ``samples_needed(q)`` samples, or a baseline percentile of 0.

    Examples
    --------
    >>> import numpy as np
    >>> base = np.tile(np.arange(1.0, 21.0), (6, 1))   # 6 rounds of 20 calls
    >>> ratio_interval(base / 2, base).ratio
    0.5
    """
    cand = [np.asarray(r, dtype=float).ravel() for r in candidate_rounds]
    base = [np.asarray(r, dtype=float).ravel() for r in baseline_rounds]
    if len(cand) != len(base):
        raise checks.InvalidArgumentError(
            f"candidate_rounds and baseline_rounds must hold the same rounds, got {len(cand)} and {len(base)}"
        )
    needed = samples_needed(q)
    short = min(len(r) for r in cand + base) if cand else 0
    if short < needed:
        raise checks.InvalidArgumentError(
            f"every round must hold at least {needed} samples for a p{q:g} (10 / (1 - q/100)), got {short}"
        )
    ratios = []
    for c, b in zip(cand, base, strict=True):
        b_q = percentile(b, q)
        if b_q <= 0:
            raise checks.InvalidArgumentError(
                f"the baseline's p{q:g} must be > 0 in every round, got {b_q!r}"
            )
        ratios.append(percentile(c, q) / b_q)
    return ratio_interval_from_values(ratios, confidence)
