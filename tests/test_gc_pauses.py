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
