"""Stage timers, request profiles and the latency budget (no wall-clock assertions)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from course_lib.serving.profiling import (
    END_TO_END,
    SUMMARY_COLUMNS,
    LatencyBudget,
    RequestProfile,
    StageTimer,
    profile_requests,
)
from course_lib.serving.profiling import _stages as profiling


class FakeClock:
    """A perf_counter_ns stand-in that advances by a fixed step on every read."""

    def __init__(self, step_ns: int):
        self.now_ns = 0
        self.step_ns = step_ns

    def __call__(self) -> int:
        self.now_ns += self.step_ns
        return self.now_ns


@pytest.fixture
def fake_clock(monkeypatch):
    clock = FakeClock(step_ns=2_500_000)  # each read moves 2.5 ms
    monkeypatch.setattr(profiling.time, "perf_counter_ns", clock)
    return clock


def source_budget(target_p50_ms=50.0, target_p99_ms=100.0) -> LatencyBudget:
    """Source 000's test: 90 requests of 30 ms, 8 of 70 ms, 2 of 150 ms, in three stages each."""
    budget = LatencyBudget(target_p50_ms=target_p50_ms, target_p99_ms=target_p99_ms)
    shapes = [(90, (5.0, 10.0, 15.0)), (8, (10.0, 20.0, 40.0)), (2, (20.0, 50.0, 80.0))]
    for count, (network, feature_store, compute) in shapes:
        for _ in range(count):
            budget.record(
                RequestProfile(
                    f"r{len(budget)}",
                    {"network": network, "feature_store": feature_store, "compute": compute},
                )
            )
    return budget


def test_source_vector_gives_p50_30_ms_and_p99_150_ms():
    table = source_budget().summary()
    total = table.loc[END_TO_END]
    assert total["count"] == 100
    assert total["p50_ms"] == 30.0
    assert total["p95_ms"] == 70.0
    assert total["p99_ms"] == 150.0
    assert total["max_ms"] == 150.0
    assert total["mean_ms"] == pytest.approx(35.6)


def test_source_vector_breaches_a_100_ms_p99_target_but_not_a_50_ms_p50():
    total = source_budget().summary().loc[END_TO_END]
    assert bool(total["p99_breached"]) is True
    assert bool(total["p50_breached"]) is False


def test_meeting_the_target_exactly_is_not_a_breach():
    total = source_budget(target_p50_ms=30.0, target_p99_ms=150.0).summary().loc[END_TO_END]
    assert not total["p50_breached"]
    assert not total["p99_breached"]


def test_summary_has_one_row_per_stage_in_order_then_end_to_end():
    table = source_budget().summary()
    assert list(table.index) == ["network", "feature_store", "compute", END_TO_END]
    assert list(table.columns) == list(SUMMARY_COLUMNS)
    assert table.loc["feature_store", "p99_ms"] == 50.0
    assert table.loc["compute", "p50_ms"] == 15.0


def test_stage_p99s_do_not_add_up_to_the_end_to_end_p99():
    # Per-stage percentiles describe different requests; only the merged totals give the total's p99.
    budget = LatencyBudget()
    budget.record(RequestProfile("a", {"lookup": 10.0, "forward": 1.0}))
    budget.record(RequestProfile("b", {"lookup": 1.0, "forward": 10.0}))
    budget.extend(RequestProfile(f"c{i}", {"lookup": 1.0, "forward": 1.0}) for i in range(8))
    table = budget.summary()
    assert table.loc["lookup", "p99_ms"] + table.loc["forward", "p99_ms"] == 20.0
    assert table.loc[END_TO_END, "p99_ms"] == 11.0


def test_stages_without_a_target_have_no_breach_flag():
    table = source_budget().summary()
    assert pd.isna(table.loc["compute", "p99_breached"])
    assert math.isnan(table.loc["compute", "target_p99_ms"])
    assert str(table["p99_breached"].dtype) == "boolean"


def test_stage_targets_flag_a_slow_stage():
    budget = LatencyBudget(stage_targets_ms={"feature_store": (None, 25.0)})
    budget.extend(source_budget().profiles)
    table = budget.summary()
    assert bool(table.loc["feature_store", "p99_breached"]) is True
    assert pd.isna(table.loc["feature_store", "p50_breached"])


def test_empty_budget_refuses_to_summarise_instead_of_reporting_zero():
    with pytest.raises(ValueError, match="no profiles recorded"):
        LatencyBudget(target_p99_ms=60.0).summary()


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_invalid_targets_are_rejected(bad):
    with pytest.raises(ValueError, match="target_p99_ms must be a finite number >= 0"):
        LatencyBudget(target_p99_ms=bad)


def test_malformed_stage_target_is_rejected():
    with pytest.raises(ValueError, match=r"\(p50_ms, p99_ms\) tuple"):
        LatencyBudget(stage_targets_ms={"lookup": 10.0})


def test_recording_something_else_than_a_profile_is_a_type_error():
    with pytest.raises(TypeError, match="RequestProfile"):
        LatencyBudget().record({"lookup": 1.0})


def test_recording_an_empty_profile_is_rejected():
    with pytest.raises(ValueError, match="holds no stages"):
        LatencyBudget().record(RequestProfile("empty"))


def test_requests_missing_a_stage_are_counted_per_stage():
    budget = LatencyBudget()
    budget.record(RequestProfile("ok", {"parse": 1.0, "lookup": 2.0}))
    budget.record(RequestProfile("refused", {"parse": 1.0}))
    table = budget.summary()
    assert table.loc["parse", "count"] == 2
    assert table.loc["lookup", "count"] == 1
    frame = budget.to_frame()
    assert list(frame.columns) == ["request_id", "parse", "lookup", END_TO_END]
    assert math.isnan(frame.loc[1, "lookup"])
    assert list(frame[END_TO_END]) == [3.0, 1.0]


def test_samples_of_an_unknown_stage_raise_and_list_the_known_ones():
    with pytest.raises(ValueError, match="network"):
        source_budget().samples_ms("gpu")


def test_stage_timer_measures_with_perf_counter_ns(fake_clock):
    with StageTimer() as timer:
        pass
    assert timer.elapsed_ns == 2_500_000
    assert timer.elapsed_ms == 2.5


def test_stage_timer_has_no_reading_before_its_block_ends():
    timer = StageTimer()
    with pytest.raises(RuntimeError, match="after the with-block"):
        _ = timer.elapsed_ms


def test_profile_stage_context_records_each_stage_in_order(fake_clock):
    profile = RequestProfile("r1")
    with profile.stage("parse"):
        pass
    with profile.stage("lookup"):
        pass
    assert profile.stages_ms == {"parse": 2.5, "lookup": 2.5}
    assert profile.total_ms == 5.0


def test_a_stage_that_raises_is_still_recorded(fake_clock):
    profile = RequestProfile("r1")
    with pytest.raises(KeyError), profile.stage("lookup"):
        raise KeyError("SC-0000000")
    assert profile.stages_ms == {"lookup": 2.5}


def test_recording_a_stage_twice_raises_instead_of_double_counting():
    profile = RequestProfile("r1", {"parse": 1.0})
    with pytest.raises(ValueError, match="already recorded"):
        profile.add_stage("parse", 1.0)
    assert profile.total_ms == 1.0


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_negative_or_non_finite_durations_are_rejected(bad):
    with pytest.raises(ValueError, match="duration_ms must be a finite number >= 0"):
        RequestProfile("r1").add_stage("parse", bad)


def test_non_numeric_duration_is_a_type_error():
    with pytest.raises(TypeError, match="duration_ms must be a finite number >= 0, got '3 ms'"):
        RequestProfile("r1").add_stage("parse", "3 ms")


@pytest.mark.parametrize("name", ["", "two words", "dur;x", END_TO_END, 7])
def test_stage_names_must_be_header_tokens_and_not_reserved(name):
    with pytest.raises(ValueError, match="stage name"):
        RequestProfile("r1").add_stage(name, 1.0)


def test_server_timing_uses_the_standard_syntax():
    profile = RequestProfile("r1", {"parse": 0.0412, "lookup": 12.0})
    assert profile.server_timing() == "parse;dur=0.041, lookup;dur=12.000"


def test_profile_requests_sends_warmup_untimed_then_records_every_key():
    sent = []

    def send(key):
        sent.append(key)
        return RequestProfile(key, {"lookup": float(len(sent))})

    budget = profile_requests(send, ["a", "b", "c"], warmup_requests=2)
    assert sent == ["a", "b", "a", "b", "c"]
    assert [p.request_id for p in budget.profiles] == ["a", "b", "c"]
    assert list(budget.samples_ms("lookup")) == [3.0, 4.0, 5.0]


def test_profile_requests_adds_to_a_budget_with_targets():
    budget = LatencyBudget(target_p99_ms=1.0)
    profile_requests(lambda k: RequestProfile(k, {"lookup": 2.0}), ["a"], warmup_requests=0, budget=budget)
    assert bool(budget.summary().loc[END_TO_END, "p99_breached"]) is True


def test_profile_requests_stops_at_its_time_limit_and_says_so(monkeypatch):
    clock = iter([0.0, 0.5, 0.9, 2.0])  # deadline = 0.0 + 1.0 s; the third check is past it
    monkeypatch.setattr(profiling.time, "monotonic", lambda: next(clock))
    with pytest.warns(RuntimeWarning, match="after 2 of 5 requests"):
        budget = profile_requests(
            lambda k: RequestProfile(k, {"lookup": 1.0}), list("abcde"), warmup_requests=0, time_limit_s=1.0
        )
    assert len(budget) == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"keys": []}, "keys must be non-empty"),
        ({"warmup_requests": -1}, "warmup_requests"),
        ({"time_limit_s": 0}, "time_limit_s"),
    ],
)
def test_profile_requests_validates_its_arguments(kwargs, match):
    args = {"send": lambda k: RequestProfile(k, {"x": 1.0}), "keys": ["a"], **kwargs}
    with pytest.raises(ValueError, match=match):
        profile_requests(**args)


def test_a_stage_name_recorded_while_its_block_ran_is_refused_at_its_end():
    profile = RequestProfile("r")
    with pytest.raises(ValueError, match="already recorded"), profile.stage("parse"), profile.stage("parse"):
        pass
    timer = profile.stage("lookup")
    with timer:
        pass
    first = profile.stages_ms["lookup"]
    with pytest.raises(ValueError, match="already recorded"), timer:
        pass
    assert profile.stages_ms["lookup"] == first


class WorkClock:
    """A perf_counter_ns stand-in that stands still until a fake stage ``work``s (known costs)."""

    def __init__(self):
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns

    def work(self, cost_ns: int) -> None:
        self.now_ns += cost_ns


def test_time_stages_core_on_three_fake_stages_with_known_costs(monkeypatch):
    from course_lib.serving.profiling import core

    clock = WorkClock()
    monkeypatch.setattr(core.time, "perf_counter_ns", clock)
    costs_ns = {"parse": 1_000, "lookup": 3_000_000, "forward": 500_000}

    def stage(name):
        return lambda x: (clock.work(costs_ns[name]), [*x, name])[1]

    answer, durations_ns = core.time_stages({n: stage(n) for n in costs_ns}, [])
    assert answer == ["parse", "lookup", "forward"]
    assert durations_ns == costs_ns and list(durations_ns) == list(costs_ns)


def test_churn_service_stage_timing_agrees_with_the_core(monkeypatch):
    """The hardened path (``handle_async`` with ``RequestProfile.stage``) against ``time_stages``."""
    from course_lib.churn.data import clean_telco, load_telco
    from course_lib.churn.model import features
    from course_lib.serving.profiling import core
    from course_lib.serving.service import STAGES, ChurnService

    clock = WorkClock()
    monkeypatch.setattr(core.time, "perf_counter_ns", clock)  # the same time module for both
    record = {
        k: (v.item() if hasattr(v, "item") else v)
        for k, v in features(clean_telco(load_telco())).iloc[0].items()
    }

    def lookup(customer_id):
        clock.work(3_000_000)
        return dict(record)

    def forward(records):
        clock.work(500_000)
        return [0.25 for _ in records]

    service = ChurnService(lookup, forward, model_version="fake")
    body = b'{"customer_id": "SC-0000042"}'
    hardened = service.handle(body)
    assert hardened.status_code == 200
    core_stages = {
        "parse": service.parse,
        "lookup": lambda request: (request, service.lookup(request)),
        "forward": lambda pair: (pair[0], service.forward([pair[1]])[0]),
        "format": lambda pair: service.format(*pair),
    }
    answer, durations_ns = core.time_stages(core_stages, body)
    assert answer == hardened.body
    assert list(durations_ns) == list(hardened.profile.stages_ms) == list(STAGES[1:])
    assert {n: ns / 1e6 for n, ns in durations_ns.items()} == hardened.profile.stages_ms
    assert sum(durations_ns.values()) / 1e6 == hardened.profile.total_ms == 3.5
