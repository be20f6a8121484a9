"""The batcher's request queue on its own: FIFO, duplicates join by key, withdrawal, fail-all, counters."""

from __future__ import annotations

import asyncio

import pytest

from course_lib.serving.batching._queue import RequestQueue
from course_lib.serving.batching._results import BatcherClosedError, BatcherStats


def _run(coro):
    return asyncio.run(coro)


def test_entries_leave_oldest_first_and_duplicates_share_one_row():
    async def scenario():
        loop = asyncio.get_running_loop()
        stats = BatcherStats()
        queue = RequestQueue(stats)
        futures = [loop.create_future() for _ in range(4)]
        a = queue.add("a", "k1", futures[0], 10)
        b = queue.add("b", "k2", futures[1], 20)
        joined = queue.add("a again", "k1", futures[2], 30)
        c = queue.add("c", None, futures[3], 40)  # no key: never joins
        assert joined is a and a.waiters == [(futures[0], 10), (futures[2], 30)]
        assert (len(queue), queue.waiting, stats.deduplicated) == (3, 4, 1)
        assert queue.oldest_arrival_ns == 10
        assert queue.take(2) == [a, b]
        assert (len(queue), queue.waiting, queue.oldest_arrival_ns) == (1, 1, 40)
        later = queue.add("a", "k1", loop.create_future(), 50)  # k1 was taken: a new entry
        assert later is not a and queue.take(2) == [c, later] and queue.waiting == 0

    _run(scenario())


def test_a_withdrawn_caller_frees_its_slot_and_an_empty_entry_leaves():
    async def scenario():
        loop = asyncio.get_running_loop()
        stats = BatcherStats()
        queue = RequestQueue(stats)
        first, second, third = (loop.create_future() for _ in range(3))
        shared = queue.add("x", "k", first, 1)
        queue.add("x", "k", second, 2)
        alone = queue.add("y", "j", third, 3)
        assert queue.withdraw(shared, first) is True
        assert (len(queue), queue.waiting, stats.cancelled_by_caller) == (2, 2, 1)
        assert queue.withdraw(shared, second) is True  # last waiter: the entry leaves the queue
        assert (len(queue), queue.waiting, queue.oldest_arrival_ns) == (1, 1, 3)
        assert queue.withdraw(shared, second) is False  # not queued any more: nothing counted twice
        assert queue.take(1) == [alone]
        assert queue.withdraw(alone, third) is False  # taken for a batch: counted when it resolves
        assert stats.cancelled_by_caller == 2

    _run(scenario())


def test_fail_all_answers_every_waiting_caller_once_and_empties_the_queue():
    async def scenario():
        loop = asyncio.get_running_loop()
        stats = BatcherStats()
        queue = RequestQueue(stats)
        waiting, duplicate, gone = (loop.create_future() for _ in range(3))
        queue.add("x", "k", waiting, 1)
        queue.add("x", "k", duplicate, 2)
        queue.add("y", None, gone, 3)
        gone.cancel()
        queue.fail_all(BatcherClosedError("stopping"))
        assert (len(queue), queue.waiting) == (0, 0)
        for future in (waiting, duplicate):
            with pytest.raises(BatcherClosedError, match="stopping"):
                future.result()
        assert (stats.closed_before_scoring, stats.cancelled_by_caller) == (2, 1)
        with pytest.raises(IndexError):
            _ = queue.oldest_arrival_ns

    _run(scenario())
