"""The production service (Lesson 12) under the probes of issue 28: deadlines, redirects, what /stats counts.

Served in a thread on the course's runtime (the door and the guarded protocol in front of it), every
forward mode, a batching delay long enough that a short client deadline passes while the request
waits in the batcher's queue.
"""

from __future__ import annotations

import json

import httpx
import pytest

from course_lib.serving.feature_store import DEFAULT_N_CUSTOMERS, customer_id
from course_lib.serving.production import (
    ProductionConfig,
    ProductionService,
    build_service,
    create_production_app,
)
from course_lib.serving.server import serve_in_thread

GOOD = json.dumps({"customer_id": customer_id(42, DEFAULT_N_CUSTOMERS)}).encode()
JSON = {"content-type": "application/json"}
QUEUE_DELAY_MS = 200.0  # a batch waits this long for company; the deadlines below are far shorter


@pytest.fixture(scope="module")
def service() -> ProductionService:
    return build_service(ProductionConfig(workers=1))


@pytest.fixture(scope="module", params=["loop", "thread", "batcher"])
def client(request, service):
    config = ProductionConfig(workers=1, forward=request.param).with_server(max_queue_delay_ms=QUEUE_DELAY_MS)
    app = create_production_app(config, service=service)
    with serve_in_thread(app) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.mark.parametrize("path", ["/score", "/predict"])
def test_a_passed_deadline_is_answered_504_never_500_and_counted(client, path):
    before = client.get("/stats").json()
    answer = client.post(path, content=GOOD, headers={**JSON, "x-request-timeout-ms": "0.001"})
    assert answer.status_code == 504, answer.text
    assert answer.json()["error"] == "deadline_exceeded"
    after = client.get("/stats").json()
    assert after["internal_errors"] == before["internal_errors"]
    assert after["deadline_expired"] == before["deadline_expired"] + 1
    assert after["outcomes"]["expired"] == before["outcomes"]["expired"] + 1
    # a deadline that leaves time is served as usual
    assert (
        client.post(path, content=GOOD, headers={**JSON, "x-request-timeout-ms": "20000"}).status_code == 200
    )


def test_a_trailing_slash_is_not_redirected_to_the_clients_host(client):
    answer = client.post(
        "/score/", content=GOOD, headers={**JSON, "host": "evil.example"}, follow_redirects=False
    )
    assert answer.status_code == 404
    assert "location" not in answer.headers


def test_stats_carry_what_the_clients_saw(client):
    before = client.get("/stats").json()["outcomes"]
    assert client.post("/score", content=GOOD, headers=JSON).status_code == 200
    assert client.post("/score", content=b"{", headers=JSON).status_code == 400
    after = client.get("/stats").json()["outcomes"]
    assert after["ok"] == before["ok"] + 1
    assert after["client_errors"] == before["client_errors"] + 1
