"""Lesson 6 mechanisms with fake targets and exact vectors: no timing thresholds anywhere."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hdrh.histogram import HdrHistogram

from course_lib.core.checks import InvalidArgumentError
from course_lib.core.percentiles import percentile
from course_lib.measure.coordinated_omission import (
    StallingTarget,
    corrected_latencies,
    run_closed_loop,
    stall_vector,
)
from course_lib.measure.generators import (
    GeneratorPool,
    generator_limit,
    generator_limit_text,
    merge_results,
    serve_null,
)
from course_lib.measure.histograms import (
    hdr_from_samples,
    hdr_percentile_ms,
    merge_encoded,
    merge_vector,
    worker_samples_vector,
)
from course_lib.measure.knee import knees_beside_generator, recovery_time_s, rolling_p99
from course_lib.measure.ladder import SloRule, climb, knees, step_row, step_table
from course_lib.measure.load_tools.locust import bucket_response_time_ms, locust_percentile
from course_lib.measure.loadgen import LoadResult, run_open_loop
from course_lib.measure.source_loadtest import source_load_test, source_percentile
from course_lib.serving.service import HttpStatusError
from course_lib.simulate.traffic import spike_schedule


def run(coro, timeout_s: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


# -- coordinated omission ---------------------------------------------------------------------------
def test_the_coordinated_omission_vector_of_the_issue():
    table = stall_vector()  # 1 user, every 1 ms, 10 s, 5 s freeze in the middle
    closed = table.loc["closed loop"]
    assert closed["requests"] == 5000
    assert (closed["p50"], closed["p99"]) == (1.0, 1.0)  # the freeze is one sample out of 5,000
    for name in ("closed loop, corrected", "open loop (intended send time)"):
        row = table.loc[name]
        assert (row["p50"], row["p75"], row["p90"], row["p99"]) == (1.0, 2501.0, 4001.0, 4901.0)


def test_correction_follows_hdrhistogram_java_and_differs_from_the_python_port_only_below_the_interval():
    lat = np.array([1.0, 3.0, 7.0, 2.0, 12.0])
    ours = corrected_latencies(lat, 2.0)
    # Java recordValueWithExpectedInterval: v, then v - i, v - 2i, ... while >= i
    assert ours.tolist() == [1.0, 3.0, 7.0, 5.0, 3.0, 2.0, 12.0, 10.0, 8.0, 6.0, 4.0, 2.0]
    hist = HdrHistogram(1, 1000, 3)
    for v in lat:
        hist.record_corrected_value(int(v), 2)
    theirs = [
        v.value_iterated_to for v in hist.get_recorded_iterator() for _ in range(v.count_at_value_iterated_to)
    ]
    # the Python port (hdrh) also records the remainder below the interval (3 -> 1, 7 -> 1)
    assert sorted(theirs) == sorted([*ours.tolist(), 1.0, 1.0])
    with pytest.raises(ValueError, match="expected_interval_ms must be a finite number > 0"):
        corrected_latencies(lat, 0.0)


def test_closed_loop_never_has_more_than_its_users_in_flight_and_records_every_request():
    in_flight = peak = 0

    async def target(i):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        in_flight -= 1
        if i % 7 == 3:
            raise HttpStatusError(503, "queue full")

    result = run(run_closed_loop(target, users=3, duration_s=0.2))
    s = result.summary()
    assert peak <= 3
    assert s["sent"] == s["ok"] + s["shed"] + s["timeouts"] + s["other_errors"] == len(result.requests)
    assert s["shed"] == int((result.requests["request_id"] % 7 == 3).sum()) > 0
    assert set(result.requests["user"]) == {0, 1, 2}


def test_a_stalling_target_delays_requests_only_inside_its_stall():
    target = StallingTarget(service_ms=1.0, stall_start_s=100.0, stall_s=1.0)  # stall never reached
    result = run(run_closed_loop(target, users=1, duration_s=0.05))
    assert result.summary()["errors"] == 0 and target.calls == len(result.requests)


# -- count in = count out, outcomes, generator honesty -------------------------------------------
def test_every_request_ends_as_exactly_one_outcome():
    async def target(i):
        if i % 4 == 1:
            raise HttpStatusError(503, "full")
        if i % 4 == 2:
            raise HttpStatusError(429, "slow down")
        if i % 4 == 3:
            raise ConnectionResetError("reset")
        if i == 8:
            await asyncio.sleep(30)
        return None

    result = run(
        run_open_loop(target, rate_rps=5000, n_requests=40, max_duration_s=5.0, request_timeout_s=0.2, seed=4)
    )
    s = result.summary()
    assert (s["sent"], s["shed"], s["other_errors"], s["timeouts"], s["ok"]) == (40, 20, 10, 1, 9)
    shed = result.requests[result.requests["outcome"] == "shed"]
    assert shed["latency_ms"].notna().all()  # the time it took to be refused is kept


def test_an_explicit_schedule_is_followed_and_validated():
    async def instant(i):
        return None

    schedule = np.array([0.0, 1.0, 1.0, 5.0])
    result = run(
        run_open_loop(instant, rate_rps=1.0, n_requests=10, max_duration_s=1.0, schedule_ms=schedule)
    )
    assert len(result.requests) == 4
    np.testing.assert_allclose(
        result.requests["scheduled_ms"] - result.requests["scheduled_ms"][0], schedule, atol=1e-6
    )
    with pytest.raises(ValueError, match="non-decreasing"):
        run(run_open_loop(instant, rate_rps=1.0, n_requests=10, max_duration_s=1.0, schedule_ms=[3.0, 1.0]))


def _fake_result(latencies, lags=None, outcomes=None, gap_ms=10.0, rate=100.0) -> LoadResult:
    n = len(latencies)
    outcomes = outcomes or ["ok"] * n
    frame = pd.DataFrame(
        {
            "request_id": range(n),
            "scheduled_ms": np.arange(n) * gap_ms,
            "lag_ms": lags if lags is not None else np.zeros(n),
            "latency_ms": [
                lat if o in ("ok", "shed") else np.nan for lat, o in zip(latencies, outcomes, strict=True)
            ],
            "ok": [o == "ok" for o in outcomes],
            "outcome": outcomes,
            "error": ["" if o == "ok" else o for o in outcomes],
        }
    )
    return LoadResult(requests=frame, rate_rps=rate, planned=n, wall_s=n * gap_ms / 1000)


def test_a_run_whose_send_lag_exceeds_the_bound_is_flagged():
    lags = np.zeros(100)
    assert _fake_result(np.ones(100), lags).summary()["generator_ok"]
    lags[-2:] = 5.0  # the generator sent 2% of its requests 5 ms late
    s = _fake_result(np.ones(100), lags).summary()
    assert (s["lag_p99_ms"], s["generator_ok"]) == (5.0, False)
    assert (
        s["generator_ok"] is False
        and step_row(_fake_result(np.ones(100), lags), p99_limit_ms=10)["generator_ok"] is False
    )


def test_a_missing_row_is_reported_as_count_in_not_equal_count_out():
    result = _fake_result(np.ones(10))
    broken = LoadResult(requests=result.requests.drop(index=4), rate_rps=1.0, planned=10, wall_s=1.0)
    with pytest.raises(ValueError, match="count in != count out"):
        broken.summary()


# -- knee and spike -------------------------------------------------------------------------------
def test_step_rows_and_the_knee():
    good = _fake_result(np.r_[np.ones(99), 8.0], rate=100.0)
    slow = _fake_result(np.r_[np.ones(90), np.full(10, 80.0)], rate=200.0)
    shedding = _fake_result(np.ones(1000), outcomes=["ok"] * 998 + ["shed"] * 2, gap_ms=1.0, rate=400.0)
    table = step_table([good, slow, shedding], p99_limit_ms=10.0)
    assert table["met_slo"].tolist() == [True, False, False]
    assert table.loc[2, "shed_rate"] == 0.002 and table.loc[2, "error_rate"] == 0.002  # over the 0.1% budget
    assert table.loc[0, "p99.9_ms"] == 8.0
    # goodput: the rate of answers (as achieved_rps measures it) x the fraction within the limit
    assert table.loc[1, "goodput_rps"] == pytest.approx(table.loc[1, "achieved_rps"] * 90 / 100)
    assert (table["goodput_rps"] <= table["achieved_rps"]).all()
    knee = knees(table).iloc[0]
    assert (knee["knee_rps"], knee["first_fail_rps"], knee["generator_ok"]) == (100.0, 200.0, True)
    assert knee["offered_rps"] == table.loc[0, "offered_rps"]  # what the run at the knee measured
    assert knees(table.iloc[1:]).iloc[0]["knee_rps"] == 0.0


def test_climb_stops_at_the_first_miss_and_settles_before_every_step():
    settled, results = [], []
    runs = {50.0: _fake_result(np.ones(100), rate=50.0), 100.0: _fake_result(np.full(100, 99.0), rate=100.0)}
    table = climb(
        lambda _, rate: runs[rate], ["server"], [100.0, 50.0, 400.0], rule=SloRule(10.0), retries=0,
        settle=settled.append, results=results,
    )  # fmt: skip
    assert table["rate_rps"].tolist() == [50.0, 100.0] and settled == ["server"] * 2 and len(results) == 2
    assert results[1] is runs[100.0] and table["met_slo"].tolist() == [True, False]


def test_a_climb_that_starts_above_the_knee_steps_down_until_a_rate_meets():
    fast, slow = np.ones(100), np.full(100, 99.0)
    runs = {r: _fake_result(fast if r <= 30.0 else slow, rate=r) for r in (20.0, 30.0, 40.0, 60.0)}
    tried = []

    def step(_, rate):
        tried.append(rate)
        return runs[rate]

    once = {"rule": SloRule(10.0), "retries": 0, "step_down": True}
    table = climb(step, ["s"], [20.0, 30.0, 40.0, 60.0, 80.0], start_rps={"s": 60.0}, **once)
    assert tried == [60.0, 40.0, 30.0]  # highest first, stops at the first that meets, never above the start
    knee = knees(table).iloc[0]
    assert knee["knee_rps"] == 30.0 and knee["first_fail_rps"] == 40.0
    tried.clear()
    climb(step, ["s"], [20.0, 30.0, 40.0], start_rps={"s": 30.0}, **once)
    assert tried == [30.0, 40.0]  # the first rate met: nothing lower is tried


def test_spike_schedule_has_three_phases_at_their_rates():
    t = spike_schedule(base_rps=100, spike_rps=1000, before_s=2, spike_s=1, after_s=2, seed=1)
    assert (np.diff(t) >= 0).all() and t[-1] < 5000
    counts = [((t >= a) & (t < b)).sum() for a, b in ((0, 2000), (2000, 3000), (3000, 5000))]
    assert 140 < counts[0] < 260 and 850 < counts[1] < 1150 and 140 < counts[2] < 260  # Poisson, +-5 sd


def test_rolling_p99_and_recovery_time():
    lat = np.ones(300)
    lat[100:150] = 500.0  # slow from 1.0 s to 1.5 s of intended send time
    outcomes = ["ok"] * 300
    outcomes[120] = "timeout"
    frame = _fake_result(lat, outcomes=outcomes).requests
    rolling = rolling_p99(frame, window_ms=200.0, step_ms=100.0)
    assert rolling.loc[rolling["t_ms"] == 1300.0, "p99_ms"].item() == np.inf  # the failed request
    assert rolling.loc[rolling["t_ms"] == 1000.0, "p99_ms"].item() == 1.0
    # the last slow request was intended at 1.49 s; windows of 200 ms clear it from 1.7 s on
    assert recovery_time_s(rolling, spike_end_ms=1500.0, p99_limit_ms=10.0) == pytest.approx(0.2)
    assert recovery_time_s(rolling, spike_end_ms=2000.0, p99_limit_ms=10.0) == 0.0


# -- merging across generator processes -----------------------------------------------------------
def test_merge_versus_average_vector():
    table = merge_vector(worker_samples_vector(), q=99)
    assert table.loc["A", "p99_ms"] == 100.0
    assert table.loc[["B", "C", "D"], "p99_ms"].tolist() == [1.0, 1.0, 1.0]
    assert table.loc["mean of worker p99", "p99_ms"] == 25.75
    assert table.loc["all samples merged", ["requests", "p99_ms"]].tolist() == [10_300, 100.0]
    hdr = table.loc["HdrHistograms added"]
    assert hdr["requests"] == 10_300 and hdr["p99_ms"] == pytest.approx(100.0, rel=1e-3)


def test_hdr_histograms_shipped_between_processes_add_up():
    rng = np.random.default_rng(0)
    parts = [rng.exponential(5.0, size=n) for n in (3000, 500, 20)]
    total = merge_encoded(hdr_from_samples(p).encode() for p in parts)
    merged = np.concatenate(parts)
    assert total.get_total_count() == len(merged)
    ordered = np.sort(merged)
    for q in (50, 90, 99, 99.9):
        rank = max(1, int(q * len(merged) / 100 + 0.5))  # HdrHistogram's rank rule
        assert hdr_percentile_ms(total, q) == pytest.approx(ordered[rank - 1], rel=1e-3, abs=1e-3)


def test_merge_results_keeps_every_sample_and_renumbers():
    a = _fake_result(np.ones(5)).requests
    b = _fake_result(np.full(3, 2.0), gap_ms=7.0).requests
    merged = merge_results([a, b], rate_rps=10.0, planned=8, wall_s=1.0)
    req = merged.requests
    assert req["request_id"].tolist() == list(range(8))
    assert (np.diff(req["scheduled_ms"]) >= 0).all()
    assert sorted(req["generator"].tolist()) == [0] * 5 + [1] * 3
    assert merged.summary()["sent"] == 8


def test_generator_processes_against_a_null_server_lose_nothing():
    with serve_null(lifetime_s=60) as url, GeneratorPool(2) as pool:
        result = pool.run(url, [{}], rate_rps=200.0, duration_s=0.5, seed=3)
        s = result.summary()
        assert s["sent"] == s["ok"] == len(result.requests) > 0
        assert set(result.requests["generator"]) == {0, 1}
        assert (result.requests["lag_ms"] >= 0).all()  # never early; lateness is counted, not dropped
        with pytest.raises(ValueError, match="warm_connections"):
            pool.run(url, [{}], rate_rps=10.0, duration_s=0.1, warm_connections=-1)
        spike = spike_schedule(base_rps=100, spike_rps=300, before_s=0.2, spike_s=0.2, after_s=0.2, seed=2)
        shaped = pool.run(url, [{}], rate_rps=100.0, duration_s=1.0, schedule_ms=spike)
        assert shaped.summary()["sent"] == len(spike)
        np.testing.assert_allclose(np.sort(shaped.requests["scheduled_ms"]) - spike, 0.0, atol=50.0)
        limit, table = generator_limit(pool, url, [50.0], duration_s=0.3, min_requests=20)
        assert 1 <= len(table) <= 2 and limit in (0.0, 50.0) and (table["errors"] == 0).all()


# -- source 004 -------------------------------------------------------------------------------------
def test_source_percentile_is_one_rank_high_and_its_concurrency_is_not_bounded():
    lat = list(range(1, 101))  # 1..100 ms
    assert source_percentile(lat, 99) == 100 and percentile(lat, 99) == 99
    assert source_percentile(lat, 95) == 96 and percentile(lat, 95) == 95
    with pytest.raises(IndexError):
        source_percentile(lat, 100)

    async def target(i):
        await asyncio.sleep(0.001)

    unbounded = run(source_load_test(target, num_requests=200, concurrent=10))
    bounded = run(source_load_test(target, num_requests=200, concurrent=10, bounded=True))
    assert unbounded["max_in_flight"] == 200 and bounded["max_in_flight"] == 10
    assert len(unbounded["latencies_ms"]) == 200 and unbounded["errors"] == 0


# -- Locust's bucketing, checked against Locust's own code ----------------------------------------
LOCUST_VALUES = [
    0.4,
    0.5,
    1.5,
    2.5,
    99.4,
    99.5,
    104.9,
    105.0,
    115.0,
    995.0,
    996.0,
    1049.0,
    1050.0,
    9950.0,
    12500.0,
]


def _locust_reference(values, samples, qs):
    """Locust's own functions, in a subprocess (importing locust monkey-patches the interpreter)."""
    code = (
        "import json, sys\n"
        "from collections import Counter\n"
        "from locust.stats import bucket_response_time, calculate_response_time_percentile\n"
        "values, samples, qs = json.loads(sys.stdin.read())\n"
        "counts = Counter(bucket_response_time(s) for s in samples)\n"
        "print(json.dumps([[bucket_response_time(v) for v in values],"
        " [calculate_response_time_percentile(counts, len(samples), q / 100) for q in qs]]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([values, samples, qs]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_locust_bucketing_and_percentiles_match_locust():
    samples = [0.4] * 98 + [996.0] * 2
    qs = [50, 95, 99, 100]
    buckets, pcts = _locust_reference(LOCUST_VALUES, samples, qs)
    assert [bucket_response_time_ms(v) for v in LOCUST_VALUES] == buckets
    assert [locust_percentile(samples, q) for q in qs] == pcts
    # whole ms below 100 ms with halves to even; 10 ms steps below 1 s; 100 ms below 10 s; 1 s above
    assert buckets == [0, 0, 2, 2, 99, 100, 100, 100, 120, 1000, 1000, 1000, 1000, 10000, 12000]
    # sub-millisecond latencies collapse to 0, and the p99 (1000) exceeds the largest latency seen (996)
    assert pcts == [0, 0, 1000, 1000] and max(samples) == 996.0
    # Locust's rank is int(q n) + 1: for 100 samples 1..100 its p99 is the 100th, not the 99th
    assert locust_percentile(range(1, 101), 99) == 100 and percentile(list(range(1, 101)), 99) == 99


def test_generator_limit_retries_a_missed_rate_once_and_stops_where_every_try_missed():
    late = {(200.0, 1), (400.0, 1), (400.0, 2)}  # (rate, try) whose send lag broke the bound

    class FakePool:
        def __init__(self):
            self.tries = {}
            self.durations_s = {}

        def run(self, url, payloads, *, rate_rps, duration_s, seed):
            attempt = self.tries[rate_rps] = self.tries.get(rate_rps, 0) + 1
            self.durations_s[rate_rps] = duration_s
            lags = np.full(100, 5.0 if (rate_rps, attempt) in late else 0.1)
            return _fake_result(np.ones(100), lags, rate=rate_rps)

    pool = FakePool()
    limit, table = generator_limit(pool, "http://unused", [400, 100, 200, 800])
    assert limit == 200.0
    # every try is long enough to hold the 1,000 requests a p99 needs (10 / (1 - 0.99)), 3 sigma over
    expected_s = {rate: (1000 + 3 * 1000**0.5) / rate for rate in (100.0, 200.0, 400.0)}
    assert pool.durations_s == pytest.approx(expected_s)
    pool = FakePool()
    generator_limit(pool, "http://unused", [100, 8000], duration_s=2.0, min_requests=20)
    assert pool.durations_s == {100.0: 2.0, 8000.0: 2.0}  # the shortest try wins over a few requests
    assert list(zip(table["rate_rps"], table["attempt"], strict=True)) == [
        (100.0, 1), (200.0, 1), (200.0, 2), (400.0, 1), (400.0, 2)
    ]  # fmt: skip
    assert table["generator_ok"].tolist() == [True, False, True, False, False]
    limit, table = generator_limit(FakePool(), "http://unused", [400], retries=0)
    assert limit == 0.0 and len(table) == 1
    with pytest.raises(ValueError, match="retries"):
        generator_limit(FakePool(), "http://unused", [100], retries=-1)
    with pytest.raises(ValueError, match="min_requests"):
        generator_limit(FakePool(), "http://unused", [100], min_requests=0)
    with pytest.raises(ValueError, match="duration_s"):
        generator_limit(FakePool(), "http://unused", [100], duration_s=0)


class _NoRunPool:
    def run(self, *args, **kwargs):
        raise AssertionError("a refused climb must send nothing")


@pytest.mark.parametrize(
    ("rates", "kwargs", "message"),
    [
        ([], {}, "rates_rps must be non-empty"),
        ("123", {}, "rates_rps must be a list or tuple or range"),
        ([100, math.nan], {}, r"rates_rps\[1\] must be a finite number"),
        ([math.inf], {}, r"rates_rps\[0\]"),
        ([True], {}, r"rates_rps\[0\]"),
        (["100"], {}, r"rates_rps\[0\]"),
        ([-100], {}, r"rates_rps\[0\] must be .*> 0"),
        ([1e12], {}, r"rates_rps\[0\] must be .*1e\+06|1,000,000|1000000"),
        ([100, 100], {}, "rates_rps must not repeat"),
        ([100], {"lag_bound_ms": 0}, "lag_bound_ms"),
        ([100], {"lag_bound_ms": "1"}, "lag_bound_ms"),
        ([100], {"on_run": 5}, "on_run must be callable"),
        ([1], {"min_requests": 10**6}, r"would last 1,003,000 s, over max_try_s=60"),
        ([0.01, 500], {}, "start at a higher rate"),
        ([500], {"duration_s": 100.0}, r"duration_s=100 would last 100 s, over max_try_s=60"),
    ],
)
def test_generator_limit_refuses_bad_arguments_before_sending(rates, kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        generator_limit(_NoRunPool(), "http://unused", rates, **kwargs)


@pytest.mark.parametrize(
    ("args", "message"),
    [((2000, 250, 1000), "in \\[250, 1000\\] req/s, got 2000"), ((500, 1000), "got 500"), ((0.4, 250), "got 0.4"),
     ((0, 250, 100), "highest_rps")],
)  # fmt: skip
def test_generator_limit_text_refuses_a_limit_no_climb_returns(args, message):
    with pytest.raises(InvalidArgumentError, match=message):
        generator_limit_text(*args)


def test_the_null_server_command_starts_what_serve_null_starts(monkeypatch):
    from course_lib.measure.generators import NULL_SERVER, _null

    started = {}
    monkeypatch.setattr(
        _null, "serve_app", lambda app, *, port, config: started.update(port=port, config=config)
    )
    _null.main(["--port", "8123"])
    assert started == {"port": 8123, "config": NULL_SERVER}
    for bad in ("70000", "0", "x"):
        done = subprocess.run(
            [sys.executable, "-m", "course_lib.measure.generators", "--port", bad],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and "must be an integer in 1..65535" in done.stderr, done.stderr
        assert done.stderr.startswith("usage: python -m course_lib.measure.generators")


def test_knees_beside_generator_words_each_case():
    above = knees_beside_generator({"production": 1520.0, "prototype": 40.0}, 1000.0, 100.0)
    assert above.startswith(
        "The knee of production (1,520 req/s) is above the generator's limit on a null server"
    )
    assert "not the service's alone" in above
    assert above.endswith("The knee of prototype (40 req/s) is at or below the limit.")
    both = knees_beside_generator({"production": 2000.0, "floor": 3000.0}, 1000.0, 100.0)
    assert both.startswith("The knees of production (2,000 req/s) and floor (3,000 req/s) are above")
    assert "such knees are the services'" in both and "at or below" not in both
    below = knees_beside_generator({"vLLM": 900.0, "prototype": 40.0}, 1000.0, 100.0)
    assert below.startswith("The knees of vLLM (900 req/s) and prototype (40 req/s) are at or below")
    assert "these rates" in below and "generator_ok" in below
    assert "at or below" in knees_beside_generator({"production": 1000.4}, 1000.0, 100.0)  # as printed
    none_ok = knees_beside_generator({"production": 900.0}, 0.0, 1000.0)
    assert "without errors at none of the rates tried on the null server (from 1,000 req/s)" in none_ok
    assert knees_beside_generator({"production": 0.0}, 500.0, 100.0).startswith("No knee to compare")
    cases = [(({"p": math.nan}, 1.0, 1.0), "knees_rps"), (({"p": 1.0}, -1.0, 1.0), "limit_rps"),
             (({"p": 1.0}, 1.0, 0.0), "lowest_rps"), (([1.0], 1.0, 1.0), "knees_rps"),
             (({"p": 1.0}, 50.0, 100.0), "limit_rps must be 0 or at least lowest_rps")]  # fmt: skip
    for bad, name in cases:
        with pytest.raises(InvalidArgumentError, match=name):
            knees_beside_generator(*bad)
