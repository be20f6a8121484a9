"""Hedged requests: the mechanism with controlled fake replicas, then over HTTP between two real replicas."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from course_lib.core.waiting import async_wait_until
from course_lib.serving.hedging import HedgeStats, HedgingClient, fanout_pages, hedged


class FakeReplicas:
    """Replicas whose answers the test releases by event; records calls and cancellations."""

    def __init__(self, n: int):
        self.release = [asyncio.Event() for _ in range(n)]
        self.calls: list[int] = []
        self.cancelled: list[int] = []
        self.fail: set[int] = set()

    async def call(self, replica: int) -> str:
        self.calls.append(replica)
        if replica in self.fail:
            raise ConnectionError(f"replica {replica} is down")
        try:
            await self.release[replica].wait()
        except asyncio.CancelledError:
            self.cancelled.append(replica)
            raise
        return f"answer from {replica}"


def run(coro):
    return asyncio.run(coro)


def test_no_hedge_when_the_primary_answers_before_the_delay():
    async def main():
        fake = FakeReplicas(2)
        fake.release[0].set()
        stats = HedgeStats()
        result = await hedged(fake.call, [0, 1], hedge_after_s=30.0, stats=stats)
        return fake, stats, result

    fake, stats, result = run(main())
    assert (result.value, result.replica, result.hedged) == ("answer from 0", 0, False)
    assert fake.calls == [0]
    assert (stats.requests, stats.sent, stats.hedges, stats.extra_request_fraction) == (1, 1, 0, 0.0)


def test_late_primary_gets_one_hedge_to_another_replica_first_answer_wins_and_the_loser_is_cancelled():
    async def main():
        fake = FakeReplicas(3)
        fake.release[2].set()  # the replica after the primary answers at once
        stats = HedgeStats()
        result = await hedged(fake.call, [0, 1, 2], hedge_after_s=0.0, primary=1, stats=stats)
        return fake, stats, result

    fake, stats, result = run(main())
    assert (result.value, result.replica, result.hedged, result.primary) == ("answer from 2", 2, True, 1)
    assert fake.calls == [1, 2]  # never the same replica twice, never a third copy
    assert fake.cancelled == [1]  # the loser was cancelled and awaited before hedged() returned
    assert (stats.sent, stats.hedges, stats.hedge_wins, stats.cancelled) == (2, 1, 1, 1)


def test_never_more_than_one_hedge_even_when_both_copies_are_slow():
    async def main():
        fake = FakeReplicas(3)
        stats = HedgeStats()
        task = asyncio.create_task(hedged(fake.call, [0, 1, 2], hedge_after_s=0.0, stats=stats))
        await async_wait_until(lambda: len(fake.calls) == 2, what="the primary and its hedge")
        for _ in range(50):  # give the event loop many turns in which a wrong client could hedge again
            await asyncio.sleep(0)
        calls_in_flight = list(fake.calls)
        fake.release[0].set()
        result = await task
        return fake, stats, result, calls_in_flight

    fake, stats, result, calls_in_flight = run(main())
    assert calls_in_flight == [0, 1]
    assert fake.calls == [0, 1]
    assert (result.replica, stats.hedges, stats.hedge_wins) == (0, 1, 0)
    assert fake.cancelled == [1]


def test_a_primary_that_fails_fast_is_hedged_at_once_and_the_hedge_answers():
    async def main():
        fake = FakeReplicas(2)
        fake.fail.add(0)
        fake.release[1].set()
        stats = HedgeStats()
        result = await hedged(fake.call, [0, 1], hedge_after_s=30.0, stats=stats)
        return stats, result

    stats, result = run(main())
    assert (result.replica, stats.failed_calls, stats.hedges) == (1, 1, 1)


def test_every_copy_failing_raises_the_primary_error():
    async def main():
        fake = FakeReplicas(2)
        fake.fail.update({0, 1})
        await hedged(fake.call, [0, 1], hedge_after_s=0.0)

    with pytest.raises(ConnectionError, match="replica 0"):
        run(main())


def test_a_cancelled_caller_cancels_both_copies():
    async def main():
        fake = FakeReplicas(2)
        task = asyncio.create_task(hedged(fake.call, [0, 1], hedge_after_s=0.0))
        await async_wait_until(lambda: len(fake.calls) == 2, what="both copies sent")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return fake

    assert sorted(run(main()).cancelled) == [0, 1]


@pytest.mark.parametrize(
    ("replicas", "kwargs", "message"),
    [
        ([0], {"hedge_after_s": 0.01}, "replicas must hold at least 2 items, got 1"),
        (["a", "a"], {"hedge_after_s": 0.01}, "replicas must not repeat an item, got 'a' twice"),
        ([0, 1], {"hedge_after_s": -1.0}, "hedge_after_s"),
        ([0, 1], {"hedge_after_s": 0.01, "primary": 2}, "primary"),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(replicas, kwargs, message):
    async def call(replica):
        return replica

    with pytest.raises(ValueError, match=message):
        run(hedged(call, replicas, **kwargs))


def test_hedging_client_needs_two_distinct_urls():
    with pytest.raises(ValueError, match="replica_urls must not repeat an item"):
        HedgingClient(["http://127.0.0.1:1", "http://127.0.0.1:1"])
    with pytest.raises(ValueError, match="replica_urls must hold at least 2 items, got 1"):
        HedgingClient(["http://127.0.0.1:1"])


# -- over HTTP, two real replica processes --------------------------------------------------------------
def test_http_hedge_answers_from_the_fast_replica_and_the_stalled_copy_is_abandoned(
    slow_and_fast_replicas, ids
):
    slow, fast = slow_and_fast_replicas  # slow: every request stalls 20 s; fast: no stalls
    before = slow.stats()

    async def main():
        async with HedgingClient([slow.url, fast.url], hedge_after_ms=50.0) as client:
            results = [await client.score(ids[i], request_id=f"t-{i}") for i in range(6)]
            return results, client.stats

    results, stats = run(main())
    # Round-robin: requests 0, 2, 4 go first to the slow replica and must be hedged; 1, 3, 5 go first
    # to the fast one and are hedged (to the slow one) only if it took over 50 ms on a busy machine.
    assert all(r.value["customer_id"] == ids[i] for i, r in enumerate(results))
    assert [r.replica for r in results] == [1] * 6
    assert [r.hedged for r in results][::2] == [True] * 3
    assert stats.requests == 6 and 3 <= stats.hedges <= 6 and stats.sent == 6 + stats.hedges
    assert stats.hedge_wins == 3  # the hedges of the slow primaries
    assert stats.cancelled == stats.hedges  # every hedged request had a loser, on the slow replica
    assert stats.extra_request_fraction == stats.hedges / 6

    def abandoned():
        now = slow.stats()
        return now["abandoned"] - before["abandoned"] == stats.hedges and now

    from course_lib.core.waiting import wait_until

    now = wait_until(abandoned, timeout_s=15.0, what="the slow replica to see its copies cancelled")
    assert now["slow_injected"] - before["slow_injected"] == stats.hedges


def test_fanout_pages_wait_for_the_slowest_call(slow_and_fast_replicas, ids):
    slow, fast = slow_and_fast_replicas

    async def main():
        async with HedgingClient([slow.url, fast.url], hedge_after_ms=20.0) as client:
            return await fanout_pages(client, ids, k=4, n_pages=2, id_prefix="fan"), client.stats

    pages, stats = run(main())
    page_ms, call_ms = pages.page_ms, pages.call_ms
    assert page_ms.shape == (2,) and call_ms.shape == (2, 4) and pages.k == 4
    assert (page_ms >= call_ms.max(axis=1)).all()
    # round-robin primaries over the 8 calls in order, and the seeded ids the stall choice reads
    assert pages.primary.tolist() == [[0, 1, 0, 1], [0, 1, 0, 1]]
    assert pages.request_ids[1, 2] == "fan-1-2"
    # the 4 calls whose primary is the stalled replica are hedged; the others only if slow here
    assert stats.requests == 8 and 4 <= stats.hedges <= 8 and stats.hedge_wins >= 4


def test_run_hedged_load_records_each_request_in_order_with_its_primary(slow_and_fast_replicas, ids):
    from course_lib.measure.experiments import run_hedged_load
    from course_lib.serving.hedging import hedging_summary

    slow, fast = slow_and_fast_replicas
    requests, stats = run(
        run_hedged_load(
            [slow.url, fast.url],
            ids,
            hedge_after_ms=30.0,
            n_requests=8,
            rate_rps=200,
            seed=1,
            id_prefix="load",
        )
    )
    assert requests["request_id"].tolist() == list(range(8))
    assert requests["ok"].all() and (requests["winner"] == 1).all()
    assert requests["primary"].tolist() == [0, 1] * 4
    assert requests.loc[requests["primary"] == 0, "hedged"].all()
    summary = hedging_summary(requests, stats)
    assert summary["errors"] == 0 and summary["p50"] <= summary["p99"] <= summary["p99.9"]
    assert summary["extra_requests"] == stats.hedges / 8 >= 0.5


# -- over HTTP, real servers that shed load with a 503 --------------------------------------------------
def _score_app(status: int):
    """A real ASGI app whose ``POST /score`` answers ``status``: 503 with ``Retry-After`` as an
    overloaded server sheds a request, 200 with a score otherwise."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def score(request):
        customer_id = (await request.json())["customer_id"]
        if status == 200:
            return JSONResponse({"customer_id": customer_id, "churn_probability": 0.25})
        return JSONResponse(
            {"error": "overloaded", "message": "queue full, try again"},
            status_code=status,
            headers={"retry-after": "1"},
        )

    return Starlette(routes=[Route("/score", score, methods=["POST"])])


@pytest.fixture(scope="module")
def shedding_servers():
    from course_lib.serving.server import serve_in_thread

    with (
        serve_in_thread(_score_app(503), max_lifetime_s=120) as shed_a,
        serve_in_thread(_score_app(503), max_lifetime_s=120) as shed_b,
        serve_in_thread(_score_app(200), max_lifetime_s=120) as ok,
    ):
        yield shed_a.url, shed_b.url, ok.url


def test_a_hedged_request_every_replica_sheds_counts_as_shed_not_as_an_error(shedding_servers):
    from course_lib.measure.experiments import run_hedged_load
    from course_lib.serving.hedging import hedging_summary
    from course_lib.serving.service import HttpStatusError

    shed_a, shed_b, _ = shedding_servers

    async def one():
        async with HedgingClient([shed_a, shed_b], hedge_after_ms=50.0) as client:
            return await client.score("SC-0000001", request_id="one")

    with pytest.raises(HttpStatusError, match=r"replica \d answered HTTP 503 \(Retry-After: 1\)") as err:
        run(one())
    assert err.value.shed and err.value.retry_after == "1"

    requests, stats = run(
        run_hedged_load(
            [shed_a, shed_b], ["SC-0000001"], hedge_after_ms=50.0, n_requests=6, rate_rps=100, seed=0
        )
    )
    assert requests["outcome"].tolist() == ["shed"] * 6
    summary = hedging_summary(requests, stats)
    assert (summary["shed"], summary["errors"]) == (6, 0)
    assert np.isnan(summary["p99"])  # no request was answered
    # each primary was shed at once, so its hedge went at once and was shed too
    assert (stats.sent, stats.hedges, stats.failed_calls, stats.shed_calls) == (12, 6, 12, 12)


def test_a_request_shed_by_its_primary_is_answered_by_the_hedge_at_once(shedding_servers):
    from course_lib.measure.experiments import run_hedged_load
    from course_lib.serving.hedging import hedging_summary

    shed, _, ok = shedding_servers
    # a hedge delay far beyond the load generator's 5 s request timeout: a request that waited for it
    # would end as a timeout, so "ok" means the shed answer triggered the hedge without waiting
    requests, stats = run(
        run_hedged_load(
            [shed, ok], ["SC-0000001"], hedge_after_ms=60_000.0, n_requests=6, rate_rps=100, seed=0
        )
    )
    assert requests["outcome"].tolist() == ["ok"] * 6
    assert requests["primary"].tolist() == [0, 1] * 3
    assert requests.loc[requests["primary"] == 0, "hedged"].all() and (requests["winner"] == 1).all()
    assert not requests.loc[requests["primary"] == 1, "hedged"].any()
    assert (stats.hedges, stats.shed_calls, stats.hedge_wins) == (3, 3, 3)
    assert (hedging_summary(requests, stats)["shed"], hedging_summary(requests, stats)["errors"]) == (0, 0)


def test_fanout_pages_stop_at_their_time_budget_with_at_least_one_page(slow_and_fast_replicas, ids):
    slow, fast = slow_and_fast_replicas

    async def main(budget_s):
        async with HedgingClient([slow.url, fast.url], hedge_after_ms=20.0) as client:
            return await fanout_pages(client, ids, k=2, n_pages=50, id_prefix="budget", budget_s=budget_s)

    # a budget far below one page: only the first page starts, and every array holds that page only
    pages = run(main(1e-9))
    assert pages.page_ms.shape == (1,) and pages.call_ms.shape == (1, 2) and pages.request_ids.shape == (1, 2)
    assert pages.request_ids[0, 1] == "budget-0-1" and pages.primary.shape == (1, 2)
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises((ValueError, TypeError), match="budget_s"):
            run(main(bad))


@pytest.mark.parametrize("answering", [0, 1])
def test_the_hardened_hedged_gives_the_core_s_answer_on_the_same_fake_replicas(answering):
    """Same vectors: a primary answering within the delay (0), or a stalled primary and a hedge that answers (1)."""
    from course_lib.serving.hedging import hedged_call_core

    async def both():
        out = []
        for use_core in (True, False):
            fake = FakeReplicas(2)
            fake.release[answering].set()
            if use_core:
                value, replica = await hedged_call_core(
                    fake.call, 0, 1, hedge_after_s=0.0 if answering else 30.0
                )
            else:
                r = await hedged(fake.call, [0, 1], hedge_after_s=0.0 if answering else 30.0)
                value, replica = r.value, r.replica
            await asyncio.sleep(0)  # let a cancelled loser record its cancellation
            out.append((value, replica, fake.calls, fake.cancelled))
        return out

    core, hardened = run(both())
    assert core == hardened
    assert core[:2] == (f"answer from {answering}", answering)
    assert core[3] == ([0] if answering else [])  # the stalled primary lost and was cancelled


def test_hedged_call_core_refuses_a_negative_delay():
    from course_lib.serving.hedging import hedged_call_core

    with pytest.raises(ValueError, match="hedge_after_s"):
        run(hedged_call_core(FakeReplicas(2).call, 0, 1, hedge_after_s=-1.0))
