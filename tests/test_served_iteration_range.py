"""Early-stopped XGBoost models are scored and timed with the trees they serve (dmlc/xgboost#8034).

The model: learning rate 0.3, early stopping after 10 rounds without improvement on the validation
split -> 32 rounds trained, best iteration 21, so ``predict_proba`` uses 22 rounds.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from course_lib.churn.export import OnnxChurnScorer, make_session, pipeline_to_onnx
from course_lib.churn.model import features, labels, make_xgb_pipeline, split_telco
from course_lib.churn.pruning import prefix_probabilities, prune_trees, served_rounds
from course_lib.measure.throughput import churn_candidates
from course_lib.measure.throughput import churn_candidates as churn_candidates_reexported


@pytest.fixture(scope="module")
def early_stopped(telco):
    split = split_telco(telco)
    pipe = make_xgb_pipeline(n_estimators=400, learning_rate=0.3, early_stopping_rounds=10)
    valid = pipe.named_steps["preprocess"].fit(features(split.train)).transform(features(split.valid))
    pipe.fit(
        features(split.train),
        labels(split.train),
        xgb__eval_set=[(valid, labels(split.valid))],
        xgb__verbose=False,
    )
    return pipe, split


def test_the_model_is_early_stopped_as_in_the_report(early_stopped):
    pipe, _ = early_stopped
    booster = pipe.named_steps["xgb"].get_booster()
    assert booster.num_boosted_rounds() == 32
    assert booster.best_iteration == 21
    assert served_rounds(pipe.named_steps["xgb"]) == 22


def test_the_throughput_candidate_scores_the_served_model(early_stopped):
    pipe, split = early_stopped
    X = features(split.test.iloc[:512])
    expected = pipe.predict_proba(X)[:, 1]
    (candidate,) = churn_candidates(SimpleNamespace(pipeline=pipe), None, runtimes=("xgboost",), n_rows=512)
    # the candidate scores synthetic customers; score the test rows the same way it does
    booster = pipe.named_steps["xgb"].get_booster()
    matrix = pipe.named_steps["preprocess"].transform(X).astype(np.float32)
    served = booster.inplace_predict(matrix, iteration_range=(0, served_rounds(pipe.named_steps["xgb"])))
    all_trees = booster.inplace_predict(matrix)
    np.testing.assert_allclose(served, expected, atol=1e-6)
    assert np.abs(all_trees - expected).max() > 0.01  # the bug the candidate must not have
    from course_lib.churn.data import make_customers

    synthetic = features(make_customers(512, seed=0))
    got = np.asarray(candidate.make_call(512)(), dtype=np.float64)
    np.testing.assert_allclose(got, pipe.predict_proba(synthetic)[:, 1], atol=1e-6)
    assert churn_candidates_reexported is churn_candidates


def test_tree_curves_and_pruning_stop_at_the_served_rounds(early_stopped):
    pipe, split = early_stopped
    probs = prefix_probabilities(pipe, split.valid, n_trees=[5, 10])
    assert list(probs) == [5, 10, 22]
    X = features(split.valid)
    np.testing.assert_allclose(probs[22], pipe.predict_proba(X)[:, 1], atol=1e-7)
    pruned = prune_trees(pipe, 10)
    assert served_rounds(pruned.named_steps["xgb"]) == 10
    np.testing.assert_allclose(pruned.predict_proba(X)[:, 1], probs[10], atol=1e-7)
    with pytest.raises(ValueError, match=r"n_trees must be an integer >= 1 and <= 22, got 30"):
        prune_trees(pipe, 30)


def test_the_onnx_export_serves_the_same_trees(early_stopped):
    pipe, split = early_stopped
    X = features(split.test)
    scorer = OnnxChurnScorer(make_session(pipeline_to_onnx(pipe)))
    np.testing.assert_allclose(scorer.predict_proba(X), pipe.predict_proba(X)[:, 1], atol=1e-5)


def test_served_rounds_rejects_what_is_not_an_xgb_classifier():
    with pytest.raises(ValueError, match="XGBClassifier"):
        served_rounds(object())
