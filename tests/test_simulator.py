"""The dynamic-batching simulator against Triton's documented behaviour, plus properties that must always hold."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.measure.batch_cost import LinearCostModel
from course_lib.simulate.batching import (
    TRIGGERS,
    check_batching_params,
    next_batch_size,
    poisson_arrivals_ms,
    simulate_dynamic_batching,
    sweep_offered_load,
)


def test_twenty_requests_every_0_4_ms_form_batches_of_8_8_4_with_the_timer_sending_the_last():
    arrivals = [0.4 * i for i in range(20)]
    result = simulate_dynamic_batching(
        arrivals, max_batch_size=8, max_queue_delay_ms=3.0, service_time_ms=0.0
    )
    batches = result.batches
    assert batches["size"].tolist() == [8, 8, 4]
    assert batches["dispatch_ms"].tolist() == pytest.approx([2.8, 6.0, 9.4])
    assert batches["trigger"].tolist() == ["max_batch_size", "max_batch_size", "max_queue_delay"]
    # The last four arrived at 6.4 .. 7.6 ms; the oldest waited exactly the 3 ms limit.
    last = result.requests[result.requests["batch_id"] == 2]
    assert last["queue_wait_ms"].tolist() == pytest.approx([3.0, 2.6, 2.2, 1.8])


def test_with_no_delay_requests_arriving_while_the_instance_is_busy_leave_together_when_it_frees():
    result = simulate_dynamic_batching(
        [0.0, 1.0, 2.0, 3.0, 4.0], max_batch_size=8, max_queue_delay_ms=0.0, service_time_ms=10.0
    )
    assert result.batches["size"].tolist() == [1, 4]
    assert result.batches["dispatch_ms"].tolist() == [0.0, 10.0]
    assert result.batches["trigger"].tolist() == ["max_queue_delay", "instance_free"]
    assert result.requests["latency_ms"].tolist() == [10.0, 19.0, 18.0, 17.0, 16.0]


def test_a_lone_request_under_low_load_waits_exactly_the_max_queue_delay():
    arrivals = [0.0, 100.0, 250.0]
    result = simulate_dynamic_batching(
        arrivals, max_batch_size=8, max_queue_delay_ms=5.0, service_time_ms=1.0
    )
    assert result.requests["dispatch_ms"].tolist() == [5.0, 105.0, 255.0]
    assert result.requests["latency_ms"].tolist() == [6.0, 6.0, 6.0]
    assert set(result.batches["trigger"]) == {"max_queue_delay"}


def test_a_preferred_size_is_sent_at_once_and_the_rest_waits_for_the_timer():
    result = simulate_dynamic_batching(
        [0.0] * 6, max_batch_size=8, max_queue_delay_ms=10.0, service_time_ms=0.0, preferred_batch_sizes=[4]
    )
    assert result.batches["size"].tolist() == [4, 2]
    assert result.batches["dispatch_ms"].tolist() == [0.0, 10.0]
    assert result.batches["trigger"].tolist() == ["preferred_batch_size", "max_queue_delay"]


def test_once_the_delay_is_exceeded_everything_pending_is_sent_not_just_a_preferred_size():
    # Request 0 goes alone by the timer at 1 ms; six arrive during its 10 ms call and are overdue at 11 ms.
    arrivals = [0.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    result = simulate_dynamic_batching(
        arrivals, max_batch_size=16, max_queue_delay_ms=1.0, service_time_ms=10.0, preferred_batch_sizes=[4]
    )
    assert result.batches["size"].tolist() == [1, 6]
    assert result.batches["dispatch_ms"].tolist() == [1.0, 11.0]
    assert result.batches["trigger"].tolist() == ["max_queue_delay", "instance_free"]


def test_a_full_queue_is_split_into_max_size_batches():
    result = simulate_dynamic_batching(
        [0.0] * 10, max_batch_size=4, max_queue_delay_ms=5.0, service_time_ms=1.0
    )
    assert result.batches["size"].tolist() == [4, 4, 2]
    assert result.batches["dispatch_ms"].tolist() == [0.0, 1.0, 5.0]


def test_two_instances_serve_overlapping_requests_in_parallel():
    result = simulate_dynamic_batching(
        [0.0, 1.0, 2.0], max_batch_size=4, max_queue_delay_ms=0.0, service_time_ms=10.0, instances=2
    )
    assert result.batches["instance"].tolist() == [0, 1, 0]
    assert result.batches["dispatch_ms"].tolist() == [0.0, 1.0, 10.0]


def test_service_time_can_be_a_fitted_cost_model():
    model = LinearCostModel(5.0, 0.2)
    result = simulate_dynamic_batching(
        [0.0] * 8, max_batch_size=8, max_queue_delay_ms=1.0, service_time_ms=model
    )
    assert result.batches["service_ms"].tolist() == [pytest.approx(6.6)]
    assert result.requests["latency_ms"].tolist() == [pytest.approx(6.6)] * 8


def test_next_batch_size_waits_when_nothing_is_full_and_time_remains():
    kwargs = {"max_batch_size": 8, "max_queue_delay_ms": 2.0, "preferred_batch_sizes": (8,)}
    assert next_batch_size(3, 1.0, 0.0, **kwargs) == (0, None)
    assert next_batch_size(3, 2.0, 0.0, **kwargs) == (3, "max_queue_delay")
    assert next_batch_size(9, 0.0, 0.0, **kwargs) == (8, "max_batch_size")


def test_default_preferred_size_is_the_max_batch_size():
    assert check_batching_params(16, 1.0) == (16, 1.0, (16,))
    assert check_batching_params(16, 1, [8, 4, 8]) == (16, 1.0, (4, 8))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1, got 0"),
        ({"max_batch_size": 2.5}, "max_batch_size must be an integer >= 1, got 2.5"),
        ({"max_queue_delay_ms": -1.0}, "max_queue_delay_ms must be a finite number >= 0"),
        ({"max_queue_delay_ms": float("nan")}, "max_queue_delay_ms must be a finite number >= 0"),
        (
            {"preferred_batch_sizes": [16]},
            r"preferred_batch_sizes\[0\] must be an integer >= 1 and <= 8, got 16",
        ),
        ({"instances": 0}, "instances must be an integer >= 1, got 0"),
        ({"service_time_ms": -1.0}, "service_time_ms must be a finite number >= 0, got -1.0"),
        (
            {"service_time_ms": lambda b: float("nan")},
            r"service_time_ms\(2\) must be a finite number >= 0, got nan",
        ),
    ],
)
def test_bad_parameters_raise_a_value_error_naming_them(kwargs, message):
    params = {"max_batch_size": 8, "max_queue_delay_ms": 1.0, "service_time_ms": 1.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        simulate_dynamic_batching([0.0, 1.0], **params)


def test_service_time_of_the_wrong_type_raises_type_error():
    with pytest.raises(TypeError, match="service_time_ms must be a finite number >= 0, got '5 ms'"):
        simulate_dynamic_batching([0.0], max_batch_size=1, max_queue_delay_ms=0.0, service_time_ms="5 ms")


@pytest.mark.parametrize(
    ("arrivals", "message"),
    [
        (
            [0.0, 2.0, 1.0],
            r"must be sorted \(non-decreasing\); index 2 \(1 ms\) comes before index 1 \(2 ms\)",
        ),
        ([0.0, float("nan")], "must be finite; index 1 is nan"),
        ([], "non-empty 1-D sequence"),
    ],
)
def test_bad_arrivals_raise_a_value_error(arrivals, message):
    with pytest.raises(ValueError, match=message):
        simulate_dynamic_batching(arrivals, max_batch_size=4, max_queue_delay_ms=1.0, service_time_ms=1.0)


def test_same_inputs_give_identical_results():
    arrivals = poisson_arrivals_ms(800.0, 3000, seed=7)
    again = poisson_arrivals_ms(800.0, 3000, seed=7)
    np.testing.assert_array_equal(arrivals, again)
    kwargs = {"max_batch_size": 16, "max_queue_delay_ms": 2.0, "service_time_ms": LinearCostModel(1.0, 0.05)}
    first = simulate_dynamic_batching(arrivals, **kwargs)
    second = simulate_dynamic_batching(again, **kwargs)
    pd.testing.assert_frame_equal(first.requests, second.requests)
    pd.testing.assert_frame_equal(first.batches, second.batches)


def test_poisson_arrivals_have_the_requested_mean_rate():
    arrivals = poisson_arrivals_ms(1000.0, 20000, seed=1)
    assert np.all(np.diff(arrivals) >= 0)
    assert 1000.0 * len(arrivals) / arrivals[-1] == pytest.approx(1000.0, rel=0.03)


@pytest.mark.parametrize(("rate", "n"), [(0.0, 10), (float("inf"), 10), (10.0, 0)])
def test_poisson_arrivals_reject_bad_rate_or_count(rate, n):
    with pytest.raises(ValueError, match=r"rate_rps|n must"):
        poisson_arrivals_ms(rate, n, seed=0)


def test_light_load_throughput_matches_offered_load_and_summary_is_complete():
    result = simulate_dynamic_batching(
        poisson_arrivals_ms(100.0, 2000, seed=3),
        max_batch_size=8,
        max_queue_delay_ms=1.0,
        service_time_ms=0.5,
    )
    summary = result.summary()
    assert summary["achieved_rps"] == pytest.approx(summary["offered_rps"], rel=0.01)
    assert summary["p99_ms"] == result.p99_latency_ms == result.latency_percentiles_ms()["p99"]
    assert 0 < summary["utilisation"] < 1


def test_sweep_returns_one_row_per_delay_and_rate():
    table = sweep_offered_load(
        [100.0, 400.0],
        [0.0, 2.0],
        max_batch_size=8,
        service_time_ms=LinearCostModel(1.0, 0.1),
        n_requests=200,
    )
    assert list(zip(table["max_queue_delay_ms"], table["rate_rps"], strict=True)) == [
        (0.0, 100.0),
        (0.0, 400.0),
        (2.0, 100.0),
        (2.0, 400.0),
    ]
    assert (table["n_requests"] == 200).all()


arrival_lists = st.lists(st.floats(0.0, 50.0, allow_nan=False), min_size=1, max_size=60).map(sorted)


@settings(max_examples=150, deadline=None)
@given(
    arrivals=arrival_lists,
    max_batch_size=st.integers(1, 10),
    delay=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    overhead=st.floats(0.0, 3.0),
    per_item=st.floats(0.0, 1.0),
    instances=st.integers(1, 3),
    preferred=st.lists(st.integers(1, 10), max_size=3),
)
def test_no_request_is_lost_duplicated_reordered_or_over_batched(
    arrivals, max_batch_size, delay, overhead, per_item, instances, preferred
):
    preferred = [p for p in preferred if p <= max_batch_size]
    result = simulate_dynamic_batching(
        arrivals,
        max_batch_size=max_batch_size,
        max_queue_delay_ms=delay,
        service_time_ms=LinearCostModel(overhead, per_item),
        preferred_batch_sizes=preferred,
        instances=instances,
    )
    req, bat = result.requests, result.batches
    assert len(req) == len(arrivals)  # count in == count out
    assert req["request_id"].tolist() == list(range(len(arrivals)))
    assert bat["size"].sum() == len(arrivals)  # every request in exactly one batch
    assert req["batch_id"].value_counts().sort_index().tolist() == bat["size"].tolist()
    assert bat["size"].max() <= max_batch_size
    assert req["batch_id"].is_monotonic_increasing  # FIFO: a later request never leaves in an earlier batch
    assert bat["dispatch_ms"].is_monotonic_increasing
    assert (req["queue_wait_ms"] >= 0).all()
    assert np.allclose(req["latency_ms"], req["queue_wait_ms"] + req["service_ms"])
    assert set(bat["trigger"]) <= set(TRIGGERS)
    for _, runs in bat.groupby("instance"):
        assert (runs["dispatch_ms"].to_numpy()[1:] >= runs["completion_ms"].to_numpy()[:-1] - 1e-9).all()


@settings(max_examples=100, deadline=None)
@given(arrivals=arrival_lists, max_batch_size=st.integers(1, 10), delay=st.floats(0.0, 5.0))
def test_with_an_always_free_instance_nobody_waits_longer_than_the_max_queue_delay(
    arrivals, max_batch_size, delay
):
    result = simulate_dynamic_batching(
        arrivals, max_batch_size=max_batch_size, max_queue_delay_ms=delay, service_time_ms=0.0
    )
    assert (result.requests["queue_wait_ms"] <= delay + 1e-9).all()
    if delay == 0:
        assert (result.requests["queue_wait_ms"] == 0).all()


def test_throughput_of_an_overloaded_batcher_is_capped_by_the_cost_model():
    model = LinearCostModel(5.0, 0.2)
    result = simulate_dynamic_batching(
        poisson_arrivals_ms(20000.0, 5000, seed=0),
        max_batch_size=32,
        max_queue_delay_ms=1.0,
        service_time_ms=model,
    )
    cap = 1000.0 * 32 / model(32)  # 2,807 requests/s with full batches
    assert result.achieved_rps() == pytest.approx(cap, rel=0.02)
    assert math.isclose(result.batches["size"].median(), 32)
