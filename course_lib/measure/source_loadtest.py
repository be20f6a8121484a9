"""Source lesson 004's load-test script, rerun as written and checked against the course's functions.

The script ("Load Testing and Capacity Planning Checklist") has two defects:

* its percentile is ``sorted(latencies)[int(0.99 * n)]``, a 0-based index, i.e. 1-based rank
  int(0.99 n) + 1: one rank above nearest rank whenever 0.99 n is a whole number (n = 100, 200, ...),
  and past the end of the list for q = 100;
* its ``concurrent`` parameter is printed but never used: it builds every request's coroutine and
  ``asyncio.gather``-s them all, so all ``num_requests`` are in flight at once whatever ``concurrent``
  says. A semaphore of size ``concurrent`` is what bounds concurrency.

Both are reproduced here (``source_percentile``, ``source_load_test``) so the lesson can compare them with
``course_lib.core.percentiles.percentile`` and a bounded run.

References
----------
Source lesson 004, "Serving Models at Scale", section "Load Testing and Capacity Planning Checklist".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from course_lib.core.checks import integer
from course_lib.core.percentiles import percentile

__all__ = ["source_load_test", "source_percentile"]


def source_percentile(latencies: Sequence[float], q: float) -> float:
    """The source's percentile: ``sorted(latencies)[int(q / 100 * len(latencies))]``.

    Raises
    ------
    IndexError
        As the source does when the index falls past the end (q = 100).
    """
    return sorted(latencies)[int(q / 100 * len(latencies))]


async def source_load_test(
    send: Callable[[int], Awaitable[Any]], *, num_requests: int, concurrent: int, bounded: bool = False
) -> dict[str, Any]:
    """Run the source's load test (``bounded=False``) or the same with a semaphore of ``concurrent``.

    Returns
    -------
    dict with ``num_requests``, ``concurrent`` (as asked), ``max_in_flight`` (as measured),
    ``latencies_ms`` (list), ``source_p99_ms`` (the source's rule), ``nearest_rank_p99_ms`` (the course's)
    and ``errors``.
    """
    concurrent = integer("concurrent", concurrent, min=1)
    in_flight = peak = errors = 0
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrent if bounded else num_requests)

    async def make_request(i: int) -> bool:
        nonlocal in_flight, peak, errors
        async with gate:
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                start = time.perf_counter()
                await send(i)
                latencies.append(1000.0 * (time.perf_counter() - start))
                return True
            except Exception:
                errors += 1
                return False
            finally:
                in_flight -= 1

    await asyncio.gather(*(make_request(i) for i in range(num_requests)))
    return {
        "num_requests": num_requests,
        "concurrent": concurrent,
        "max_in_flight": peak,
        "latencies_ms": latencies,
        "source_p99_ms": source_percentile(latencies, 99) if latencies else float("nan"),
        "nearest_rank_p99_ms": percentile(latencies, 99) if latencies else float("nan"),
        "errors": errors,
    }
