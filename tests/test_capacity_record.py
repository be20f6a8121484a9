"""Lesson 3's HTTP capacity record, read by Lesson 5."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from course_lib.measure.capacity_record import RECORDED_HTTP_CAPACITY, load_http_capacity, save_http_capacity


def table() -> pd.DataFrame:
    rows = {
        ("xgboost", "one call"): (200.0, 300.0, 98.0),
        ("xgboost", "batched"): (400.0, 600.0, 34.0),
        ("onnxruntime", "one call"): (800.0, math.nan, 70.0),
    }
    frame = pd.DataFrame.from_dict(
        rows, orient="index", columns=["sustained_rps", "first_failed_rps", "p99_ms"]
    )
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=["runtime", "target"])
    return frame


def test_round_trip_keeps_the_table_and_the_provenance(tmp_path):
    path = save_http_capacity(table(), tmp_path / "cap.json", p99_limit_ms=100.0, ladder_rps=[25, 50, 800])
    record = load_http_capacity(path)
    pd.testing.assert_frame_equal(record.capacity, table(), check_names=False)
    assert record.lowest_sustained() == (("xgboost", "one call"), 200.0)
    assert record.p99_limit_ms == 100.0 and record.ladder_rps == [25.0, 50.0, 800.0]
    assert "p99 limit 100 ms" in record.provenance() and record.usable_cores >= 1


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="run Lesson 3"):
        load_http_capacity(tmp_path / "none.json")
    (tmp_path / "other.json").write_text('{"schema": "x"}')
    with pytest.raises(ValueError, match="not an HTTP capacity record"):
        load_http_capacity(tmp_path / "other.json")
    with pytest.raises(ValueError, match="runtime, target"):
        save_http_capacity(table().droplevel(0), tmp_path / "x.json", p99_limit_ms=1, ladder_rps=[1])
    with pytest.raises(ValueError, match="lacks the columns"):
        save_http_capacity(
            table().drop(columns="p99_ms"), tmp_path / "x.json", p99_limit_ms=1, ladder_rps=[1]
        )


def test_the_release_carries_a_recorded_run():
    record = load_http_capacity(RECORDED_HTTP_CAPACITY)
    assert set(record.capacity.index.get_level_values("runtime")) == {"xgboost", "onnxruntime"}
    assert (record.capacity["sustained_rps"] > 0).all()
