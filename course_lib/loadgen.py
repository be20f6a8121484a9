"""An open-loop Poisson load generator, bounded in request count and in time.

Open loop means requests are sent on a fixed schedule (Poisson arrivals at the offered rate), whether
or not earlier ones have been answered, as independent users do. A closed-loop client (send, wait,
send) slows down when the server slows down and so hides queueing; an open-loop one exposes it.
Latency is measured from each request's *scheduled* send time, so if the generator itself falls
behind, that lag counts against the latency instead of silently vanishing ("coordinated omission").

The target is any coroutine function ``send(i)``: an HTTP POST (``http_target``) or an in-process
call such as ``DynamicBatcher.submit`` (``coroutine_target``).

References
----------
Schroeder, Wierman and Harchol-Balter (2006), "Open versus closed: a cautionary tale", NSDI.
Gil Tene, "How NOT to measure latency" (coordinated omission).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from course_lib.batching_rule import poisson_arrivals_ms
from course_lib.percentiles import percentiles

__all__ = [
    "OUTCOMES",
    "SEND_LAG_BOUND_MS",
    "SERVED_FIELDS",
    "HttpStatusError",
    "LoadResult",
    "batcher_target",
    "capacity_table",
    "coroutine_target",
    "http_client_target",
    "http_target",
    "run_open_loop",
    "sustainable_rate",
    "sweep_rates",
]

Send = Callable[[int], Awaitable[Mapping[str, Any] | None]]
#: What the batcher (and the batching server) report about how each request was served.
SERVED_FIELDS: tuple[str, ...] = ("queue_wait_ms", "service_ms", "batch_size")
#: How every request ends: answered (2xx), shed by the server (429/503), timed out, or another error.
OUTCOMES: tuple[str, ...] = ("ok", "shed", "timeout", "error")
#: Send lag (actual - scheduled send time) p99 above this flags a run as generator-bound (ms).
SEND_LAG_BOUND_MS = 1.0


class HttpStatusError(RuntimeError):
    """A non-2xx answer: ``status`` (429 and 503 count as shed load) and the ``Retry-After`` header, if any."""

    def __init__(self, status: int, body: str = "", *, retry_after: str | None = None):
        hint = f" (Retry-After: {retry_after})" if retry_after is not None else ""
        super().__init__(f"HTTP {status}{hint}: {body[:200]}")
        self.status = int(status)
        self.retry_after = retry_after


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, HttpStatusError) and exc.status in (429, 503):
        return "shed"
    return "error"


@dataclass(frozen=True)
class LoadResult:
    """Everything one open-loop run recorded.

    Attributes
    ----------
    requests : DataFrame, one row per request sent
        ``request_id``, ``scheduled_ms`` (since the run started), ``lag_ms`` (actual send - scheduled),
        ``latency_ms`` (answer - scheduled; NaN if no answer came), ``ok``, ``outcome`` (one of
        ``OUTCOMES``), ``error`` (empty when ok), plus one column per field the target returned
        (e.g. ``queue_wait_ms``, ``batch_size``). A shed request (429/503) keeps its ``latency_ms``:
        the time it took to be refused.
    rate_rps : float
        Offered rate asked for.
    planned : int
        Requests the schedule held; ``len(requests)`` is smaller if ``max_duration_s`` cut it short.
    wall_s : float
        From start to the last answer (or give-up), seconds.
    """

    requests: pd.DataFrame
    rate_rps: float
    planned: int
    wall_s: float

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
        n = {name: int(counts.get(name, 0)) for name in OUTCOMES}
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


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return float(value)


async def run_open_loop(
    send: Send,
    *,
    rate_rps: float,
    n_requests: int,
    max_duration_s: float,
    seed: int = 0,
    request_timeout_s: float = 5.0,
    schedule_ms: Sequence[float] | np.ndarray | None = None,
) -> LoadResult:
    """Send up to ``n_requests`` requests at Poisson times for at most ``max_duration_s`` seconds.

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
        Intended send times in ms (non-decreasing, e.g. a spike from ``course_lib.knee.spike_schedule``)
        instead of Poisson times at ``rate_rps``; ``rate_rps`` is then only the label of the run.

    Returns
    -------
    LoadResult

    Raises
    ------
    ValueError
        For a rate, duration or timeout that is not a finite number > 0, ``n_requests`` < 1, or a
        schedule that is empty, not finite or decreasing.
    """
    rate = _check_positive("rate_rps", rate_rps)
    duration = _check_positive("max_duration_s", max_duration_s)
    timeout = _check_positive("request_timeout_s", request_timeout_s)
    if isinstance(n_requests, bool) or not isinstance(n_requests, (int, np.integer)) or n_requests < 1:
        raise ValueError(f"n_requests must be an integer >= 1, got {n_requests!r}")
    if schedule_ms is None:
        schedule_s = poisson_arrivals_ms(rate, int(n_requests), seed) / 1000.0
    else:
        schedule_s = np.asarray(schedule_ms, dtype=float)[: int(n_requests)] / 1000.0
        if schedule_s.ndim != 1 or not schedule_s.size or not np.isfinite(schedule_s).all():
            raise ValueError("schedule_ms must be a non-empty 1-D array of finite send times in ms")
        if (np.diff(schedule_s) < 0).any():
            raise ValueError("schedule_ms must be non-decreasing (intended send times in order)")
    schedule_s = schedule_s - schedule_s[0]  # first request at t = 0
    schedule_s = schedule_s[schedule_s <= duration]
    rows: list[dict[str, Any] | None] = [None] * len(schedule_s)
    clock = time.perf_counter
    start = clock()

    async def one(i: int, scheduled: float) -> None:
        sent = clock()
        row: dict[str, Any] = {"request_id": i, "scheduled_ms": 1000.0 * (scheduled - start)}
        row["lag_ms"] = 1000.0 * (sent - scheduled)
        try:
            async with asyncio.timeout(timeout):
                fields = await send(i)
        except TimeoutError:
            row.update(
                ok=False,
                outcome="timeout",
                error=f"TimeoutError: no answer within {timeout:g} s",
                latency_ms=math.nan,
            )
        except Exception as exc:
            kind = _outcome(exc)
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
        rows[i] = row

    tasks = []
    for i, offset in enumerate(schedule_s.tolist()):
        due = start + offset
        wait = due - clock()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(i, due)))
    if tasks:
        await asyncio.gather(*tasks)
    missing = [i for i, r in enumerate(rows) if r is None]
    if missing:  # every request sent has a row: an answer, a shed, a timeout or an error
        raise RuntimeError(f"{len(missing)} requests have no outcome (first: {missing[:5]})")
    frame = pd.DataFrame(rows)
    return LoadResult(requests=frame, rate_rps=rate, planned=int(n_requests), wall_s=clock() - start)


def coroutine_target(
    submit: Callable[[Any], Awaitable[Any]], items: Sequence[Any], *, fields: Iterable[str] = ()
) -> Send:
    """Wrap an in-process coroutine (e.g. ``DynamicBatcher.submit``) as a load-generator target.

    Request ``i`` submits ``items[i % len(items)]``; the named fields of the result (attributes, or
    keys if it is a mapping; e.g. ``queue_wait_ms``, ``batch_size``) are recorded.

    Raises
    ------
    ValueError
        If ``items`` is empty.
    """
    if len(items) == 0:
        raise ValueError("items must hold at least one request payload")
    names = tuple(fields)

    async def send(i: int) -> dict[str, Any]:
        result = await submit(items[i % len(items)])
        if isinstance(result, Mapping):
            return {name: result.get(name) for name in names}
        return {name: getattr(result, name) for name in names}

    return send


def http_target(client: Any, url: str, payloads: Sequence[Any], *, fields: Iterable[str] = ()) -> Send:
    """POST ``payloads[i % len(payloads)]`` as JSON to ``url`` with an ``httpx.AsyncClient``.

    A non-2xx answer raises ``HttpStatusError`` (a ``RuntimeError``) naming the status and the start
    of the body, so it is recorded as an error (or as shed, for 429/503) with its reason. The named fields of the JSON answer are recorded.

    Raises
    ------
    ValueError
        If ``payloads`` is empty.
    """
    names = tuple(fields)

    async def post(payload: Any) -> Mapping[str, Any]:
        response = await client.post(url, json=payload)
        if response.status_code >= 300:
            raise HttpStatusError(
                response.status_code, response.text, retry_after=response.headers.get("retry-after")
            )
        return response.json() if names else {}

    return coroutine_target(post, payloads, fields=names)


def batcher_target(
    score_batch: Callable[[list[Any]], Sequence[Any]],
    items: Sequence[Any],
    *,
    fields: Iterable[str] = SERVED_FIELDS,
    **batcher_kwargs: Any,
) -> Callable[[], AbstractAsyncContextManager[Send]]:
    """Factory for ``sweep_rates``: a fresh ``DynamicBatcher`` per run, in process (no HTTP).

    Parameters
    ----------
    score_batch : the batch score function.
    items : request payloads, sent round-robin.
    fields : attributes of ``BatchedResult`` to record.
    **batcher_kwargs : knobs of ``course_lib.batcher.DynamicBatcher`` (``max_batch_size``, ...).
    """
    from course_lib.batcher import DynamicBatcher

    DynamicBatcher(score_batch, **batcher_kwargs)  # validate the knobs now, not mid-sweep
    names = tuple(fields)

    @asynccontextmanager
    async def factory():
        async with DynamicBatcher(score_batch, **batcher_kwargs) as batcher:
            yield coroutine_target(batcher.submit, items, fields=names)

    return factory


def http_client_target(
    url: str, payloads: Sequence[Any], *, fields: Iterable[str] = SERVED_FIELDS, max_connections: int = 256
) -> Callable[[], AbstractAsyncContextManager[Send]]:
    """Factory for ``sweep_rates``: a fresh ``httpx.AsyncClient`` per run, POSTing JSON to ``url``."""
    import httpx

    names = tuple(fields)
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)

    @asynccontextmanager
    async def factory():
        async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
            yield http_target(client, url, payloads, fields=names)

    return factory


def sustainable_rate(
    table: pd.DataFrame,
    *,
    p99_limit_ms: float,
    min_achieved_fraction: float = 0.95,
    achieved_column: str = "achieved_rps",
) -> float:
    """Highest offered rate in a sweep that met the p99 limit, kept up, and had no errors.

    A row qualifies when its ``errors`` are 0 (a table without that column, like the simulator's,
    has none), ``p99_ms <= p99_limit_ms`` and ``achieved_column`` is at least
    ``min_achieved_fraction`` of ``offered_rps``. Returns 0.0 if no row does. The answer is only as
    fine as the sweep: the true limit lies between this rate and the next one measured.

    Parameters
    ----------
    table : DataFrame with ``offered_rps``, ``p99_ms`` and ``achieved_column`` (one row per rate),
        e.g. ``LoadResult.summary()`` rows or ``course_lib.simulator.sweep_offered_load`` output
        (the default ``achieved_column`` names it).
    p99_limit_ms : float > 0
    min_achieved_fraction : float in (0, 1]
    achieved_column : str

    Raises
    ------
    ValueError
        For a limit that is not > 0, a fraction outside (0, 1], or a missing column.
    """
    _check_positive("p99_limit_ms", p99_limit_ms)
    if not 0 < min_achieved_fraction <= 1:
        raise ValueError(f"min_achieved_fraction must be in (0, 1], got {min_achieved_fraction!r}")
    missing = [c for c in ("offered_rps", "p99_ms", achieved_column) if c not in table.columns]
    if missing:
        raise ValueError(f"table is missing columns {missing}")
    errors = table["errors"] if "errors" in table.columns else 0
    good = table[
        (errors == 0)
        & (table["p99_ms"] <= p99_limit_ms)
        & (table[achieved_column] >= min_achieved_fraction * table["offered_rps"])
    ]
    return float(good["offered_rps"].max()) if len(good) else 0.0


async def sweep_rates(
    targets: Mapping[str, Callable[[], AbstractAsyncContextManager[Send]]],
    rates_rps: Iterable[float],
    *,
    p99_limit_ms: float,
    duration_s: float,
    max_requests: int = 100_000,
    seed: int = 0,
    request_timeout_s: float | None = None,
    warmup_requests: int = 20,
    min_done_fraction: float = 0.95,
    retries: int = 1,
) -> pd.DataFrame:
    """Climb a ladder of offered rates for several targets side by side, until each one fails.

    At every rate the targets take turns (A, B, A, B, ...), so slow drift of a shared machine hits
    them alike. A run meets the SLO when no request failed and its p99 is within the limit (so 99% of
    requests were answered within the limit of their scheduled time: the target kept up). A run
    that missed although at least ``min_done_fraction`` of its requests were answered by the end of
    the schedule plus the limit was a hiccup of a shared machine, not an overload: the rate is tried
    again (``retries`` times, with the next seed). A target that misses every try, or is plainly
    overloaded, drops out: higher rates would only pile up a longer queue.

    Parameters
    ----------
    targets : mapping name -> zero-argument factory of an async context manager yielding ``send``
        Each run enters a fresh context (e.g. a new ``DynamicBatcher`` or a new HTTP client) so runs
        do not share a backlog.
    rates_rps : iterable of float > 0, climbed in ascending order
    p99_limit_ms : float > 0
        The latency SLO a rate must meet.
    duration_s : float > 0
        Length of each run (``max_duration_s`` of ``run_open_loop``).
    max_requests : int
        Upper bound on requests per run.
    seed : int
        Arrival schedule seed (the same schedule for every target at a given rate).
    request_timeout_s : float, optional
        Give up on a request after this long; default 5 x the p99 limit (at least 0.5 s), which is
        already a failure, so an overloaded run ends soon after ``duration_s``.
    warmup_requests : int >= 0
        Requests sent one at a time before each run and not recorded (thread pools, caches, sockets).
    min_done_fraction : float in (0, 1]
        Share of requests answered by the end of the schedule plus the limit, above which a miss
        counts as a hiccup and is retried.
    retries : int >= 0
        Extra tries at a rate after a hiccup.

    Returns
    -------
    DataFrame with ``target``, ``attempt`` (1 for the first try at a rate), the
    ``LoadResult.summary()`` columns, ``done_in_time`` (share answered by the end of the schedule
    plus the limit) and ``met_slo`` (bool), one row per run, in the order they ran.

    Raises
    ------
    ValueError
        For a p99 limit that is not > 0 or a negative ``retries``.
    """
    limit = _check_positive("p99_limit_ms", p99_limit_ms)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
    if not 0 < min_done_fraction <= 1:
        raise ValueError(f"min_done_fraction must be in (0, 1], got {min_done_fraction!r}")
    timeout = request_timeout_s if request_timeout_s is not None else max(0.5, 5 * limit / 1000.0)
    alive = list(targets)
    rows = []
    for rate in sorted(float(r) for r in rates_rps):
        for name in list(alive):
            for attempt in range(1, retries + 2):
                async with targets[name]() as send:
                    for i in range(warmup_requests):
                        await send(i)
                    result = await run_open_loop(
                        send,
                        rate_rps=rate,
                        n_requests=max_requests,
                        max_duration_s=duration_s,
                        seed=seed + attempt - 1,
                        request_timeout_s=timeout,
                    )
                row = {"target": name, "attempt": attempt, **result.summary()}
                req = result.requests
                in_time = req["ok"] & (
                    req["scheduled_ms"] + req["latency_ms"] <= req["scheduled_ms"].max() + limit
                )
                row["done_in_time"] = float(in_time.mean())
                row["met_slo"] = bool(row["errors"] == 0 and row["p99_ms"] <= limit)
                rows.append(row)
                hiccup = row["errors"] == 0 and row["done_in_time"] >= min_done_fraction
                if row["met_slo"] or not hiccup:  # overloaded: trying again would only repeat it
                    break
            if not row["met_slo"]:
                alive.remove(name)
        if not alive:
            break
    return pd.DataFrame(rows)


def capacity_table(sweep: pd.DataFrame, *, baseline: str) -> pd.DataFrame:
    """Per target of a ``sweep_rates`` table: the highest rate that met the SLO and the gain over a baseline.

    Parameters
    ----------
    sweep : output of ``sweep_rates`` (its ``met_slo`` column carries the SLO that was applied).
    baseline : str
        Target the ``gain`` column divides by (e.g. the one-call-per-request configuration).

    Returns
    -------
    DataFrame indexed by target with ``sustained_rps`` (the highest rung of the ladder, ``rate_rps``,
    that met the SLO; a lower bound, since the true limit lies below the next rung), the realised
    ``offered_rps`` and the ``achieved_rps`` of that run, its ``p99_ms`` and
    ``mean_batch_size`` at that rate, ``first_failed_rps`` (lowest rung where every try missed, NaN
    if none did) and
    ``gain`` (sustained_rps / baseline's; NaN if the baseline met the SLO at no rate, in which case
    start the ladder lower).

    Raises
    ------
    ValueError
        If ``baseline`` is not a target of the sweep.
    """
    if baseline not in set(sweep["target"]):
        raise ValueError(f"baseline {baseline!r} is not one of the targets {sorted(set(sweep['target']))}")
    rows = {}
    for name, runs in sweep.groupby("target", sort=False):
        good = runs[runs["met_slo"]]
        bad = runs[~runs["met_slo"] & ~runs["rate_rps"].isin(good["rate_rps"])]  # no try at that rate met
        best = good.loc[good["rate_rps"].idxmax()] if len(good) else None
        rows[name] = {
            "sustained_rps": float(best["rate_rps"]) if best is not None else 0.0,
            "offered_rps": float(best["offered_rps"]) if best is not None else math.nan,
            "achieved_rps": float(best["achieved_rps"]) if best is not None else math.nan,
            "p99_ms": float(best["p99_ms"]) if best is not None else math.nan,
            "mean_batch_size": float(best.get("mean_batch_size", math.nan)) if best is not None else math.nan,
            "first_failed_rps": float(bad["rate_rps"].min()) if len(bad) else math.nan,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "target"
    base = table.loc[baseline, "sustained_rps"]
    table["gain"] = table["sustained_rps"] / base if base > 0 else math.nan
    return table
