"""A deterministic discrete-event simulator of Triton's dynamic batcher.

Requests arrive at given times and wait in one FIFO queue. Whenever a model instance is free, the
batcher applies Triton's rule (``next_batch_size``) to the queue:

* if the queue holds a preferred batch size (by default the only preferred size is
  ``max_batch_size``), send the largest preferred size it can fill, at once;
* otherwise wait, but never let the oldest queued request wait longer than ``max_queue_delay_ms``:
  when that delay runs out, send what is queued (up to ``max_batch_size``) as it is;
* with ``max_queue_delay_ms = 0`` nothing waits: a free instance takes what is queued at once.

Requests that arrive while every instance is busy queue up and leave together, as one batch, when
an instance frees. The same inputs always give the same output: there is no randomness and no clock.
The rule itself, its knobs' checks and Poisson arrivals live in :mod:`course_lib.serving.batching.rule`
(re-exported here), which ``course_lib.serving.batching.batcher`` imports to apply the very same rule
to real requests.

References
----------
NVIDIA Triton Inference Server documentation, "Batchers: Dynamic Batcher" (sections "Preferred
Batch Sizes" and "Delayed Batching"), and ``src/dynamic_batch_scheduler.cc`` (``GetDynamicBatch``) in
github.com/triton-inference-server/core; ``model_config_utils.cc`` sets the preferred batch size to
``max_batch_size`` when none is configured.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd

from course_lib.core.checks import integer, positive_number
from course_lib.core.percentiles import percentile, percentiles
from course_lib.serving.batching.rule import TRIGGERS, check_batching_params, next_batch_size
from course_lib.simulate.traffic import poisson_arrivals_ms

__all__ = [
    "TRIGGERS",
    "BatchingResult",
    "check_batching_params",
    "next_batch_size",
    "simulate_dynamic_batching",
    "sweep_offered_load",
]

ServiceTime = float | Callable[[int], float]


def _service_fn(service_time_ms: ServiceTime) -> Callable[[int], float]:
    if callable(service_time_ms):
        fn = service_time_ms
    else:
        constant = positive_number("service_time_ms", service_time_ms, allow_zero=True)
        fn = lambda _size: constant  # noqa: E731

    def checked(size: int) -> float:
        return positive_number(f"service_time_ms({size})", fn(size), allow_zero=True)

    return checked


def _check_arrivals(arrival_times_ms: Sequence[float] | np.ndarray) -> np.ndarray:
    arrivals = np.asarray(arrival_times_ms, dtype=float)
    if arrivals.ndim != 1 or arrivals.size == 0:
        raise ValueError(
            f"arrival_times_ms must be a non-empty 1-D sequence of ms, got shape {arrivals.shape}"
        )
    if not np.all(np.isfinite(arrivals)):
        bad = int(np.flatnonzero(~np.isfinite(arrivals))[0])
        raise ValueError(f"arrival_times_ms must be finite; index {bad} is {float(arrivals[bad])!r}")
    if np.any(np.diff(arrivals) < 0):
        bad = int(np.flatnonzero(np.diff(arrivals) < 0)[0]) + 1
        raise ValueError(
            f"arrival_times_ms must be sorted (non-decreasing); index {bad} ({arrivals[bad]:g} ms) "
            f"comes before index {bad - 1} ({arrivals[bad - 1]:g} ms)"
        )
    return arrivals


@dataclass(frozen=True)
class BatchingResult:
    """Output of ``simulate_dynamic_batching``.

    Attributes
    ----------
    requests : DataFrame, one row per request in arrival order
        ``request_id``, ``arrival_ms``, ``dispatch_ms``, ``queue_wait_ms``, ``service_ms``,
        ``completion_ms``, ``latency_ms`` (= queue wait + service), ``batch_id``.
    batches : DataFrame, one row per model call in dispatch order
        ``batch_id``, ``size``, ``dispatch_ms``, ``service_ms``, ``completion_ms``, ``instance``,
        ``trigger`` (one of ``TRIGGERS``).
    params : dict
        The knobs the run used (normalised).
    """

    requests: pd.DataFrame
    batches: pd.DataFrame
    params: dict[str, object] = field(default_factory=dict)

    def achieved_rps(self) -> float:
        """Completed requests per second from the first arrival to the last completion."""
        span_ms = float(self.requests["completion_ms"].max() - self.requests["arrival_ms"].min())
        return math.inf if span_ms == 0 else 1000.0 * len(self.requests) / span_ms

    def offered_rps(self) -> float:
        """Arrival rate: (n - 1) gaps over the arrival span, requests per second (nan for one request)."""
        arrivals = self.requests["arrival_ms"]
        span_ms = float(arrivals.max() - arrivals.min())
        return math.nan if len(arrivals) < 2 or span_ms == 0 else 1000.0 * (len(arrivals) - 1) / span_ms

    def latency_percentiles_ms(self, qs: Iterable[float] = (50, 95, 99)) -> dict[str, float]:
        """End-to-end latency percentiles (nearest rank), keyed ``p50``, ``p95``, ``p99``."""
        return percentiles(self.requests["latency_ms"].to_numpy(), qs)

    @property
    def p99_latency_ms(self) -> float:
        return percentile(self.requests["latency_ms"].to_numpy(), 99)

    def summary(self) -> dict[str, float]:
        """One row for a sweep table: rates, batch sizes, latency percentiles and utilisation."""
        lat = self.latency_percentiles_ms()
        span_ms = float(self.requests["completion_ms"].max() - self.requests["arrival_ms"].min())
        instances = int(cast(int, self.params.get("instances", 1)))  # simulate_batching stores an int
        busy_ms = float(self.batches["service_ms"].sum())
        row = {
            "n_requests": len(self.requests),
            "offered_rps": self.offered_rps(),
            "achieved_rps": self.achieved_rps(),
            "mean_batch_size": float(self.batches["size"].mean()),
            "p50_ms": lat["p50"],
            "p95_ms": lat["p95"],
            "p99_ms": lat["p99"],
            "p99_queue_wait_ms": percentile(self.requests["queue_wait_ms"].to_numpy(), 99),
            "utilisation": busy_ms / (span_ms * instances) if span_ms > 0 else math.nan,
        }
        return row


@dataclass(frozen=True)
class _Batch:
    """One model call: which instance runs how many of the oldest queued requests, and why now."""

    size: int
    instance: int
    trigger: str


class _Batcher:
    """The state of one replay: the FIFO queue, each instance's free time and the batches sent so far."""

    def __init__(
        self,
        arrivals_ms: list[float],
        service: Callable[[int], float],
        *,
        max_batch_size: int,
        max_queue_delay_ms: float,
        preferred_batch_sizes: tuple[int, ...],
        instances: int,
    ) -> None:
        self.arrivals_ms = arrivals_ms
        self.service = service
        self.max_batch_size = max_batch_size
        self.max_queue_delay_ms = max_queue_delay_ms
        self.preferred_batch_sizes = preferred_batch_sizes
        self.instances = instances
        self.free_at_ms = [-math.inf] * instances
        self.queue: deque[int] = deque()
        self.next_arrival = 0
        self.request_batch = np.empty(len(arrivals_ms), dtype=np.int64)
        self.batch_rows: list[tuple[int, int, float, float, int, str]] = []

    def has_work(self) -> bool:
        """Whether a request has still to arrive or still waits in the queue."""
        return self.next_arrival < len(self.arrivals_ms) or bool(self.queue)

    def queue_arrivals_until(self, t: float) -> None:
        """Append every request arriving at or before ``t`` to the queue, in arrival order."""
        while self.next_arrival < len(self.arrivals_ms) and self.arrivals_ms[self.next_arrival] <= t:
            self.queue.append(self.next_arrival)
            self.next_arrival += 1

    def form_batch(self, t: float) -> _Batch | None:
        """The batch Triton's rule sends at ``t``, or None (no free instance, empty queue, or it waits)."""
        free = [k for k in range(self.instances) if self.free_at_ms[k] <= t]
        if not self.queue or not free:
            return None
        oldest = self.arrivals_ms[self.queue[0]]
        size, trigger = next_batch_size(
            len(self.queue),
            t,
            oldest,
            max_batch_size=self.max_batch_size,
            max_queue_delay_ms=self.max_queue_delay_ms,
            preferred_batch_sizes=self.preferred_batch_sizes,
        )
        if size == 0:
            return None
        if trigger == "max_queue_delay" and t > oldest + self.max_queue_delay_ms:
            trigger = "instance_free"  # the delay ran out while every instance was busy
        instance = min(free, key=lambda j: (self.free_at_ms[j], j))  # free longest, then lowest index
        return _Batch(size=size, instance=instance, trigger=str(trigger))

    def serve(self, batch: _Batch, t: float) -> None:
        """Dispatch ``batch`` at ``t``: its requests leave the queue; its instance is busy for the service."""
        ms = self.service(batch.size)
        batch_id = len(self.batch_rows)
        for _ in range(batch.size):
            self.request_batch[self.queue.popleft()] = batch_id
        self.batch_rows.append((batch_id, batch.size, t, ms, batch.instance, batch.trigger))
        self.free_at_ms[batch.instance] = t + ms

    def next_event_ms(self, t: float) -> float:
        """The next instant the batcher may act: an arrival, the oldest's delay ending, or a free instance.

        ``t`` itself when nothing is left (``has_work`` is then false).
        """
        candidates = []
        if self.next_arrival < len(self.arrivals_ms):
            candidates.append(self.arrivals_ms[self.next_arrival])
        if self.queue:
            if any(f <= t for f in self.free_at_ms):
                # an instance is free yet the rule waits: for the timer (delay > 0 here)
                candidates.append(self.arrivals_ms[self.queue[0]] + self.max_queue_delay_ms)
            else:
                candidates.append(min(self.free_at_ms))
        return min(candidates, default=t)


def _result(arrivals: np.ndarray, batcher: _Batcher) -> BatchingResult:
    """The per-request and per-batch tables of a finished replay, with the knobs it used."""
    batches = pd.DataFrame(
        batcher.batch_rows, columns=["batch_id", "size", "dispatch_ms", "service_ms", "instance", "trigger"]
    )
    batches["completion_ms"] = batches["dispatch_ms"] + batches["service_ms"]
    batches = batches[
        ["batch_id", "size", "dispatch_ms", "service_ms", "completion_ms", "instance", "trigger"]
    ]
    request_batch = batcher.request_batch
    dispatch = batches["dispatch_ms"].to_numpy()[request_batch]
    service_ms = batches["service_ms"].to_numpy()[request_batch]
    requests = pd.DataFrame(
        {
            "request_id": np.arange(arrivals.size),
            "arrival_ms": arrivals,
            "dispatch_ms": dispatch,
            "queue_wait_ms": dispatch - arrivals,
            "service_ms": service_ms,
            "completion_ms": dispatch + service_ms,
            "latency_ms": dispatch + service_ms - arrivals,
            "batch_id": request_batch,
        }
    )
    params = {
        "max_batch_size": batcher.max_batch_size,
        "max_queue_delay_ms": batcher.max_queue_delay_ms,
        "preferred_batch_sizes": batcher.preferred_batch_sizes,
        "instances": batcher.instances,
    }
    return BatchingResult(requests=requests, batches=batches, params=params)


def simulate_dynamic_batching(
    arrival_times_ms: Sequence[float] | np.ndarray,
    *,
    max_batch_size: int,
    max_queue_delay_ms: float,
    service_time_ms: ServiceTime,
    preferred_batch_sizes: Iterable[int] = (),
    instances: int = 1,
) -> BatchingResult:
    """Replay arrivals through a Triton-style dynamic batcher with ``instances`` model instances.

    Parameters
    ----------
    arrival_times_ms : 1-D array-like of float, shape (n,), n >= 1, sorted (non-decreasing), finite
        When each request reaches the batcher, ms.
    max_batch_size : int >= 1
        Largest batch one model call takes.
    max_queue_delay_ms : float >= 0
        Longest the oldest queued request may be held back to let a batch fill (0 = never wait).
    service_time_ms : float >= 0 or callable batch_size -> ms
        Time one model call takes; e.g. a fitted ``course_lib.measure.batch_cost.LinearCostModel``.
    preferred_batch_sizes : iterable of int in [1, max_batch_size], optional
        Batch sizes to send as soon as they can be formed (Triton default: ``max_batch_size`` only).
    instances : int >= 1
        Model instances serving the one queue in parallel (Triton's ``instance_group`` count).

    Returns
    -------
    BatchingResult
        Per-request queue wait, service time and latency, and the batches formed (with trigger).

    Raises
    ------
    ValueError
        Batch size below 1, negative or NaN delay, preferred size outside [1, max_batch_size],
        unsorted / NaN / empty arrivals, ``instances`` below 1, or a service time that is negative
        or not finite.
    TypeError
        If ``service_time_ms`` is neither a number nor a callable.

    Notes
    -----
    Ties are resolved deterministically: all requests arriving at or before an instant join the queue
    before the batcher decides; the instance that has been free longest (then the lowest index) runs
    the next batch. A batch dispatched at t with service s completes at t + s for every request in it.

    References
    ----------
    NVIDIA Triton Inference Server documentation, "Dynamic Batcher" (preferred batch sizes,
    ``max_queue_delay_microseconds``); ``GetDynamicBatch`` in triton-inference-server/core.
    """
    max_batch_size, delay, preferred = check_batching_params(
        max_batch_size, max_queue_delay_ms, preferred_batch_sizes
    )
    instances = integer("instances", instances, min=1)
    arrivals = _check_arrivals(arrival_times_ms)
    batcher = _Batcher(
        arrivals.tolist(),
        _service_fn(service_time_ms),
        max_batch_size=max_batch_size,
        max_queue_delay_ms=delay,
        preferred_batch_sizes=preferred,
        instances=int(instances),
    )
    t = float(arrivals[0])
    while batcher.has_work():
        batcher.queue_arrivals_until(t)  # every request that has arrived by t joins the queue
        while (batch := batcher.form_batch(t)) is not None:  # Triton's rule, on a free instance
            batcher.serve(batch, t)
        t = batcher.next_event_ms(t)  # wait: next arrival, the oldest's delay running out, or a free instance
    return _result(arrivals, batcher)


def sweep_offered_load(
    rates_rps: Iterable[float],
    max_queue_delays_ms: Iterable[float],
    *,
    max_batch_size: int,
    service_time_ms: ServiceTime,
    n_requests: int = 2000,
    seed: int = 0,
    preferred_batch_sizes: Iterable[int] = (),
    instances: int = 1,
) -> pd.DataFrame:
    """Simulate every (max_queue_delay_ms, offered rate) pair on Poisson arrivals; one row each.

    The same seed is used at every point, so curves differ only by the knob being varied.

    Parameters
    ----------
    rates_rps : iterable of float > 0
        Offered loads, requests per second.
    max_queue_delays_ms : iterable of float >= 0
    max_batch_size, service_time_ms, preferred_batch_sizes, instances
        As in ``simulate_dynamic_batching``.
    n_requests : int >= 1
        Arrivals per point.
    seed : int

    Returns
    -------
    DataFrame with ``max_queue_delay_ms``, ``rate_rps`` and the columns of ``BatchingResult.summary``.
    """
    preferred = tuple(preferred_batch_sizes)
    rows = []
    for delay in max_queue_delays_ms:
        for rate in rates_rps:
            result = simulate_dynamic_batching(
                poisson_arrivals_ms(rate, n_requests, seed),
                max_batch_size=max_batch_size,
                max_queue_delay_ms=delay,
                service_time_ms=service_time_ms,
                preferred_batch_sizes=preferred,
                instances=instances,
            )
            rows.append({"max_queue_delay_ms": delay, "rate_rps": rate, **result.summary()})
    return pd.DataFrame(rows)
