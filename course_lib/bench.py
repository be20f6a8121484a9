"""A small micro-benchmark harness: time callables side by side and report ratios.

Machines are shared and noisy, so absolute times are shown but never trusted alone: candidates are
run in interleaved rounds (A B C, A B C, ...) so that drift hits all of them alike, warm-up calls
are excluded, and the table reports each candidate's median relative to a baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from course_lib.percentiles import percentile

__all__ = ["compare_latency", "time_calls_ns"]


def time_calls_ns(fn: Callable[[], object], n_calls: int, *, warmup_calls: int = 0) -> np.ndarray:
    """Call ``fn()`` ``warmup_calls`` times untimed, then ``n_calls`` times timed.

    Returns
    -------
    numpy.ndarray of int64, shape (n_calls,)
        Wall time of each call in nanoseconds (``time.perf_counter_ns``).

    Raises
    ------
    ValueError
        If ``n_calls`` < 1 or ``warmup_calls`` < 0.
    """
    if n_calls < 1:
        raise ValueError(f"n_calls must be >= 1, got {n_calls}")
    if warmup_calls < 0:
        raise ValueError(f"warmup_calls must be >= 0, got {warmup_calls}")
    for _ in range(warmup_calls):
        fn()
    out = np.empty(n_calls, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(n_calls):
        start = clock()
        fn()
        out[i] = clock() - start
    return out


def compare_latency(
    candidates: dict[str, Callable[[], object]],
    *,
    n_calls: int = 200,
    rounds: int = 5,
    warmup_calls: int = 20,
    baseline: str | None = None,
    items_per_call: int = 1,
) -> pd.DataFrame:
    """Time several callables side by side and tabulate latency and speed-up.

    Parameters
    ----------
    candidates : dict of name -> zero-argument callable
        Each scores the same input (e.g. one customer) its own way.
    n_calls : int
        Timed calls per candidate in each round.
    rounds : int
        Interleaved rounds; each round runs every candidate once for ``n_calls`` calls.
    warmup_calls : int
        Untimed calls per candidate before the first round (JIT, caches, thread pools).
    baseline : str, optional
        Candidate the ``speedup`` column divides by; defaults to the first one.
    items_per_call : int
        Predictions per call, for the ``us_per_item`` column.

    Returns
    -------
    DataFrame indexed by candidate with ``median_us``, ``p99_us`` (nearest rank), ``us_per_item`` and
    ``speedup`` (baseline median / candidate median) over all ``n_calls x rounds`` timed calls.
    """
    if not candidates:
        raise ValueError("candidates must name at least one callable")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    base = baseline if baseline is not None else next(iter(candidates))
    if base not in candidates:
        raise ValueError(f"baseline {base!r} is not one of {list(candidates)}")
    samples: dict[str, list[np.ndarray]] = {name: [] for name in candidates}
    for fn in candidates.values():
        time_calls_ns(fn, 1, warmup_calls=warmup_calls)
    for _ in range(rounds):
        for name, fn in candidates.items():
            samples[name].append(time_calls_ns(fn, n_calls))
    rows = {}
    for name, parts in samples.items():
        us = np.concatenate(parts) / 1e3
        rows[name] = {"median_us": float(np.median(us)), "p99_us": percentile(us, 99)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["us_per_item"] = table["median_us"] / items_per_call
    table["speedup"] = table.loc[base, "median_us"] / table["median_us"]
    table.index.name = "candidate"
    return table
