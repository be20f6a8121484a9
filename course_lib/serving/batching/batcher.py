"""A real asyncio dynamic batcher with Triton's knobs, a bounded queue and request de-duplication.

Callers ``await batcher.submit(item)`` one request at a time; model instances (worker tasks) take
batches from one FIFO queue by the same rule the simulator uses (``course_lib.simulate.batching.
next_batch_size``): send a full (or preferred-size) batch at once, otherwise wait until the oldest
request has waited ``max_queue_delay_ms``, and with a delay of 0 never wait. Each caller gets back its
value together with its own queue wait and the size of the batch it rode in.

This module is the scheduling (when a batch leaves, which instance scores it, shutdown); the queue with
its de-duplication is :mod:`course_lib.serving.batching._queue`, the results, errors and counters are
:mod:`course_lib.serving.batching._results` (re-exported here).

What it adds over the core
--------------------------
:class:`course_lib.serving.batching.core.CoreBatcher` (about 60 lines, read in Lesson 3) is the idea:
a queue, Triton's rule, one model call in a thread, one future per caller.
``tests/test_batching_core.py`` checks that both form the same batches and give the same answers on
the same arrivals. This class adds what a server needs: preferred batch sizes and several model
instances; admission control (a bounded queue that rejects at once); de-duplication of identical
queued requests; cancellation (a caller that gives up frees its slot); per-request results (queue
wait, batch size) and counters; errors routed to the callers of the failed batch; and a graceful,
time-bounded shutdown. The decisions behind each follow.

Design decisions
----------------
* **Bounded queue, fail fast.** When ``max_queue_size`` requests are waiting, ``submit`` raises
  ``QueueFullError`` at once (an HTTP server answers 503). Nothing blocks forever, nothing is dropped
  silently: every accepted request gets a value or an exception.
* **The model runs in a worker thread by default** (one thread per instance). A model call of a few
  milliseconds on the event loop would freeze it: no new request admitted, no timer fired, no HTTP
  body parsed until the call returns. XGBoost and ONNX Runtime release the GIL inside their C++
  code, so in a thread the loop keeps queueing the next batch while this one is scored. The thread
  hop costs tens of microseconds per batch; for a score function that itself takes microseconds
  (a fake scorer in a test, a lookup) pass ``run_in_thread=False`` and it runs on the loop.
* **De-duplication window = the queue.** With ``dedup_key``, a request whose key equals that of a
  request still waiting in the queue joins it: the item is scored once, and every caller gets the
  answer (``deduplicated=True`` for the joiners; counted in ``stats.deduplicated``). Duplicates do not
  take a row in the batch; they do count against ``max_queue_size``.
* **A caller that gives up frees its slot at once.** If the awaiting task is cancelled (a client
  disconnected, a timeout fired) while its request is queued, the request leaves the queue then and
  there: the slot counts against ``max_queue_size`` no more, the item never reaches the model, and
  ``stats.cancelled_by_caller`` counts it. (A request already in a running batch cannot be recalled;
  its result is dropped and it is counted when the batch ends.) Ray Serve had the opposite bug
  (ray-project/ray#50046, fixed by PR #50054).
* **Graceful shutdown.** ``stop()`` stops admitting requests, fails every queued request with
  ``BatcherClosedError`` (or scores them first with ``drain=True``), lets a batch already running
  finish, and gives up on a hung model call after ``timeout_s`` (its callers get the error too).

Timer resolution: asyncio sleeps on ``epoll`` (Linux), whose timeout is rounded up to whole
milliseconds, so a real ``max_queue_delay_ms`` below 1 ms behaves like about 1 ms.

References
----------
NVIDIA Triton Inference Server documentation, "Dynamic Batcher" (``max_batch_size``,
``preferred_batch_size``, ``max_queue_delay_microseconds``, ``max_queue_size`` in the queue policy).
Source lesson 004 ("Serving Models at Scale"): asyncio batching server and request de-duplication.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from course_lib.core.checks import callable_, integer
from course_lib.serving.batching._queue import QueueEntry, RequestQueue
from course_lib.serving.batching._results import (
    BatchedResult,
    BatcherClosedError,
    BatcherStats,
    BatchScoringError,
    QueueFullError,
)
from course_lib.serving.batching.rule import check_batching_params, next_batch_size
from course_lib.serving.server import DEFAULTS

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BatchScoringError",
    "BatchedResult",
    "BatcherClosedError",
    "BatcherStats",
    "DynamicBatcher",
    "QueueFullError",
]

T = TypeVar("T")
R = TypeVar("R")


class DynamicBatcher(Generic[T, R]):
    """Group concurrent ``submit`` calls into batches for a synchronous batch score function.

    Parameters
    ----------
    score_batch : callable list[item] -> sequence of results, same length and order
        The model call, e.g. ``lambda records: scorer.run(scorer.feeds_from_records(records))``.
    max_batch_size : int >= 1
    max_queue_delay_ms : float >= 0
        Longest the oldest queued request is held back to let a batch fill (0 = never wait).
    preferred_batch_sizes : iterable of int in [1, max_batch_size]
        Sizes sent as soon as they can be formed; default ``(max_batch_size,)`` as in Triton.
    max_queue_size : int >= 1
        Requests allowed to wait (duplicates included); one more is rejected with ``QueueFullError``.
    dedup_key : callable item -> hashable, optional
        Requests with equal keys waiting together are scored once. None disables de-duplication.
    instances : int >= 1
        Model instances (worker tasks, each with its own thread) serving the queue.
    run_in_thread : bool
        Run ``score_batch`` in a worker thread (default) or directly on the event loop (tiny functions).

    Raises
    ------
    ValueError
        For any knob outside its range (same checks as the simulator).
    TypeError
        If ``score_batch`` or ``dedup_key`` is not callable.

    Examples
    --------
    >>> async def main():
    ...     async with DynamicBatcher(lambda xs: [x * 2 for x in xs], max_batch_size=8,
    ...                               max_queue_delay_ms=2.0, run_in_thread=False) as batcher:
    ...         results = await asyncio.gather(*(batcher.submit(i) for i in range(3)))
    ...     return [(r.value, r.batch_size) for r in results]
    >>> asyncio.run(main())
    [(0, 3), (2, 3), (4, 3)]
    """

    def __init__(
        self,
        score_batch: Callable[[list[T]], Sequence[R] | np.ndarray],
        *,
        max_batch_size: int,
        max_queue_delay_ms: float,
        preferred_batch_sizes: Iterable[int] = (),
        max_queue_size: int = DEFAULTS.max_queue_size,
        dedup_key: Callable[[T], Hashable] | None = None,
        instances: int = 1,
        run_in_thread: bool = True,
    ):
        callable_("score_batch", score_batch)
        if dedup_key is not None:
            callable_("dedup_key", dedup_key)
        self.max_batch_size, self.max_queue_delay_ms, self.preferred_batch_sizes = check_batching_params(
            max_batch_size, max_queue_delay_ms, preferred_batch_sizes
        )
        self.max_queue_size = integer("max_queue_size", max_queue_size, min=1)
        self.instances = integer("instances", instances, min=1)
        self.run_in_thread = bool(run_in_thread)
        self._score_batch = score_batch
        self._dedup_key = dedup_key
        self._wake: asyncio.Event | None = None
        self._workers: list[asyncio.Task] = []
        self._executors: list[ThreadPoolExecutor] = []
        self._state = "new"  # new -> running -> stopping -> stopped
        self._drain = False
        self._next_batch_id = 0
        self.stats = BatcherStats()
        self._queue = RequestQueue(self.stats)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> DynamicBatcher[T, R]:
        """Start the worker tasks on the running event loop (idempotent while running)."""
        if self._state == "running":
            return self
        if self._state != "new":
            raise BatcherClosedError("a stopped batcher cannot be restarted; create a new one")
        self._wake = asyncio.Event()
        self._state = "running"
        for k in range(self.instances):
            executor = (
                ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batcher-instance-{k}")
                if self.run_in_thread
                else None
            )
            if executor is not None:
                self._executors.append(executor)
            self._workers.append(asyncio.create_task(self._worker(k, executor), name=f"batcher-instance-{k}"))
        return self

    async def stop(self, *, drain: bool = False, timeout_s: float = 10.0) -> None:
        """Stop admitting requests and shut the workers down; never leaves a caller hanging.

        Parameters
        ----------
        drain : bool
            False (default): queued requests fail with ``BatcherClosedError`` now. True: they are
            scored first (batches leave without waiting for the delay).
        timeout_s : float > 0
            How long to wait for running model calls; after it, the workers are cancelled and their
            callers get ``BatcherClosedError`` (a hung model call cannot hang shutdown).
        """
        if self._state in ("stopping", "stopped"):
            return
        if self._state == "new":
            self._state = "stopped"
            return
        self._state = "stopping"
        self._drain = drain
        if not drain:
            self._queue.fail_all(
                BatcherClosedError("the batcher is shutting down; this request was not scored")
            )
        assert self._wake is not None
        self._wake.set()
        _done, pending = await asyncio.wait(self._workers, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        self._queue.fail_all(BatcherClosedError("the batcher stopped before this request was scored"))
        for executor in self._executors:
            executor.shutdown(wait=False, cancel_futures=True)
        self._state = "stopped"

    async def __aenter__(self) -> DynamicBatcher[T, R]:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def queue_len(self) -> int:
        """Requests waiting (duplicates included), not counting a batch being scored."""
        return self._queue.waiting

    @property
    def running(self) -> bool:
        return self._state == "running"

    # ------------------------------------------------------------------ requests
    async def submit(self, item: T) -> BatchedResult[R]:
        """Queue one request and wait for its result.

        Raises
        ------
        QueueFullError
            If ``max_queue_size`` requests are already waiting (raised at once, nothing queued).
        BatcherClosedError
            If the batcher is not running, or stops before this request is scored.
        BatchScoringError
            If the model call for this request's batch raised or returned the wrong number of results.
        """
        if self._state != "running":
            raise BatcherClosedError(f"the batcher is {self._state}; call start() first or create a new one")
        self.stats.submitted += 1
        if self._queue.waiting >= self.max_queue_size:
            self.stats.rejected_queue_full += 1
            raise QueueFullError(
                f"queue full: {self._queue.waiting} requests waiting (max_queue_size={self.max_queue_size}); "
                "retry later or add capacity",
                max_queue_size=self.max_queue_size,
            )
        now_ns = time.perf_counter_ns()
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        key = self._dedup_key(item) if self._dedup_key is not None else None
        entry = self._queue.add(item, key, future, now_ns)
        assert self._wake is not None
        self._wake.set()
        try:
            return await future
        except asyncio.CancelledError:
            if self._queue.withdraw(entry, future) and self._wake is not None:
                self._wake.set()  # the oldest request may have changed: recompute the deadline
            raise

    # ------------------------------------------------------------------ internals
    async def _next_batch(self, freed_ns: int | None) -> tuple[list[QueueEntry], str, int] | None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            if self._state != "running" and not (self._drain and self._queue):
                return None
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                freed_ns = None
                continue
            now_ns = time.perf_counter_ns()
            oldest_ms = self._queue.oldest_arrival_ns / 1e6
            trigger: str | None
            if self._state != "running":  # draining: flush without waiting
                size, trigger = min(len(self._queue), self.max_batch_size), "shutdown_drain"
            else:
                size, trigger = next_batch_size(
                    len(self._queue),
                    now_ns / 1e6,
                    oldest_ms,
                    max_batch_size=self.max_batch_size,
                    max_queue_delay_ms=self.max_queue_delay_ms,
                    preferred_batch_sizes=self.preferred_batch_sizes,
                )
            if size:
                deadline_ms = oldest_ms + self.max_queue_delay_ms
                if trigger == "max_queue_delay" and freed_ns is not None and freed_ns / 1e6 > deadline_ms:
                    trigger = "instance_free"
                return self._queue.take(size), str(trigger), now_ns
            wait_s = (oldest_ms + self.max_queue_delay_ms - now_ns / 1e6) / 1e3
            self._wake.clear()
            timer = loop.call_later(max(wait_s, 0.0), self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()
            freed_ns = None

    async def _worker(self, instance: int, executor: ThreadPoolExecutor | None) -> None:
        loop = asyncio.get_running_loop()
        freed_ns: int | None = None
        while True:
            batch = await self._next_batch(freed_ns)
            if batch is None:
                return
            entries, trigger, dispatch_ns = batch
            batch_id = self._next_batch_id
            self._next_batch_id += 1
            items = [entry.item for entry in entries]
            values: Sequence[Any] | np.ndarray | None = None
            error: BaseException | None = None
            try:
                if executor is not None:
                    values = await loop.run_in_executor(executor, self._score_batch, items)
                else:
                    values = self._score_batch(items)
                if values is None or len(values) != len(items):
                    got = "None" if values is None else f"{len(values)} results"
                    raise ValueError(f"score_batch returned {got} for {len(items)} items")
            except asyncio.CancelledError:
                self._resolve(
                    entries, None, BatcherClosedError("the batcher stopped while this batch was scored")
                )
                raise
            except Exception as exc:
                error = exc
            end_ns = time.perf_counter_ns()
            self.stats.batches += 1
            self.stats.items_scored += len(items)
            self._resolve(
                entries,
                values,
                error,
                meta={
                    "batch_id": batch_id,
                    "trigger": trigger,
                    "dispatch_ns": dispatch_ns,
                    "service_ms": (end_ns - dispatch_ns) / 1e6,
                },
            )
            freed_ns = end_ns

    def _resolve(
        self,
        entries: list[QueueEntry],
        values: Sequence[Any] | np.ndarray | None,
        error: BaseException | None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        batch_requests = sum(len(entry.waiters) for entry in entries)
        for i, entry in enumerate(entries):
            for j, (future, arrival_ns) in enumerate(entry.waiters):
                if future.done():  # the caller gave up (cancelled); nothing to deliver
                    self.stats.cancelled_by_caller += 1
                    continue
                if isinstance(error, BatcherClosedError):
                    future.set_exception(BatcherClosedError(str(error)))
                    self.stats.closed_before_scoring += 1
                elif error is not None:
                    failure = BatchScoringError(
                        f"model call for batch {meta['batch_id'] if meta else '?'} "
                        f"({len(entries)} items) failed: {error!r}"
                    )
                    failure.__cause__ = error
                    future.set_exception(failure)
                    self.stats.failed += 1
                else:
                    assert values is not None and meta is not None
                    future.set_result(
                        BatchedResult(
                            value=values[i],
                            queue_wait_ms=(meta["dispatch_ns"] - arrival_ns) / 1e6,
                            service_ms=meta["service_ms"],
                            batch_size=len(entries),
                            batch_requests=batch_requests,
                            batch_id=meta["batch_id"],
                            trigger=meta["trigger"],
                            deduplicated=j > 0,
                        )
                    )
                    self.stats.completed += 1
