"""The dynamic batcher's idea in one short class: a queue, Triton's rule, one model call, futures.

``CoreBatcher`` is what Lesson 3 reads: callers ``await submit(item)``; one worker (``run``) waits
until ``max_batch_size`` requests are queued or the oldest has waited ``max_queue_delay_ms``
(:func:`course_lib.serving.batching.rule.next_batch_size` decides which), scores the batch in one
call in a worker thread, and resolves each caller's future. It has no bounded queue, no
de-duplication, no cancellation, no shutdown and no timeouts: the hardened
:class:`course_lib.serving.batching.batcher.DynamicBatcher` adds those, and
``tests/test_batching_core.py`` checks that both form the same batches and give the same answers on
the same arrivals.

References
----------
Source lesson 004 ("Serving Models at Scale"): an asyncio batching server (queue, window, one call,
futures). NVIDIA Triton Inference Server documentation, "Dynamic Batcher" (``max_batch_size``,
``max_queue_delay_microseconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from course_lib.core.checks import callable_
from course_lib.serving.batching.rule import check_batching_params, next_batch_size

__all__ = ["CoreBatcher"]

T = TypeVar("T")
R = TypeVar("R")


class CoreBatcher(Generic[T, R]):
    """Group concurrent ``submit`` calls into batches for ``score_batch`` (the core, no hardening).

    Parameters
    ----------
    score_batch : callable list[item] -> sequence of results, same length and order
        The model call; it runs in a worker thread so the event loop keeps queueing requests.
    max_batch_size : int >= 1
    max_queue_delay_ms : float >= 0
        Longest the oldest queued request is held back to let a batch fill (0 = never wait).

    Attributes
    ----------
    batch_sizes : list of int
        The size of every batch scored so far, in order.

    Raises
    ------
    ValueError
        For a knob outside its range (the checks the simulator and ``DynamicBatcher`` use).
    TypeError
        If ``score_batch`` is not callable.

    Examples
    --------
    >>> async def main():
    ...     batcher = CoreBatcher(lambda xs: [10 * x for x in xs], max_batch_size=2, max_queue_delay_ms=5)
    ...     worker = asyncio.create_task(batcher.run())
    ...     answers = await asyncio.gather(*(batcher.submit(x) for x in range(5)))
    ...     worker.cancel()
    ...     return answers, batcher.batch_sizes
    >>> asyncio.run(main())
    ([0, 10, 20, 30, 40], [2, 2, 1])
    """

    def __init__(
        self, score_batch: Callable[[list[T]], Sequence[R]], *, max_batch_size: int, max_queue_delay_ms: float
    ):
        self.score_batch = callable_("score_batch", score_batch)
        self.max_batch_size, self.max_queue_delay_ms, _ = check_batching_params(
            max_batch_size, max_queue_delay_ms
        )
        self.queue: list[tuple[float, T, asyncio.Future[R]]] = []  # (arrival_ms, item, future), oldest first
        self.arrived = asyncio.Event()
        self.batch_sizes: list[int] = []

    async def submit(self, item: T) -> R:
        """Queue one request and wait for its answer."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self.queue.append((time.perf_counter() * 1000, item, future))
        self.arrived.set()
        return await future

    async def run(self) -> None:
        """The worker (one model instance): form batches by Triton's rule, forever (cancel to stop)."""
        while True:
            timeout_s = None  # empty queue: wait for the first request
            if self.queue:
                oldest_ms = self.queue[0][0]
                size, _trigger = next_batch_size(
                    len(self.queue), time.perf_counter() * 1000, oldest_ms,
                    max_batch_size=self.max_batch_size, max_queue_delay_ms=self.max_queue_delay_ms,
                    preferred_batch_sizes=(self.max_batch_size,),
                )  # fmt: skip
                if size:
                    batch, self.queue = self.queue[:size], self.queue[size:]
                    results = await asyncio.to_thread(self.score_batch, [item for _, item, _ in batch])
                    for (_, _, future), result in zip(batch, results, strict=True):
                        future.set_result(result)
                    self.batch_sizes.append(size)
                    continue
                timeout_s = max(oldest_ms + self.max_queue_delay_ms - time.perf_counter() * 1000, 0) / 1000
            self.arrived.clear()  # sleep until a request arrives or the oldest one's delay runs out
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), timeout_s)
