"""The asyncio dynamic batcher with a fake scorer that records every batch it is given."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.core.waiting import async_wait_until
from course_lib.serving.batching.batcher import (
    BatchedResult,
    BatcherClosedError,
    BatchScoringError,
    DynamicBatcher,
    QueueFullError,
)
from course_lib.simulate.batching import simulate_dynamic_batching


class RecordingScorer:
    """Multiplies by 10 and records each batch; optionally blocks the first call until released."""

    def __init__(self, block_first: bool = False):
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        if not block_first:
            self.gate.set()

    def __call__(self, items):
        self.batches.append(list(items))
        if len(self.batches) == 1:
            self.gate.wait(10)
        return [10 * x for x in items]


def run(coro, timeout_s: float = 10.0):
    """Run a test coroutine with a hard timeout, so a hang fails instead of blocking the suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


WINDOW_MS = 1000.0


def test_a_burst_of_20_forms_batches_of_8_8_4_like_the_simulator():
    scorer = RecordingScorer()

    # All 20 are queued before the worker first runs (asyncio runs the submits in order). The window is
    # long so that the two full batches finish far inside it even on a loaded runner, and the remaining
    # 4 leave on the timer as in the simulator; a 30 ms window could run out during a scheduler stall
    # while an instance was busy, which the batcher rightly reports as "instance_free".
    async def main():
        async with DynamicBatcher(
            scorer, max_batch_size=8, max_queue_delay_ms=WINDOW_MS, run_in_thread=False
        ) as b:
            return await asyncio.gather(*(b.submit(i) for i in range(20)))

    results = run(main())
    assert [len(batch) for batch in scorer.batches] == [8, 8, 4]
    assert [r.value for r in results] == [10 * i for i in range(20)]
    assert [r.batch_size for r in results] == [8] * 16 + [4] * 4
    assert [r.trigger for r in results[::8]] == ["max_batch_size", "max_batch_size", "max_queue_delay"]
    simulated = simulate_dynamic_batching(
        [0.0] * 20, max_batch_size=8, max_queue_delay_ms=WINDOW_MS, service_time_ms=0.0
    )
    assert simulated.batches["size"].tolist() == [len(batch) for batch in scorer.batches]
    assert simulated.batches["trigger"].tolist() == [r.trigger for r in results[::8]]


def test_each_result_carries_its_queue_wait_service_time_and_batch():
    scorer = RecordingScorer()

    async def main():
        async with DynamicBatcher(scorer, max_batch_size=4, max_queue_delay_ms=5.0) as b:
            return await asyncio.gather(*(b.submit(i) for i in range(4)))

    results = run(main())
    assert all(isinstance(r, BatchedResult) for r in results)
    assert {r.batch_id for r in results} == {0}
    assert all(r.queue_wait_ms >= 0 and r.service_ms >= 0 for r in results)
    assert all(r.batch_size == r.batch_requests == 4 and not r.deduplicated for r in results)


def test_with_no_delay_requests_arriving_while_the_model_is_busy_are_batched_when_it_frees():
    scorer = RecordingScorer(block_first=True)

    async def main():
        async with DynamicBatcher(scorer, max_batch_size=8, max_queue_delay_ms=0.0) as b:
            first = asyncio.create_task(b.submit(0))
            await async_wait_until(lambda: len(scorer.batches) == 1)
            rest = [asyncio.create_task(b.submit(i)) for i in range(1, 6)]
            await async_wait_until(lambda: b.queue_len == 5)
            scorer.gate.set()
            return await first, await asyncio.gather(*rest)

    first, rest = run(main())
    assert scorer.batches == [[0], [1, 2, 3, 4, 5]]
    assert first.trigger == "max_queue_delay"  # a lone request on an idle model: waited 0 ms = the limit
    assert {r.trigger for r in rest} == {"instance_free"}
    assert {r.batch_size for r in rest} == {5}


def test_a_lone_request_is_sent_by_the_timer_without_a_full_batch():
    scorer = RecordingScorer()

    async def main():
        async with DynamicBatcher(scorer, max_batch_size=64, max_queue_delay_ms=5.0) as b:
            return await b.submit(7)

    result = run(main())
    assert (result.value, result.batch_size, result.trigger) == (70, 1, "max_queue_delay")


def test_a_preferred_size_leaves_at_once_and_the_rest_waits_for_the_timer():
    scorer = RecordingScorer()

    async def main():
        async with DynamicBatcher(
            scorer, max_batch_size=8, max_queue_delay_ms=20.0, preferred_batch_sizes=[4], run_in_thread=False
        ) as b:
            return await asyncio.gather(*(b.submit(i) for i in range(6)))

    results = run(main())
    assert scorer.batches == [[0, 1, 2, 3], [4, 5]]
    assert [results[0].trigger, results[5].trigger] == ["preferred_batch_size", "max_queue_delay"]


def test_a_full_queue_rejects_at_once_and_every_accepted_request_is_still_answered():
    scorer = RecordingScorer(block_first=True)

    async def main():
        async with DynamicBatcher(scorer, max_batch_size=8, max_queue_delay_ms=0.0, max_queue_size=3) as b:
            in_flight = asyncio.create_task(b.submit(0))
            await async_wait_until(lambda: len(scorer.batches) == 1)
            queued = [asyncio.create_task(b.submit(i)) for i in (1, 2, 3)]
            await async_wait_until(lambda: b.queue_len == 3)
            with pytest.raises(QueueFullError, match=r"queue full: 3 requests waiting \(max_queue_size=3\)"):
                await b.submit(4)
            scorer.gate.set()
            results = [await in_flight, *await asyncio.gather(*queued)]
            return results, b.stats

    results, stats = run(main())
    assert [r.value for r in results] == [0, 10, 20, 30]
    assert stats.rejected_queue_full == 1
    assert stats.submitted == 5
    assert stats.completed == 4


def test_identical_queued_requests_are_scored_once_and_answered_to_all():
    scorer = RecordingScorer()

    async def main():
        async with DynamicBatcher(
            scorer, max_batch_size=8, max_queue_delay_ms=10.0, dedup_key=lambda x: x, run_in_thread=False
        ) as b:
            results = await asyncio.gather(*(b.submit(x) for x in [1, 1, 2, 1, 3]))
            return results, b.stats

    results, stats = run(main())
    assert scorer.batches == [[1, 2, 3]]
    assert [r.value for r in results] == [10, 10, 20, 10, 30]
    assert [r.deduplicated for r in results] == [False, True, False, True, False]
    assert {(r.batch_size, r.batch_requests) for r in results} == {(3, 5)}
    assert stats.deduplicated == 2
    assert stats.items_scored == 3
    assert stats.completed == 5


def test_without_a_dedup_key_identical_requests_are_scored_separately():
    scorer = RecordingScorer()

    async def main():
        async with DynamicBatcher(scorer, max_batch_size=8, max_queue_delay_ms=5.0, run_in_thread=False) as b:
            return await asyncio.gather(*(b.submit(1) for _ in range(3)))

    run(main())
    assert scorer.batches == [[1, 1, 1]]


def test_a_failing_model_call_fails_its_callers_and_the_batcher_keeps_serving():
    calls = []

    def flaky(items):
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("model crashed")
        return [x + 1 for x in items]

    async def main():
        async with DynamicBatcher(flaky, max_batch_size=2, max_queue_delay_ms=1.0) as b:
            failed = await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)
            ok = await b.submit(3)
            return failed, ok, b.stats

    failed, ok, stats = run(main())
    assert all(isinstance(e, BatchScoringError) for e in failed)
    assert isinstance(failed[0].__cause__, RuntimeError)
    assert "model crashed" in str(failed[0])
    assert ok.value == 4
    assert (stats.failed, stats.completed) == (2, 1)


def test_a_score_function_returning_the_wrong_number_of_results_is_an_error():
    async def main():
        async with DynamicBatcher(lambda xs: [0], max_batch_size=4, max_queue_delay_ms=2.0) as b:
            return await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)

    errors = run(main())
    assert all(isinstance(e, BatchScoringError) for e in errors)
    assert "returned 1 results for 2 items" in str(errors[0])


def test_stop_fails_queued_and_hung_requests_instead_of_hanging():
    scorer = RecordingScorer(block_first=True)

    async def main():
        b = await DynamicBatcher(scorer, max_batch_size=8, max_queue_delay_ms=0.0).start()
        hung = asyncio.create_task(b.submit(0))
        await async_wait_until(lambda: len(scorer.batches) == 1)
        queued = [asyncio.create_task(b.submit(i)) for i in (1, 2)]
        await async_wait_until(lambda: b.queue_len == 2)
        await b.stop(timeout_s=0.2)
        outcomes = await asyncio.gather(hung, *queued, return_exceptions=True)
        with pytest.raises(BatcherClosedError, match="stopped"):
            await b.submit(9)
        return outcomes, b.stats

    try:
        outcomes, stats = run(main())
    finally:
        scorer.gate.set()  # let the fake model's thread finish
    assert all(isinstance(o, BatcherClosedError) for o in outcomes)
    assert stats.closed_before_scoring == 3


def test_stop_with_drain_scores_what_is_queued():
    scorer = RecordingScorer()

    async def main():
        b = await DynamicBatcher(scorer, max_batch_size=8, max_queue_delay_ms=1000.0).start()
        tasks = [asyncio.create_task(b.submit(i)) for i in range(3)]
        await async_wait_until(lambda: b.queue_len == 3)
        await b.stop(drain=True)
        return await asyncio.gather(*tasks)

    results = run(main())
    assert [r.value for r in results] == [0, 10, 20]
    assert {r.trigger for r in results} == {"shutdown_drain"}


def test_submit_before_start_is_refused():
    async def main():
        await DynamicBatcher(lambda xs: xs, max_batch_size=1, max_queue_delay_ms=0.0).submit(1)

    with pytest.raises(BatcherClosedError, match="call start\\(\\) first"):
        run(main())


def test_a_caller_that_gives_up_does_not_disturb_the_others():
    scorer = RecordingScorer()

    async def main():
        async with DynamicBatcher(scorer, max_batch_size=8, max_queue_delay_ms=200.0) as b:
            impatient = asyncio.create_task(b.submit(1))
            patient = asyncio.create_task(b.submit(2))
            await async_wait_until(lambda: b.queue_len == 2, what="both requests queued")
            impatient.cancel()
            result = await patient
            return result, b.stats

    result, stats = run(main())
    assert result.value == 20
    assert stats.cancelled_by_caller == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be an integer >= 1, got 0"),
        ({"max_queue_delay_ms": -2.0}, ValueError, "max_queue_delay_ms must be a finite number >= 0"),
        ({"max_queue_size": 0}, ValueError, "max_queue_size must be an integer >= 1, got 0"),
        ({"instances": 0}, ValueError, "instances must be an integer >= 1, got 0"),
        (
            {"preferred_batch_sizes": [9]},
            ValueError,
            r"preferred_batch_sizes\[0\] must be an integer >= 1 and <= 8, got 9",
        ),
        ({"dedup_key": "customer_id"}, TypeError, "dedup_key must be callable"),
    ],
)
def test_bad_parameters_are_rejected_up_front(kwargs, error, message):
    params = {"max_batch_size": 8, "max_queue_delay_ms": 1.0, **kwargs}
    with pytest.raises(error, match=message):
        DynamicBatcher(lambda xs: xs, **params)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 40),
    max_batch_size=st.integers(1, 9),
    delay=st.sampled_from([0.0, 0.5, 2.0]),
    instances=st.integers(1, 2),
    keys=st.lists(st.integers(0, 5), min_size=40, max_size=40),
)
def test_every_request_is_answered_once_with_its_own_value(n, max_batch_size, delay, instances, keys):
    items = keys[:n]
    batches: list[list[int]] = []

    def score(xs):
        batches.append(list(xs))
        return [x * 3 for x in xs]

    async def main():
        async with DynamicBatcher(
            score,
            max_batch_size=max_batch_size,
            max_queue_delay_ms=delay,
            instances=instances,
            dedup_key=lambda x: x,
        ) as b:
            results = await asyncio.gather(*(b.submit(x) for x in items))
            return results, b.stats

    results, stats = run(main())
    assert [r.value for r in results] == [3 * x for x in items]
    assert all(len(batch) <= max_batch_size for batch in batches)
    assert sum(len(batch) for batch in batches) + stats.deduplicated == n
    assert stats.completed == stats.submitted == n


# -- cancellation at every point of a request's life (issue 10, item 4; ray-project/ray#50046) -----
def test_three_cancelled_callers_free_their_slots_at_once_and_never_reach_the_model():
    """The vector: max_queue_size=3, 50 ms delay, three callers cancel, then a new submit."""
    scorer = RecordingScorer()

    async def main():
        async with DynamicBatcher(scorer, max_batch_size=8, max_queue_delay_ms=50.0, max_queue_size=3) as b:
            gone = [asyncio.create_task(b.submit(i)) for i in (1, 2, 3)]
            await async_wait_until(lambda: b.queue_len == 3)
            for task in gone:
                task.cancel()
            await asyncio.gather(*gone, return_exceptions=True)
            assert b.queue_len == 0  # freed at once, not when the timer fires
            fresh = await b.submit(4)  # accepted (was QueueFullError) and scored
            return fresh, b.stats

    fresh, stats = run(main())
    assert fresh.value == 40 and fresh.batch_size == 1
    assert scorer.batches == [[4]]  # the three cancelled rows never reached the model
    assert (stats.cancelled_by_caller, stats.completed, stats.rejected_queue_full) == (3, 1, 0)


def test_a_cancelled_duplicate_leaves_the_shared_row_to_the_others():
    scorer = RecordingScorer()

    async def main():
        async with DynamicBatcher(
            scorer, max_batch_size=8, max_queue_delay_ms=30.0, dedup_key=lambda x: x, run_in_thread=False
        ) as b:
            first = asyncio.create_task(b.submit(7))
            joiner = asyncio.create_task(b.submit(7))
            await async_wait_until(lambda: b.queue_len == 2)
            first.cancel()  # the entry's first waiter leaves; the row stays for the joiner
            result = await joiner
            return result, b.stats

    result, stats = run(main())
    assert result.value == 70 and scorer.batches == [[7]]
    assert (stats.cancelled_by_caller, stats.completed, stats.deduplicated) == (1, 1, 1)


def test_a_caller_cancelled_while_its_batch_runs_is_counted_once_when_the_batch_ends():
    scorer = RecordingScorer(block_first=True)

    async def main():
        async with DynamicBatcher(scorer, max_batch_size=8, max_queue_delay_ms=0.0) as b:
            inside = asyncio.create_task(b.submit(1))
            await async_wait_until(lambda: len(scorer.batches) == 1)  # in the model call now
            inside.cancel()
            await asyncio.gather(inside, return_exceptions=True)
            scorer.gate.set()
            after = await b.submit(2)
            return after, b.stats

    after, stats = run(main())
    assert after.value == 20
    assert (stats.cancelled_by_caller, stats.completed) == (1, 1)
    assert stats.submitted == stats.completed + stats.cancelled_by_caller


def test_a_caller_cancelled_during_shutdown_is_counted_once():
    scorer = RecordingScorer()

    async def main():
        b = DynamicBatcher(scorer, max_batch_size=8, max_queue_delay_ms=5_000.0)
        await b.start()
        waiting = [asyncio.create_task(b.submit(i)) for i in range(3)]
        await async_wait_until(lambda: b.queue_len == 3)
        waiting[0].cancel()
        await asyncio.gather(waiting[0], return_exceptions=True)
        await b.stop()
        outcomes = await asyncio.gather(*waiting[1:], return_exceptions=True)
        return outcomes, b.stats

    outcomes, stats = run(main())
    assert all(isinstance(o, BatcherClosedError) for o in outcomes)
    assert (stats.cancelled_by_caller, stats.closed_before_scoring) == (1, 2)
    assert scorer.batches == []


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 24),
    cancel=st.lists(st.booleans(), min_size=24, max_size=24),
    keys=st.lists(st.integers(0, 4), min_size=24, max_size=24),
)
def test_cancelled_requests_never_reach_the_model_and_every_request_is_counted_once(n, cancel, keys):
    items, scored = keys[:n], []

    def score(xs):
        scored.extend(xs)
        return [x * 3 for x in xs]

    async def main():
        async with DynamicBatcher(
            score, max_batch_size=8, max_queue_delay_ms=5_000.0, dedup_key=lambda x: x, run_in_thread=False
        ) as b:
            tasks = [asyncio.create_task(b.submit(x)) for x in items]
            await async_wait_until(lambda: b.queue_len == n)
            dropped = [task for task, drop in zip(tasks, cancel, strict=False) if drop]
            for task in dropped:
                task.cancel()
            await asyncio.gather(*dropped, return_exceptions=True)  # each cancellation has run
            kept = [x for x, drop in zip(items, cancel, strict=False) if not drop]
            assert b.queue_len == len(kept)  # slots freed at once
            await b.stop(drain=True)  # score what is left without waiting for the 5 s timer
            results = await asyncio.gather(*tasks, return_exceptions=True)
            return kept, results, b.stats

    kept, results, stats = run(main())
    assert sorted(scored) == sorted(set(kept))  # cancelled-only rows never reached the model
    answered = [r.value for r in results if isinstance(r, BatchedResult)]
    assert answered == [3 * x for x in kept]
    assert stats.cancelled_by_caller == n - len(kept)
    assert stats.submitted == stats.completed + stats.cancelled_by_caller


def test_numpy_integers_are_accepted_as_the_simulator_accepts_them():
    """The batcher and the simulator read their knobs with one rule (core.checks.integer)."""
    knobs = {
        "max_batch_size": np.int64(8),
        "max_queue_delay_ms": np.float32(1.0),
        "preferred_batch_sizes": (np.int32(4),),
        "instances": np.int64(2),
    }
    batcher = DynamicBatcher(lambda xs: xs, max_queue_size=np.int64(16), **knobs)
    assert (batcher.max_batch_size, batcher.preferred_batch_sizes, batcher.instances) == (8, (4,), 2)
    assert type(batcher.max_batch_size) is int and type(batcher.max_queue_size) is int
    simulated = simulate_dynamic_batching([0.0, 0.5], service_time_ms=1.0, **knobs)
    assert len(simulated.requests) == 2 and simulated.params["max_batch_size"] == 8
