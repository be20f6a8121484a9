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
reports latency percentiles next to the number and length of collections.

References
----------
Python documentation, ``gc`` module: ``gc.callbacks``, ``gc.freeze`` (3.7+), ``gc.set_threshold``.
CPython ``Modules/gcmodule.c`` (3.11): the 25 % rule for full collections (``long_lived_pending``).
Instagram Engineering (2017), "Dismissing Python Garbage Collection at Instagram" (gc.freeze's motive).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from course_lib.core.checks import integer, non_empty, one_of
from course_lib.core.percentiles import percentiles

__all__ = [
    "GC_SETTINGS",
    "RAISED_THRESHOLDS",
    "GcEvent",
    "GcRecorder",
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


def _overlaps(starts: np.ndarray, ends: np.ndarray, events: Sequence[GcEvent]) -> np.ndarray:
    """Per request, whether a collection ran while it was in flight."""
    hit = np.zeros(len(starts), dtype=bool)
    for event in events:
        lo, hi = event.start_ns, event.start_ns + event.duration_ns
        i = np.searchsorted(ends, lo)  # first request ending after the collection began
        if i < len(starts) and starts[i] <= hi:
            hit[i] = True
    return hit


def measure_gc_tail(
    make_handle: Callable[[], Callable[[int], object]],
    n_requests: int,
    *,
    settings: Sequence[str] = GC_SETTINGS,
    warmup_requests: int = 200,
) -> pd.DataFrame:
    """Run requests 0..n_requests-1 under each GC setting; latency and collections.

    For each setting, ``make_handle()`` builds a fresh request path ``handle(i)`` (same starting
    state every time), ``warmup_requests`` untimed calls warm it, the setting is applied (so
    ``gc.freeze()`` happens at the end of the warm-up, as a server would do it before reporting
    ready), and the same requests run in order, each timed with ``perf_counter_ns`` (closed loop:
    no queueing, so a pause shows in the request that was running).

    Returns
    -------
    DataFrame indexed by setting: ``p50_ms``, ``p99_ms``, ``p99.9_ms``, ``max_ms``, collections per
    generation, ``gc_total_ms``, ``longest_pause_ms``, ``longest_full_ms``, ``requests_hit``
    (requests during which a collection ran) and ``tracked_objects`` (``len(gc.get_objects())``).

    Raises
    ------
    ValueError
        If ``n_requests`` < 1 or a setting is unknown.
    """
    n_requests = integer("n_requests", n_requests, min=1)
    rows = {}
    clock = time.perf_counter_ns
    for setting in settings:
        handle = make_handle()
        for i in range(warmup_requests):
            handle(-1 - i)
        with gc_settings(setting):
            gc.collect()
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
        rows[setting] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "gc setting"
    return table


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
    import json
    from collections import deque

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
