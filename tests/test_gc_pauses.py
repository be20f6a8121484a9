"""The GC recorder sees every collection; the settings apply and are undone; the experiment table."""

from __future__ import annotations

import gc

import pytest

from course_lib.measure.gc_pauses import (
    GC_SETTINGS,
    RAISED_THRESHOLDS,
    GcRecorder,
    gc_settings,
    measure_gc_tail,
    traced_request_path,
)


def test_recorder_times_each_collection_by_generation():
    with GcRecorder() as rec:
        gc.collect(0)
        gc.collect(2)
    assert [e.generation for e in rec.events][-2:] == [0, 2]
    assert all(e.duration_ns >= 0 for e in rec.events)
    summary = rec.summary()
    assert summary["gen2_collections"] >= 1 and summary["longest_full_ms"] >= 0
    assert rec._callback not in gc.callbacks


def test_settings_apply_inside_the_block_and_are_restored():
    before = gc.get_threshold()
    with gc_settings("raised thresholds"):
        assert gc.get_threshold() == RAISED_THRESHOLDS
    assert gc.get_threshold() == before
    with gc_settings("freeze"):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError, match="setting must be one of"), gc_settings("off"):
        pass


def test_measure_gc_tail_runs_every_setting_on_a_fresh_request_path():
    def make_handle():
        return traced_request_path(lambda body: len(body), ["SC-0000001", "SC-0000002"], spans_per_request=50)

    table = measure_gc_tail(make_handle, 3_000, warmup_requests=10)
    assert list(table.index) == list(GC_SETTINGS)
    default, raised = table.loc["default"], table.loc["raised thresholds"]
    # 3,000 requests keep 150,000 span dicts alive: the default threshold (700) collects gen0 often,
    # the raised one (70,000) at most a few times
    assert default["gen0_collections"] > 100
    assert raised["gen0_collections"] + raised["gen1_collections"] <= 10
    assert (
        table["requests_hit"]
        <= table[["gen0_collections", "gen1_collections", "gen2_collections"]].sum(axis=1)
    ).all()
    assert (table["p99_ms"] <= table["max_ms"]).all()


def test_traced_path_keeps_a_bounded_trace_buffer():
    handle = traced_request_path(lambda body: body, ["SC-0000001"], spans_per_request=3, keep_traces=5)
    for i in range(12):
        handle(i)
    assert len(handle.traces) == 5 and handle.traces[-1][0]["request"] == 11
    with pytest.raises(ValueError, match="customer_ids"):
        traced_request_path(lambda body: body, [])


def test_gc_rounds_rotate_the_settings_and_compare_each_round_with_the_defaults():
    from course_lib.measure.gc_pauses import gc_rounds

    def make_handle():
        return traced_request_path(lambda body: len(body), ["SC-0000001"], spans_per_request=20)

    rounds = gc_rounds(make_handle, 200, rounds=6, warmup_requests=5)
    table = rounds.table
    assert len(table) == 18 and rounds.settings == list(GC_SETTINGS) and rounds.baseline == "default"
    first = table[table["position"] == 0].sort_values("round")["setting"].tolist()
    assert first == [*GC_SETTINGS, *GC_SETTINGS]  # each setting runs first in two of the six rounds
    assert rounds.per_round("p99_ms").shape == (6, 3)
    interval = rounds.ratio("raised thresholds", "max_ms")
    per_round = rounds.per_round("max_ms")
    assert interval.rounds == 6
    assert interval.ratio == pytest.approx(
        float((per_round["raised thresholds"] / per_round["default"]).median())
    )
    # the gen0 count is set by allocations, not by time: the same in every round of a setting
    assert rounds.per_round("gen0_collections").nunique().tolist() == [1, 1, 1]
    summary = rounds.summary()
    assert list(summary.index) == list(GC_SETTINGS) and summary.loc["freeze", "tracked_objects"] == 0
    with pytest.raises(ValueError, match="setting must be one of"):
        rounds.ratio("off")
