"""The production churn service: its configuration, its app on every forward mode, and its worker processes."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
from starlette.middleware import Middleware

from course_lib.core.checks import InvalidArgumentError
from course_lib.serving.feature_store import DEFAULT_N_CUSTOMERS, FeatureStore, customer_id
from course_lib.serving.production import (
    NULL_ANSWER,
    OFF_LOOP_ABOVE_MS,
    PRODUCTION,
    PRODUCTION_SERVER,
    ProductionConfig,
    ProductionService,
    build_service,
    create_production_app,
    serve_production,
)
from course_lib.serving.production._app import _all_loaded, worker_ready_path
from course_lib.serving.production._workers import parse_arguments
from course_lib.serving.server import serve_in_thread
from course_lib.serving.service import RequestError, ScoreRequest

CUSTOMER = customer_id(42, DEFAULT_N_CUSTOMERS)


@pytest.fixture(scope="module")
def service() -> ProductionService:
    return build_service(ProductionConfig(workers=1))


def test_config_checks_every_lever_and_round_trips_through_the_command_line():
    with pytest.raises(InvalidArgumentError, match="runtime"):
        ProductionConfig(runtime="tensorrt")
    with pytest.raises(InvalidArgumentError, match="workers"):
        ProductionConfig(workers=0)
    with pytest.raises(InvalidArgumentError, match="forward"):
        ProductionConfig(forward="gpu")
    with pytest.raises(InvalidArgumentError, match="server"):
        ProductionConfig(server={"http": "h11"})
    config = ProductionConfig(runtime="xgboost", forward="thread", encoder="json", workers=3).with_server(
        http="h11", loop="asyncio", max_batch_size=8
    )
    _, parsed = parse_arguments(["--port=1", *config.to_argv()])
    assert parsed == config and parsed.server.max_batch_size == 8
    _, default = parse_arguments(["--port=1"])
    assert default == PRODUCTION and PRODUCTION.server == PRODUCTION_SERVER
    assert PRODUCTION.n_workers >= 1 and "httptools + uvloop" in PRODUCTION.describe()


def test_answer_is_encoded_once_with_the_same_fields_either_way(service):
    request = ScoreRequest(customer_id=CUSTOMER)
    fields = service.answer(request, 0.1234567)
    as_json = ProductionService(service.lookup_features, service.forward, model_version="v", encoder="json")
    assert (
        json.loads(service.format(request, 0.1234567))
        == fields
        == {
            **json.loads(as_json.format(request, 0.1234567)),
            "model_version": service.model_version,
            "runtime": service.runtime,
            "lookup": service.lookup_mode,
        }
    )
    assert fields["churn_probability"] == 0.123457


@pytest.mark.parametrize("forward", ["loop", "thread", "batcher"])
def test_every_forward_mode_answers_the_same_score_and_refuses_bad_input(service, forward):
    app = create_production_app(ProductionConfig(forward=forward, workers=1), service=service)
    assert app.state.forward_mode == forward
    with serve_in_thread(app) as server, httpx.Client(base_url=server.url) as client:
        ok = client.post("/score", json={"customer_id": CUSTOMER})
        assert ok.status_code == 200 and set(ok.headers["server-timing"].split(", ")) >= {
            "format;dur=" + ok.headers["server-timing"].split("format;dur=")[1]
        }
        expected = service.forward([service.lookup_features(CUSTOMER)])[0]
        assert ok.json()["churn_probability"] == pytest.approx(round(float(expected), 6))
        predicted = client.post("/predict", json={"customer_id": CUSTOMER})
        assert predicted.json() == ok.json() and int(predicted.headers["x-batch-size"]) >= 1
        assert client.post("/null", json={"customer_id": CUSTOMER}).content == NULL_ANSWER
        dup = client.post(
            "/score",
            content=b'{"customer_id": "SC-0000001", "customer_id": "SC-0000002"}',
            headers={"content-type": "application/json"},
        )
        assert dup.status_code == 400 and "twice" in dup.json()["message"]
        assert client.post("/score", json={"customer_id": "nobody"}).status_code == 422
        assert client.post("/score", json={"customer_id": "SC-9999999"}).status_code == 404
        assert client.post("/score", content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
        assert (
            client.post(
                "/null", content=b"x" * 20_000, headers={"content-type": "application/json"}
            ).status_code
            == 413
        )
        stats = client.get("/stats").json()
        assert stats["forward"] == forward and stats["workers"] == 1 and stats["internal_errors"] == 0
        health = client.get("/healthz").json()
        assert health["status"] == "ok" and health["model_version"] == service.model_version
        metrics = client.get("/metrics").text
        assert 'churn_requests_total{endpoint="/score",status="200"} 1.0' in metrics
        assert 'churn_requests_total{endpoint="/score",status="404"} 1.0' in metrics


def test_a_stored_record_outside_the_schema_is_refused_before_the_unchecked_feeds(service):
    # the production forward builds ONNX feeds without checking (check_features ran once already), so
    # every path to it must refuse a bad record first: /score in each mode, /predict and score_customer
    calls: list[object] = []

    def forward(records):
        calls.append(records)
        return service.forward(records)

    def bad_lookup(cid):  # a numeric string for tenure: unchecked feeds would parse it
        record = service.lookup_features(cid)
        return None if record is None else {**record, "tenure": "12"}

    bad = ProductionService(bad_lookup, forward, model_version=service.model_version)
    with pytest.raises(RequestError, match="tenure"):
        bad.score_customer(CUSTOMER)
    for mode in ("loop", "thread", "batcher"):
        app = create_production_app(ProductionConfig(forward=mode, workers=1), service=bad)
        with serve_in_thread(app) as server, httpx.Client(base_url=server.url) as client:
            for path in ("/score", "/predict"):
                answer = client.post(path, json={"customer_id": CUSTOMER})
                assert answer.status_code == 422 and answer.json()["error"] == "invalid_features", (
                    mode,
                    path,
                )
    assert calls == []


def test_auto_keeps_a_cheap_call_on_the_loop_and_moves_a_costly_one_off_it(service):
    cheap = create_production_app(ProductionConfig(workers=1), service=service)
    assert cheap.state.forward_cost_ms <= OFF_LOOP_ABOVE_MS and cheap.state.forward_mode == "loop"

    def slow_forward(records):
        time.sleep(0.002)
        return np.full(len(records), 0.5)

    slow = ProductionService(service.lookup_features, slow_forward, model_version="slow")
    costly = create_production_app(ProductionConfig(workers=1), service=slow)
    assert costly.state.forward_cost_ms > OFF_LOOP_ABOVE_MS and costly.state.forward_mode == "thread"


def test_middleware_wraps_the_app(service):
    class Stamp:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            async def stamped(message):
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []), (b"x-replica", b"7")]
                await send(message)

            await self.app(scope, receive, stamped)

    app = create_production_app(ProductionConfig(workers=1), service=service, middleware=[Middleware(Stamp)])
    with serve_in_thread(app) as server:
        assert httpx.post(server.url + "/score", json={"customer_id": CUSTOMER}).headers["x-replica"] == "7"


def test_readiness_waits_for_every_worker(tmp_path):
    assert _all_loaded(None, 4)
    assert not _all_loaded(str(tmp_path), 2)
    worker_ready_path(tmp_path, 11).touch()
    worker_ready_path(tmp_path, 12).touch()
    assert _all_loaded(str(tmp_path), 2)


@pytest.mark.timeout(240)
def test_two_worker_processes_share_one_port_and_stop_with_the_block():
    import psutil

    with serve_production(ProductionConfig(workers=2)) as server:
        url = server.url
        assert httpx.get(url + "/healthz").status_code == 200  # only once both workers have loaded
        pids = {httpx.get(url + "/healthz").json()["worker_pid"] for _ in range(40)}
        ids = FeatureStore.open().sample_ids(20, seed=3)
        answers = [httpx.post(url + "/score", json={"customer_id": c}) for c in ids]
        assert all(a.status_code == 200 for a in answers)
        supervisor = psutil.Process(server.pid)
        assert psutil.Process(httpx.get(url + "/stats").json()["worker_pid"]).ppid() == server.pid
        workers = supervisor.children()
    assert len(pids) == 2, pids  # the kernel handed connections to both workers
    assert len(workers) == 2
    _, alive = psutil.wait_procs([supervisor, *workers], timeout=15)
    assert not alive


@pytest.mark.timeout(180)
def test_the_httptools_worker_is_guarded_like_h11_a_slow_header_is_cut_off():
    """serve_app guards uvicorn's httptools protocol too: headers must arrive within header_timeout_s."""
    import socket
    from urllib.parse import urlsplit

    from course_lib.core.waiting import wait_until

    config = ProductionConfig(workers=1).with_server(http="httptools", loop="uvloop", header_timeout_s=1.0)
    with serve_production(config) as server:
        host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
        with socket.create_connection((host, port), timeout=10) as slow:
            slow.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")  # and never the end of the headers
            slow.settimeout(10)
            closed = []
            wait_until(
                lambda: closed.append(slow.recv(1024)) or closed[-1] == b"", timeout_s=10, what="the cut-off"
            )
        assert httpx.post(server.url + "/score", json={"customer_id": CUSTOMER}).status_code == 200
