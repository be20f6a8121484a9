"""The versioned service over real HTTP: /metrics parses and its counters equal the requests sent;
shadow scoring."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from course_lib.churn.versions import build_versions, load_versions
from course_lib.operate.canary import HashRouter
from course_lib.operate.monitored_service import (
    ServiceMetrics,
    ShadowScorer,
    VersionedChurnService,
    create_monitored_app,
)
from course_lib.operate.prom_quantile import SLO_BUCKETS_S, histogram_quantile, scraped_buckets
from course_lib.serving.feature_store import (
    CachedFeatureStore,
    FeatureStore,
    build_feature_store,
    customer_id,
)
from course_lib.serving.server import serve_in_thread
from course_lib.serving.service import onnx_forward

N_CUSTOMERS = 3000


@pytest.fixture(scope="module")
def parts(churn_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("l9")
    store = FeatureStore(build_feature_store(N_CUSTOMERS, 0, folder=folder).path)
    versions = load_versions(build_versions(folder / "versions", model=churn_model))
    yield store, {r: onnx_forward(v.scorer) for r, v in versions.items()}
    store.close()


def _samples(text):
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _post(client, body: bytes):
    return client.post("/score", content=body, headers={"content-type": "application/json"})


def test_metrics_endpoint_counts_every_request(parts):
    store, forwards = parts
    cache = CachedFeatureStore(store)
    metrics = ServiceMetrics(cache=cache)
    router = HashRouter("v1", "v2", 25)
    service = VersionedChurnService(
        cache.get, {"v1": forwards["v1"], "v2": forwards["v2"]}, router, metrics=metrics
    )
    ids = [customer_id(i % 200 + 1, N_CUSTOMERS) for i in range(400)]
    sent = {"v1": 0, "v2": 0}
    with (
        serve_in_thread(create_monitored_app(service), max_lifetime_s=120) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        for cid in ids:
            answer = _post(client, json.dumps({"customer_id": cid}).encode())
            assert answer.status_code == 200
            assert answer.json()["model_version"] == router.version_for(cid)  # the version that scored it
            sent[answer.json()["model_version"]] += 1
        assert _post(client, b"{not json").status_code == 400
        assert _post(client, json.dumps({"customer_id": "SC-9999999"}).encode()).status_code == 404
        page = client.get("/metrics")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    got = _samples(page.text)
    for version, n in sent.items():
        assert got[("churn_requests_total", (("status", "200"), ("version", version)))] == n
        assert got[("churn_score_count", (("version", version),))] == n
    assert got[("churn_requests_total", (("status", "400"), ("version", "none")))] == 1
    assert (
        sum(
            v
            for (name, labels), v in got.items()
            if name == "churn_requests_total" and ("status", "404") in labels
        )
        == 1
    )
    assert got[("churn_requests_in_flight", ())] == 0
    latency_counts = [v for (name, _), v in got.items() if name == "churn_request_latency_seconds_count"]
    assert sum(latency_counts) == len(ids) + 2  # every request is timed, refused ones too
    assert got[("churn_batch_size_count", (("path", "primary"),))] == len(
        ids
    )  # a 404 never reaches the model
    assert got[("churn_feature_cache_requests_total", (("result", "hit"),))] == cache.hits
    assert got[("churn_feature_cache_requests_total", (("result", "miss"),))] == cache.misses
    assert cache.hits + cache.misses == len(ids) + 1  # the unknown customer is a miss
    buckets = scraped_buckets(page.text, "churn_request_latency_seconds", version="v1")
    assert [le for le, _ in buckets] == [*SLO_BUCKETS_S, float("inf")]
    assert histogram_quantile(0.95, buckets) > 0


def test_shadow_scores_everything_off_the_response_path(parts):
    store, forwards = parts
    metrics = ServiceMetrics()
    lookup = lambda cid: store.get(cid)  # noqa: E731
    shadow = ShadowScorer("v2", forwards["v2"], lookup, metrics=metrics, max_batch=16)
    service = VersionedChurnService(
        lookup, {"v1": forwards["v1"]}, HashRouter("v1", "v2", 0), metrics=metrics, shadow=shadow
    )
    ids = [customer_id(i + 1, N_CUSTOMERS) for i in range(100)]
    answers = {}
    for cid in ids:
        version, response = service.handle(json.dumps({"customer_id": cid}).encode())
        assert version == "v1" and response.status_code == 200
        answers[cid] = response.json()["churn_probability"]
    shadow.flush()
    shadow.stop()
    log = list(shadow.log)
    assert [r["customer_id"] for r in log] == ids and shadow.dropped == 0
    expected = forwards["v2"]([store.get(c) for c in ids])
    assert np.allclose([r["shadow_score"] for r in log], expected, atol=1e-6)
    assert [r["primary_score"] for r in log] == [answers[c] for c in ids]
    got = _samples(metrics.exposition().decode())
    assert got[("churn_shadow_requests_total", (("outcome", "scored"), ("version", "v2")))] == 100
    assert got[("churn_batch_size_count", (("path", "shadow"),))] >= 100 / 16


def test_a_full_shadow_queue_drops_shadow_work_not_answers(parts):
    store, forwards = parts
    metrics = ServiceMetrics()
    shadow = ShadowScorer("v2", forwards["v2"], store.get, metrics=metrics, max_queue=1, flush_interval_s=60)
    service = VersionedChurnService(
        store.get, {"v1": forwards["v1"]}, HashRouter("v1", "v2"), metrics=metrics, shadow=shadow
    )
    for i in range(5):
        _, answer = service.handle(json.dumps({"customer_id": customer_id(i + 1, N_CUSTOMERS)}).encode())
        assert answer.status_code == 200
    shadow.stop()
    got = _samples(metrics.exposition().decode())
    assert got[("churn_shadow_requests_total", (("outcome", "dropped"), ("version", "v2")))] == 4
    assert (
        shadow.dropped == 4
    )  # refused at the door; the one queued item is scored when stop() wakes the worker
    assert got[("churn_shadow_requests_total", (("outcome", "scored"), ("version", "v2")))] == 1


def test_metrics_off_and_bad_arguments(parts):
    store, forwards = parts
    service = VersionedChurnService(store.get, {"v1": forwards["v1"]}, HashRouter("v1", "v2"))
    with serve_in_thread(create_monitored_app(service), max_lifetime_s=60) as server:
        assert httpx.get(f"{server.url}/metrics").status_code == 404
        assert httpx.get(f"{server.url}/healthz").json()["versions"] == ["v1"]
    with pytest.raises(ValueError, match="forwards"):
        VersionedChurnService(store.get, {}, HashRouter("v1", "v2"))
    with pytest.raises(ValueError, match="max_queue"):
        ShadowScorer("v2", forwards["v2"], store.get, max_queue=0)
