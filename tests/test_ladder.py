"""The one rate-ladder climber and knee reader: ladders, turns, retries, starts, stepping down, the rule."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from course_lib.core.checks import InvalidArgumentError
from course_lib.measure.ladder import (
    SloRule,
    climb,
    climb_async,
    geometric_ladder,
    knees,
    start_rungs,
    step_table,
)
from course_lib.measure.loadgen import MIN_REQUESTS_P99, LoadResult, rung_duration_s

#: The waterfall's rule: p99 within 100 ms, errors below 0.1 %, at least 1,000 requests a rung.
RULE = SloRule(100.0, min_requests=MIN_REQUESTS_P99)


def fake_result(
    rate: float, n: int, latency_ms: float, *, lag_ms: float = 0.1, failed: int = 0
) -> LoadResult:
    """A LoadResult of n requests at ``rate`` whose slowest 2 % take ``latency_ms`` (the rest 1 ms)."""
    lat = np.ones(n)
    lat[: max(1, n // 50)] = latency_ms
    ok = np.ones(n, dtype=bool)
    ok[:failed] = False
    frame = pd.DataFrame(
        {
            "request_id": np.arange(n),
            "scheduled_ms": np.arange(n) * 1000.0 / rate,
            "lag_ms": np.full(n, lag_ms),
            "latency_ms": np.where(ok, lat, np.nan),
            "ok": ok,
            "outcome": np.where(ok, "ok", "error"),
            "error": np.where(ok, "", "boom"),
        }
    )
    return LoadResult(frame, rate_rps=rate, planned=n, wall_s=n / rate)


def capacity_runner(capacity: dict[str, float], calls: list, *, n: int = 1000, flaky: set | None = None):
    """run_step for steps that meet a 100 ms p99 below their capacity (``flaky``: (step, rate) missing once)."""
    flaky = set(flaky or ())

    def run(step: str, rate: float) -> LoadResult:
        calls.append((step, rate))
        if (step, rate) in flaky:
            flaky.discard((step, rate))
            return fake_result(rate, n, 500.0)
        return fake_result(rate, n, 20.0 if rate <= capacity[step] else 500.0)

    return run


def test_ladder_and_rung_size():
    assert geometric_ladder(100, 400, ratio=2) == [100.0, 200.0, 400.0]
    ladder = geometric_ladder(20, 8000)
    assert ladder[0] == 20 and ladder[-1] >= 8000
    assert all(1.17 < b / a < 1.21 for a, b in itertools.pairwise(ladder))
    assert rung_duration_s(25) == pytest.approx((1000 + 3 * 1000**0.5) / 25)  # >= 1,000 requests at 25 req/s
    assert rung_duration_s(5000, min_duration_s=1.5) == 1.5
    with pytest.raises(InvalidArgumentError, match="rate_rps"):
        rung_duration_s(0)
    with pytest.raises(ValueError, match="ratio"):
        geometric_ladder(1, 10, ratio=1.0)


def test_interleaved_climb_takes_turns_retries_once_and_stops_each_target_at_its_miss():
    calls: list = []
    run = capacity_runner({"A": 100, "B": 300}, calls, flaky={("B", 140.0)})
    rows = climb(run, ["A", "B"], [50, 70, 100, 140, 200, 280, 400], rule=RULE)
    assert calls[:4] == [("A", 50.0), ("B", 50.0), ("A", 70.0), ("B", 70.0)]  # turns at every rung
    retried = rows[(rows["target"] == "B") & (rows["rate_rps"] == 140)]
    assert list(retried["attempt"]) == [1, 2] and list(retried["met_slo"]) == [False, True]
    a_rows = rows[rows["target"] == "A"]
    assert (
        a_rows["rate_rps"].max() == 140 and len(a_rows[a_rows["rate_rps"] == 140]) == 2
    )  # missed twice, stopped
    k = knees(rows).set_index("target")
    assert k.loc["A", "knee_rps"] == 100 and k.loc["A", "first_fail_rps"] == 140
    assert k.loc["B", "knee_rps"] == 280 and k.loc["B", "first_fail_rps"] == 400
    assert not k["generator_bound"].any()


def test_climb_rotates_order_respects_starts_and_needs_enough_requests_and_a_punctual_generator():
    calls: list = []
    run = capacity_runner({"A": 1000, "B": 1000}, calls)
    climb(run, ["A", "B"], [50, 100], rule=RULE, repeat=1, start_rps={"A": 100})
    assert calls == [("B", 50.0), ("B", 100.0), ("A", 100.0)]
    few = climb(
        lambda s, r: fake_result(r, 200, 5.0), ["A"], [50, 100], rule=SloRule(100.0, min_requests=1000)
    )
    assert not few["met_slo"].any() and not few["enough_requests"].any()
    late_but_fast = climb(lambda s, r: fake_result(r, 2000, 5.0, lag_ms=3.0), ["A"], [50], rule=RULE)
    assert late_but_fast["met_slo"].all()  # latency counts the lag already: met despite it
    late_and_slow = climb(lambda s, r: fake_result(r, 2000, 500.0, lag_ms=300.0), ["A"], [50], rule=RULE)
    k = knees(late_and_slow).iloc[0]
    assert k["knee_rps"] == 0 and k["generator_bound"]
    with pytest.raises(ValueError, match="targets"):
        climb(run, [], [50], rule=RULE)


def test_a_start_above_this_machines_capacity_steps_down_until_a_rung_meets_when_asked():
    ladder = [50, 70, 100, 140, 200, 280]
    calls: list = []
    run = capacity_runner({"A": 70, "B": 1000, "C": 10}, calls)
    starts = {"A": 200, "B": 140, "C": 100}
    rows = climb(run, ["A", "B", "C"], ladder, rule=RULE, start_rps=starts, step_down=True)
    k = knees(rows).set_index("target")
    assert (k.loc["A", "knee_rps"], k.loc["A", "first_fail_rps"]) == (70, 100)  # 200, 140, 100 missed, 70 met
    assert [r for s, r in calls if s == "A"] == [
        200,
        200,
        140,
        100,
        70,
    ]  # the start tried twice, then once each
    assert k.loc["B", "knee_rps"] == 280 and math.isnan(k.loc["B", "first_fail_rps"])  # climbed as before
    assert (k.loc["C", "knee_rps"], k.loc["C", "first_fail_rps"]) == (0, 50)  # even the first rung missed
    plain = knees(climb(capacity_runner({"A": 70}, []), ["A"], ladder, rule=RULE,
                                    start_rps={"A": 200})).iloc[0]  # fmt: skip
    assert (plain["knee_rps"], plain["first_fail_rps"]) == (0, 200)  # without step_down: knee 0, as before


def test_step_down_starts_from_the_first_rung_run_and_bad_climb_inputs_are_refused():
    ladder = [100, 141, 200, 283, 400]
    calls: list = []
    rows = climb(capacity_runner({"A": 150}, calls), ["A"], ladder, rule=RULE,
                             start_rps={"A": 250}, step_down=True, retries=0)  # fmt: skip
    assert [r for _, r in calls] == [283, 200, 141]  # 250 lies between rungs: it starts at 283
    k = knees(rows).iloc[0]
    assert (k["knee_rps"], k["first_fail_rps"]) == (141, 200)
    run = capacity_runner({"A": 150, "B": 150}, [])
    bad = [
        ({"targets": "AB"}, "targets must be a list or tuple"),
        ({"targets": ["A", "A"]}, "targets must not repeat"),
        ({"ladder_rps": []}, "ladder_rps"),
        ({"ladder_rps": [100, 100, 200]}, "ladder_rps"),
        ({"ladder_rps": [0, 100]}, "ladder_rps"),
        ({"ladder_rps": [100, float("nan")]}, "ladder_rps"),
        ({"start_rps": {"a": 200}}, "not climbed"),
        ({"start_rps": {"A": 1000}}, r"start_rps\['A'\]"),
        ({"start_rps": {"A": float("nan")}}, r"start_rps\['A'\]"),
        ({"start_rps": {"A": "200"}}, r"start_rps\['A'\]"),
        ({"step_down": "no"}, "step_down"),
        ({"repeat": 1.5}, "repeat"),
    ]
    for change, message in bad:
        kwargs = {"targets": ["A", "B"], "ladder_rps": ladder, "rule": RULE, **change}
        with pytest.raises(InvalidArgumentError, match=message):
            climb(run, **kwargs)


def test_start_rungs_sit_back_below_the_expected_knee():
    assert start_rungs({"a": 100.0, "b": 0.0, "c": 1e6}, [50, 70, 100, 140], back=1) == {
        "a": 70.0,
        "b": 50.0,
        "c": 100.0,
    }


def test_the_rule_counts_requests_and_retries_only_a_hiccup_when_asked():
    few = fake_result(100.0, 200, 5.0)
    assert not SloRule(100.0, min_requests=1000)(few)["met_slo"] and SloRule(100.0)(few)["met_slo"]
    failed = fake_result(100.0, 2000, 5.0, failed=1)  # 0.05 %: within the 0.1 % budget, not within none
    assert SloRule(100.0)(failed)["met_slo"] and not SloRule.without_errors(100.0)(failed)["met_slo"]
    assert SloRule(100.0)(failed)["retry"] and not SloRule.without_errors(100.0)(failed)["retry"]  # errors
    slow = SloRule.without_errors(100.0)(fake_result(100.0, 2000, 500.0))  # answered, but late: a hiccup
    assert not slow["met_slo"] and slow["retry"] and slow["done_in_time"] > 0.95
    with pytest.raises(ValueError, match="max_error_rate"):
        SloRule(100.0, max_error_rate=-0.1)
    with pytest.raises(ValueError, match="retry_min_done_fraction"):
        SloRule(100.0, retry_min_done_fraction=0.0)


def test_a_miss_the_rule_will_not_retry_ends_the_target_at_once():
    calls: list = []
    rule = SloRule.without_errors(100.0)
    rows = climb(
        lambda t, r: calls.append(r) or fake_result(r, 1000, 5.0, failed=1 if r > 60 else 0), ["A"], [50, 70, 100],
        rule=rule, retries=3,
    )  # fmt: skip
    assert calls == [50.0, 70.0] and rows["attempt"].tolist() == [1, 1]


def test_the_async_climb_follows_the_same_plan():
    import asyncio

    calls: list = []
    sync_run = capacity_runner({"A": 100, "B": 300}, calls, flaky={("B", 140.0)})

    async def run(target: str, rate: float) -> LoadResult:
        return sync_run(target, rate)

    ladder = [50, 70, 100, 140, 200, 280, 400]
    rows = asyncio.run(climb_async(run, ["A", "B"], ladder, rule=RULE))
    again = climb(
        capacity_runner({"A": 100, "B": 300}, [], flaky={("B", 140.0)}), ["A", "B"], ladder, rule=RULE
    )
    columns = ["repeat", "target", "attempt", "rate_rps", "met_slo"]
    pd.testing.assert_frame_equal(rows[columns], again[columns])


def test_knees_carry_the_run_at_the_knee_and_rejudged_runs_read_the_same_way():
    results: list = []
    rows = climb(
        capacity_runner({"A": 100}, []), ["A"], [50, 70, 100, 140], rule=RULE, retries=0, results=results
    )
    k = knees(rows).iloc[0]
    assert (k["repeat"], k["target"], k["knee_rps"], k["first_fail_rps"]) == (0, "A", 100.0, 140.0)
    assert k["offered_rps"] == rows.loc[2, "offered_rps"] and k["p99_ms"] == 20.0 and k["generator_ok"]
    stricter = knees(step_table(results, p99_limit_ms=10.0)).iloc[0]  # the same runs under a 10 ms limit
    assert (stricter["knee_rps"], stricter["first_fail_rps"]) == (0.0, 50.0)
    with pytest.raises(ValueError, match="met_slo"):
        knees(rows.drop(columns="met_slo"))


@pytest.mark.parametrize(
    "p99s, limit",
    [
        ([10, 20, 30, 200, 40], 100.0),
        ([150, 20], 100.0),
        ([1, 2, 3, 4, 5], 100.0),
        ([10, 90, 101, 50, 60], 100.0),
    ],
)
def test_the_knee_core_and_knees_read_the_same_knee_off_the_same_climb(p99s, limit):
    from course_lib.measure.knee import knee_core

    rates = [100.0, 200.0, 400.0, 800.0, 1600.0][: len(p99s)]
    rows = pd.DataFrame(
        {"repeat": 0, "target": "t", "rate_rps": rates, "p99_ms": p99s, "met_slo": [p <= limit for p in p99s]}
    )
    assert knee_core(rates, p99s, p99_limit_ms=limit) == knees(rows).iloc[0]["knee_rps"]
