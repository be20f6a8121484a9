"""Python's garbage collector in the latency tail: record every collection, compare GC settings.

CPython frees most objects by reference counting; the cyclic garbage collector runs besides, in
three generations, when allocations minus deallocations of container objects pass ``threshold0``
(700 by default) and, for older generations, after ``threshold1``/``threshold2`` younger
collections. A collection of generation 2 (a *full* collection) walks every tracked object of the
process, so its pause grows with the heap (imported modules, caches, loaded models), and the request
that is running at the time waits for it. A full collection runs only when the objects promoted to
generation 2 since the last one exceed 25 % of those that were there, so they are rare.

``GcRecorder`` times every collection through ``gc.callbacks``; ``gc_settings`` applies one of the
settings compared in the lesson; ``measure_gc_tail`` runs the same requests under each setting and
reports latency percentiles next to the number and length of collections; ``gc_rounds`` repeats that
in interleaved rounds (the settings taking turns, the order rotated) so that every comparison with
the defaults has an interval.

``gc.freeze()`` has a consequence the 25 % rule explains: frozen objects leave the count the rule
compares with, so right after a freeze the old generation looks empty and the next full collection
comes as soon as the young generations allow it (each walks only what was allocated since the
freeze). Freezing trades rare full collections over the whole heap for more frequent ones over the
new objects.

References
----------
Python documentation, ``gc`` module: ``gc.callbacks``, ``gc.freeze`` (3.7+), ``gc.set_threshold``.
CPython ``Modules/gcmodule.c`` (3.11): the 25 % rule for full collections (``long_lived_pending``).
Instagram Engineering (2017), "Dismissing Python Garbage Collection at Instagram" (gc.freeze's motive).
"""

from __future__ import annotations

import gc
import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from course_lib.core.bench import Order, round_order
from course_lib.core.checks import integer, non_empty, one_of
from course_lib.core.intervals import RatioInterval, ratio_interval_from_values
from course_lib.core.percentiles import percentiles

__all__ = [
    "GC_SETTINGS",
    "RAISED_THRESHOLDS",
    "GcEvent",
    "GcRecorder",
    "GcRounds",
    "gc_paused",
    "gc_rounds",
    "gc_settings",
    "measure_gc_tail",
    "traced_request_path",
]

#: The settings compared: the interpreter's defaults, ``gc.freeze()`` after warm-up, raised thresholds.
GC_SETTINGS: tuple[str, ...] = ("default", "freeze", "raised thresholds")
#: Thresholds of the "raised thresholds" setting: young collections 100x rarer than the default 700.
RAISED_THRESHOLDS: tuple[int, int, int] = (70_000, 20, 20)


@dataclass(frozen=True)
class GcEvent:
    """One collection: generation, start (``perf_counter_ns``), duration (ns), objects collected."""

    generation: int
    start_ns: int
    duration_ns: int
    collected: int


@dataclass
class GcRecorder:
    """Context manager that records every garbage collection through ``gc.callbacks``.

    Examples
    --------
    >>> with GcRecorder() as rec:
    ...     _ = gc.collect()
    >>> rec.events[-1].generation
    2
    """

    events: list[GcEvent] = field(default_factory=list)
    _start: dict[int, int] = field(default_factory=dict)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._start[info["generation"]] = now
        else:
            begun = self._start.pop(info["generation"], now)
            self.events.append(GcEvent(info["generation"], begun, now - begun, info.get("collected", 0)))

    def __enter__(self) -> GcRecorder:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, float]:
        """Collections per generation, total and longest pause (ms)."""
        out: dict[str, float] = {f"gen{g}_collections": 0 for g in range(3)}
        for event in self.events:
            out[f"gen{event.generation}_collections"] += 1
        durations = np.array([e.duration_ns for e in self.events], dtype=float) / 1e6
        out["gc_total_ms"] = float(durations.sum()) if durations.size else 0.0
        out["longest_pause_ms"] = float(durations.max()) if durations.size else 0.0
        full = [e.duration_ns / 1e6 for e in self.events if e.generation == 2]
        out["longest_full_ms"] = max(full) if full else 0.0
        return out


@contextmanager
def gc_settings(setting: str) -> Iterator[None]:
    """Apply one of ``GC_SETTINGS`` for the ``with`` block and restore the previous state after it.

    ``"freeze"`` runs a full collection and ``gc.freeze()`` (everything alive now, the warmed-up
    process, is moved to a permanent generation that collections skip), and ``gc.unfreeze()`` at
    exit. ``"raised thresholds"`` sets ``RAISED_THRESHOLDS``.

    Raises
    ------
    ValueError
        For a setting not in ``GC_SETTINGS``.
    """
    one_of("setting", setting, GC_SETTINGS)
    old = gc.get_threshold()
    try:
        if setting == "freeze":
            gc.collect()
            gc.freeze()
        elif setting == "raised thresholds":
            gc.set_threshold(*RAISED_THRESHOLDS)
        yield
    finally:
        gc.set_threshold(*old)
        if setting == "freeze":
            gc.unfreeze()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Switch the cyclic collector off for the ``with`` block and back on after it (if it was on).

    For a load generator or client in a process with a large heap (a notebook kernel holds hundreds of
    thousands of objects): one full collection there stops its event loop for as long as the walk takes,
    every request in flight waits, and a hedging client then sends copies for all of them at once. The
    replicas' latency is what the experiment measures, not the client's collector, so the client pauses
    it, as ``timeit`` does while it times (reference counting still frees everything without a cycle).

    Examples
    --------
    >>> with gc_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _overlaps(starts: np.ndarray, ends: np.ndarray, events: Sequence[GcEvent]) -> np.ndarray:
    """Per request, whether a collection ran while it was in flight."""
    hit = np.zeros(len(starts), dtype=bool)
    for event in events:
        lo, hi = event.start_ns, event.start_ns + event.duration_ns
        i = np.searchsorted(ends, lo)  # first request ending after the collection began
        if i < len(starts) and starts[i] <= hi:
            hit[i] = True
    return hit


def _run_setting(
    make_handle: Callable[[], Callable[[int], object]], n_requests: int, setting: str, warmup_requests: int
) -> dict[str, float]:
    """One setting from a fresh request path: warm-up, the setting applied, the requests timed."""
    clock = time.perf_counter_ns
    handle = make_handle()
    for i in range(warmup_requests):
        handle(-1 - i)
    with gc_settings(setting):
        gc.collect()  # every setting starts with empty young generations (after a freeze: cheap)
        tracked = len(gc.get_objects())
        starts = np.empty(n_requests, dtype=np.int64)
        ends = np.empty(n_requests, dtype=np.int64)
        with GcRecorder() as rec:
            for i in range(n_requests):
                starts[i] = clock()
                handle(i)
                ends[i] = clock()
    latency_ms = (ends - starts) / 1e6
    del handle  # the next setting starts from the same state
    row = {f"{k}_ms": v for k, v in percentiles(latency_ms, (50, 99, 99.9)).items()}
    row["max_ms"] = float(latency_ms.max())
    row.update(rec.summary())
    row["requests_hit"] = int(_overlaps(starts, ends, rec.events).sum())
    row["tracked_objects"] = tracked
    return row


def measure_gc_tail(
    make_handle: Callable[[], Callable[[int], object]],
    n_requests: int,
    *,
    settings: Sequence[str] = GC_SETTINGS,
    warmup_requests: int = 200,
) -> pd.DataFrame:
    """Run requests 0..n_requests-1 under each GC setting once; latency and collections.

    For each setting, ``make_handle()`` builds a fresh request path ``handle(i)`` (same starting
    state every time), ``warmup_requests`` untimed calls warm it, the setting is applied (so
    ``gc.freeze()`` happens at the end of the warm-up, as a server would do it before reporting
    ready), and the same requests run in order, each timed with ``perf_counter_ns`` (closed loop:
    no queueing, so a pause shows in the request that was running). One run per setting, in the
    order given: :func:`gc_rounds` repeats them in rotated order, for intervals.

    Returns
    -------
    DataFrame indexed by setting: ``p50_ms``, ``p99_ms``, ``p99.9_ms``, ``max_ms``, collections per
    generation, ``gc_total_ms``, ``longest_pause_ms``, ``longest_full_ms``, ``requests_hit``
    (requests during which a collection ran) and ``tracked_objects`` (``len(gc.get_objects())``
    once the setting applied: 0 after ``gc.freeze()``, which hides the frozen objects).

    Raises
    ------
    ValueError
        If ``n_requests`` < 1 or a setting is unknown.
    """
    n_requests = integer("n_requests", n_requests, min=1)
    warmup_requests = integer("warmup_requests", warmup_requests, min=0)
    for setting in settings:
        one_of("setting", setting, GC_SETTINGS)
    rows = {setting: _run_setting(make_handle, n_requests, setting, warmup_requests) for setting in settings}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "gc setting"
    return table


@dataclass(frozen=True)
class GcRounds:
    """GC settings measured in interleaved rounds (:func:`gc_rounds`).

    Attributes
    ----------
    table : DataFrame
        One row per (round, setting), in the order they ran: ``round``, ``setting``, ``position``
        (0 = ran first in its round) and the columns of :func:`measure_gc_tail`.
    baseline : str
        The setting the others are compared with ("default").
    """

    table: pd.DataFrame
    baseline: str

    @property
    def settings(self) -> list[str]:
        """The settings, in the order given."""
        return list(dict.fromkeys(self.table["setting"]))

    def per_round(self, column: str) -> pd.DataFrame:
        """``column`` as a (rounds x settings) table."""
        return self.table.pivot(index="round", columns="setting", values=column)[self.settings]

    def ratio(self, setting: str, column: str = "p99_ms", *, confidence: float = 0.95) -> RatioInterval:
        """``setting``'s ``column`` over the baseline's, round by round, with the interval of the median.

        Raises
        ------
        course_lib.core.checks.InvalidArgumentError
            For an unknown setting, too few rounds for ``confidence``, or a value of 0 (e.g. a pause
            column where a round had no collection).
        """
        one_of("setting", setting, self.settings)
        values = self.per_round(column)
        return ratio_interval_from_values((values[setting] / values[self.baseline]).to_numpy(), confidence)

    def summary(self) -> pd.DataFrame:
        """Per setting, the median over rounds of every column (counts and times alike)."""
        numeric = self.table.drop(columns=["round", "position"]).groupby("setting", sort=False)
        out = numeric.median()
        out.index.name = "gc setting"
        return out


def gc_rounds(
    make_handle: Callable[[], Callable[[int], object]],
    n_requests: int,
    *,
    rounds: int = 6,
    settings: Sequence[str] = GC_SETTINGS,
    warmup_requests: int = 100,
    order: Order = "rotate",
) -> GcRounds:
    """:func:`measure_gc_tail`'s runs repeated in ``rounds`` rounds, the settings taking turns.

    Round ``r`` runs every setting once, from a fresh request path, in the order
    ``course_lib.core.bench.round_order(settings, r)`` gives (rotated: no setting always runs first,
    right after the previous round's heap was freed). Each round yields one ratio per setting against
    the first setting, so :meth:`GcRounds.ratio` has an interval (``course_lib.core.intervals``).

    Parameters
    ----------
    make_handle : callable () -> handle(i)
        Builds a fresh request path (e.g. ``lambda: traced_request_path(service.handle, ids)``).
    n_requests : int >= 1
        Timed requests per setting and round (1,000 for a p99: ``samples_needed(99)``).
    rounds : int >= 1
        Rounds (6 for a 95 % interval: ``course_lib.core.intervals.min_rounds``).
    settings : sequence of ``GC_SETTINGS``
        The first is the baseline.
    warmup_requests : int >= 0
        Untimed requests before each timed run.
    order : {"rotate", "fixed"}

    Returns
    -------
    GcRounds

    Raises
    ------
    ValueError
        For a count out of range, no settings, or an unknown setting.
    """
    n_requests = integer("n_requests", n_requests, min=1)
    rounds = integer("rounds", rounds, min=1)
    warmup_requests = integer("warmup_requests", warmup_requests, min=0)
    non_empty("settings", settings)
    for setting in settings:
        one_of("setting", setting, GC_SETTINGS)
    rows = []
    for r in range(rounds):
        for position, setting in enumerate(round_order(list(settings), r, order)):
            row = _run_setting(make_handle, n_requests, setting, warmup_requests)
            rows.append({"round": r, "setting": setting, "position": position, **row})
    return GcRounds(pd.DataFrame(rows), baseline=settings[0])


def traced_request_path(
    handle_body: Callable[[bytes], object],
    customer_ids: Sequence[str],
    *,
    spans_per_request: int = 20,
    keep_traces: int = 5_000,
) -> Callable[[int], object]:
    """A request path that allocates many objects: score a customer and keep a trace of the request.

    Request ``i`` scores ``customer_ids[i % len]`` with ``handle_body`` (e.g. ``ChurnService.handle``)
    and appends a trace of ``spans_per_request`` span records (two dicts each, as a tracing library
    keeps them) to a buffer of the last ``keep_traces`` requests: objects that live long enough to be
    promoted to the old generation, as caches, metrics and traces in a real service do.

    Raises
    ------
    ValueError
        For an empty id list or a count < 1.
    """

    non_empty("customer_ids", customer_ids)
    spans_per_request = integer("spans_per_request", spans_per_request, min=1)
    keep_traces = integer("keep_traces", keep_traces, min=1)
    bodies = [json.dumps({"customer_id": c}).encode() for c in customer_ids]
    traces: deque[list[dict[str, object]]] = deque(maxlen=keep_traces)

    def handle(i: int) -> object:
        result = handle_body(bodies[i % len(bodies)])
        traces.append(
            [{"span": j, "request": i, "attrs": {"stage": j % 4}} for j in range(spans_per_request)]
        )
        return result

    handle.traces = traces  # type: ignore[attr-defined]
    return handle
