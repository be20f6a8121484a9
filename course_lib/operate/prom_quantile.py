"""Prometheus's own arithmetic, in Python: ``histogram_quantile`` and ``rate``, plus bucket choice.

A Prometheus histogram keeps cumulative counts per upper bound ``le`` instead of the raw latencies,
so every percentile it reports is an *estimate*: ``histogram_quantile`` finds the bucket that holds
the wanted rank and interpolates linearly inside it. How wrong that estimate is depends entirely on
the buckets: source 004's ``[0.01, 0.05, 0.1, 0.5, 1.0]`` s puts everything between 10 and 50 ms in
one bucket, so it cannot tell a 15 ms p95 from a 45 ms one; ``SLO_BUCKETS_S`` is dense around the
20 ms p95 SLO and has 20 ms itself as a bound, so "is p95 within the SLO?" is answered exactly.

``histogram_quantile`` is a line-by-line port of ``bucketQuantile`` in Prometheus's
``promql/quantile.go`` (coalescing equal bounds, correcting float precision, forcing monotonic
counts, the special cases for q outside [0, 1], a missing +Inf bucket and an empty histogram).
``extrapolated_rate`` ports ``extrapolatedRate`` in ``promql/functions.go`` for float counters, with
the two rules that changed between the Prometheus versions a student may have (``rate_rules`` picks
them from a version string): the range's left end (closed before 3.0, open from 3.0) and the order of
the "never extrapolate below zero" limit and the 1.1-interval test (swapped in 2.51).

References
----------
Prometheus documentation, "Query functions: histogram_quantile()" and "Histograms and summaries"
(https://prometheus.io/docs/practices/histograms/). Prometheus source, ``promql/quantile.go``
(``bucketQuantile``, ``coalesceBuckets``, ``ensureMonotonic``, ``correctPrecisionErrors``) and
``promql/functions.go`` (``extrapolatedRate``; commit 7f912db, "promql: Fix limiting of extrapolation
to negative values", first released in v2.51.0).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from course_lib.core.percentiles import percentile

__all__ = [
    "SLO_BUCKETS_S",
    "SLO_P95_S",
    "SOURCE004_BUCKETS_S",
    "bucket_error_table",
    "bucket_quantile",
    "cumulative_buckets",
    "extrapolated_rate",
    "histogram_quantile",
    "rate_rules",
    "scraped_buckets",
]

#: The latency SLO of the churn service used in this lesson: p95 within 20 ms.
SLO_P95_S = 0.020
#: Source 004's latency buckets (seconds).
SOURCE004_BUCKETS_S: tuple[float, ...] = (0.01, 0.05, 0.1, 0.5, 1.0)
#: Buckets chosen for the SLO: 2.5 ms steps up to 20 ms (the SLO is a bound), coarser above.
SLO_BUCKETS_S: tuple[float, ...] = (
    0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02,
    0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 1.0,
)  # fmt: skip

Bucket = tuple[float, float]  # (upper bound le, cumulative count)


def _coalesce(buckets: list[list[float]]) -> list[list[float]]:
    out = [list(buckets[0])]
    for le, count in buckets[1:]:
        if le == out[-1][0]:
            out[-1][1] += count
        else:
            out.append([le, count])
    return out


def _correct_precision(buckets: list[list[float]], tolerance: float = 1e-12) -> None:
    prev = buckets[0][1]
    for b in buckets[1:]:
        delta = abs(b[1] - prev)
        if delta == 0:
            continue
        if delta / b[1] <= tolerance:
            b[1] = prev
        else:
            prev = b[1]


def _ensure_monotonic(buckets: list[list[float]]) -> None:
    running = buckets[0][1]
    for b in buckets[1:]:
        if b[1] > running:
            running = b[1]
        elif b[1] < running:
            b[1] = running


def bucket_quantile(q: float, buckets: Sequence[Bucket]) -> float:
    """The q-quantile of a histogram by Prometheus's rule, without the edge cases (the core).

    Parameters
    ----------
    q : float
        The quantile, 0 < q <= 1 (0.95 for p95).
    buckets : sequence of (le, cumulative_count)
        Sorted by upper bound ``le``, cumulative counts, the last bound ``+inf``, at least one
        observation.

    Returns
    -------
    float
        Find the first bucket whose cumulative count reaches the rank q x total, then interpolate
        linearly between that bucket's lower and upper bound (the first bucket's lower bound is 0).
        A rank in the +Inf bucket returns the largest finite bound.

    Notes
    -----
    :func:`histogram_quantile` is the full port: it also sorts, merges duplicate bounds, repairs
    non-monotonic counts, and returns NaN or +-inf where Prometheus does. Tests check both on the same
    buckets.

    References
    ----------
    Prometheus documentation, "Query functions: histogram_quantile()" and "Histograms and summaries";
    ``bucketQuantile`` in ``promql/quantile.go``.
    """
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le  # the rank is above every finite bound
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return lower_le


def histogram_quantile(q: float, buckets: Iterable[Bucket]) -> float:
    """The q-quantile of a classic histogram, computed exactly as Prometheus does.

    Parameters
    ----------
    q : float
        The quantile, 0 <= q <= 1 (0.95 for p95).
    buckets : iterable of (le, cumulative_count)
        Upper bounds in the units of the histogram (seconds here) with the cumulative count of
        observations <= le, in any order; the last bound must be ``+inf``. Counts may be rates.

    Returns
    -------
    float
        Linear interpolation inside the bucket holding rank ``q x count``, taking 0 as the lower
        edge of the first bucket when its bound is > 0. If the rank falls in the +Inf bucket, the
        largest finite bound is returned. NaN for q NaN, no +Inf bucket, fewer than 2 buckets or no
        observations; -inf for q < 0 and +inf for q > 1 (as Prometheus, which reports no error).

    Notes
    -----
    Port of ``bucketQuantile`` (prometheus/prometheus, ``promql/quantile.go``). Because it
    interpolates, the estimate can exceed every observation in the bucket (even the largest one).
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    work = sorted(([float(le), float(c)] for le, c in buckets), key=lambda b: b[0])
    if not work or not math.isinf(work[-1][0]) or work[-1][0] < 0:
        return math.nan
    work = _coalesce(work)
    _correct_precision(work)
    _ensure_monotonic(work)
    if len(work) < 2:
        return math.nan
    observations = work[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    counts = [c for _, c in work[:-1]]
    b = next((i for i, c in enumerate(counts) if c >= rank), len(work) - 1)  # sort.Search
    if b == len(work) - 1:
        return work[-2][0]
    if b == 0 and work[0][0] <= 0:
        return work[0][0]
    start, end, count = 0.0, work[b][0], work[b][1]
    if b > 0:
        start = work[b - 1][0]
        count -= work[b - 1][1]
        rank -= work[b - 1][1]
    return start + (end - start) * (rank / count)


def cumulative_buckets(samples: Sequence[float] | np.ndarray, bounds: Sequence[float]) -> list[Bucket]:
    """What a Prometheus histogram with ``bounds`` would hold after observing ``samples``.

    Parameters
    ----------
    samples : 1-D array of observations (same unit as ``bounds``).
    bounds : increasing finite upper bounds; ``+inf`` is appended.

    Returns
    -------
    list of (le, count of samples <= le), ending with (inf, len(samples)).

    Raises
    ------
    ValueError
        If ``bounds`` is empty or not strictly increasing.
    """
    edges = [float(b) for b in bounds]
    if not edges or any(b <= a for a, b in itertools.pairwise(edges)):
        raise ValueError(f"bounds must be a non-empty, strictly increasing sequence, got {list(bounds)}")
    ordered = np.sort(np.asarray(samples, dtype=float))
    counts = np.searchsorted(ordered, edges, side="right")
    return [*zip(edges, counts.astype(float).tolist(), strict=True), (math.inf, float(len(ordered)))]


def bucket_error_table(
    samples_s: Sequence[float] | np.ndarray,
    bucket_sets: Mapping[str, Sequence[float]],
    qs: Sequence[float] = (0.5, 0.95, 0.99),
) -> pd.DataFrame:
    """Histogram estimates against the exact percentile of the raw samples, per bucket layout.

    Returns
    -------
    DataFrame with one row per (buckets, q): ``exact_ms`` (nearest rank of the raw samples),
    ``estimate_ms`` (``histogram_quantile``), ``error_ms`` (estimate - exact), ``max_ms`` (largest
    sample) and ``above_max`` (the estimate exceeds every observation).
    """
    samples = np.asarray(samples_s, dtype=float)
    rows = []
    for name, bounds in bucket_sets.items():
        buckets = cumulative_buckets(samples, bounds)
        for q in qs:
            exact = percentile(samples, 100 * q) * 1e3
            est = histogram_quantile(q, buckets) * 1e3
            rows.append(
                {
                    "buckets": name,
                    "q": q,
                    "exact_ms": exact,
                    "estimate_ms": est,
                    "error_ms": est - exact,
                    "max_ms": float(samples.max()) * 1e3,
                    "above_max": bool(est > samples.max() * 1e3),
                }
            )
    return pd.DataFrame(rows).set_index(["buckets", "q"])


def scraped_buckets(text: str, name: str, **labels: str) -> list[Bucket]:
    """The buckets of one histogram series from a ``/metrics`` page, parsed by ``prometheus_client``.

    Parameters
    ----------
    text : the exposition text (Prometheus text format 0.0.4).
    name : the histogram's name without ``_bucket`` (e.g. ``churn_request_latency_seconds``).
    **labels : label values that select the series (e.g. ``version="v1"``).

    Raises
    ------
    KeyError
        If no ``<name>_bucket`` sample matches the labels.
    """
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name != f"{name}_bucket":
                continue
            if all(s.labels.get(k) == v for k, v in labels.items()):
                out.append((float(s.labels["le"]), float(s.value)))
    if not out:
        raise KeyError(f"no {name}_bucket samples with labels {labels} on the page")
    return sorted(out)


def extrapolated_rate(
    times_s: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    at_s: float,
    range_s: float,
    *,
    left_open: bool = False,
    limit_to_zero_first: bool = False,
) -> float:
    """``rate(counter[range])`` evaluated at ``at_s``, with Prometheus's extrapolation.

    Parameters
    ----------
    times_s, values : the counter's samples (scrape times in s, increasing, and values).
    at_s : evaluation time (s). range_s : the range selector (s), e.g. 300 for ``[5m]``.
    left_open : bool
        Prometheus 3 selects samples in (at - range, at]; Prometheus 2 (and the promtool 2.x that
        Debian ships) in [at - range, at]. Both are kept so a test can avoid instants where they differ.
    limit_to_zero_first : bool
        Prometheus before 2.51 first moves the start of the extrapolation to the counter's extrapolated
        zero point (when that is closer) and only then applies the 1.1-interval test; from 2.51 the
        test comes first and the zero limit after (commit 7f912db). The two differ only when the
        first sample is far from the range's start and the counter extrapolates to zero nearby.
        ``rate_rules(version)`` gives the right flags for a server's version.

    Returns
    -------
    float
        Per-second rate, or NaN when fewer than two samples fall in the range (no result).

    Notes
    -----
    Port of ``extrapolatedRate`` for float counters: counter resets add the value before the reset;
    the increase is extrapolated to the range's edges when the first/last sample lies within 1.1
    average sample intervals of them (else by half an interval), never below a counter value of 0.
    """
    t = list(map(float, times_s))
    start, end = at_s - range_s, at_s
    lo = bisect.bisect_right(t, start) if left_open else bisect.bisect_left(t, start)
    hi = bisect.bisect_right(t, end)
    ts, vs = t[lo:hi], [float(v) for v in values[lo:hi]]
    if len(ts) < 2:
        return math.nan
    result = vs[-1] - vs[0]
    for prev, cur in itertools.pairwise(vs):
        if cur < prev:
            result += prev
    to_start, to_end = ts[0] - start, end - ts[-1]
    sampled = ts[-1] - ts[0]
    average = sampled / (len(ts) - 1)
    threshold = average * 1.1
    can_reach_zero = result > 0 and vs[0] >= 0
    if limit_to_zero_first and can_reach_zero:  # Prometheus < 2.51
        to_start = min(to_start, sampled * (vs[0] / result))
    if to_start >= threshold:
        to_start = average / 2
    if not limit_to_zero_first and can_reach_zero:  # Prometheus >= 2.51
        to_start = min(to_start, sampled * (vs[0] / result))
    if to_end >= threshold:
        to_end = average / 2
    # the same operations in the same order as Go's, so the float result is the same to the last bit
    extrapolate_to = sampled
    extrapolate_to += to_start
    extrapolate_to += to_end
    factor = extrapolate_to / sampled
    factor /= range_s
    return result * factor


def rate_rules(version: str) -> dict[str, bool]:
    """The ``extrapolated_rate`` flags that reproduce the ``rate`` of a Prometheus ``version``.

    Parameters
    ----------
    version : str
        As ``/api/v1/status/buildinfo`` or ``prometheus --version`` give it, e.g. ``"2.42.0+ds"``.

    Returns
    -------
    dict with ``left_open`` (True from 3.0) and ``limit_to_zero_first`` (True before 2.51).

    Raises
    ------
    ValueError
        If ``version`` does not start with MAJOR.MINOR.

    Examples
    --------
    >>> rate_rules("2.42.0+ds"), rate_rules("3.5.0")
    ({'left_open': False, 'limit_to_zero_first': True}, {'left_open': True, 'limit_to_zero_first': False})
    """
    parts = str(version).lstrip("v").split(".")
    try:
        major, minor = int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or "x")
    except (IndexError, ValueError):
        raise ValueError(f"version must start with MAJOR.MINOR (e.g. '2.42.0'), got {version!r}") from None
    return {"left_open": major >= 3, "limit_to_zero_first": (major, minor) < (2, 51)}
