"""The core batcher (Lesson 3 reads it) and the hardened DynamicBatcher form the same batches.

Each vector is a list of bursts: the requests of a burst are submitted together and the next burst
starts once they are all answered. Both batchers score with the same fake model (10 x item) and must
give the same batch sizes, the same answers, and the simulator's batch sizes for the same bursts.
"""

from __future__ import annotations

import asyncio

import pytest

from course_lib.serving.batching.batcher import DynamicBatcher
from course_lib.serving.batching.core import CoreBatcher
from course_lib.simulate.batching import simulate_dynamic_batching

VECTORS = [
    # (bursts, max_batch_size, max_queue_delay_ms, expected batch sizes)
    ([5], 2, 5.0, [2, 2, 1]),  # Lesson 3's example
    ([20], 8, 3.0, [8, 8, 4]),
    ([3], 8, 0.0, [3]),
    ([3, 2], 4, 1.0, [3, 2]),
    ([1, 1, 1], 2, 0.0, [1, 1, 1]),
    ([7, 4], 3, 2.0, [3, 3, 1, 3, 1]),
]


class Recording:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, items: list[int]) -> list[int]:
        self.sizes.append(len(items))
        return [10 * x for x in items]


async def feed_core(bursts, max_batch_size, delay_ms):
    model = Recording()
    batcher = CoreBatcher(model, max_batch_size=max_batch_size, max_queue_delay_ms=delay_ms)
    worker = asyncio.create_task(batcher.run())
    answers, start = [], 0
    for n in bursts:
        answers += await asyncio.gather(*(batcher.submit(x) for x in range(start, start + n)))
        start += n
    worker.cancel()
    assert batcher.batch_sizes == model.sizes
    return answers, model.sizes


async def feed_hardened(bursts, max_batch_size, delay_ms):
    model = Recording()
    answers, start = [], 0
    async with DynamicBatcher(model, max_batch_size=max_batch_size, max_queue_delay_ms=delay_ms) as batcher:
        for n in bursts:
            results = await asyncio.gather(*(batcher.submit(x) for x in range(start, start + n)))
            answers += [r.value for r in results]
            start += n
    return answers, model.sizes


@pytest.mark.parametrize(("bursts", "max_batch_size", "delay_ms", "expected"), VECTORS)
def test_core_and_hardened_form_the_same_batches(bursts, max_batch_size, delay_ms, expected):
    core = asyncio.run(asyncio.wait_for(feed_core(bursts, max_batch_size, delay_ms), 10))
    hardened = asyncio.run(asyncio.wait_for(feed_hardened(bursts, max_batch_size, delay_ms), 10))
    assert core == hardened
    assert core[1] == expected
    assert core[0] == [10 * x for x in range(sum(bursts))]


@pytest.mark.parametrize(("bursts", "max_batch_size", "delay_ms", "expected"), VECTORS)
def test_the_simulator_forms_them_too(bursts, max_batch_size, delay_ms, expected):
    arrivals = [1000.0 * k for k, n in enumerate(bursts) for _ in range(n)]  # bursts far apart
    run = simulate_dynamic_batching(
        arrivals, max_batch_size=max_batch_size, max_queue_delay_ms=delay_ms, service_time_ms=0.0
    )
    assert run.batches["size"].tolist() == expected


def test_core_checks_its_knobs():
    with pytest.raises(ValueError):
        CoreBatcher(lambda xs: xs, max_batch_size=0, max_queue_delay_ms=1.0)
    with pytest.raises(TypeError):
        CoreBatcher(3, max_batch_size=2, max_queue_delay_ms=1.0)  # type: ignore[arg-type]
