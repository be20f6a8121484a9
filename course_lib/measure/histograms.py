"""Percentiles across load-generator processes: merge samples or histograms, never average percentiles.

Several generator processes each see part of the traffic. The p99 of all requests is a property of
all samples together; the mean of each process's p99 is not a percentile of anything, and is wrong
whenever the processes saw different amounts of traffic or different latencies. Two correct ways:

* exact: concatenate every process's samples and take the percentile once
  (``course_lib.measure.generators.merge_results`` does this for whole runs);
* compact: each process records into an HdrHistogram (a few kB whatever the request count), ships
  ``encode()``-ed bytes, and the parent adds them.

An HdrHistogram percentile differs from the nearest-rank percentile of the same samples for three
reasons, each of which :func:`hdr_explain` measures on its own (read ``hdrh/histogram.py``):

1. **its rank rule**: ``get_target_count_at_percentile`` asks for rank ``max(1, int(q/100 x n + 0.5))``,
   q/100 x n rounded half up, where nearest rank takes ``ceil(q/100 x n)``. The two agree unless q/100 x n
   has a fraction strictly between 0 and one half; then HdrHistogram takes the sample one rank lower
   (p99 of 1,060 samples: 1049.4 gives rank 1049, nearest rank 1050), and on a tail one rank can be
   several percent (:func:`hdr_rank`);
2. **its recording**: values are integers (the course records whole microseconds, so a sample is moved
   by up to 0.5 us);
3. **its resolution**: with 3 significant digits each value lands in a bucket no wider than 1/1024 of
   the value (2,048 sub-buckets per power of two), and ``get_value_at_percentile`` reports the bucket's
   *highest* equivalent value, so it never reports less than the recorded sample and at most about
   0.1 % more.

Only (2) and (3) are HdrHistogram's precision; (1) is a different definition of the percentile. Compare
an HdrHistogram with the sample at *its* rank to see its precision, and with nearest rank to see both.

References
----------
HdrHistogram (Gil Tene), Python package ``hdrhistogram`` (module ``hdrh``): ``record_value``, ``add``,
``encode``/``decode``, ``get_value_at_percentile``, ``get_target_count_at_percentile``,
``get_highest_equivalent_value`` (version pinned in requirements.lock).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from hdrh.histogram import HdrHistogram

from course_lib.core import checks
from course_lib.core.checks import non_empty, number
from course_lib.core.percentiles import nearest_rank, percentile

__all__ = [
    "HDR_HIGHEST_US",
    "HDR_SIGNIFICANT_DIGITS",
    "hdr_explain",
    "hdr_explain_table",
    "hdr_from_samples",
    "hdr_percentile_ms",
    "hdr_rank",
    "merge_encoded",
    "merge_vector",
    "worker_samples_vector",
]

#: Histograms record microseconds from 1 us to 1 hour with 3 significant digits (0.1% resolution).
HDR_HIGHEST_US = 3_600_000_000
HDR_SIGNIFICANT_DIGITS = 3


def hdr_from_samples(latencies_ms: Iterable[float] | np.ndarray) -> HdrHistogram:
    """An HdrHistogram of latencies, recorded in whole microseconds (values below 1 us count as 1 us).

    Raises
    ------
    ValueError
        For NaN, negative or over-an-hour latencies.
    """
    lat = np.asarray(list(latencies_ms) if not isinstance(latencies_ms, np.ndarray) else latencies_ms, float)
    if np.isnan(lat).any() or (lat < 0).any() or (lat * 1000 > HDR_HIGHEST_US).any():
        raise ValueError("latencies_ms must be in [0, 3.6e6] ms and not NaN (drop failed requests first)")
    hist = HdrHistogram(1, HDR_HIGHEST_US, HDR_SIGNIFICANT_DIGITS)
    values, counts = np.unique(np.maximum(1, np.rint(lat * 1000.0)).astype(np.int64), return_counts=True)
    for value, count in zip(values.tolist(), counts.tolist(), strict=True):
        hist.record_value(value, count)
    return hist


def hdr_percentile_ms(hist: HdrHistogram, q: float) -> float:
    """The q-th percentile of a histogram in ms, by HdrHistogram's rule: the highest value equivalent to
    the recorded value at rank :func:`hdr_rank` (``max(1, int(q/100 x n + 0.5))``), at most 1/1024 above it.
    """
    q = number("q", q, min=0, max=100)
    return hist.get_value_at_percentile(q) / 1000.0


def hdr_rank(n: int, q: float) -> int:
    """The 1-based rank HdrHistogram reads for the q-th percentile of ``n`` values.

    ``hdrh.histogram.HdrHistogram.get_target_count_at_percentile``:
    ``max(int(min(q, 100) x n / 100 + 0.5), 1)``, the same float arithmetic, so q/100 x n rounded half up,
    where nearest rank takes ``ceil(q/100 x n)``.

    Raises
    ------
    ValueError
        For ``n`` < 1 or q outside [0, 100].

    Examples
    --------
    >>> hdr_rank(1060, 99), hdr_rank(1000, 99), hdr_rank(150, 99)
    (1049, 990, 149)
    """
    n = checks.integer("n", n, min=1)
    q = checks.number("q", q, min=0, max=100)
    return max(int((min(q, 100.0) * n / 100) + 0.5), 1)


def hdr_explain(samples_ms: Iterable[float] | np.ndarray, q: float) -> dict[str, float]:
    """Why an HdrHistogram's q-th percentile differs from the nearest-rank one, each cause measured alone.

    The samples are recorded as :func:`hdr_from_samples` records them (whole microseconds) and the
    histogram is read with ``get_value_at_percentile``; the value it returns is checked to be the
    highest value equivalent to the recorded sample at HdrHistogram's rank (an ``AssertionError``
    otherwise: it would mean the installed hdrh no longer works as its source reads).

    Parameters
    ----------
    samples_ms : 1-D array-like of float, latencies in ms (as :func:`hdr_from_samples` accepts).
    q : float in (0, 100]
        The percentile, 99 for p99.

    Returns
    -------
    dict with
        ``n``; ``nearest_rank`` and ``hdr_rank`` (1-based); ``exact_ms`` (nearest-rank percentile, the
        course's); ``at_hdr_rank_ms`` (the exact sample at HdrHistogram's rank); ``hdr_ms`` (what the
        histogram reports); ``rank_rule_ms`` = at_hdr_rank_ms - exact_ms (the definitions differ; 0 when
        the ranks agree or the samples tie); ``precision_ms`` = hdr_ms - at_hdr_rank_ms (recording in
        whole microseconds plus reporting the bucket's highest equivalent value); ``precision_bound_ms``
        (0.5 us of rounding plus the bucket's width minus one unit: what ``precision_ms`` can reach);
        ``total_ms`` = hdr_ms - exact_ms.

    Raises
    ------
    ValueError
        As :func:`hdr_from_samples`, for no samples, or for q outside (0, 100].

    Examples
    --------
    >>> e = hdr_explain([1.0] * 1049 + [2.0, 2.5] + [3.0] * 9, 99)  # 1,060 samples
    >>> e["nearest_rank"], e["hdr_rank"], e["exact_ms"], e["at_hdr_rank_ms"], e["hdr_ms"]
    (1050, 1049, 2.0, 1.0, 1.0)
    """
    q = checks.number("q", q, min=0, max=100, min_open=True)
    lat = np.asarray(list(samples_ms) if not isinstance(samples_ms, np.ndarray) else samples_ms, float)
    if lat.size == 0:
        raise ValueError("samples_ms is empty: a percentile needs at least one latency sample")
    hist = hdr_from_samples(lat)
    ordered = np.sort(lat)
    n = len(ordered)
    rank_hdr = hdr_rank(n, q)
    exact = percentile(ordered, q)
    at_rank = float(ordered[rank_hdr - 1])
    recorded_us = max(1, int(np.rint(at_rank * 1000.0)))
    reported_us = int(hist.get_value_at_percentile(q))
    highest_us = int(hist.get_highest_equivalent_value(recorded_us))
    assert reported_us == highest_us, (
        f"hdrh reported {reported_us} us for p{q:g}, not the highest value equivalent to the recorded sample "
        f"at its rank ({recorded_us} us -> {highest_us} us): the installed hdrh differs from its source"
    )
    lowest_us = int(hist.get_lowest_equivalent_value(recorded_us))
    hdr = reported_us / 1000.0
    return {
        "n": n,
        "nearest_rank": nearest_rank(n, q),
        "hdr_rank": rank_hdr,
        "exact_ms": exact,
        "at_hdr_rank_ms": at_rank,
        "hdr_ms": hdr,
        "rank_rule_ms": at_rank - exact,
        "precision_ms": hdr - at_rank,
        "precision_bound_ms": (0.5 + highest_us - lowest_us) / 1000.0,
        "total_ms": hdr - exact,
    }


def hdr_explain_table(
    samples_ms: Iterable[float] | np.ndarray, qs: Sequence[float] = (50, 90, 99, 99.9)
) -> pd.DataFrame:
    """:func:`hdr_explain` for several percentiles, one row each (index ``q``).

    Examples
    --------
    >>> table = hdr_explain_table(range(1, 1061), qs=(50, 99))
    >>> rows = table[["nearest_rank", "hdr_rank", "rank_rule_ms"]].to_dict("index")
    >>> list(rows)
    [50.0, 99.0]
    >>> rows[50.0]
    {'nearest_rank': 530, 'hdr_rank': 530, 'rank_rule_ms': 0.0}
    >>> rows[99.0]
    {'nearest_rank': 1050, 'hdr_rank': 1049, 'rank_rule_ms': -1.0}
    """
    lat = np.asarray(list(samples_ms) if not isinstance(samples_ms, np.ndarray) else samples_ms, float)
    rows = {float(q): hdr_explain(lat, q) for q in qs}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("q")


def merge_encoded(encoded: Iterable[bytes | str]) -> HdrHistogram:
    """Decode and add histograms shipped by several processes (``HdrHistogram.encode()`` output)."""
    total = HdrHistogram(1, HDR_HIGHEST_US, HDR_SIGNIFICANT_DIGITS)
    for blob in encoded:
        total.decode_and_add(blob)
    return total


def worker_samples_vector() -> dict[str, np.ndarray]:
    """The textbook case: worker A 10,000 requests (200 at 100 ms, the rest 1 ms); B, C, D 100 at 1 ms."""
    a = np.concatenate([np.full(9_800, 1.0), np.full(200, 100.0)])
    return {"A": a, "B": np.full(100, 1.0), "C": np.full(100, 1.0), "D": np.full(100, 1.0)}


def merge_vector(workers: Mapping[str, Sequence[float] | np.ndarray], q: float = 99.0) -> pd.DataFrame:
    """Per-worker percentile, their mean, and the percentile of all samples (exact and via HdrHistogram).

    Parameters
    ----------
    workers : mapping worker name -> its latency samples in ms
    q : percentile, default 99

    Returns
    -------
    DataFrame with one row per worker (``requests``, ``p<q>_ms`` nearest rank) and three more rows:
    ``mean of worker p<q>`` (wrong), ``all samples merged`` (exact) and ``HdrHistograms added``
    (each worker's histogram encoded, decoded and added, as separate processes would ship them).
    """
    non_empty("workers", workers)
    col = f"p{q:g}_ms"
    rows = {name: {"requests": len(s), col: percentile(s, q)} for name, s in workers.items()}
    merged = np.concatenate([np.asarray(s, float) for s in workers.values()])
    total = merge_encoded(hdr_from_samples(s).encode() for s in workers.values())
    rows[f"mean of worker p{q:g}"] = {
        "requests": len(merged),
        col: float(np.mean([r[col] for r in rows.values()])),
    }
    rows["all samples merged"] = {"requests": len(merged), col: percentile(merged, q)}
    rows["HdrHistograms added"] = {"requests": int(total.get_total_count()), col: hdr_percentile_ms(total, q)}
    return pd.DataFrame.from_dict(rows, orient="index")
