"""course_lib.churn.pruning: the trees curve, its flattening point, and pruning without retraining."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from course_lib.churn.export import OnnxChurnScorer, check_parity, make_session, pipeline_to_onnx
from course_lib.churn.model import features
from course_lib.churn.pruning import flattening_point, prefix_probabilities, prune_trees, trees_curve


def test_trees_curve_ends_with_the_full_model(churn_model):
    curve = trees_curve(churn_model.pipeline, churn_model.split.valid, [10, 50, 100])
    assert list(curve.index) == [10, 50, 100, 400]
    assert curve["auc_vs_full"].iloc[-1] == 0
    assert curve.loc[10, "log_loss"] > curve.loc[400, "log_loss"]  # 10 trees are badly calibrated
    default = trees_curve(churn_model.pipeline, churn_model.split.valid)
    assert default.index[0] == 10 and default.index[-1] == 400


def test_curve_matches_iteration_range_predictions(churn_model):
    from sklearn.metrics import roc_auc_score

    pipe, df = churn_model.pipeline, churn_model.split.valid
    curve = trees_curve(pipe, df, [50])
    X = pipe.named_steps["preprocess"].transform(features(df))
    p = pipe.named_steps["xgb"].predict_proba(X, iteration_range=(0, 50))[:, 1]
    assert curve.loc[50, "roc_auc"] == pytest.approx(roc_auc_score(df["churn"].astype(int), p))


def test_prefix_probabilities_grow_towards_the_full_model(churn_model):
    probs = prefix_probabilities(churn_model.pipeline, churn_model.split.valid, [1, 100])
    assert list(probs) == [1, 100, 400]
    full = churn_model.predict_proba(churn_model.split.valid)
    np.testing.assert_allclose(probs[400], full, atol=1e-7)
    gaps = [np.abs(p - full).mean() for p in probs.values()]
    assert gaps[0] > gaps[1] > gaps[2] == pytest.approx(0, abs=1e-7)


def test_flattening_point_is_the_fewest_trees_within_tolerance():
    curve = pd.DataFrame(
        {"roc_auc": [0.80, 0.836, 0.839, 0.840], "log_loss": [0.50, 0.45, 0.43, 0.42]},
        index=pd.Index([10, 50, 100, 400], name="n_trees"),
    )
    assert flattening_point(curve, auc_tolerance=0.005) == 50
    assert flattening_point(curve, auc_tolerance=0.005, log_loss_tolerance=0.01) == 100
    assert flattening_point(curve, auc_tolerance=0.0) == 400
    with pytest.raises(ValueError, match="auc_tolerance must be a finite number >= 0"):
        flattening_point(curve, auc_tolerance=-1)
    with pytest.raises(ValueError, match="trees_curve"):
        flattening_point(curve[["roc_auc"]])


def test_pruned_model_predicts_like_its_first_trees_and_exports_to_onnx(churn_model):
    pipe, df = churn_model.pipeline, churn_model.split.valid
    pruned = prune_trees(pipe, 60)
    assert pruned.named_steps["xgb"].get_booster().num_boosted_rounds() == 60
    assert pipe.named_steps["xgb"].get_booster().num_boosted_rounds() == 400  # original untouched
    X = pipe.named_steps["preprocess"].transform(features(df))
    expected = pipe.named_steps["xgb"].predict_proba(X, iteration_range=(0, 60))[:, 1]
    np.testing.assert_allclose(pruned.predict_proba(features(df))[:, 1], expected, rtol=0, atol=1e-7)
    scorer = OnnxChurnScorer(make_session(pipeline_to_onnx(pruned)))
    assert check_parity(pruned, scorer, features(df)).passed


@pytest.mark.parametrize("bad", [0, 401, 2.5, True])
def test_bad_tree_counts_raise(churn_model, bad):
    with pytest.raises(ValueError, match="n_trees"):
        prune_trees(churn_model.pipeline, bad)


def test_bad_curve_grids_and_pipelines_raise(churn_model):
    with pytest.raises(ValueError, match=r"n_trees\[0\] must be an integer >= 1 and <= 400, got 0"):
        trees_curve(churn_model.pipeline, churn_model.split.valid, [0, 10])
    with pytest.raises(ValueError, match="strictly increasing"):
        trees_curve(churn_model.pipeline, churn_model.split.valid, [50, 10])
    from course_lib.churn.model import make_baseline_pipeline

    with pytest.raises(ValueError, match="XGBClassifier"):
        trees_curve(make_baseline_pipeline(), churn_model.split.valid)
