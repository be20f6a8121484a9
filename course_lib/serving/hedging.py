"""Hedged requests: if the first replica has not answered in time, ask a second one; keep the first answer.

``hedged`` is the mechanism for any coroutine ``call(replica)``; ``HedgingClient`` applies it to the
churn service's ``POST /score`` over HTTP with ``aiohttp``. Rules, after Dean and Barroso (2013):

* the primary replica is chosen round-robin; a hedge goes to a *different* replica, never the same;
* at most one hedge per request, sent only if the primary has not answered after ``hedge_after_s``
  (``None`` never hedges, 0 sends both at once);
* the first *successful* answer wins; the other call is cancelled and awaited, so no request is
  left running that nobody waits for (an HTTP request cancelled mid-flight closes its connection,
  which the server sees as a disconnect);
* if the caller itself is cancelled (e.g. by a timeout), both calls are cancelled too;
* a copy that fails (an exception, or a non-2xx answer: ``HttpStatusError``) does not answer; if every
  copy sent failed, the first failure is raised, so a request that every replica shed (429/503) is
  counted as shed by the load generator (:func:`course_lib.measure.loadgen.outcome_of`), not as an error;
* every copy sent is counted, so the extra load is a measured number, not a guess.

One concept, one module: hedged requests. The mechanism, the HTTP client that applies it, the fan-out
pages (``fanout_pages``, whose slowest call hedging shortens; they take a ``HedgingClient``) and the summary
of a hedged run exist only for hedging and are read together by the tail-latency lesson.

References
----------
Dean, J. and Barroso, L. A. (2013), "The Tail at Scale", Communications of the ACM 56(2): 74-80,
section "Hedged requests". Python documentation, ``asyncio.wait`` and task cancellation.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import numpy as np
import pandas as pd

from course_lib.core.checks import distinct, integer, non_empty, positive_number
from course_lib.core.percentiles import percentiles
from course_lib.serving.service import HttpStatusError

__all__ = [
    "FakeReplicas",
    "FanoutRun",
    "HedgeStats",
    "HedgedResult",
    "HedgingClient",
    "fanout_pages",
    "hedged",
    "hedged_call_core",
    "hedging_summary",
]

R = TypeVar("R")  # a replica (URL, client, ...)
T = TypeVar("T")  # an answer


@dataclass
class HedgeStats:
    """Counters of a hedging caller.

    Attributes
    ----------
    requests : logical requests made.
    sent : copies sent to replicas (requests + hedges).
    hedges : second copies sent.
    hedge_wins : requests answered by the hedge rather than the primary.
    cancelled : calls cancelled because the other copy answered first (or the caller gave up).
    failed_calls : calls that raised (the other copy may still have answered).
    shed_calls : failed calls that the replica shed (answered 429 or 503, ``HttpStatusError.shed``).
    """

    requests: int = 0
    sent: int = 0
    hedges: int = 0
    hedge_wins: int = 0
    cancelled: int = 0
    failed_calls: int = 0
    shed_calls: int = 0

    def failed(self, error: BaseException) -> BaseException:
        """Count one failed call (and whether it was shed); returns ``error``."""
        self.failed_calls += 1
        if isinstance(error, HttpStatusError) and error.shed:
            self.shed_calls += 1
        return error

    @property
    def extra_request_fraction(self) -> float:
        """hedges / requests: 0.05 means 5 % more requests than without hedging (NaN before any)."""
        return self.hedges / self.requests if self.requests else math.nan

    def as_dict(self) -> dict[str, float]:
        return {**self.__dict__, "extra_request_fraction": self.extra_request_fraction}


@dataclass(frozen=True)
class HedgedResult(Generic[T]):
    """The winning answer, which replica gave it, the primary's index, and whether a hedge was sent."""

    value: T
    replica: int
    hedged: bool
    latency_ms: float
    primary: int


async def _cancel_and_wait(tasks: set[asyncio.Task[Any]], stats: HedgeStats) -> None:
    for task in tasks:
        if not task.done():
            task.cancel()
            stats.cancelled += 1
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


class _HedgedRequest(Generic[R, T]):
    """One logical request of :func:`hedged`: the copies in flight, their replicas and their failures."""

    def __init__(
        self, call: Callable[[R], Awaitable[T]], replicas: Sequence[R], primary: int, stats: HedgeStats
    ) -> None:
        self.call = call
        self.replicas = replicas
        self.primary = primary
        self.stats = stats
        self.start = time.perf_counter()
        self.owner: dict[asyncio.Task[Any], int] = {}  # each copy's replica index
        self.pending: set[asyncio.Task[Any]] = set()
        self.errors: list[BaseException] = []
        self.hedge_sent = False
        stats.requests += 1

    def send(self, index: int, *, hedge: bool = False) -> None:
        """Send a copy to ``replicas[index]``, counted in ``stats.sent`` (and ``stats.hedges`` if a hedge)."""
        self.stats.sent += 1
        if hedge:
            self.hedge_sent = True
            self.stats.hedges += 1
        task = asyncio.ensure_future(self.call(self.replicas[index]))
        self.owner[task] = index
        self.pending.add(task)

    async def first_answer(self, *, timeout_s: float | None = None) -> HedgedResult[T] | None:
        """Wait until a copy finishes (or ``timeout_s`` passes): its answer if it succeeded, else None.

        A copy that failed is counted and its error kept; if the primary and the hedge finish together,
        the primary's answer is taken.
        """
        done, self.pending = await asyncio.wait(
            self.pending, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        for task in sorted(done, key=lambda t: self.owner[t] != self.primary):  # a tie goes to the primary
            if task.exception() is None:
                return self._result(task)
            self.errors.append(
                self.stats.failed(cast(BaseException, task.exception()))
            )  # done, not a success
        return None

    def _result(self, task: asyncio.Task[Any]) -> HedgedResult[T]:
        """The successful ``task``'s answer, timed from the start of the request."""
        if self.owner[task] != self.primary:
            self.stats.hedge_wins += 1
        return HedgedResult(
            value=task.result(),
            replica=self.owner[task],
            hedged=self.hedge_sent,
            latency_ms=1000 * (time.perf_counter() - self.start),
            primary=self.primary,
        )


class FakeReplicas:
    """Replicas that answer after a fixed delay each, to run a hedged call by hand (Lesson 7).

    ``await replicas.call(name)`` sleeps ``delays_ms[name]`` and answers ``"answer from <name>"``; it
    records each call in ``calls`` and each cancellation in ``cancelled``.
    """

    def __init__(self, delays_ms: dict[str, float]):
        self.delays_ms = {
            name: positive_number(f"delays_ms[{name!r}]", ms, allow_zero=True)
            for name, ms in delays_ms.items()
        }
        self.calls: list[str] = []
        self.cancelled: list[str] = []

    async def call(self, replica: str) -> str:
        self.calls.append(replica)
        try:
            await asyncio.sleep(self.delays_ms[replica] / 1000.0)
        except asyncio.CancelledError:
            self.cancelled.append(replica)
            raise
        return f"answer from {replica}"


async def hedged_call_core(
    call: Callable[[R], Awaitable[T]], first: R, second: R, *, hedge_after_s: float
) -> tuple[T, R]:
    """A hedged call, small: ask ``first``; if no answer within ``hedge_after_s``, ask ``second`` too.

    The first answer wins and the other call is cancelled. :func:`hedged` is this plus hardening: a
    failed copy does not win (the other may still answer), the loser is awaited after its
    cancellation, a cancelled caller cancels both copies, round-robin primaries, and counters.

    Parameters
    ----------
    call : coroutine function replica -> answer
        Must be safe to run twice (an idempotent read such as scoring a customer).
    first, second : replicas
        Where the request goes first, and where its one copy goes.
    hedge_after_s : float >= 0
        The hedge delay in seconds (Dean and Barroso: the p95 of the expected latency).

    Returns
    -------
    (answer, replica)
        The first answer and the replica that gave it.

    References
    ----------
    Dean, J. and Barroso, L. A. (2013), "The Tail at Scale", CACM 56(2): 74-80, "Hedged requests".
    """
    delay_s = positive_number("hedge_after_s", hedge_after_s, allow_zero=True)
    primary = asyncio.ensure_future(call(first))
    done, _ = await asyncio.wait({primary}, timeout=delay_s)
    if done:  # answered within the delay: no copy
        return primary.result(), first
    hedge = asyncio.ensure_future(call(second))
    done, pending = await asyncio.wait({primary, hedge}, return_when=asyncio.FIRST_COMPLETED)
    for loser in pending:
        loser.cancel()
    winner = done.pop()
    return winner.result(), (first if winner is primary else second)


async def hedged(
    call: Callable[[R], Awaitable[T]],
    replicas: Sequence[R],
    *,
    hedge_after_s: float | None,
    primary: int = 0,
    stats: HedgeStats | None = None,
) -> HedgedResult[T]:
    """Call ``replicas[primary]``; after ``hedge_after_s`` without an answer, also call the next replica.

    This is :func:`hedged_call_core` plus hardening: a copy that fails does not win while the other may
    still answer (a fast error is hedged at once), the loser is cancelled *and awaited* so nothing runs
    that nobody waits for, a cancelled caller cancels both copies, replicas are checked distinct (a
    hedge into the same queue shares its stall), and every copy is counted (``stats``).

    Parameters
    ----------
    call : coroutine function replica -> answer
        Must be safe to run twice (an idempotent read such as scoring a customer).
    replicas : sequence of at least 2 distinct replicas
    hedge_after_s : float >= 0 or None
        Delay before the hedge; None never hedges.
    primary : int
        Index of the first replica; the hedge goes to ``(primary + 1) % len(replicas)``.
    stats : HedgeStats, optional
        Counters to update.

    Returns
    -------
    HedgedResult
        The first successful answer. Its ``latency_ms`` is measured from the call to ``hedged``.

    Raises
    ------
    ValueError
        Fewer than 2 replicas, a replica listed twice, a negative delay, or a bad ``primary`` index.
    Exception
        The primary's error if every copy sent failed.
    """
    non_empty("replicas", replicas, min_items=2)
    distinct("replicas", replicas, key=repr)  # a hedge to the same replica shares its stall
    if hedge_after_s is not None:
        hedge_after_s = positive_number("hedge_after_s", hedge_after_s, allow_zero=True)
    primary = integer("primary", primary, min=0, max=len(replicas) - 1)
    request = _HedgedRequest(call, replicas, primary, stats if stats is not None else HedgeStats())
    try:
        request.send(primary)
        if hedge_after_s is not None:
            if (answer := await request.first_answer(timeout_s=hedge_after_s)) is not None:
                return answer  # the primary answered in time: no hedge
            request.send((primary + 1) % len(replicas), hedge=True)  # late (or failed): one hedge
        while request.pending:
            if (answer := await request.first_answer()) is not None:
                return answer  # the first success wins
        raise request.errors[0]  # every copy failed: the primary's error
    finally:
        await _cancel_and_wait(request.pending, request.stats)  # the loser is cancelled and awaited


class HedgingClient:
    """Score customers on several replicas of the churn service with hedged ``POST /score`` calls.

    Parameters
    ----------
    replica_urls : sequence of str
        Base URLs of at least 2 distinct replicas, e.g. ``http://127.0.0.1:8123``.
    hedge_after_ms : float or None
        Hedge delay in ms (None: no hedging). Can be changed between runs (attribute).
    timeout_s : float
        Per-call timeout of each copy (a hung replica fails its copy instead of hanging the caller).
    max_connections : int
        Connection pool size per replica.

    Notes
    -----
    Each call sends the header ``x-request-id`` (the caller's id, the same for a request and its
    hedge), so a replica that injects stalls by request id stalls the same requests in every run.
    The HTTP client is aiohttp (its C parser costs a few times less CPU per request than httpx's
    pure-Python one, so the client is not the bottleneck of a lesson's experiment); one
    ``aiohttp.ClientSession`` per replica, opened on entry. A copy cancelled mid-flight closes its
    connection, which the replica sees as a disconnect. Use as ``async with HedgingClient(...) as client``.
    """

    def __init__(
        self,
        replica_urls: Sequence[str],
        *,
        hedge_after_ms: float | None = None,
        timeout_s: float = 10.0,
        max_connections: int = 64,
    ):
        urls = non_empty("replica_urls", distinct("replica_urls", replica_urls), min_items=2)
        self.replica_urls = urls
        self.hedge_after_ms = hedge_after_ms
        self.stats = HedgeStats()
        self._timeout_s = positive_number("timeout_s", timeout_s)
        self._max_connections = integer("max_connections", max_connections, min=1)
        self._sessions: list[Any] = []
        self._rotation = itertools.count()

    def _open(self) -> list[Any]:
        import aiohttp  # noqa: PLC0415 (heavy optional dependency)

        if not self._sessions:
            timeout = aiohttp.ClientTimeout(total=self._timeout_s)
            self._sessions = [
                aiohttp.ClientSession(
                    base_url=url,
                    timeout=timeout,
                    connector=aiohttp.TCPConnector(limit=self._max_connections),
                )
                for url in self.replica_urls
            ]
        return self._sessions

    async def _post(self, index: int, body: bytes, request_id: str) -> dict[str, Any]:
        headers = {"content-type": "application/json", "x-request-id": request_id}
        async with self._open()[index].post("/score", data=body, headers=headers) as response:
            text = await response.text()
            if not 200 <= response.status < 300:
                raise HttpStatusError(
                    response.status,
                    text,
                    retry_after=response.headers.get("Retry-After"),
                    where=f"replica {index}",
                )
            return json.loads(text)

    async def score(self, customer_id: str, *, request_id: str) -> HedgedResult[dict[str, Any]]:
        """Score one customer: primary round-robin, a hedge to the other replica if it is late.

        Raises
        ------
        HttpStatusError
            If every copy sent failed and the first failure was a non-2xx answer (``.shed`` for a
            429/503); another exception (a refused connection, a timeout) as it was raised.
        """
        body = json.dumps({"customer_id": customer_id}).encode()
        primary = next(self._rotation) % len(self.replica_urls)
        delay = None if self.hedge_after_ms is None else self.hedge_after_ms / 1000.0
        return await hedged(
            lambda index: self._post(index, body, request_id),
            range(len(self.replica_urls)),
            hedge_after_s=delay,
            primary=primary,
            stats=self.stats,
        )

    def reset_stats(self) -> HedgeStats:
        """Return the counters so far and start new ones."""
        old, self.stats = self.stats, HedgeStats()
        return old

    async def aclose(self) -> None:
        """Close every replica's connections."""
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            await session.close()

    async def __aenter__(self) -> HedgingClient:
        self._open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@dataclass(frozen=True)
class FanoutRun:
    """Pages of ``k`` parallel calls (:func:`fanout_pages`).

    Attributes
    ----------
    page_ms : ndarray, shape (n_pages,)
        Each page's latency: from its first send to its slowest answer, ms.
    call_ms : ndarray, shape (n_pages, k)
        Each call's latency (``HedgedResult.latency_ms``), ms.
    primary : ndarray of int, shape (n_pages, k)
        The replica each call went to first.
    request_ids : ndarray of str, shape (n_pages, k)
        Each call's ``x-request-id``.
    """

    page_ms: np.ndarray
    call_ms: np.ndarray
    primary: np.ndarray
    request_ids: np.ndarray

    @property
    def k(self) -> int:
        """Calls per page."""
        return int(self.call_ms.shape[1])


async def fanout_pages(
    client: HedgingClient,
    customer_ids: Sequence[str],
    *,
    k: int,
    n_pages: int,
    id_prefix: str,
    budget_s: float | None = None,
) -> FanoutRun:
    """Load ``n_pages`` pages one after another, each made of ``k`` parallel ``score`` calls.

    A page is ready when its slowest call answered. Call ``j`` of page ``p`` scores
    ``customer_ids[(p * k + j) % len]`` with request id ``f"{id_prefix}-{p}-{j}"`` (the same ids in
    every run, so a replica that stalls by request id stalls the same calls). With ``budget_s``
    (seconds), no page starts once that long has passed since the first (at least one runs), so a
    stall that a busy machine made long cannot stretch the run without bound.

    Returns
    -------
    FanoutRun

    Raises
    ------
    ValueError
        If k or n_pages < 1, ``budget_s`` is not a positive number, or ``customer_ids`` is empty.
    """
    k = integer("k", k, min=1)
    n_pages = integer("n_pages", n_pages, min=1)
    budget_s = None if budget_s is None else positive_number("budget_s", budget_s)
    non_empty("customer_ids", customer_ids)
    page_ms = np.empty(n_pages)
    call_ms = np.empty((n_pages, k))
    primary = np.empty((n_pages, k), dtype=int)
    request_ids = np.array([[f"{id_prefix}-{p}-{j}" for j in range(k)] for p in range(n_pages)])
    first = time.perf_counter()
    for p in range(n_pages):
        start = time.perf_counter()
        if p and budget_s is not None and start - first >= budget_s:
            n_pages = p
            break
        results = await asyncio.gather(
            *(
                client.score(customer_ids[(p * k + j) % len(customer_ids)], request_id=request_ids[p, j])
                for j in range(k)
            )
        )
        page_ms[p] = 1000 * (time.perf_counter() - start)
        call_ms[p] = [r.latency_ms for r in results]
        primary[p] = [r.primary for r in results]
    return FanoutRun(page_ms[:n_pages], call_ms[:n_pages], primary[:n_pages], request_ids[:n_pages])


def hedging_summary(requests: pd.DataFrame, stats: HedgeStats) -> dict[str, float]:
    """p50/p95/p99/p99.9 (ms, nearest rank) of the answered requests, failures and hedge counters.

    ``shed`` counts the failed requests whose first failure was a 429/503 answer (the load
    generator's ``outcome`` ``"shed"``); ``errors`` the other failures, timeouts included. The
    percentiles are NaN when no request was answered.
    """
    ok = requests[requests["ok"]]
    if "outcome" in requests.columns:
        shed = requests["outcome"] == "shed"
    else:  # a table without outcomes (not from the load generator): every failure is an error
        shed = pd.Series(False, index=requests.index)
    qs = (50, 95, 99, 99.9)
    latency = percentiles(ok["latency_ms"].to_numpy(), qs) if len(ok) else {f"p{q:g}": math.nan for q in qs}
    return {
        **latency,
        "errors": int((~requests["ok"] & ~shed).sum()),
        "shed": int(shed.sum()),
        "extra_requests": stats.extra_request_fraction,
        "hedge_wins": stats.hedge_wins,
        "copies_cancelled": stats.cancelled,
    }
