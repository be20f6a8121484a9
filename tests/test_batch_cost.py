"""Batch cost model: the source table, the least-squares fit and real measurements of both runtimes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.churn.model import features
from course_lib.measure.batch_cost import (
    LinearCostModel,
    cost_table,
    fit_linear_cost,
    forward_call_factory,
    measure_call_ms,
)


def test_source_table_for_5_plus_0_2_per_item_is_reproduced_exactly():
    table = cost_table(LinearCostModel(5.0, 0.2), (1, 8, 32, 128))
    assert table["call_ms"].round(1).tolist() == [5.2, 6.6, 11.4, 30.6]
    assert table["items_per_s"].round(0).astype(int).tolist() == [192, 1212, 2807, 4183]
    assert table["speedup_vs_batch1"].round(1).tolist() == [1.0, 6.3, 14.6, 21.8]


def test_cost_table_accepts_any_callable_cost_model():
    table = cost_table(lambda b: 2.0 * b, (1, 4))
    # Pure per-item cost: batching gains nothing.
    assert table["speedup_vs_batch1"].tolist() == pytest.approx([1.0, 1.0])


def test_cost_table_rejects_a_model_returning_zero_time():
    with pytest.raises(ValueError, match="model\\(1\\)"):
        cost_table(lambda b: 0.0, (1, 2))


def test_linear_model_is_callable_and_knows_its_ceiling():
    model = LinearCostModel(5.0, 0.2)
    assert model(128) == pytest.approx(30.6)
    assert model.max_items_per_s == pytest.approx(5000.0)
    assert LinearCostModel(1.0, 0.0).max_items_per_s == math.inf
    assert str(model) == "call_ms = 5 + 0.2 x batch_size"


@pytest.mark.parametrize(
    "kwargs", [{"overhead_ms": -1.0, "per_item_ms": 0.1}, {"overhead_ms": 1.0, "per_item_ms": float("nan")}]
)
def test_linear_model_rejects_negative_or_nan_parameters(kwargs):
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        LinearCostModel(**kwargs)


def test_linear_model_rejects_batch_size_zero():
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        LinearCostModel(1.0, 0.1)(0)


@given(
    overhead=st.floats(0.0, 50.0),
    per_item=st.floats(0.001, 2.0),
    relative=st.booleans(),
)
def test_fit_recovers_an_exact_line(overhead, per_item, relative):
    sizes = np.array([1, 2, 4, 8, 16, 32, 64, 128])
    fit = fit_linear_cost(sizes, overhead + per_item * sizes, relative=relative)
    assert fit.model.overhead_ms == pytest.approx(overhead, abs=1e-6)
    assert fit.model.per_item_ms == pytest.approx(per_item, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.max_abs_residual_ms < 1e-6


def test_fit_reports_residuals_that_reveal_a_curve():
    sizes = np.array([1, 2, 4, 8, 16, 32, 64])
    fit = fit_linear_cost(sizes, 1.0 + 0.01 * sizes**2)
    assert fit.r_squared < 0.99
    table = fit.residual_table()
    assert list(table.columns) == ["batch_size", "measured_ms", "fitted_ms", "residual_ms", "residual_pct"]
    assert table["residual_ms"].sum() == pytest.approx(0.0, abs=1e-9)  # OLS with an intercept


def test_relative_fit_weights_small_batches_more():
    # Small batches cost more than the line through the big ones predicts (the ONNX Runtime shape).
    sizes = np.array([1, 2, 4, 8, 64, 256, 1024])
    measured = 0.005 * sizes + np.where(sizes <= 4, 0.02, 0.0) + 0.001
    absolute = fit_linear_cost(sizes, measured)
    relative = fit_linear_cost(sizes, measured, relative=True)
    assert abs(relative.residuals_ms[0]) < abs(absolute.residuals_ms[0])


def test_negative_raw_intercept_is_clipped_but_kept_visible():
    sizes = np.array([1, 10, 100])
    fit = fit_linear_cost(sizes, [0.5, 1.0, 20.0])
    assert fit.raw_overhead_ms < 0
    assert fit.model.overhead_ms == 0.0


@pytest.mark.parametrize(
    ("sizes", "times", "message"),
    [
        ([1, 2], [1.0], "same length"),
        ([4, 4], [1.0, 1.0], "two or more distinct"),
        ([1, 2], [1.0, float("nan")], "finite and > 0"),
        ([0, 2], [1.0, 2.0], r"batch_sizes\[0\] must be an integer >= 1, got 0"),
    ],
)
def test_fit_rejects_bad_input(sizes, times, message):
    with pytest.raises(ValueError, match=message):
        fit_linear_cost(sizes, times)


def test_measure_call_ms_times_each_batch_size_with_the_prepared_call():
    prepared = []

    def make_call(b):
        data = list(range(b))
        prepared.append(b)
        return lambda: sum(data)

    table = measure_call_ms(make_call, (1, 4, 16), n_calls=5, rounds=2, warmup_calls=1)
    assert prepared == [1, 4, 16]
    assert table["batch_size"].tolist() == [1, 4, 16]
    assert (table["n_calls"] == 10).all()
    assert (table["median_ms"] > 0).all()
    assert (table["min_ms"] <= table["median_ms"]).all()
    assert (table["median_ms"] <= table["p99_ms"]).all()


def test_measure_call_ms_rejects_zero_rounds():
    with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
        measure_call_ms(lambda b: lambda: None, (1,), rounds=0)


def test_forward_factory_times_the_forward_stage_on_the_first_records(churn_model, onnx_scorer, telco):
    from course_lib.serving.service import native_forward, onnx_forward

    records = features(telco.head(16)).astype(object).to_dict("records")
    native = forward_call_factory(native_forward(churn_model.pipeline), records)
    onnx = forward_call_factory(onnx_forward(onnx_scorer), records)
    np.testing.assert_allclose(native(8)(), onnx(8)(), atol=1e-5)
    assert native(8)().shape == (8,)
    with pytest.raises(ValueError, match="batch size 32 needs at least 32 records, got 16"):
        native(32)
    table = measure_call_ms(onnx, (1, 16), n_calls=2, rounds=1, warmup_calls=0)
    assert table["batch_size"].tolist() == [1, 16]
