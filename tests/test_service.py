"""The churn request pipeline in-process and behind a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from course_lib.churn.data import FEATURE_COLUMNS, ID_COLUMN, make_customers
from course_lib.core.waiting import wait_until
from course_lib.serving.feature_store import (
    CachedFeatureStore,
    FeatureStore,
    build_feature_store,
    make_lookup,
)
from course_lib.serving.profiling import parse_server_timing
from course_lib.serving.server import serve_in_thread
from course_lib.serving.service import (
    MAX_BODY_BYTES,
    SERVER_STAGES,
    STAGES,
    ChurnClient,
    ChurnService,
    HttpStatusError,
    create_app,
    encode_answer,
    native_forward,
    onnx_forward,
    run_without_event_loop,
)

N_CUSTOMERS = 5_000
SEED = 11
GOOD_ID = "SC-0000042"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("service_store")
    with FeatureStore(build_feature_store(N_CUSTOMERS, SEED, folder=folder).path) as opened:
        yield opened


@pytest.fixture(scope="module")
def expected_p(churn_model):
    """Native churn probability of every customer of the test population, by id."""
    frame = make_customers(N_CUSTOMERS, SEED)
    p = churn_model.pipeline.predict_proba(frame[list(FEATURE_COLUMNS)])[:, 1]
    return dict(zip(frame[ID_COLUMN], p, strict=True))


@pytest.fixture(scope="module")
def onnx_service(store, onnx_scorer, churn_model):
    return ChurnService(
        make_lookup(store, "indexed"),
        onnx_forward(onnx_scorer),
        model_version=churn_model.model_version,
        lookup_mode="indexed",
        runtime="onnx",
    )


@pytest.fixture(scope="module")
def server(onnx_service):
    with serve_in_thread(create_app(onnx_service), max_lifetime_s=300) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with ChurnClient(server.url, timeout_s=10) as c:
        yield c


def body_of(payload) -> bytes:
    return json.dumps(payload).encode()


# -- in-process ------------------------------------------------------------------------------
def test_in_process_request_runs_four_server_stages_and_scores_like_the_native_model(
    onnx_service, expected_p
):
    result = onnx_service.handle(body_of({"customer_id": GOOD_ID}), request_id="r1")
    assert result.status_code == 200
    answer = result.json()
    assert answer["customer_id"] == GOOD_ID
    assert answer["churn_probability"] == pytest.approx(expected_p[GOOD_ID], abs=1e-5)
    assert answer["runtime"] == "onnx" and answer["lookup"] == "indexed"
    assert list(result.profile.stages_ms) == list(SERVER_STAGES)
    assert parse_server_timing(result.headers["server-timing"]).keys() == set(SERVER_STAGES)


@pytest.mark.parametrize("mode", ["indexed", "unindexed", "cached"])
def test_native_and_onnx_forward_agree_for_every_lookup_mode(
    store, churn_model, onnx_scorer, expected_p, mode
):
    ids = store.sample_ids(5, seed=2)
    lookup = make_lookup(store, mode)
    for forward in (native_forward(churn_model.pipeline), onnx_forward(onnx_scorer)):
        service = ChurnService(lookup, forward, model_version=churn_model.model_version)
        for cid in ids:
            answer = service.handle(body_of({"customer_id": cid})).json()
            assert answer["churn_probability"] == pytest.approx(expected_p[cid], abs=1e-5)


def test_native_forward_handles_a_customer_not_yet_billed(store, churn_model, onnx_scorer):
    record = dict(store.get(GOOD_ID), total_charges=float("nan"), tenure=0)
    native = native_forward(churn_model.pipeline)([record])
    onnx = onnx_forward(onnx_scorer)([record])
    assert native.shape == onnx.shape == (1,)
    assert native[0] == pytest.approx(float(onnx[0]), abs=1e-5)


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe\x00", 400, "not valid JSON"),
        (body_of({"customer_id": 42}), 422, "customer_id: Input should be a valid string"),
        (body_of({}), 422, "customer_id: Field required"),
        (body_of({"customer": GOOD_ID}), 422, "Extra inputs are not permitted"),
        (body_of({"customer_id": "42"}), 422, "should match pattern"),
        (body_of([GOOD_ID]), 422, "must be a JSON object"),
        (body_of({"customer_id": "SC-0999999"}), 404, "not in the feature store"),
        (b" " * (MAX_BODY_BYTES + 1), 413, "limit is"),
    ],
)
def test_in_process_bad_requests_get_4xx_with_a_reason(onnx_service, body, status, reason):
    result = onnx_service.handle(body)
    assert result.status_code == status
    assert reason in result.json()["message"]


def test_refused_request_profiles_only_the_stages_that_ran(onnx_service):
    result = onnx_service.handle(body_of({"customer_id": "SC-0999999"}))
    assert list(result.profile.stages_ms) == ["parse", "lookup"]


def test_model_returning_an_impossible_probability_is_a_500(store):
    service = ChurnService(make_lookup(store, "indexed"), lambda records: np.array([1.5]), model_version="x")
    result = service.handle(body_of({"customer_id": GOOD_ID}))
    assert result.status_code == 500
    assert "outside [0, 1]" in result.json()["message"]


def test_handle_async_awaits_a_replaceable_forward(onnx_service):
    seen = []

    async def forward(records):
        seen.append(len(records))
        await asyncio.sleep(0)  # yields once: the forward really is awaited (no ordering depends on it)
        return np.array([0.25])

    result = asyncio.run(onnx_service.handle_async(body_of({"customer_id": GOOD_ID}), forward=forward))
    assert result.status_code == 200
    assert result.json()["churn_probability"] == 0.25
    assert seen == [1]


def test_lookup_and_forward_must_be_callables():
    with pytest.raises(TypeError, match="lookup must be callable, got None"):
        ChurnService(None, lambda r: r, model_version="x")


# -- over HTTP, real uvicorn on 127.0.0.1 ------------------------------------------------------
def assert_still_serving(client, expected_p, cid=GOOD_ID):
    response, profile = client.score(cid)
    assert response.status_code == 200
    assert response.json()["churn_probability"] == pytest.approx(expected_p[cid], abs=1e-5)
    return profile


def test_server_listens_on_loopback_only(server):
    assert server.host == "127.0.0.1"
    assert server.url.startswith("http://127.0.0.1:")


def test_good_request_returns_score_and_server_timing(client, expected_p):
    response, profile = client.score(GOOD_ID)
    assert response.status_code == 200
    assert set(parse_server_timing(response.headers["server-timing"])) == set(SERVER_STAGES)
    assert list(profile.stages_ms) == list(STAGES)
    assert profile.stages_ms["transport"] > 0
    assert response.json()["churn_probability"] == pytest.approx(expected_p[GOOD_ID], abs=1e-5)


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b'{"customer_id": "SC-0000042"', 400, "not valid JSON"),
        (body_of({"customer_id": 42}), 422, "valid string"),
        (body_of({"customer_id": ["SC-0000042"]}), 422, "valid string"),
        (body_of({}), 422, "Field required"),
        (body_of({"customer_id": "SC-0999999"}), 404, "not in the feature store"),
        (body_of({"customer_id": "x" * 1_000_000}), 413, "limit is 16384 bytes"),
    ],
    ids=["bad-json", "wrong-type-int", "wrong-type-list", "missing-field", "unknown-id", "1MB-body"],
)
def test_malformed_request_gets_4xx_with_reason_and_server_keeps_answering(
    client, expected_p, body, status, reason
):
    response = client.post(body)
    assert response.status_code == status
    assert reason in response.json()["message"]
    assert_still_serving(client, expected_p)


def test_non_json_content_type_gets_415_and_server_keeps_answering(client, expected_p):
    response = client.post(body_of({"customer_id": GOOD_ID}), content_type="text/plain")
    assert response.status_code == 415
    assert "application/json" in response.json()["message"]
    assert_still_serving(client, expected_p)


def test_oversized_chunked_body_without_length_gets_413(server, client, expected_p):
    chunks = (b"x" * 65_536 for _ in range(16))  # 1 MiB, sent chunked (no Content-Length)
    response = httpx.post(
        f"{server.url}/score", content=chunks, headers={"content-type": "application/json"}, timeout=10
    )
    assert response.status_code == 413
    assert "exceeds the limit" in response.json()["message"]
    assert_still_serving(client, expected_p)


def test_4xx_answers_carry_the_server_timing_of_the_stages_that_ran(client):
    response = client.post(body_of({"customer_id": "SC-0999999"}))
    assert list(parse_server_timing(response.headers["server-timing"])) == ["parse", "lookup"]


def test_timed_score_raises_the_one_non_2xx_error_with_the_status(client):
    assert tuple(client.timed_score("SC-0000001").stages_ms) == STAGES
    with pytest.raises(HttpStatusError, match=r"HTTP 404: .*not in the feature store") as err:
        client.timed_score("SC-0999999")
    assert (err.value.status, err.value.shed) == (404, False)


def test_healthz_reports_the_model_version(server, churn_model):
    answer = httpx.get(f"{server.url}/healthz", timeout=10).json()
    assert answer == {"status": "ok", "model_version": churn_model.model_version}


def test_many_sequential_requests_are_all_answered_correctly(client, store, expected_p):
    for cid in store.sample_ids(30, seed=9):
        assert_still_serving(client, expected_p, cid)


def test_failing_forward_gives_a_500_and_the_server_keeps_serving(
    store, churn_model, onnx_scorer, expected_p
):
    calls = {"n": 0}
    good = onnx_forward(onnx_scorer)

    async def flaky(records):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("model worker crashed")
        return good(records)

    service = ChurnService(make_lookup(store, "cached"), good, model_version=churn_model.model_version)
    with (
        serve_in_thread(create_app(service, forward=flaky), max_lifetime_s=60) as running,
        ChurnClient(running.url) as c,
    ):
        response = c.post(body_of({"customer_id": GOOD_ID}))
        assert response.status_code == 500
        message = response.json()["message"]
        assert "server log" in message  # the course's own short reason ...
        assert "RuntimeError" not in message and "crashed" not in message  # ... never the exception
        assert_still_serving(c, expected_p)
    assert calls["n"] == 2


def test_cached_service_over_http_counts_hits(store, churn_model, onnx_scorer, expected_p):
    cache = CachedFeatureStore(store)
    service = ChurnService(
        make_lookup(store, "cached", cache=cache), onnx_forward(onnx_scorer), model_version="v"
    )
    with serve_in_thread(create_app(service), max_lifetime_s=60) as running, ChurnClient(running.url) as c:
        for _ in range(3):
            assert_still_serving(c, expected_p)
    assert (cache.hits, cache.misses) == (2, 1)


# -- the server helper -----------------------------------------------------------------------
def test_server_thread_is_stopped_when_the_block_ends(onnx_service):
    with serve_in_thread(create_app(onnx_service), max_lifetime_s=60) as running:
        assert running.running
    assert not running.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{running.url}/healthz", timeout=2)


def test_server_stops_by_itself_after_its_lifetime(onnx_service):
    with serve_in_thread(create_app(onnx_service), max_lifetime_s=0.3) as running:
        wait_until(lambda: not running.thread.is_alive(), timeout_s=10, what="the server thread to stop")


def test_server_without_tcp_nodelay_still_answers(onnx_service, expected_p):
    with (
        serve_in_thread(create_app(onnx_service), max_lifetime_s=60, tcp_nodelay=False) as running,
        ChurnClient(running.url) as c,
    ):
        assert_still_serving(c, expected_p)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"port": 70000}, "port"), ({"port": -1}, "port"), ({"max_lifetime_s": 0}, "max_lifetime_s")],
)
def test_server_parameters_are_validated(onnx_service, kwargs, match):
    with pytest.raises(ValueError, match=match), serve_in_thread(create_app(onnx_service), **kwargs):
        pass


# -- features outside the schema, the strict JSON door (issue 10, items 2 and 8) ----------------
def bad_store_lookup(store, **changes):
    def lookup(cid):
        record = store.get(cid)
        return None if record is None else {**record, **changes}

    return lookup


def test_a_stored_customer_outside_the_schema_gets_a_422_naming_the_column(store, onnx_scorer, churn_model):
    service = ChurnService(
        bad_store_lookup(store, tenure=-5),
        onnx_forward(onnx_scorer),
        model_version=churn_model.model_version,
    )
    result = service.handle(body_of({"customer_id": GOOD_ID}))
    assert result.status_code == 422
    assert result.json()["error"] == "invalid_features"
    assert (
        "'tenure' must be an integer in [0, 72]" in result.json()["message"]
        and "got -5" in result.json()["message"]
    )
    with serve_in_thread(create_app(service), max_lifetime_s=60) as running, ChurnClient(running.url) as c:
        response = c.post(body_of({"customer_id": GOOD_ID}))
        assert response.status_code == 422 and "'tenure'" in response.json()["message"]


def test_one_customer_outside_the_schema_never_fails_its_batch_mates(store, churn_model):
    from course_lib.serving.batching.predict import create_batched_app

    bad_id = "SC-0000007"

    def lookup(cid):
        record = store.get(cid)
        return {**record, "monthly_charges": float("inf")} if cid == bad_id else record

    service = ChurnService(
        lookup, native_forward(churn_model.pipeline), model_version=churn_model.model_version
    )
    app = create_batched_app(service, max_batch_size=8, max_queue_delay_ms=20.0)

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                ids = [bad_id, "SC-0000001", "SC-0000002", "SC-0000003"]
                return await asyncio.gather(*(client.post("/predict", json={"customer_id": i}) for i in ids))

    bad, *good = asyncio.run(asyncio.wait_for(main(), 30))
    assert bad.status_code == 422 and "'monthly_charges'" in bad.json()["message"]
    assert [r.status_code for r in good] == [200, 200, 200]
    assert {r.json()["batch_size"] for r in good} == {3}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"customer_id": "SC-0000001", "customer_id": "SC-0000002"}', "key 'customer_id' appears twice"),
        (b"[" * 1000 + b"]" * 1000, "nested deeper than 32"),
        (b'{"customer_id": ' + b"9" * 4301 + b"}", "a number has 4301 characters; the limit is 64"),
        (b'{"customer_id": Infinity}', "Infinity is not a JSON number"),
        (json.dumps({"customer_id": GOOD_ID}).encode("utf-16"), "not UTF-8 at byte 0"),
    ],
)
def test_the_parser_refuses_what_json_leaves_undefined_with_a_400(onnx_service, body, reason):
    result = onnx_service.handle(body)
    assert result.status_code == 400 and result.json()["error"] == "bad_json"
    assert reason in result.json()["message"]


def test_a_utf8_byte_order_mark_is_ignored(onnx_service, expected_p):
    result = onnx_service.handle(b"\xef\xbb\xbf" + body_of({"customer_id": GOOD_ID}))
    assert result.status_code == 200
    assert result.json()["churn_probability"] == pytest.approx(expected_p[GOOD_ID], abs=1e-5)


@pytest.mark.parametrize(
    ("content_type", "accepted"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/vnd.api+json", True),
        ("application/merge-patch+json", True),
        ("application/+json", False),
        ("text/json", False),
        ("application/jsonp", False),
        ("", False),
    ],
)
def test_json_media_types_follow_fastapis_rule(content_type, accepted):
    from course_lib.serving.service import is_json_content_type

    assert is_json_content_type(content_type) is accepted


def test_handle_runs_the_stages_without_an_event_loop_even_inside_a_running_one(onnx_service):
    body = body_of({"customer_id": "SC-0000042"})

    async def inside_a_loop():  # a notebook's kernel runs its own loop while a cell calls handle()
        return onnx_service.handle(body)

    assert asyncio.run(inside_a_loop()).status_code == onnx_service.handle(body).status_code == 200


def test_a_coroutine_that_suspends_is_refused_and_closed():
    closed = []

    async def waits():
        try:
            await asyncio.sleep(0)
        finally:
            closed.append(True)

    async def returns():
        return 7

    assert run_without_event_loop(returns()) == 7
    with pytest.raises(RuntimeError, match="needs an event loop"):
        run_without_event_loop(waits())
    assert closed == [True]


def test_the_two_answer_encoders_give_the_same_json_and_another_is_refused():
    answer = {"customer_id": GOOD_ID, "churn_probability": 0.123457, "model_version": "v", "lookup": "m"}
    assert json.loads(encode_answer(answer, "orjson")) == json.loads(encode_answer(answer)) == answer
    with pytest.raises(ValueError, match="encoder must be one of 'json', 'orjson', got 'pickle'"):
        encode_answer(answer, "pickle")
    with pytest.raises(ValueError, match="encoder must be one of 'json', 'orjson', got 'ujson'"):
        ChurnService(lambda cid: {}, lambda records: [0.5], model_version="v", encoder="ujson")
