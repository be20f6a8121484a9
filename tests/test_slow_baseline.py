"""The capstone's deliberately slow scorer: right answers, every stage timed, every mistake really made."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from course_lib.churn.model import load_or_train_churn_model
from course_lib.serving.feature_store import FeatureStore, make_lookup
from course_lib.serving.profiling import profile_requests
from course_lib.serving.slow_baseline import STAGES, SlowChurnScorer


@pytest.fixture(scope="module")
def model():
    return load_or_train_churn_model()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with FeatureStore.open(500, 4, folder=tmp_path_factory.mktemp("store")) as opened:
        yield opened


@pytest.fixture
def scorer(store, model, tmp_path):
    return SlowChurnScorer(store, model.pipeline, log_path=tmp_path / "requests.log")


def test_scores_are_the_reference_models_probabilities_for_the_stored_features(scorer, store, model):
    ids = store.sample_ids(20, seed=1)
    expected = model.pipeline.predict_proba(pd.DataFrame([store.get(cid) for cid in ids]))[:, 1]
    got = np.array([scorer.score(cid) for cid in ids])
    assert np.allclose(got, expected, rtol=0, atol=1e-12)
    assert all(isinstance(scorer.score(cid), float) for cid in ids[:3])


def test_every_request_is_profiled_in_the_five_named_stages(scorer, store):
    p, profile = scorer.score_profiled(store.customer_id(7))
    assert 0.0 <= p <= 1.0
    assert tuple(profile.stages_ms) == STAGES
    assert all(ms >= 0 for ms in profile.stages_ms.values())
    budget = profile_requests(scorer.timed_score, store.sample_ids(5, seed=2), warmup_requests=1)
    assert len(budget) == 5 and budget.stage_names == list(STAGES)


def test_the_lookup_reads_the_store_without_its_index(scorer, store, monkeypatch):
    calls = []
    original = store.get

    def spy(customer_id, *, use_index=True):
        calls.append(use_index)
        return original(customer_id, use_index=use_index)

    monkeypatch.setattr(store, "get", spy)
    scorer.score(store.customer_id(3))
    assert calls == [False]
    assert "SCAN" in store.query_plan(use_index=False)


def test_the_model_is_re_created_for_every_request(scorer, store, monkeypatch):
    import course_lib.serving.slow_baseline as slow

    loads = []
    real_loads = slow.pickle.loads
    monkeypatch.setattr(slow.pickle, "loads", lambda data: loads.append(len(data)) or real_loads(data))
    for cid in store.sample_ids(3, seed=3):
        scorer.score(cid)
    assert len(loads) == 3 and loads[0] > 100_000, "the whole pickled pipeline, once per request"
    assert scorer.reference_pipeline() is not scorer.reference_pipeline()


def test_each_request_logs_its_whole_feature_dict_as_json(scorer, store):
    ids = store.sample_ids(4, seed=4)
    probabilities = [scorer.score(cid) for cid in ids]
    text = scorer.log_path.read_text(encoding="utf-8")
    decoder, records, pos = json.JSONDecoder(), [], 0
    while pos < len(text.rstrip()):
        record, end = decoder.raw_decode(text, pos)
        records.append(record)
        pos = end + 1
    assert [r["customer_id"] for r in records] == ids
    assert [r["churn_probability"] for r in records] == probabilities
    for record, cid in zip(records, ids, strict=True):
        stored = store.get(cid)
        assert record["features"].keys() == stored.keys()
        for key, value in stored.items():
            assert record["features"][key] == value or (
                math.isnan(value) and math.isnan(record["features"][key])
            )


def test_a_new_scorer_starts_an_empty_log(store, model, tmp_path):
    log = tmp_path / "requests.log"
    log.write_text("old requests\n", encoding="utf-8")
    SlowChurnScorer(store, model.pipeline, log_path=log)
    assert log.read_text(encoding="utf-8") == ""


def test_a_replacement_lookup_is_used_and_changes_nothing_else(store, model, tmp_path):
    indexed = make_lookup(store, "indexed")
    seen = []

    def lookup(customer_id):
        seen.append(customer_id)
        return indexed(customer_id)

    slow = SlowChurnScorer(store, model.pipeline, log_path=tmp_path / "a.log")
    fixed = SlowChurnScorer(store, model.pipeline, log_path=tmp_path / "b.log", lookup=lookup)
    cid = store.customer_id(11)
    assert fixed.score(cid) == slow.score(cid) and seen == [cid]
    assert tuple(fixed.timed_score(cid).stages_ms) == STAGES


def test_unknown_customers_and_bad_arguments_raise_clear_errors(scorer, store, model, tmp_path):
    with pytest.raises(KeyError, match="SC-9999999"):
        scorer.score("SC-9999999")
    with pytest.raises(TypeError, match="customer_id must be a str"):
        scorer.score(42)
    with pytest.raises(TypeError, match="store must be"):
        SlowChurnScorer("features.sqlite", model.pipeline, log_path=tmp_path / "x.log")
    with pytest.raises(TypeError, match="pipeline must be"):
        SlowChurnScorer(store, object(), log_path=tmp_path / "x.log")
    with pytest.raises(TypeError, match="lookup must be"):
        SlowChurnScorer(store, model.pipeline, log_path=tmp_path / "x.log", lookup="indexed")
