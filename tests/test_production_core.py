"""The production app against its core (Lesson 12): the same scores and the same refusals on the same requests."""

from __future__ import annotations

import httpx
import pytest

from course_lib.serving.feature_store import FeatureStore
from course_lib.serving.production import ProductionConfig, build_service, create_production_app
from course_lib.serving.production.core import core_command, core_service, create_core_app
from course_lib.serving.server import run_processes, serve_in_thread

#: Bodies each app must refuse, with the status both answer.
BAD_REQUESTS = [
    (b'{"customer_id": "nobody"}', "application/json", 422),
    (b'{"customer_id": "SC-9999999"}', "application/json", 404),
    (b'{"customer_id": "SC-0000001", "customer_id": "SC-0000002"}', "application/json", 400),
    (b"{not json", "application/json", 400),
    (b'{"customer_id": "SC-0000001"}', "text/plain", 415),
]


@pytest.fixture(scope="module")
def core():
    return core_service()


def _answers(url: str, ids: list[str]) -> tuple[list[dict], list[int]]:
    with httpx.Client(base_url=url) as client:
        scores = [client.post("/score", json={"customer_id": c}).json() for c in ids]
        refusals = [
            client.post("/score", content=body, headers={"content-type": kind}).status_code
            for body, kind, _ in BAD_REQUESTS
        ]
    return scores, refusals


def test_core_and_production_apps_answer_the_same_scores_and_refusals(core):
    ids = FeatureStore.open().sample_ids(12, seed=5)
    production = create_production_app(
        ProductionConfig(workers=1), service=build_service(ProductionConfig(workers=1))
    )
    with serve_in_thread(create_core_app(core)) as server:
        core_scores, core_refusals = _answers(server.url, ids)
    with serve_in_thread(production) as server:
        prod_scores, prod_refusals = _answers(server.url, ids)
    assert core_scores == prod_scores  # every field: score, model version, runtime, lookup
    assert core_refusals == prod_refusals == [status for _, _, status in BAD_REQUESTS]
    in_process = core.forward([core.lookup_features(c) for c in ids])
    assert [a["churn_probability"] for a in core_scores] == [round(float(p), 6) for p in in_process]
    assert {a["runtime"] for a in core_scores} == {"onnxruntime"}


def test_the_core_runs_under_two_worker_processes_on_one_port(core):
    ids = FeatureStore.open().sample_ids(6, seed=9)
    with run_processes({"core": core_command()}, workers=2) as urls:
        scores, refusals = _answers(urls["core"], ids)
        assert len(urls.workers["core"]) == 2
    expected = core.forward([core.lookup_features(c) for c in ids])
    assert [a["churn_probability"] for a in scores] == [round(float(p), 6) for p in expected]
    assert refusals == [status for _, _, status in BAD_REQUESTS]
