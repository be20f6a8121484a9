"""Open-loop load generator: bounded, records every request, turns failures into rows, never hangs."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pandas as pd
import pytest

from course_lib.measure.batching_gain import capacity_table
from course_lib.measure.ladder import SloRule, climb_async, open_loop_runs, sustainable_rate
from course_lib.measure.loadgen import SPIN_WINDOW_S, outcome_of, run_open_loop
from course_lib.measure.targets import batcher_target, coroutine_target
from course_lib.serving.batching.batcher import DynamicBatcher
from course_lib.serving.service import HttpStatusError
from course_lib.simulate.traffic import poisson_arrivals_ms


def in_process_climb(targets, rates_rps, *, p99_limit_ms, retries=1, **run_kwargs):
    """The in-process sweep of Lesson 3: the targets taking turns, no error allowed, a hiccup retried."""
    runs = open_loop_runs(targets, request_timeout_s=max(0.5, 5 * p99_limit_ms / 1000), **run_kwargs)
    return climb_async(
        runs, list(targets), rates_rps, rule=SloRule.without_errors(p99_limit_ms), retries=retries
    )


def run(coro, timeout_s: float = 20.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def instant(i):
    await asyncio.sleep(0)
    return {"echo": i}


def test_every_scheduled_request_is_sent_once_and_recorded():
    result = run(run_open_loop(instant, rate_rps=2000.0, n_requests=200, max_duration_s=10.0, seed=3))
    req = result.requests
    assert req["request_id"].tolist() == list(range(200))
    assert req["ok"].all()
    assert (req["echo"] == req["request_id"]).all()
    assert (req["latency_ms"] >= 0).all()
    summary = result.summary()
    assert (summary["sent"], summary["ok"], summary["errors"]) == (200, 200, 0)


def test_no_request_leaves_before_its_intended_send_time():
    # Timer alone, or the coarse timer stopping SPIN_WINDOW_S early and the loop then yielding until
    # the exact instant: the send lag is never negative (early sends would flatter the latencies).
    for spin_s in (0.0, SPIN_WINDOW_S):
        result = run(
            run_open_loop(
                instant, rate_rps=2000.0, n_requests=300, max_duration_s=10.0, seed=5, spin_s=spin_s
            )
        )
        assert len(result.requests) == 300
        assert (result.requests["lag_ms"] >= 0).all()
    with pytest.raises(ValueError, match="spin_s"):
        run(run_open_loop(instant, rate_rps=10.0, n_requests=1, max_duration_s=1.0, spin_s=-0.001))


def test_the_schedule_is_poisson_from_the_seed_and_starts_at_zero():
    result = run(run_open_loop(instant, rate_rps=500.0, n_requests=50, max_duration_s=10.0, seed=11))
    expected = poisson_arrivals_ms(500.0, 50, 11)
    offsets = result.requests["scheduled_ms"].to_numpy()
    np.testing.assert_allclose(offsets - offsets[0], expected - expected[0], atol=1e-6)


def test_max_duration_bounds_the_run_before_the_count_does():
    result = run(run_open_loop(instant, rate_rps=100.0, n_requests=100_000, max_duration_s=0.3, seed=0))
    assert 0 < len(result.requests) < 100
    assert result.planned == 100_000
    assert result.requests["scheduled_ms"].max() <= 300.0 + 1.0


def test_failures_and_timeouts_become_error_rows_not_exceptions():
    async def flaky(i):
        if i == 0:
            await asyncio.Event().wait()  # never answers: only the request timeout ends it
        if i % 2:
            raise ConnectionError(f"refused {i}")
        return None

    result = run(
        run_open_loop(
            flaky, rate_rps=1000.0, n_requests=10, max_duration_s=5.0, seed=1, request_timeout_s=0.05
        )
    )
    req = result.requests.set_index("request_id")
    assert req.loc[0, "error"].startswith("TimeoutError: no answer within 0.05 s")
    assert req.loc[1, "error"] == "ConnectionError: refused 1"
    assert req.loc[2, "ok"]
    assert np.isnan(req.loc[1, "latency_ms"])
    assert result.summary()["errors"] == 6


def test_coroutine_target_records_how_the_batcher_served_each_request():
    async def main():
        async with DynamicBatcher(
            lambda xs: [x + 1 for x in xs], max_batch_size=16, max_queue_delay_ms=1.0, run_in_thread=False
        ) as batcher:
            send = coroutine_target(
                batcher.submit, list(range(10)), fields=("value", "batch_size", "queue_wait_ms")
            )
            return await run_open_loop(send, rate_rps=2000.0, n_requests=100, max_duration_s=5.0, seed=2)

    result = run(main())
    req = result.requests
    assert (req["value"] == req["request_id"] % 10 + 1).all()
    assert req["batch_size"].between(1, 16).all()
    summary = result.summary()
    assert 1 <= summary["mean_batch_size"] <= 16
    assert summary["p99_queue_wait_ms"] >= 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate_rps": 0.0}, "rate_rps must be a finite number > 0"),
        ({"max_duration_s": float("inf")}, "max_duration_s must be a finite number > 0"),
        ({"n_requests": 0}, "n_requests must be an integer >= 1, got 0"),
        ({"request_timeout_s": -1.0}, "request_timeout_s must be a finite number > 0"),
    ],
)
def test_bad_load_parameters_are_rejected(kwargs, message):
    params = {"rate_rps": 10.0, "n_requests": 10, "max_duration_s": 1.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        run(run_open_loop(instant, **params))


def test_targets_need_at_least_one_payload():
    with pytest.raises(ValueError, match="items must be non-empty"):
        coroutine_target(instant, [])


def test_sustainable_rate_is_the_highest_rate_that_kept_up_within_the_p99_limit():
    table = pd.DataFrame(
        {
            "offered_rps": [100.0, 200.0, 400.0, 800.0],
            "achieved_rps": [100.0, 199.0, 395.0, 500.0],
            "errors": [0, 0, 0, 0],
            "p99_ms": [5.0, 8.0, 19.0, 900.0],
        }
    )
    assert sustainable_rate(table, p99_limit_ms=20.0) == 400.0
    assert sustainable_rate(table, p99_limit_ms=6.0) == 100.0
    assert sustainable_rate(table, p99_limit_ms=1.0) == 0.0
    with_errors = table.assign(errors=[0, 0, 3, 0])
    assert sustainable_rate(with_errors, p99_limit_ms=20.0) == 200.0


def test_sustainable_rate_reads_simulator_sweeps_too():
    table = pd.DataFrame(
        {"offered_rps": [100.0, 200.0], "throughput_rps": [100.0, 150.0], "p99_ms": [1.0, 2.0]}
    )
    assert sustainable_rate(table, p99_limit_ms=10.0, achieved_column="throughput_rps") == 100.0
    with pytest.raises(ValueError, match="missing columns \\['achieved_rps'\\]"):
        sustainable_rate(table, p99_limit_ms=10.0)


def test_the_climb_goes_up_the_ladder_side_by_side_and_drops_a_target_at_its_first_miss():
    lock = asyncio.Lock()

    async def serial_40ms(i):  # one request at a time, 40 ms each: about 25 requests/s at most
        async with lock:
            await asyncio.sleep(0.04)

    @contextlib.asynccontextmanager
    async def fast_factory():
        yield instant

    @contextlib.asynccontextmanager
    async def slow_factory():
        yield serial_40ms

    sweep = run(
        in_process_climb(
            {"fast": fast_factory, "slow": slow_factory},
            [160.0, 10.0, 80.0],
            p99_limit_ms=300.0,
            duration_s=0.5,
            seed=5,
            warmup_requests=2,
        ),
        timeout_s=60.0,
    )
    assert sweep["rate_rps"].tolist()[:4] == [10.0, 10.0, 80.0, 80.0]  # ascending, targets taking turns
    assert sweep["target"].tolist()[:4] == ["fast", "slow", "fast", "slow"]
    fast = sweep[sweep["target"] == "fast"]
    slow = sweep[sweep["target"] == "slow"]
    assert fast["met_slo"].all() and len(fast) == 3
    # 80 requests/s overloads it (half its requests are still queued at the end: no retry); 160 is never tried
    assert slow["met_slo"].tolist() == [True, False]
    table = capacity_table(sweep, baseline="slow")
    assert table.loc["slow", "first_failed_rps"] == 80.0
    assert table.loc["fast", "gain"] == pytest.approx(
        table.loc["fast", "sustained_rps"] / table.loc["slow", "sustained_rps"]
    )


def _sweep_rows(rows):
    columns = ["target", "rate_rps", "offered_rps", "achieved_rps", "p99_ms", "mean_batch_size", "met_slo"]
    return pd.DataFrame(rows, columns=columns)


def test_capacity_table_reports_the_highest_rung_met_and_the_gain():
    sweep = _sweep_rows(
        [
            ("one", 50.0, 49.0, 49.0, 20.0, 1.0, True),
            ("many", 50.0, 49.0, 49.0, 22.0, 1.5, True),
            ("one", 100.0, 101.0, 80.0, 900.0, 1.0, False),
            ("many", 100.0, 101.0, 100.0, 30.0, 3.0, True),
            ("many", 200.0, 198.0, 150.0, 700.0, 9.0, False),
        ]
    )
    table = capacity_table(sweep, baseline="one")
    assert table.loc["many", "sustained_rps"] == 100.0  # the rung, not the realised Poisson rate
    assert table.loc["many", "offered_rps"] == 101.0
    assert table.loc["many", "first_failed_rps"] == 200.0
    assert table.loc["many", "mean_batch_size"] == 3.0
    assert table.loc["many", "gain"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"baseline must be one of .*, got 'none'"):
        capacity_table(sweep, baseline="none")


def test_capacity_table_gain_is_nan_when_the_baseline_never_met_the_slo():
    sweep = _sweep_rows(
        [("one", 50.0, 49.0, 10.0, 900.0, 1.0, False), ("many", 50.0, 49.0, 49.0, 9.0, 2.0, True)]
    )
    table = capacity_table(sweep, baseline="one")
    assert table.loc["one", "sustained_rps"] == 0.0
    assert np.isnan(table.loc["many", "gain"])


def test_capacity_table_divides_by_the_best_of_several_baselines():
    sweep = _sweep_rows(
        [
            ("thread", 50.0, 49.0, 10.0, 900.0, 1.0, False),
            ("loop", 50.0, 49.0, 49.0, 30.0, 1.0, True),
            ("many", 50.0, 49.0, 49.0, 9.0, 2.0, True),
            ("loop", 100.0, 99.0, 60.0, 900.0, 1.0, False),
            ("many", 100.0, 99.0, 99.0, 9.0, 2.0, True),
        ]
    )
    table = capacity_table(sweep, baseline=["thread", "loop"])
    assert table.attrs["baseline"] == "loop"
    assert table["gain"].to_dict() == {"thread": 0.0, "loop": 1.0, "many": 2.0}
    with pytest.raises(ValueError, match=r"baseline must be one of .*, got 'none'"):
        capacity_table(sweep, baseline=["loop", "none"])
    with pytest.raises(ValueError, match="baseline must be non-empty"):
        capacity_table(sweep, baseline=[])


def test_batcher_target_checks_the_knobs_before_any_run():
    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1, got 0"):
        batcher_target(lambda xs: xs, [1], max_batch_size=0, max_queue_delay_ms=0.0)


def test_a_p99_miss_that_kept_up_is_retried_and_does_not_end_the_climb():
    entries = []

    @contextlib.asynccontextmanager
    async def hiccup_once():
        entries.append(1)
        hiccup = len(entries) == 2  # the first try at the second rate
        calls = []

        async def send(i):
            calls.append(i)
            if hiccup and len(calls) == 5:  # one slow answer early in the measured run
                await asyncio.sleep(0.4)

        yield send

    sweep = run(
        in_process_climb(
            {"hiccup": hiccup_once}, [20.0, 40.0, 60.0], p99_limit_ms=300.0, duration_s=1.0, warmup_requests=3
        )
    )
    assert sweep["rate_rps"].tolist() == [20.0, 40.0, 40.0, 60.0]
    assert sweep["attempt"].tolist() == [1, 1, 2, 1]
    assert sweep["met_slo"].tolist() == [True, False, True, True]
    table = capacity_table(sweep, baseline="hiccup")
    assert np.isnan(table.loc["hiccup", "first_failed_rps"])
    assert table.loc["hiccup", "sustained_rps"] == 60.0


def test_errors_end_the_climb_without_a_retry():
    @contextlib.asynccontextmanager
    async def refusing():
        async def send(i):
            raise ConnectionRefusedError("down")

        yield send

    sweep = run(
        in_process_climb(
            {"down": refusing}, [20.0, 40.0], p99_limit_ms=300.0, duration_s=0.2, warmup_requests=0
        )
    )
    assert sweep["attempt"].tolist() == [1]
    assert not sweep["met_slo"].any()


def test_negative_retries_are_rejected():
    @contextlib.asynccontextmanager
    async def factory():
        yield instant

    with pytest.raises(ValueError, match="retries must be an integer >= 0, got -1"):
        run(in_process_climb({"a": factory}, [10.0], p99_limit_ms=10.0, duration_s=0.1, retries=-1))


@pytest.mark.parametrize(
    ("status", "outcome"), [(503, "shed"), (429, "shed"), (500, "error"), (404, "error")]
)
def test_a_non_2xx_answer_is_shed_only_for_429_and_503(status, outcome):
    err = HttpStatusError(status, "queue full", retry_after="1", where="replica 0")
    assert err.shed is (outcome == "shed") and err.status == status
    assert outcome_of(err) == outcome
    assert str(err) == f"replica 0 answered HTTP {status} (Retry-After: 1): queue full"
    assert outcome_of(TimeoutError()) == "timeout" and outcome_of(ConnectionError()) == "error"


def test_a_shed_answer_keeps_its_latency_and_is_counted_as_shed():
    async def send(i):
        if i % 2:
            raise HttpStatusError(503, "full", retry_after="1")
        return {}

    result = run(run_open_loop(send, rate_rps=500, n_requests=10, max_duration_s=5, seed=0))
    frame = result.requests.sort_values("request_id")
    assert frame["outcome"].tolist() == ["ok", "shed"] * 5
    assert frame["latency_ms"].notna().all()  # the time it took to be refused
    summary = result.summary()
    assert (summary["ok"], summary["shed"], summary["other_errors"]) == (5, 5, 0)


def test_the_hardened_generator_keeps_the_core_s_schedule_and_latency_accounting():
    """Same schedule for both: sends in order, none waits for an answer, latency from the intended time.

    Every answer is held until the last request has been sent, so request 0 cannot be answered before the
    last intended send time: from its intended time its latency is at least the schedule's span.
    """
    from course_lib.measure.loadgen import open_loop_core

    schedule_ms = np.array([0.0, 2.0, 4.0, 6.0, 8.0, 10.0])

    async def one(use_core: bool):
        order, last_sent = [], asyncio.Event()

        async def send(i):
            order.append(i)
            if i == len(schedule_ms) - 1:
                last_sent.set()
            await last_sent.wait()  # a closed loop would deadlock here

        if use_core:
            latency = await open_loop_core(send, schedule_ms / 1000)
        else:
            result = await run_open_loop(
                send, rate_rps=100.0, n_requests=len(schedule_ms), max_duration_s=1.0, schedule_ms=schedule_ms
            )
            latency = result.requests["latency_ms"].to_numpy()
        return order, latency

    for use_core in (True, False):
        order, latency = asyncio.run(one(use_core))
        assert order == list(range(len(schedule_ms)))
        assert latency.shape == schedule_ms.shape and np.isfinite(latency).all()
        assert latency[0] >= schedule_ms[-1] - schedule_ms[0] - 1.0  # 1 ms: the loop's clock may wake early


def test_open_loop_core_refuses_negative_send_times():
    from course_lib.measure.loadgen import open_loop_core

    async def send(i):
        return None

    with pytest.raises(ValueError, match="send_times_s"):
        asyncio.run(open_loop_core(send, [0.0, -1.0]))
