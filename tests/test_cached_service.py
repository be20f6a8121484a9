"""The cached scoring path: hits skip lookup and model, keys follow the model version, served over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from course_lib.measure.experiments import measure_dedup
from course_lib.serving.cache.redis_server import redis_server
from course_lib.serving.cache.service import CACHED_STAGES, CachedChurnService, StoreSnapshot, store_snapshot
from course_lib.serving.cache.stores import InProcessPredictionCache, RedisPredictionCache
from course_lib.serving.feature_store import FeatureStore, build_feature_store, make_lookup
from course_lib.serving.server import serve_in_thread
from course_lib.serving.service import ChurnClient, ChurnService, create_app, onnx_forward

N_CUSTOMERS = 2_000


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    build = build_feature_store(N_CUSTOMERS, seed=3, folder=tmp_path_factory.mktemp("store"))
    with FeatureStore(build.path) as opened:
        yield opened


@pytest.fixture(scope="module")
def service(store, churn_model, onnx_scorer):
    return ChurnService(
        make_lookup(store, "indexed"), onnx_forward(onnx_scorer), model_version=churn_model.model_version
    )


class CountingForward:
    """Wraps a forward stage and counts the model calls."""

    def __init__(self, forward):
        self.forward, self.calls = forward, 0

    def __call__(self, records):
        self.calls += 1
        return self.forward(records)


def body(customer: str) -> bytes:
    return json.dumps({"customer_id": customer}).encode()


def test_hit_skips_lookup_and_model_and_returns_the_same_score(store, service):
    cached = CachedChurnService(
        service, InProcessPredictionCache(100, 60.0), feature_snapshot=store_snapshot(store)
    )
    first = cached.handle(body("SC-0000042"))
    second = cached.handle(body("SC-0000042"))
    assert first.status_code == second.status_code == 200
    a, b = first.json(), second.json()
    assert (a["cache"], b["cache"]) == ("miss", "hit")
    assert a["churn_probability"] == b["churn_probability"]
    assert a["model_version"] == service.model_version
    assert list(first.profile.stages_ms) == list(CACHED_STAGES)
    assert list(second.profile.stages_ms) == ["parse", "cache_get", "format"]
    direct = service.handle(body("SC-0000042")).json()["churn_probability"]
    assert b["churn_probability"] == direct


def test_refusals_pass_through_and_are_never_cached(store, service):
    cache = InProcessPredictionCache(100, 60.0)
    cached = CachedChurnService(service, cache, feature_snapshot=store_snapshot(store))
    assert cached.handle(b"{not json").status_code == 400
    assert cached.handle(body(f"SC-{N_CUSTOMERS + 5:07d}")).status_code == 404
    assert cached.handle(json.dumps({"customer_id": 7}).encode()).status_code == 422
    assert len(cache) == 0
    assert cache.stats().lookups == 1  # only the unknown customer reached the cache (a miss)


def test_model_version_switch_never_serves_the_old_models_score(store, churn_model, onnx_scorer):
    cache = InProcessPredictionCache(1000, 600.0)
    old_forward = CountingForward(onnx_forward(onnx_scorer))
    old = ChurnService(make_lookup(store, "indexed"), old_forward, model_version="old-model")
    new_forward = CountingForward(lambda records: np.full(len(records), 0.5))  # a different model
    new = ChurnService(make_lookup(store, "indexed"), new_forward, model_version="new-model")
    snapshot = store_snapshot(store)
    ids = [store.customer_id(i) for i in range(1, 51)]
    before = CachedChurnService(old, cache, feature_snapshot=snapshot)
    for cid in ids * 2:
        before.score(cid)
    assert old_forward.calls == 50
    after = CachedChurnService(new, cache, feature_snapshot=snapshot)  # same cache, new model
    answers = [after.score(cid) for cid in ids]
    assert all(a["churn_probability"] == 0.5 and a["cache"] == "miss" for a in answers)
    assert new_forward.calls == 50
    # the version-less key of a public post-mortem: every answer after the switch is the OLD model's
    unsafe_cache = InProcessPredictionCache(1000, 600.0)
    for cid in ids:
        CachedChurnService(old, unsafe_cache, feature_snapshot=snapshot, key_model_version=False).score(cid)
    unsafe = CachedChurnService(new, unsafe_cache, feature_snapshot=snapshot, key_model_version=False)
    stale = [a for a in map(unsafe.score, ids) if a["churn_probability"] != 0.5]
    assert len(stale) == 50 and all(a["model_version"] == "new-model" for a in stale)


def test_a_new_feature_snapshot_is_a_miss(store, service):
    cache = InProcessPredictionCache(100, 60.0)
    CachedChurnService(service, cache, feature_snapshot="features@1").score("SC-0000007")
    refreshed = CachedChurnService(service, cache, feature_snapshot="features@2")
    assert refreshed.score("SC-0000007")["cache"] == "miss"


def _file_backed_service(tmp_path, record):
    """A service whose features live in a dict, with a store file that a refresh rewrites."""
    store_file = tmp_path / "features.sqlite"
    store_file.write_text("refresh 1")
    features = {"SC-0000001": {**record, "tenure": 1}}
    service = ChurnService(
        features.get, lambda records: np.array([r["tenure"] / 100 for r in records]), model_version="m1"
    )
    return SimpleNamespace(path=store_file), features, service


@pytest.mark.parametrize("how", ["rewrite in place", "replace the file"])
def test_a_refreshed_store_file_is_seen_at_request_time(tmp_path, how, store):
    fake_store, features, service = _file_backed_service(tmp_path, store.get("SC-0000001"))
    cached = CachedChurnService(
        service, InProcessPredictionCache(100, 3600.0), feature_snapshot=store_snapshot(fake_store)
    )
    assert cached.score("SC-0000001")["churn_probability"] == 0.01
    assert cached.score("SC-0000001")["cache"] == "hit"
    before = cached.feature_snapshot
    features["SC-0000001"] = {**features["SC-0000001"], "tenure": 60}  # the refresh: new features, new file
    if how == "rewrite in place":
        fake_store.path.write_text("refresh 2, longer")
    else:
        new_file = tmp_path / "features.sqlite.tmp"
        new_file.write_text("refresh 2")
        os.replace(new_file, fake_store.path)
    assert cached.feature_snapshot != before
    answer = cached.score("SC-0000001")
    assert answer["cache"] == "miss" and answer["churn_probability"] == 0.6


def test_snapshot_check_interval_bounds_how_long_the_old_version_is_used(tmp_path):
    store_file = tmp_path / "features.sqlite"
    store_file.write_text("refresh 1")
    clock = [0.0]
    snapshot = StoreSnapshot(store_file, check_interval_ms=100.0, timer=lambda: clock[0])
    first = snapshot()
    assert first.startswith("features.sqlite@") and str(snapshot) == first
    store_file.write_text("refresh 2, longer")
    clock[0] = 0.099
    assert snapshot() == first  # inside the interval: not re-read yet
    clock[0] = 0.100
    assert snapshot() != first
    with pytest.raises(ValueError, match="check_interval_ms"):
        StoreSnapshot(store_file, check_interval_ms=-1)
    with pytest.raises(FileNotFoundError):
        StoreSnapshot(tmp_path / "missing.sqlite")


def test_feature_snapshot_must_be_a_str_or_callable(tmp_path, store):
    _, _, service = _file_backed_service(tmp_path, store.get("SC-0000001"))
    with pytest.raises(TypeError, match="feature_snapshot"):
        CachedChurnService(service, InProcessPredictionCache(10, 60.0), feature_snapshot=42)
    with pytest.raises(ValueError, match="feature_snapshot"):
        CachedChurnService(service, InProcessPredictionCache(10, 60.0), feature_snapshot=lambda: "a|b")


def test_served_over_http_by_the_lesson2_app(store, service):
    cache = InProcessPredictionCache(100, 60.0)
    cached = CachedChurnService(service, cache, feature_snapshot=store_snapshot(store))
    with serve_in_thread(create_app(cached), max_lifetime_s=60) as server, ChurnClient(server.url) as client:
        miss, miss_profile = client.score("SC-0000010")
        hit, hit_profile = client.score("SC-0000010")
        assert (miss.json()["cache"], hit.json()["cache"]) == ("miss", "hit")
        assert "lookup" in miss_profile.stages_ms and "lookup" not in hit_profile.stages_ms
        assert "transport" in hit_profile.stages_ms
        assert client.post(b'{"customer_id": 1}').status_code == 422
        assert client.score("SC-0000010")[0].status_code == 200  # still serving
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (2, 1)


@pytest.mark.needs("redis-server")
def test_the_same_path_with_redis(store, service):
    with redis_server(max_lifetime_s=120) as server:
        cache = RedisPredictionCache(server.client(), ttl_s=60.0)
        cached = CachedChurnService(service, cache, feature_snapshot=store_snapshot(store))
        a, b = cached.score("SC-0000011"), cached.score("SC-0000011")
        assert (a["cache"], b["cache"]) == ("miss", "hit")
        assert a["churn_probability"] == b["churn_probability"]
        assert cache.stats().hits == 1


def test_dedup_counts_identical_requests_waiting_together(store):
    record = store.get("SC-0000001")
    other = store.get("SC-0000002")
    records = [record] * 30 + [other] * 10

    def score_batch(batch):
        return [0.5] * len(batch)

    result = asyncio.run(
        asyncio.wait_for(measure_dedup(score_batch, records, rate_rps=20_000, max_queue_delay_ms=20.0), 60)
    )
    assert result["submitted"] == result["completed"] == 40 and result["errors"] == 0
    assert result["deduplicated"] + result["items_scored"] == 40
    assert result["deduplicated"] >= 30  # at most a few distinct rows per batch
    with pytest.raises(ValueError, match="records"):
        asyncio.run(measure_dedup(score_batch, [], rate_rps=10))
