"""course_lib.variants and course_lib.neural_model: the variant scorecard on a small MLP."""

from __future__ import annotations

import onnx
import pytest

from course_lib.accuracy_budget import AccuracyBudget
from course_lib.compression import make_variant
from course_lib.export import pipeline_to_onnx
from course_lib.neural_model import make_mlp_pipeline, mlp_n_parameters, train_mlp_churn_model
from course_lib.variants import load_scorers, variant_scorecard


@pytest.fixture(scope="module")
def variant_paths(churn_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("variants")
    pipe = train_mlp_churn_model(churn_model.split.train, hidden_layer_sizes=(32,), max_iter=20)
    fp32 = folder / "fp32.onnx"
    onnx.save(pipeline_to_onnx(pipe), fp32)
    return {
        "fp32": fp32,
        "fp16": make_variant(fp32, folder / "fp16.onnx", "fp16"),
        "int8-dynamic": make_variant(fp32, folder / "int8.onnx", "int8-dynamic"),
    }


def test_scorecard_has_size_accuracy_verdict_and_latency_for_every_variant(variant_paths, churn_model):
    card = variant_scorecard(
        variant_paths,
        churn_model.split.test,
        AccuracyBudget(),
        batch_sizes=(1, 8),
        n_calls={1: 5, 8: 5},
        rounds=1,
    )
    assert list(card.index) == ["fp32", "fp16", "int8-dynamic"]
    assert card.loc["fp32", "size_vs_reference"] == 1.0 and card.loc["fp32", "max_abs_diff"] == 0
    assert card.loc["int8-dynamic", "file_bytes"] < card.loc["fp32", "file_bytes"]
    assert card.loc["fp16", "max_abs_diff"] < 2e-3
    assert bool(card.loc["fp32", "passes"]) and bool(card.loc["fp16", "passes"])
    assert {"median_us_b1", "speedup_b8", "worst_slice", "log_loss_increase"} <= set(card.columns)
    assert card.loc["fp32", "speedup_b1"] == 1.0


def test_scorecard_without_timing_and_with_bad_reference(variant_paths, churn_model):
    card = variant_scorecard(variant_paths, churn_model.split.test, AccuracyBudget(), batch_sizes=None)
    assert "median_us_b1" not in card.columns
    with pytest.raises(ValueError, match="reference"):
        variant_scorecard(
            variant_paths, churn_model.split.test, AccuracyBudget(), reference="int4", batch_sizes=None
        )


def test_missing_variant_file_raises_with_its_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="'fp16'"):
        load_scorers({"fp16": tmp_path / "nope.onnx"})
    with pytest.raises(ValueError, match="at least one"):
        load_scorers({})


def test_mlp_pipeline_rejects_unknown_parameters_and_unfitted_models():
    with pytest.raises(ValueError, match="hidden_layers"):
        make_mlp_pipeline(hidden_layers=(3,))
    with pytest.raises(ValueError, match="fitted 'mlp'"):
        mlp_n_parameters(make_mlp_pipeline())
