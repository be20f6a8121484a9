"""Percentiles across load-generator processes: merge samples or histograms, never average percentiles.

Several generator processes each see part of the traffic. The p99 of all requests is a property of
all samples together; the mean of each process's p99 is not a percentile of anything, and is wrong
whenever the processes saw different amounts of traffic or different latencies. Two correct ways:

* exact: concatenate every process's samples and take the percentile once
  (``course_lib.measure.generators.merge_results`` does this for whole runs);
* compact: each process records into an HdrHistogram (a few kB whatever the request count, values kept
  to 3 significant digits), ships ``encode()``-ed bytes, and the parent adds them; the merged
  histogram's percentiles are those of all samples to within its precision.

References
----------
HdrHistogram (Gil Tene), Python package ``hdrhistogram`` (module ``hdrh``): ``record_value``, ``add``,
``encode``/``decode``, ``get_value_at_percentile``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from hdrh.histogram import HdrHistogram

from course_lib.core.checks import non_empty, number
from course_lib.core.percentiles import percentile

__all__ = [
    "HDR_HIGHEST_US",
    "HDR_SIGNIFICANT_DIGITS",
    "hdr_from_samples",
    "hdr_percentile_ms",
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
    """The q-th percentile of a histogram in ms (HdrHistogram's rule: the highest value equivalent, within
    0.1%, to the sample at rank round(q/100 x n))."""
    q = number("q", q, min=0, max=100)
    return hist.get_value_at_percentile(q) / 1000.0


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
