"""An open-loop Poisson load generator, bounded in request count and in time.

Open loop means requests are sent on a fixed schedule (Poisson arrivals at the offered rate), whether
or not earlier ones have been answered, as independent users do. A closed-loop client (send, wait,
send) slows down when the server slows down and so hides queueing; an open-loop one exposes it.
Latency is measured from each request's *scheduled* send time, so if the generator itself falls
behind, that lag counts against the latency instead of silently vanishing ("coordinated omission").

The target is any coroutine function ``send(i)``: an HTTP POST or an in-process call such as
``DynamicBatcher.submit`` (ready-made ones in ``course_lib.measure.targets``). Ladders of rates built
on this generator live in ``course_lib.measure.ladder``.

One concept, one module: the open-loop send loop. Its short core (:func:`open_loop_core`, read in Lesson 6),
the hardened generator built the same way (:func:`run_open_loop`) and the run record they produce belong
together.

References
----------
Schroeder, Wierman and Harchol-Balter (2006), "Open versus closed: a cautionary tale", NSDI.
Gil Tene, "How NOT to measure latency" (coordinated omission).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from course_lib.core.checks import integer, number, positive_number
from course_lib.core.percentiles import percentiles, samples_needed
from course_lib.core.vocabulary import CLIENT_OUTCOMES
from course_lib.serving.service import HttpStatusError
from course_lib.simulate.traffic import poisson_arrivals_ms

__all__ = [
    "MIN_REQUESTS_P99",
    "SEND_LAG_BOUND_MS",
    "SERVED_FIELDS",
    "SPIN_WINDOW_S",
    "LoadResult",
    "Send",
    "open_loop_core",
    "outcome_of",
    "run_open_loop",
    "rung_duration_s",
    "wait_until",
]

Send = Callable[[int], Awaitable[Mapping[str, Any] | None]]
#: What the batcher (and the batching server) report about how each request was served.
SERVED_FIELDS: tuple[str, ...] = ("queue_wait_ms", "service_ms", "batch_size")
#: Requests a run needs to judge a p99: 10 / (1 - 0.99) = 1,000 (``course_lib.core.percentiles.samples_needed``).
MIN_REQUESTS_P99 = samples_needed(99)
#: Send lag (actual - scheduled send time) p99 above this flags a run as generator-bound (ms).
SEND_LAG_BOUND_MS = 1.0
#: Default ``spin_s`` of a generator in its own process (``course_lib.measure.generators``): it sleeps on the
#: event loop's timer until this long before a send, then yields to the loop (``asyncio.sleep(0)``,
#: which still handles answers) until the intended instant. Timers alone wake up to a millisecond or
#: more late (libuv keeps time in whole ms; 1 ms was measured too short), which would spend the whole
#: ``SEND_LAG_BOUND_MS``; the cost is at most this much CPU per request (s), spent yielding
#: (``os.sched_yield``) so that a server on the same cores still gets them.
SPIN_WINDOW_S = 0.002


async def wait_until(due_s: float, *, spin_s: float, clock: Callable[[], float] = time.perf_counter) -> float:
    """Wait on the event loop until ``clock()`` reaches ``due_s``, never early; returns the spin's CPU s.

    Sleeps on the loop's timer until ``spin_s`` before ``due_s`` (the loop's timers are coarse: whole
    milliseconds in uvloop/libuv), then yields to the loop (``asyncio.sleep(0)``, which still handles
    other tasks' callbacks, e.g. answers) until the instant; with ``spin_s`` > 0 each turn also yields
    the CPU to other processes (``os.sched_yield``: a busy machine has the server to run). ``spin_s`` 0
    relies on the timer and yields only for what remains when it wakes early (``SPIN_WINDOW_S`` is the
    generator processes' choice).

    Parameters
    ----------
    due_s : float
        The instant to wait for, on ``clock``'s scale (s).
    spin_s : float >= 0
        The last stretch spent yielding instead of sleeping (s). Not checked here: callers check it.
    clock : callable returning seconds
        ``time.perf_counter`` (a run's schedule) or ``time.time`` (an instant several processes share).

    Returns
    -------
    float
        The process CPU seconds (``time.process_time``) spent from the timer's wake-up to the instant.
    """
    wait = due_s - clock() - spin_s
    if wait > 0:
        await asyncio.sleep(wait)
    spin_start_s = time.process_time()
    while clock() < due_s:
        if spin_s:
            os.sched_yield()
        await asyncio.sleep(0)
    return time.process_time() - spin_start_s


def outcome_of(exc: BaseException) -> str:
    """Which of ``course_lib.core.vocabulary.CLIENT_OUTCOMES`` a failed request ends as: timeout, shed, error.

    ``shed`` is a ``course_lib.serving.service.HttpStatusError`` whose status the server answers when
    it sheds load (429, 503: ``.shed``), whichever client raised it (an HTTP target, the hedging
    client after every copy was shed).
    """
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, HttpStatusError) and exc.shed:
        return "shed"
    return "error"


def rung_duration_s(
    rate_rps: float, *, min_requests: int = MIN_REQUESTS_P99, min_duration_s: float = 1.0
) -> float:
    """Seconds a run (a rung) at ``rate_rps`` lasts to hold ``min_requests`` requests (at least ``min_duration_s``).

    Poisson arrivals put n +- sqrt(n) requests where n are expected, so the rung is sized for
    ``min_requests + 3 sqrt(min_requests)``: fewer than ``min_requests`` then come about once in 570 rungs for
    1,000 (the Poisson count's exact tail; the normal approximation says once in 740), once in 380 for 120.

    >>> round(rung_duration_s(50), 2)
    21.9
    >>> rung_duration_s(4000)
    1.0

    Raises ``InvalidArgumentError`` (a ``ValueError``) for a rate or ``min_duration_s`` that is not a finite
    number > 0, or ``min_requests`` < 1.
    """
    rate = positive_number("rate_rps", rate_rps, unit="req/s")
    n = integer("min_requests", min_requests, min=1)
    return max(positive_number("min_duration_s", min_duration_s, unit="s"), (n + 3.0 * math.sqrt(n)) / rate)


@dataclass(frozen=True)
class LoadResult:
    """Everything one open-loop run recorded.

    Attributes
    ----------
    requests : DataFrame, one row per request sent
        ``request_id``, ``scheduled_ms`` (since the run started), ``lag_ms`` (actual send - scheduled),
        ``latency_ms`` (answer - scheduled; NaN if no answer came), ``ok``, ``outcome`` (one of
        ``course_lib.core.vocabulary.CLIENT_OUTCOMES``), ``error`` (empty when ok), plus one column per
        field the target returned
        (e.g. ``queue_wait_ms``, ``batch_size``). A shed request (429/503) keeps its ``latency_ms``:
        the time it took to be refused.
    rate_rps : float
        Offered rate asked for.
    planned : int
        Requests the schedule held; ``len(requests)`` is smaller if ``max_duration_s`` cut it short.
    wall_s : float
        From start to the last answer (or give-up), seconds.
    client_cpu_s : float
        CPU seconds (user + system, ``time.process_time``) the sending process(es) spent during the
        run, summed over processes; NaN where not measured. On a machine the generator shares with the
        server, this is CPU the server did not get.
    spin_cpu_s : float
        Of that, the CPU spent between the coarse timer's wake-up and each send (``spin_s``: yielding
        to the loop and, with a spin, to other processes), summed likewise; NaN where not measured. It
        holds the callbacks of answers that arrive meanwhile too, so it bounds the spin from above.
    """

    requests: pd.DataFrame
    rate_rps: float
    planned: int
    wall_s: float
    client_cpu_s: float = math.nan
    spin_cpu_s: float = math.nan

    def summary(self, *, lag_bound_ms: float = SEND_LAG_BOUND_MS) -> dict[str, float]:
        """Offered and achieved rates, outcome counts and latency percentiles of the successful requests.

        ``offered_rps`` = (sent - 1) / (last - first scheduled send time); ``achieved_rps`` =
        (successful answers - 1) / (last - first answer time), the same kind of rate measured at the
        other end, so the two agree when the target keeps up, however short the run. Counts obey
        ``sent = ok + shed + timeouts + other_errors`` (``errors`` = all but ok). ``lag_p99_ms`` is the
        p99 of the generator's send lag and ``generator_ok`` says whether it stayed within
        ``lag_bound_ms``: when it did not, the latencies measure the generator, not the service.

        Raises
        ------
        ValueError
            If nothing was sent, or a request's row is missing (count in != count out).
        """
        req = self.requests
        sent = len(req)
        if sent == 0:
            raise ValueError("no request was sent (max_duration_s shorter than the first gap?)")
        ok = req[req["ok"]]
        if len(ok):
            done_ms = (ok["scheduled_ms"] + ok["latency_ms"]).to_numpy()
            span_ms = float(done_ms.max() - done_ms.min())
            achieved = 1000.0 * (len(ok) - 1) / span_ms if span_ms > 0 else math.nan
            lat = percentiles(ok["latency_ms"].to_numpy(), (50, 95, 99))
        else:
            achieved = 0.0
            lat = {"p50": math.nan, "p95": math.nan, "p99": math.nan}
        sched = req["scheduled_ms"].to_numpy()
        offered = (
            float(1000.0 * (sent - 1) / (sched[-1] - sched[0]))
            if sent > 1 and sched[-1] > sched[0]
            else math.nan
        )
        outcome = req["outcome"] if "outcome" in req.columns else req["ok"].map({True: "ok", False: "error"})
        counts = outcome.value_counts()
        n = {name: int(counts.get(name, 0)) for name in CLIENT_OUTCOMES}
        if sum(n.values()) != sent or sorted(req["request_id"]) != list(range(sent)):
            raise ValueError(f"count in != count out: {sent} rows, outcomes {n}")
        lag_p99 = percentiles(req["lag_ms"].to_numpy(), (99,))["p99"]
        row: dict[str, float] = {
            "rate_rps": self.rate_rps,
            "offered_rps": offered,
            "achieved_rps": achieved,
            "sent": sent,
            "ok": len(ok),
            "errors": sent - len(ok),
            "shed": n["shed"],
            "timeouts": n["timeout"],
            "other_errors": n["error"],
            "p50_ms": lat["p50"],
            "p95_ms": lat["p95"],
            "p99_ms": lat["p99"],
            "max_lag_ms": float(req["lag_ms"].max()),
            "lag_p99_ms": lag_p99,
            "generator_ok": bool(lag_p99 <= lag_bound_ms),
        }
        if "batch_size" in req.columns and len(ok):
            row["mean_batch_size"] = float(ok["batch_size"].mean())
        if "queue_wait_ms" in req.columns and len(ok):
            row["p99_queue_wait_ms"] = percentiles(ok["queue_wait_ms"].to_numpy(), (99,))["p99"]
        return row


async def open_loop_core(
    send: Callable[[int], Awaitable[object]], send_times_s: Sequence[float]
) -> np.ndarray:
    """The open-loop send loop, small: send request ``i`` at ``start + send_times_s[i]``, whatever came before.

    No request waits for an earlier answer (each is its own task), and each latency is timed from the
    *intended* send time, so a late send or a queue in the server counts in the latency instead of
    vanishing (coordinated omission). :func:`run_open_loop` is this loop plus hardening: Poisson
    schedules, a timeout per request, an outcome per request (shed, timeout, error), the send lag of
    every request and a spin before each send.

    Parameters
    ----------
    send : coroutine function i -> anything
        Sends request ``i`` and returns when it is answered.
    send_times_s : 1-D sequence of float, shape (n,)
        Intended send times in seconds from the start, non-decreasing.

    Returns
    -------
    numpy.ndarray of float, shape (n,)
        Latency of each request in ms, from its intended send time to its answer.

    References
    ----------
    Gil Tene, "How NOT to measure latency" (coordinated omission); Schroeder, Wierman and
    Harchol-Balter (2006), "Open versus closed: a cautionary tale", NSDI.
    """
    times = [number("send_times_s", t, min=0) for t in send_times_s]
    latency_ms = np.full(len(times), np.nan)
    start = time.perf_counter()

    async def one(i: int, due: float) -> None:
        await send(i)
        latency_ms[i] = 1000.0 * (time.perf_counter() - due)  # from the intended time, not the actual send

    tasks = []
    for i, offset in enumerate(times):
        due = start + offset
        await asyncio.sleep(max(0.0, due - time.perf_counter()))  # wait for the schedule, never for answers
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    return latency_ms


def _send_times_s(
    rate_rps: float,
    n_requests: int,
    seed: int,
    schedule_ms: Sequence[float] | np.ndarray | None,
    max_duration_s: float,
) -> np.ndarray:
    """A run's intended send times (s from its first send, the first at 0, none after ``max_duration_s``).

    Poisson arrivals at ``rate_rps`` (``seed``), or the first ``n_requests`` of ``schedule_ms``, checked.
    Raises ValueError for a schedule that is empty, not 1-D, not finite or decreasing.
    """
    if schedule_ms is None:
        schedule_s = poisson_arrivals_ms(rate_rps, n_requests, seed) / 1000.0
    else:
        schedule_s = np.asarray(schedule_ms, dtype=float)[:n_requests] / 1000.0
        if schedule_s.ndim != 1 or not schedule_s.size or not np.isfinite(schedule_s).all():
            raise ValueError("schedule_ms must be a non-empty 1-D array of finite send times in ms")
        if (np.diff(schedule_s) < 0).any():
            raise ValueError("schedule_ms must be non-decreasing (intended send times in order)")
    schedule_s = schedule_s - schedule_s[0]  # first request at t = 0
    return schedule_s[schedule_s <= max_duration_s]


async def _timed_request(
    send: Send, i: int, scheduled: float, *, start: float, timeout_s: float, clock: Callable[[], float]
) -> dict[str, Any]:
    """Send request ``i`` now and return its row: times from its ``scheduled`` instant, and its outcome.

    ``scheduled_ms`` is counted from the run's ``start``, ``lag_ms`` is the send's lateness, and
    ``latency_ms`` runs from the intended instant (NaN without an answer; a shed keeps its time).
    """
    sent = clock()
    row: dict[str, Any] = {"request_id": i, "scheduled_ms": 1000.0 * (scheduled - start)}
    row["lag_ms"] = 1000.0 * (sent - scheduled)
    try:
        async with asyncio.timeout(timeout_s):
            fields = await send(i)
    except TimeoutError:
        row.update(
            ok=False,
            outcome="timeout",
            error=f"TimeoutError: no answer within {timeout_s:g} s",
            latency_ms=math.nan,
        )
    except Exception as exc:
        kind = outcome_of(exc)
        row.update(
            ok=False,
            outcome=kind,
            error=f"{type(exc).__name__}: {str(exc)[:200]}",
            latency_ms=1000.0 * (clock() - scheduled) if kind == "shed" else math.nan,
        )
    else:
        row.update(ok=True, outcome="ok", error="", latency_ms=1000.0 * (clock() - scheduled))
        if fields:
            row.update(fields)
    return row


async def run_open_loop(
    send: Send,
    *,
    rate_rps: float,
    n_requests: int,
    max_duration_s: float,
    seed: int = 0,
    request_timeout_s: float = 5.0,
    schedule_ms: Sequence[float] | np.ndarray | None = None,
    spin_s: float = 0.0,
) -> LoadResult:
    """Send up to ``n_requests`` requests at Poisson times for at most ``max_duration_s`` seconds.

    :func:`open_loop_core` plus: schedules bounded in count and time, a timeout and an outcome per request
    (count in = count out), each request's send lag, and a spin before each send (timers wake late).

    Parameters
    ----------
    send : coroutine function i -> mapping or None
        Sends request ``i`` and returns fields to record (e.g. ``{"queue_wait_ms": 0.8,
        "batch_size": 12}``); raising marks the request as an error (type and message recorded).
    rate_rps : float > 0
        Offered load, requests per second.
    n_requests : int >= 1
        Upper bound on requests sent.
    max_duration_s : float > 0
        No request is scheduled later than this many seconds after the start.
    seed : int
        Seed of the arrival schedule (same seed, same schedule).
    request_timeout_s : float > 0
        A request not answered within this many seconds of its send is cancelled and recorded as
        an error, so the whole run ends within about ``max_duration_s + request_timeout_s``.
    schedule_ms : 1-D array of float, optional
        Intended send times in ms (non-decreasing, e.g. a spike from ``course_lib.measure.knee.spike_schedule``)
        instead of Poisson times at ``rate_rps``; ``rate_rps`` is then only the label of the run.
    spin_s : float >= 0
        Sleep on the loop's timer until ``spin_s`` before each send, then yield to the loop until the
        exact instant (``SPIN_WINDOW_S`` is the generator processes' choice). 0, the default, relies on
        the timer alone (sends up to about a millisecond late), which is what an in-process run wants:
        a spinning loop holds the GIL that the code under test, in the same interpreter, needs.

    Returns
    -------
    LoadResult

    Raises
    ------
    ValueError
        For a rate, duration or timeout that is not a finite number > 0, ``n_requests`` < 1, a
        negative ``spin_s``, or a schedule that is empty, not finite or decreasing.
    """
    rate = positive_number("rate_rps", rate_rps)
    duration = positive_number("max_duration_s", max_duration_s)
    timeout = positive_number("request_timeout_s", request_timeout_s)
    spin_s = number("spin_s", spin_s, min=0, max=1, max_open=True)
    n_requests = integer("n_requests", n_requests, min=1)
    schedule_s = _send_times_s(rate, n_requests, seed, schedule_ms, duration)
    rows: list[dict[str, Any] | None] = [None] * len(schedule_s)
    clock = time.perf_counter
    start = clock()

    async def one(i: int, scheduled: float) -> None:
        rows[i] = await _timed_request(send, i, scheduled, start=start, timeout_s=timeout, clock=clock)

    tasks = []
    spin_cpu_s = 0.0  # CPU spent in the last stretch before the sends (other tasks' callbacks run there too)
    for i, offset in enumerate(schedule_s.tolist()):
        due = start + offset
        spin_cpu_s += await wait_until(due, spin_s=spin_s, clock=clock)
        tasks.append(asyncio.create_task(one(i, due)))
    if tasks:
        await asyncio.gather(*tasks)
    missing = [i for i, r in enumerate(rows) if r is None]
    if missing:  # every request sent has a row: an answer, a shed, a timeout or an error
        raise RuntimeError(f"{len(missing)} requests have no outcome (first: {missing[:5]})")
    frame = pd.DataFrame(rows)
    return LoadResult(
        requests=frame, rate_rps=rate, planned=n_requests, wall_s=clock() - start, spin_cpu_s=spin_cpu_s
    )
