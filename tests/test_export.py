"""ONNX export: one graph, parity with native XGBoost (missing values included), clear boundary errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from course_lib.churn.export import ParityError, check_parity, make_session, pipeline_to_onnx
from course_lib.churn.model import features


def test_graph_has_one_input_per_feature_and_a_probability_output(onnx_model):
    names = [i.name for i in onnx_model.graph.input]
    assert len(names) == 19
    assert [o.name for o in onnx_model.graph.output] == ["label", "probabilities"]


def test_onnx_matches_native_on_the_test_set(churn_model, onnx_scorer):
    report = check_parity(churn_model.pipeline, onnx_scorer, features(churn_model.split.test))
    assert report.passed and report.max_abs_diff <= 1e-5
    assert report.n_rows == len(churn_model.split.test)


def test_onnx_matches_native_on_rows_with_missing_values(churn_model, onnx_scorer, telco):
    blank = features(telco[telco["total_charges"].isna()])
    assert check_parity(churn_model.pipeline, onnx_scorer, blank).n_rows_with_missing == 11
    X = features(churn_model.split.test).copy()
    rng = np.random.default_rng(0)
    for col in ("tenure", "monthly_charges", "total_charges"):
        X.loc[rng.random(len(X)) < 0.25, col] = np.nan
    report = check_parity(churn_model.pipeline, onnx_scorer, X)
    assert report.n_rows_with_missing > 500 and report.max_abs_diff <= 1e-5


def test_parity_failure_raises_with_the_worst_rows(churn_model, onnx_scorer):
    from course_lib.churn.model import train_churn_model

    X = features(churn_model.split.test).iloc[:50]
    other = train_churn_model(n_estimators=20)  # a different model: parity must fail loudly
    with pytest.raises(ParityError, match="worst rows") as err:
        check_parity(other.pipeline, onnx_scorer, X)
    assert len(err.value.worst_rows) == 5
    assert {"p_native", "p_onnx", "abs_diff"} <= set(err.value.worst_rows.columns)


def test_misspelt_column_is_named_with_a_suggestion(churn_model, onnx_scorer):
    X = features(churn_model.split.test).rename(columns={"tenure": "tenur"})
    with pytest.raises(ValueError, match=r"'tenur'.*did you mean 'tenure'"):
        onnx_scorer.predict_proba(X)


def test_missing_column_is_named(churn_model, onnx_scorer):
    X = features(churn_model.split.test).drop(columns=["contract"])
    with pytest.raises(ValueError, match="missing column 'contract'"):
        onnx_scorer.predict_proba(X)


def test_wrong_dtype_is_named(churn_model, onnx_scorer):
    X = features(churn_model.split.test).astype({"monthly_charges": str})
    with pytest.raises(ValueError, match="'monthly_charges' must be numeric"):
        onnx_scorer.predict_proba(X)
    X = features(churn_model.split.test).copy()
    X["contract"] = 1
    with pytest.raises(ValueError, match="'contract' must hold strings"):
        onnx_scorer.predict_proba(X)


def test_unknown_level_is_rejected_not_encoded_as_zeros(churn_model, onnx_scorer):
    X = features(churn_model.split.test).iloc[:3].copy()
    X["contract"] = X["contract"].astype(str)
    X.iloc[0, X.columns.get_loc("contract")] = "Three year"
    with pytest.raises(ValueError, match="unknown levels"):
        onnx_scorer.predict_proba(X)


def test_records_path_matches_dataframe_path(churn_model, onnx_scorer):
    X = features(churn_model.split.test).iloc[:20]
    records = [
        {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
        for row in X.astype(object).to_dict(orient="records")
    ]
    from_records = onnx_scorer.run(onnx_scorer.feeds_from_records(records))
    np.testing.assert_allclose(from_records, onnx_scorer.predict_proba(X), atol=0)
    # the unchecked builder (one array per kind, each input a row of it) gives the DataFrame path's feeds
    built, expected = onnx_scorer.feeds_from_checked_records(records), onnx_scorer.feeds(X)
    assert set(built) == set(expected) == set(onnx_scorer.input_names)
    for name, feed in built.items():
        assert feed.shape == (20, 1) and feed.flags.c_contiguous, name
        if feed.dtype == object:
            assert feed.tolist() == expected[name].tolist(), name
        else:
            np.testing.assert_array_equal(feed, expected[name], err_msg=name)


def test_records_with_bad_fields_are_rejected(churn_model, onnx_scorer):
    record = features(churn_model.split.test).iloc[0].to_dict()
    record = {k: (v.item() if hasattr(v, "item") else v) for k, v in record.items()}
    with pytest.raises(ValueError, match="missing field 'tenure'"):
        onnx_scorer.feeds_from_records([{k: v for k, v in record.items() if k != "tenure"}])
    with pytest.raises(ValueError, match=r"'tenure' must be an integer in \[0, 72\].*got '12'"):
        onnx_scorer.feeds_from_records([{**record, "tenure": "12"}])
    with pytest.raises(ValueError, match="unexpected fields"):
        onnx_scorer.feeds_from_records([{**record, "colour": "red"}])
    with pytest.raises(ValueError, match="records must be non-empty"):
        onnx_scorer.feeds_from_records([])


def test_session_options_are_validated(onnx_model, tmp_path):
    with pytest.raises(ValueError, match="intra_op_num_threads"):
        make_session(onnx_model, intra_op_num_threads=-1)
    with pytest.raises(ValueError, match="graph_optimization_level"):
        make_session(onnx_model, graph_optimization_level="max")
    with pytest.raises(ValueError, match="not available"):
        make_session(onnx_model, providers=("NoSuchExecutionProvider",))
    with pytest.raises(FileNotFoundError, match=r"absent\.onnx"):
        make_session(tmp_path / "absent.onnx")


def test_session_loads_from_a_file(onnx_model, tmp_path, churn_model):
    path = tmp_path / "churn.onnx"
    path.write_bytes(onnx_model.SerializeToString())
    session = make_session(path)
    assert len(session.get_inputs()) == 19


def test_pipeline_to_onnx_is_repeatable(churn_model, onnx_model):
    again = pipeline_to_onnx(churn_model.pipeline)
    assert again.graph.SerializeToString() == onnx_model.graph.SerializeToString()


def test_scorer_rejects_non_dataframes(onnx_scorer):
    with pytest.raises(TypeError, match="DataFrame"):
        onnx_scorer.predict_proba(np.zeros((2, 19)))
    with pytest.raises(ValueError, match="X must be non-empty"):
        check_parity(None, onnx_scorer, pd.DataFrame())


# -- each score tied to the model that made it (issue 10, item 3) ------------------------------
def test_the_onnx_file_carries_the_model_version_and_the_data_checksum(churn_model, onnx_model, onnx_scorer):
    from course_lib.churn.data import TELCO_SHA256
    from course_lib.churn.export import METADATA_DATA_SHA256, METADATA_MODEL_VERSION

    meta = {p.key: p.value for p in onnx_model.metadata_props}
    assert meta[METADATA_MODEL_VERSION] == churn_model.model_version
    assert meta[METADATA_DATA_SHA256] == TELCO_SHA256
    assert (onnx_scorer.model_version, onnx_scorer.data_sha256) == (churn_model.model_version, TELCO_SHA256)
    onnx_scorer.check_model_version(churn_model.model_version)


def test_a_model_paired_with_another_models_onnx_file_is_refused(churn_model, onnx_scorer, tmp_path):
    """The vector: churn_service(churn_model=A, onnx_scorer=B) answered B's score under A's version."""
    from course_lib.churn.export import ModelMismatchError, OnnxChurnScorer
    from course_lib.churn.model import train_churn_model
    from course_lib.serving.service import churn_service

    other = train_churn_model(n_estimators=20)
    assert other.model_version != churn_model.model_version
    with pytest.raises(ModelMismatchError, match=f"exported from model '{churn_model.model_version}'"):
        churn_service(
            "onnxruntime", churn_model=other, onnx_scorer=onnx_scorer, n_customers=500, store_folder=tmp_path
        )
    unversioned = pipeline_to_onnx(churn_model.pipeline)
    del unversioned.metadata_props[:]
    with pytest.raises(ModelMismatchError, match="exported from model None"):
        OnnxChurnScorer(make_session(unversioned)).check_model_version(churn_model.model_version)
    matched = churn_service(
        "onnxruntime",
        churn_model=churn_model,
        onnx_scorer=onnx_scorer,
        n_customers=500,
        store_folder=tmp_path,
    )
    answer = matched.handle(b'{"customer_id": "SC-0000042"}').json()
    assert answer["model_version"] == onnx_scorer.model_version == churn_model.model_version


def test_a_pipeline_without_trees_gets_a_version_only_when_given(churn_model):
    from course_lib.churn.export import METADATA_MODEL_VERSION
    from course_lib.churn.model import make_baseline_pipeline

    X, y = features(churn_model.split.train), churn_model.split.train["churn"].astype(int)
    logistic = make_baseline_pipeline().fit(X, y)
    keys = {p.key for p in pipeline_to_onnx(logistic).metadata_props}
    assert METADATA_MODEL_VERSION not in keys
    tagged = pipeline_to_onnx(logistic, model_version="logistic-1")
    assert {p.key: p.value for p in tagged.metadata_props}[METADATA_MODEL_VERSION] == "logistic-1"


def test_check_parity_agrees_with_its_core_on_the_lesson_vectors(churn_model, onnx_scorer, telco):
    from course_lib.churn.export.parity import parity_gaps

    def native(rows):
        return churn_model.pipeline.predict_proba(rows)[:, 1]

    for X in (features(churn_model.split.test), features(telco[telco["total_charges"].isna()])):
        gaps = parity_gaps(native, onnx_scorer.predict_proba, X)
        assert gaps.shape == (len(X),) and gaps.dtype == np.float64
        report = check_parity(churn_model.pipeline, onnx_scorer, X)
        assert report.max_abs_diff == float(gaps.max())
        assert report.passed == bool(gaps.max() <= report.atol)


def test_parity_core_on_a_hand_checkable_example():
    from course_lib.churn.export.parity import parity_gaps

    X = pd.DataFrame({"p": [0.1, 0.5, 0.9]})
    gaps = parity_gaps(
        lambda X: X["p"].to_numpy(), lambda X: X["p"].to_numpy() + np.array([0.0, 0.25, 0.0]), X
    )
    np.testing.assert_allclose(gaps, [0.0, 0.25, 0.0])
