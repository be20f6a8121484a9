"""The course's one timing harness: time callables side by side in interleaved rounds.

Machines are shared and noisy, so absolute times are shown but never trusted alone. Every measurement
in the course goes through :func:`interleaved_rounds_ns`:

1. each candidate is called ``warmup_calls`` times untimed (JIT, caches, thread pools);
2. the calls per round are fixed: given, or set by the one rule :func:`calls_per_round` from one
   timed probe call of each candidate (the slowest sets the count, so every candidate gets the same);
3. ``rounds`` rounds run every candidate in turn for that many calls, so drift on the machine hits
   all of them alike; the order rotates from round to round (A B C, B C A, C A B, ...:
   :func:`round_order`), so no candidate always runs first, right after the warm-up or right after
   the same neighbour;
4. the per-call wall times come back in nanoseconds, one row per round, so a caller can take a
   statistic per round (:func:`p99_median_of_rounds_us`) or over all calls pooled.

:func:`compare_latency` builds the usual table on it (median, p99 and speed-up over a baseline, and
with ``confidence`` the interval of :mod:`course_lib.core.intervals` for the speed-up, from the rounds);
:func:`compare_latency_by_batch` runs it at each batch size in turn (``runtime_tuning.tuning_table`` and
``variants.variant_latency``); ``batch_cost.measure_call_ms`` and ``throughput.measure_batch_latency`` are
built on the rounds too. :func:`usable_cores` is the one core count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Literal, TypeVar

import numpy as np
import pandas as pd

from course_lib.core import checks
from course_lib.core.checks import (
    InvalidArgumentError,
    callable_,
    integer,
    non_empty,
    one_of,
    positive_number,
)
from course_lib.core.intervals import ratio_interval
from course_lib.core.percentiles import percentile

__all__ = [
    "calls_per_round",
    "compare_latency",
    "compare_latency_by_batch",
    "interleaved_rounds_ns",
    "p99_median_of_rounds_us",
    "round_order",
    "time_calls_ns",
    "usable_cores",
]

K = TypeVar("K", bound=Hashable)
Order = Literal["rotate", "fixed"]


def round_order(keys: Sequence[K], round_index: int, order: Order = "rotate") -> list[K]:
    """The order in which round ``round_index`` runs the candidates ``keys``.

    ``"rotate"`` (the default of every course measurement) starts round r at candidate r mod k, so over
    k rounds every candidate runs once in every position; ``"fixed"`` keeps the given order.

    Raises
    ------
    ValueError
        For an unknown ``order`` or a negative ``round_index``.

    Examples
    --------
    >>> [round_order("ABC", r) for r in range(4)]
    [['A', 'B', 'C'], ['B', 'C', 'A'], ['C', 'A', 'B'], ['A', 'B', 'C']]
    """
    checks.one_of("order", order, ("rotate", "fixed"))
    round_index = checks.integer("round_index", round_index, min=0)
    keys = list(keys)
    if order == "fixed" or not keys:
        return keys
    shift = round_index % len(keys)
    return keys[shift:] + keys[:shift]


def usable_cores() -> int:
    """CPU cores this process may run on: ``os.sched_getaffinity`` where available, else ``os.cpu_count()``.

    Returns
    -------
    int >= 1
        The cores a container or ``taskset`` leaves to this process (which can be fewer than the
        machine's logical cores).

    Examples
    --------
    >>> usable_cores() >= 1
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


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

    Examples
    --------
    >>> time_calls_ns(lambda: None, 3, warmup_calls=1).shape
    (3,)
    """
    n_calls = integer("n_calls", n_calls, min=1)
    warmup_calls = integer("warmup_calls", warmup_calls, min=0)
    for _ in range(warmup_calls):
        fn()
    out = np.empty(n_calls, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(n_calls):
        start = clock()
        fn()
        out[i] = clock() - start
    return out


def calls_per_round(
    seconds_per_call: float, *, target_s: float, rounds: int, min_calls: int = 20, max_calls: int = 1000
) -> int:
    """The course's one call-count rule: enough calls for about ``target_s`` timed seconds per candidate.

    ``n = clip(target_s / (rounds x seconds_per_call), min_calls, max_calls)``: fast calls get many
    samples (a p99 needs >= 100 calls per round to be more than the slowest call), slow calls few, and
    a lesson's run time stays bounded on a slow machine.

    Parameters
    ----------
    seconds_per_call : float >= 0
        One probe call's wall time, seconds (the slowest candidate's); below 100 ns counts as 100 ns.
    target_s : float > 0
        Timed seconds per candidate over all rounds.
    rounds : int >= 1
    min_calls, max_calls : int, 1 <= min_calls <= max_calls
        Bounds on the calls per round.

    Returns
    -------
    int, calls per round.

    Raises
    ------
    ValueError
        For a non-positive ``target_s``, ``rounds`` < 1 or bounds out of order.

    Examples
    --------
    >>> calls_per_round(0.001, target_s=1.0, rounds=5)
    200
    >>> calls_per_round(1.0, target_s=1.0, rounds=5, min_calls=3)
    3
    """
    target_s = positive_number("target_s", target_s)
    rounds = integer("rounds", rounds, min=1)
    min_calls = integer("min_calls", min_calls, min=1)
    max_calls = integer("max_calls", max_calls, min=1)
    if max_calls < min_calls:
        raise InvalidArgumentError(f"max_calls must be >= min_calls={min_calls}, got {max_calls}")
    seconds_per_call = positive_number("seconds_per_call", seconds_per_call, allow_zero=True)
    return int(np.clip(target_s / (rounds * max(seconds_per_call, 1e-7)), min_calls, max_calls))


def interleaved_rounds_ns(
    candidates: Mapping[K, Callable[[], object]],
    *,
    n_calls: int | None = None,
    rounds: int = 5,
    warmup_calls: int = 0,
    target_s: float = 1.0,
    min_calls: int = 20,
    max_calls: int = 1000,
    order: Order = "rotate",
) -> dict[K, np.ndarray]:
    """Time every candidate in interleaved rounds; per-call wall times in nanoseconds, one row per round.

    Parameters
    ----------
    candidates : mapping of key -> zero-argument callable
        Each does one call of the work being timed (inputs prepared beforehand, so only the call is timed).
    n_calls : int >= 1, optional
        Timed calls per candidate in each round. None: :func:`calls_per_round` from one timed probe call
        of each candidate (after warm-up), with ``target_s``, ``min_calls`` and ``max_calls``.
    rounds : int >= 1
        Rounds; each runs every candidate once for ``n_calls`` calls, in the order :func:`round_order`
        gives (rotated from round to round unless ``order="fixed"``).
    warmup_calls : int >= 0
        Untimed calls per candidate before anything is timed.
    target_s, min_calls, max_calls
        The call-count rule's settings, used only when ``n_calls`` is None.
    order : {"rotate", "fixed"}
        See :func:`round_order`.

    Returns
    -------
    dict of key -> numpy.ndarray of int64, shape (rounds, n_calls)
        Row r holds the candidate's calls of round r, in nanoseconds (``time.perf_counter_ns``).

    Raises
    ------
    ValueError
        For no candidates, ``rounds`` < 1, ``n_calls`` < 1 or ``warmup_calls`` < 0.

    Examples
    --------
    >>> samples = interleaved_rounds_ns({"a": lambda: None, "b": lambda: None}, n_calls=4, rounds=3)
    >>> {name: s.shape for name, s in samples.items()}
    {'a': (3, 4), 'b': (3, 4)}
    """
    non_empty("candidates", candidates)
    for key, fn in candidates.items():
        callable_(f"candidates[{key!r}]", fn)
    rounds = integer("rounds", rounds, min=1)
    warmup_calls = integer("warmup_calls", warmup_calls, min=0)
    if n_calls is not None:
        n_calls = integer("n_calls", n_calls, min=1)
    for fn in candidates.values():
        for _ in range(warmup_calls):
            fn()
    if n_calls is None:
        slowest_ns = max(int(time_calls_ns(fn, 1)[0]) for fn in candidates.values())
        n_calls = calls_per_round(
            slowest_ns / 1e9, target_s=target_s, rounds=rounds, min_calls=min_calls, max_calls=max_calls
        )
    samples = {key: np.empty((rounds, int(n_calls)), dtype=np.int64) for key in candidates}
    for r in range(rounds):
        for key in round_order(list(candidates), r, order):
            samples[key][r] = time_calls_ns(candidates[key], int(n_calls))
    return samples


def p99_median_of_rounds_us(rounds_ns: Sequence[np.ndarray] | np.ndarray) -> float:
    """Median over rounds of each round's p99 (nearest rank) call time, in microseconds.

    A scheduler stall that lands in a minority of the rounds does not move it; a slow tail the timed
    code produces itself shows in most rounds and does (see :mod:`course_lib.measure.throughput._measure`).

    Parameters
    ----------
    rounds_ns : sequence of 1-D arrays (or a 2-D array, one row per round) of call times in nanoseconds,
        at least one call each.

    Returns
    -------
    float, microseconds. With an odd number of rounds it is one round's p99; with an even number, the
    mean of the two middle ones (``numpy.median``).

    Raises
    ------
    ValueError
        If there are no rounds or a round is empty.

    References
    ----------
    Nearest-rank percentile: :func:`course_lib.core.percentiles.percentile`. The median-of-rounds rule is the
    course's choice for a shared machine.

    Examples
    --------
    >>> p99_median_of_rounds_us([[1000, 2000], [3000, 4000], [5000, 9_000_000]])
    4.0
    """
    non_empty("rounds_ns", rounds_ns)
    for i, r in enumerate(rounds_ns):
        non_empty(f"rounds_ns[{i}]", r)
    return float(np.median([percentile(np.asarray(r) / 1e3, 99) for r in rounds_ns]))


def compare_latency(
    candidates: Mapping[K, Callable[[], object]],
    *,
    n_calls: int | None = 200,
    rounds: int = 5,
    warmup_calls: int = 20,
    baseline: K | None = None,
    items_per_call: int = 1,
    target_s: float = 1.0,
    confidence: float | None = None,
) -> pd.DataFrame:
    """Time several callables side by side and tabulate latency and speed-up.

    Parameters
    ----------
    candidates : dict of name -> zero-argument callable
        Each scores the same input (e.g. one customer) its own way.
    n_calls : int >= 1 or None
        Timed calls per candidate in each round; None applies :func:`calls_per_round` (about
        ``target_s`` timed seconds per candidate, 20 to 1,000 calls per round).
    rounds : int
        Interleaved rounds (:func:`interleaved_rounds_ns`).
    warmup_calls : int
        Untimed calls per candidate before the first round (JIT, caches, thread pools).
    baseline : str, optional
        Candidate the ``speedup`` column divides by; defaults to the first one.
    items_per_call : int
        Predictions per call, for the ``us_per_item`` column.
    target_s : float > 0
        Used only when ``n_calls`` is None.
    confidence : float in (0, 1), optional
        Also give the speed-up's interval from the rounds (:func:`course_lib.core.intervals.ratio_interval`
        on per-round medians): needs ``min_rounds(confidence)`` rounds (6 for 0.95) and 20 calls per round.

    Returns
    -------
    DataFrame indexed by candidate with ``median_us``, ``p99_us`` (nearest rank), ``us_per_item`` and
    ``speedup`` (baseline median / candidate median) over all ``n_calls x rounds`` timed calls. With
    ``confidence``, ``speedup`` is instead the median over rounds of the per-round speed-up (baseline
    median / candidate median in the same round), and ``speedup_low`` and ``speedup_high`` give its interval
    and ``resolved`` (-1 slower, +1 faster, 0 when the interval contains 1), and ``.attrs["intervals"]`` maps
    each candidate to its :class:`course_lib.core.intervals.RatioInterval` (candidate time / baseline time, so
    ``.phrase(less="faster", more="slower")`` words it). ``.attrs["rounds_ns"]`` always holds the per-round
    call times (:func:`interleaved_rounds_ns`), for intervals between any two candidates
    (:func:`course_lib.core.intervals.ratio_interval`).

    Raises
    ------
    ValueError
        For no candidates, an unknown baseline, or counts below 1; with ``confidence``, for too few
        rounds or calls per round.
    """
    non_empty("candidates", candidates)
    base = one_of("baseline", baseline, candidates) if baseline is not None else next(iter(candidates))
    if n_calls is not None:
        n_calls = integer("n_calls", n_calls, min=1)
    samples = interleaved_rounds_ns(
        candidates, n_calls=n_calls, rounds=rounds, warmup_calls=warmup_calls, target_s=target_s
    )
    rows: dict[K, dict[str, float]] = {}
    for name, ns in samples.items():
        us = ns.ravel() / 1e3
        rows[name] = {"median_us": float(np.median(us)), "p99_us": percentile(us, 99)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["us_per_item"] = table["median_us"] / items_per_call
    table["speedup"] = rows[base]["median_us"] / table["median_us"]
    table.attrs["rounds_ns"] = samples
    if confidence is not None:
        intervals = {
            name: ratio_interval(ns, samples[base], q=50, confidence=confidence)
            for name, ns in samples.items()
        }
        table["speedup"] = [1.0 / intervals[name].ratio for name in table.index]
        table["speedup_low"] = [1.0 / intervals[name].high for name in table.index]
        table["speedup_high"] = [1.0 / intervals[name].low for name in table.index]
        table["resolved"] = [-intervals[name].direction for name in table.index]
        table.attrs["intervals"] = intervals
    table.index.name = "candidate"
    return table


def compare_latency_by_batch(
    candidates_at: Callable[[int], Mapping[K, Callable[[], object]]],
    batch_sizes: Iterable[int],
    *,
    n_calls: Mapping[int, int] | None = None,
    rounds: int = 6,
    warmup_calls: int = 5,
    confidence: float | None = None,
) -> dict[int, pd.DataFrame]:
    """:func:`compare_latency` at each batch size in turn, in the order given: batch size -> its table
    (one batch size's candidates are timed side by side, so paired; different batch sizes are not).

    Parameters
    ----------
    candidates_at : callable, batch size -> dict of name -> zero-argument callable
        Called once per batch size, just before it is timed; each callable scores one batch of that size.
    batch_sizes : iterable of int
        Batch sizes to time (also the ``items_per_call`` of each table's ``us_per_item``).
    n_calls : mapping of batch size -> timed calls per round, optional
        A batch size it does not name gets the harness's rule (:func:`calls_per_round`: about 1 s timed
        per candidate, 20 to 1,000 calls per round).
    rounds, warmup_calls, confidence : as in :func:`compare_latency` (``confidence`` adds interval columns).

    Returns
    -------
    dict of batch size -> the :func:`compare_latency` table of that batch size's candidates.

    Raises
    ------
    ValueError
        As :func:`compare_latency`.
    """
    return {
        batch: compare_latency(
            candidates_at(batch),
            n_calls=(n_calls or {}).get(batch),
            rounds=rounds,
            warmup_calls=warmup_calls,
            items_per_call=batch,
            confidence=confidence,
        )
        for batch in batch_sizes
    }
