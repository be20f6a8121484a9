"""Closed-loop clients and coordinated omission: why "send, wait, send again" hides a stalled service.

A closed-loop user sends a request, waits for the answer, then sends the next one. When the service
freezes, the user freezes with it: it sends nothing while it waits, so the freeze shows up as one slow
sample, not as the thousands of requests real users would have sent (and waited on) meanwhile. The
client has "coordinated" with the service and omitted exactly the bad samples (Gil Tene's term).

Two cures, both here:

* measure open loop: requests leave on their schedule, latency counts from the intended send time
  (``course_lib.measure.loadgen.run_open_loop``);
* correct a closed-loop record afterwards, as HdrHistogram's ``recordValueWithExpectedInterval`` does:
  a sample of v ms from a client that meant to send every ``interval`` ms stands for the requests it
  should have sent meanwhile, which would have waited v - interval, v - 2 interval, ... ms.

``stall_vector`` is the textbook case in exact arithmetic (no clock): one user sending every 1 ms for
10 s while the service freezes for 5 s in the middle.

References
----------
Gil Tene, "How NOT to measure latency" (talk, 2015) and HdrHistogram's
``AbstractHistogram.recordValueWithExpectedInterval`` (Java) / ``record_corrected_value`` (Python hdrh).
Schroeder, Wierman and Harchol-Balter (2006), "Open versus closed: a cautionary tale", NSDI.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pandas as pd

from course_lib.core.checks import integer, positive_number
from course_lib.core.percentiles import percentiles
from course_lib.measure.loadgen import LoadResult, outcome_of

__all__ = [
    "SerialTarget",
    "StallingTarget",
    "corrected_latencies",
    "run_closed_loop",
    "stall_vector",
]


def corrected_latencies(latencies_ms: np.ndarray, expected_interval_ms: float) -> np.ndarray:
    """Add back the samples a closed-loop client omitted (HdrHistogram's expected-interval correction).

    Each sample v > ``expected_interval_ms`` is followed by v - i, v - 2i, ... while the value is still
    >= i (i = ``expected_interval_ms``); samples <= i are kept as they are.

    Parameters
    ----------
    latencies_ms : 1-D array of float, shape (n,), >= 0
    expected_interval_ms : float > 0
        How often the client meant to send.

    Returns
    -------
    ndarray of float, shape (n + added,): the samples, each followed by the ones it stands for.

    Raises
    ------
    ValueError
        For a non-positive interval, or negative or NaN latencies.
    """
    interval = positive_number("expected_interval_ms", expected_interval_ms)
    lat = np.asarray(latencies_ms, dtype=float).ravel()
    if np.isnan(lat).any() or (lat < 0).any():
        raise ValueError("latencies_ms must be >= 0 and not NaN (drop failed requests first)")
    parts = []
    for v in lat:
        extra = np.arange(v - interval, interval - 1e-9, -interval) if v > interval else np.empty(0)
        parts.append(np.concatenate(([v], extra)))
    return np.concatenate(parts) if parts else lat


def stall_vector(
    *,
    interval_ms: float = 1.0,
    duration_ms: float = 10_000.0,
    stall_start_ms: float = 2_500.0,
    stall_ms: float = 5_000.0,
    service_ms: float = 1.0,
    qs: tuple[float, ...] = (50, 75, 90, 99),
) -> pd.DataFrame:
    """The coordinated-omission vector, computed exactly with a fake target (no clock, no threads).

    The target answers in ``service_ms``, except that a request arriving during the stall
    [``stall_start_ms``, ``stall_start_ms + stall_ms``) is answered ``service_ms`` after the stall ends
    (it serves every waiting request at once when it wakes, so no backlog follows). One closed-loop
    user sends, waits, and sends again ``interval_ms`` after its previous send (or at once, if the
    answer came later); an open-loop schedule sends every ``interval_ms`` regardless.

    Returns
    -------
    DataFrame indexed by ``closed loop``, ``closed loop, corrected`` (``corrected_latencies``) and
    ``open loop (intended send time)``, with ``requests`` and the nearest-rank percentiles ``qs`` (ms).
    """
    for name, value in (
        ("interval_ms", interval_ms),
        ("duration_ms", duration_ms),
        ("service_ms", service_ms),
    ):
        positive_number(name, value)
    stall_end = stall_start_ms + stall_ms

    def answer_at(t: float) -> float:
        return (stall_end if stall_start_ms <= t < stall_end else t) + service_ms

    closed, t = [], 0.0
    while t < duration_ms:
        done = answer_at(t)
        closed.append(done - t)
        t = max(t + interval_ms, done)
    intended = np.arange(0.0, duration_ms, interval_ms)
    open_loop = np.array([answer_at(x) - x for x in intended])
    runs = {
        "closed loop": np.array(closed),
        "closed loop, corrected": corrected_latencies(np.array(closed), interval_ms),
        "open loop (intended send time)": open_loop,
    }
    rows = {name: {"requests": len(lat), **percentiles(lat, qs)} for name, lat in runs.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


class StallingTarget:
    """A fake in-process service that answers after ``service_ms`` but freezes for one stall.

    Call ``start()`` at the start of a run; requests that arrive during
    [``stall_start_s``, ``stall_start_s + stall_s``) after it wait for the stall to end. Any number of
    requests are served in parallel (no queue), so only the stall delays anyone.
    """

    def __init__(self, *, service_ms: float = 1.0, stall_start_s: float, stall_s: float):
        self.service_s = positive_number("service_ms", service_ms) / 1000.0
        self.stall_start_s = float(stall_start_s)
        self.stall_s = positive_number("stall_s", stall_s)
        self.t0 = time.perf_counter()
        self.calls = 0

    def start(self) -> None:
        """Set time zero (the stall is placed relative to it)."""
        self.t0 = time.perf_counter()

    async def __call__(self, i: int) -> dict[str, Any]:
        self.calls += 1
        now = time.perf_counter() - self.t0
        end = self.stall_start_s + self.stall_s
        if self.stall_start_s <= now < end:
            await asyncio.sleep(end - now)
        await asyncio.sleep(self.service_s)
        return {}


class SerialTarget:
    """A fake in-process service that serves one request at a time, each for ``service_ms``.

    Requests queue for it in arrival order (an ``asyncio.Lock``), like a server whose model call blocks
    its event loop: at a rate above ``1000 / service_ms`` requests/s the queue, and each latency from the
    intended send time, grows by the difference. Used by Lesson 6 to check the open-loop loop by hand.
    """

    def __init__(self, *, service_ms: float):
        self.service_s = positive_number("service_ms", service_ms) / 1000.0
        self._lock: asyncio.Lock | None = None

    async def __call__(self, i: int) -> dict[str, Any]:
        if self._lock is None:  # made on first use, inside the running loop
            self._lock = asyncio.Lock()
        async with self._lock:
            await asyncio.sleep(self.service_s)
        return {}


async def run_closed_loop(
    send: Callable[[int], Awaitable[Any]],
    *,
    users: int,
    duration_s: float,
    interval_ms: float = 0.0,
    request_timeout_s: float = 5.0,
) -> LoadResult:
    """``users`` closed-loop users for ``duration_s``: each sends, waits for the answer, sends again.

    A user's next request leaves ``interval_ms`` after its previous send, or at once if the answer
    came later (Locust's ``constant_pacing``); ``interval_ms=0`` sends the next as soon as the answer
    arrives. At most ``users`` requests are ever in flight. Latency counts from the actual send, as
    closed-loop tools do, so the result's ``lag_ms`` is 0: the schedule bends to the service.

    Returns
    -------
    LoadResult
        ``requests`` has the columns of ``run_open_loop`` plus ``user``; ``rate_rps`` is the
        nominal users x 1000 / interval_ms (NaN for interval 0).

    Raises
    ------
    ValueError
        For ``users`` < 1, or a duration or timeout that is not > 0, or a negative interval.
    """
    users = integer("users", users, min=1)
    duration = positive_number("duration_s", duration_s)
    timeout = positive_number("request_timeout_s", request_timeout_s)
    interval_ms = positive_number("interval_ms", interval_ms, allow_zero=True)
    clock = time.perf_counter
    start = clock()
    rows: list[dict[str, Any]] = []
    counter = iter(range(10**12))

    async def user(u: int) -> None:
        while (sent := clock()) - start < duration:
            i = next(counter)
            row: dict[str, Any] = {"request_id": i, "user": u, "scheduled_ms": 1000.0 * (sent - start)}
            row["lag_ms"] = 0.0
            try:
                async with asyncio.timeout(timeout):
                    await send(i)
            except Exception as exc:
                kind = outcome_of(exc)
                row.update(ok=False, outcome=kind, error=f"{type(exc).__name__}: {exc}", latency_ms=math.nan)
            else:
                row.update(ok=True, outcome="ok", error="", latency_ms=1000.0 * (clock() - sent))
            rows.append(row)
            wait = sent + interval_ms / 1000.0 - clock()
            if wait > 0:
                await asyncio.sleep(wait)

    await asyncio.gather(*(user(u) for u in range(users)))
    frame = pd.DataFrame(rows).sort_values("request_id").reset_index(drop=True)
    nominal = users * 1000.0 / interval_ms if interval_ms > 0 else math.nan
    return LoadResult(requests=frame, rate_rps=nominal, planned=len(frame), wall_s=clock() - start)
