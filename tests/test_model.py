"""The churn model: split, quality bar, slices, baseline, version hash."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.churn.model import (
    classification_metrics,
    features,
    labels,
    make_baseline_pipeline,
    metrics_by_slice,
    model_version,
    split_telco,
    train_churn_model,
)


def test_split_is_stratified_and_disjoint(telco):
    split = split_telco(telco)
    ids = [set(part["customer_id"]) for part in (split.train, split.valid, split.test)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert sum(split.sizes().values()) == len(telco)
    for part in (split.train, split.valid, split.test):
        assert abs(part["churn"].mean() - telco["churn"].mean()) < 0.01


@pytest.mark.parametrize(("valid", "test"), [(0.0, 0.2), (0.2, 1.0), (0.5, 0.5)])
def test_split_rejects_impossible_fractions(telco, valid, test):
    with pytest.raises(ValueError, match="fraction"):
        split_telco(telco, valid_fraction=valid, test_fraction=test)


def test_xgboost_reaches_the_quality_bar_on_the_test_set(churn_model):
    test = churn_model.split.test
    metrics = classification_metrics(labels(test), churn_model.predict_proba(test))
    assert metrics["roc_auc"] >= 0.84
    assert metrics["log_loss"] < 0.45


def test_logistic_baseline_is_reported_and_reasonable(churn_model):
    split = churn_model.split
    base = make_baseline_pipeline().fit(features(split.train), labels(split.train))
    auc = classification_metrics(labels(split.test), base.predict_proba(features(split.test))[:, 1])[
        "roc_auc"
    ]
    assert 0.80 < auc < 0.90


def test_slice_table_covers_every_level_with_row_counts(churn_model):
    test = churn_model.split.test
    table = metrics_by_slice(test, churn_model.predict_proba(test))
    assert table.loc[("all", "all"), "n"] == len(test)
    for slice_name in ("contract", "internet_service", "tenure_band", "senior_citizen"):
        assert table.loc[slice_name, "n"].sum() == len(test)
    assert {"roc_auc", "pr_auc", "log_loss", "brier"} <= set(table.columns)


def test_training_is_deterministic_and_version_is_a_content_hash(churn_model):
    again = train_churn_model()
    assert again.model_version == churn_model.model_version
    assert len(churn_model.model_version) == 12
    other = train_churn_model(n_estimators=50)
    assert other.model_version != churn_model.model_version
    assert model_version(again.pipeline) == churn_model.model_version


def test_metrics_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="equal length"):
        classification_metrics(np.array([0, 1, 1]), np.array([0.2, 0.8]))


def test_metrics_of_a_single_class_slice_leave_auc_undefined():
    m = classification_metrics(np.array([0, 0, 0]), np.array([0.1, 0.2, 0.3]))
    assert np.isnan(m["roc_auc"]) and m["n"] == 3


# -- the model cache (issue 10, item 5) --------------------------------------------------------
def test_the_cache_key_changes_with_library_versions_and_training_code(monkeypatch):
    from course_lib.churn import model

    key = model.model_cache_key()
    assert key == model.model_cache_key() and len(key) == 10
    real_version = model.version  # importlib.metadata.version, as the module imported it
    monkeypatch.setattr(model, "version", lambda name: "9.9.9" if name == "xgboost" else real_version(name))
    assert model.model_cache_key() != key  # an XGBoost upgrade retrains
    monkeypatch.undo()
    monkeypatch.setattr(model, "_TRAINING_CODE", ("data.py",))
    assert model.model_cache_key() != key  # the hash covers model.py's code
    monkeypatch.undo()
    real_read = model.Path.read_bytes
    monkeypatch.setattr(
        model.Path,
        "read_bytes",
        lambda self: real_read(self) + (b"# edited" if self.name == "data.py" else b""),
    )
    assert model.model_cache_key() != key  # an edit to the preprocessing code retrains


def test_load_or_train_reuses_the_cache_named_by_the_key(tmp_path, monkeypatch):
    import pickle

    from course_lib.churn import model

    path = tmp_path / f"churn_model_{model.model_cache_key()}.pkl"
    path.write_bytes(pickle.dumps("cached model"))
    assert model.load_or_train_churn_model(tmp_path) == "cached model"
