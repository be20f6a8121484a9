"""POST /predict behind the dynamic batcher: in-process through ASGI, and the real uvicorn server on
127.0.0.1."""

from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np
import pytest

from course_lib.core.waiting import async_wait_until
from course_lib.measure.batching_gain import capacity_table
from course_lib.measure.ladder import SloRule, climb_async, open_loop_runs
from course_lib.measure.loadgen import run_open_loop
from course_lib.measure.targets import http_client_target, http_target
from course_lib.serving.batching.predict import create_batched_app, customer_key, run_servers
from course_lib.serving.feature_store import FeatureStore, customer_id, make_lookup
from course_lib.serving.service import ChurnService, churn_service, native_forward

N_CUSTOMERS = 2000


@pytest.fixture(scope="module")
def store_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("feature_store")


@pytest.fixture(scope="module")
def store(store_folder):
    return FeatureStore.open(N_CUSTOMERS, 0, folder=store_folder)


@pytest.fixture(scope="module")
def service(churn_model, store_folder):
    return churn_service(
        "xgboost",
        lookup_mode="indexed",
        n_customers=N_CUSTOMERS,
        store_folder=store_folder,
        churn_model=churn_model,
    )


def in_process_climb(targets, rates_rps, *, p99_limit_ms, retries=1, **run_kwargs):
    """The in-process sweep of Lesson 3: the targets taking turns, no error allowed, a hiccup retried."""
    runs = open_loop_runs(targets, request_timeout_s=max(0.5, 5 * p99_limit_ms / 1000), **run_kwargs)
    return climb_async(
        runs, list(targets), rates_rps, rule=SloRule.without_errors(p99_limit_ms), retries=retries
    )


def run(coro, timeout_s: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def body(index: int) -> dict[str, str]:
    return {"customer_id": customer_id(index, N_CUSTOMERS)}


async def call_app(app, requests, then=()):
    """Run the app's lifespan, send (method, path, json) requests concurrently through ASGI, then
    the ``then`` requests one by one after all of those were answered."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            answers = await asyncio.gather(*(client.request(m, p, json=b) for m, p, b in requests))
            return [*answers, *[await client.request(m, p, json=b) for m, p, b in then]]


def test_predict_answers_like_score_plus_how_the_request_was_batched(service, store, churn_model):
    app = create_batched_app(service, max_batch_size=8, max_queue_delay_ms=20.0)
    *predictions, score = run(
        call_app(app, [("POST", "/predict", body(i)) for i in range(1, 9)] + [("POST", "/score", body(1))])
    )
    assert [r.status_code for r in predictions] == [200] * 8
    answers = [r.json() for r in predictions]
    records = [store.get(a["customer_id"]) for a in answers]
    expected = native_forward(churn_model.pipeline)(records)
    np.testing.assert_allclose([a["churn_probability"] for a in answers], expected, atol=1e-6)
    assert {a["batch_size"] for a in answers} == {8}
    assert all(a["queue_wait_ms"] >= 0 and a["service_ms"] >= 0 for a in answers)
    assert set(score.json()) <= set(answers[0])  # the Lesson 2 answer, extended
    assert answers[0]["churn_probability"] == score.json()["churn_probability"]
    assert "forward;dur=" in predictions[0].headers["server-timing"]


def test_identical_customers_waiting_together_are_scored_once(service):
    app = create_batched_app(service, max_batch_size=16, max_queue_delay_ms=20.0)
    requests = [("POST", "/predict", body(7))] * 5 + [("POST", "/predict", body(8))]
    *predictions, state = run(call_app(app, requests, then=[("GET", "/batcher", None)]))
    answers = [r.json() for r in predictions]
    assert sum(a["deduplicated"] for a in answers) == 4
    assert {(a["batch_size"], a["batch_requests"]) for a in answers} == {(2, 6)}
    assert len({a["churn_probability"] for a in answers[:5]}) == 1
    assert state.json()["stats"]["deduplicated"] == 4
    assert state.json()["max_batch_size"] == 16


@pytest.mark.parametrize(
    ("payload", "status", "error"),
    [
        ({"customer_id": "SC-9999999"}, 404, "not_found"),
        ({"customer_id": 42}, 422, "invalid_request"),
        ({"customer": "SC-0000001"}, 422, "invalid_request"),
    ],
)
def test_a_bad_request_gets_the_lesson_2_error_and_the_server_keeps_serving(service, payload, status, error):
    app = create_batched_app(service, max_batch_size=4, max_queue_delay_ms=0.0)
    bad, good = run(call_app(app, [("POST", "/predict", payload), ("POST", "/predict", body(3))]))
    assert (bad.status_code, bad.json()["error"]) == (status, error)
    assert good.status_code == 200


def test_wrong_content_type_and_oversized_bodies_are_refused(service):
    app = create_batched_app(service, max_batch_size=4, max_queue_delay_ms=0.0)

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                not_json = await client.post(
                    "/predict", content=b"customer_id=1", headers={"content-type": "text/plain"}
                )
                huge = await client.post(
                    "/predict", content=b"x" * 100_000, headers={"content-type": "application/json"}
                )
                broken = await client.post(
                    "/predict", content=b"{oops", headers={"content-type": "application/json"}
                )
                return not_json, huge, broken

    not_json, huge, broken = run(main())
    assert (not_json.status_code, not_json.json()["error"]) == (415, "unsupported_media_type")
    assert (huge.status_code, huge.json()["error"]) == (413, "body_too_large")
    assert (broken.status_code, broken.json()["error"]) == (400, "bad_json")


def test_a_full_queue_answers_503_with_retry_after_and_nothing_is_lost(store):
    gate, in_model = threading.Event(), threading.Event()

    def slow_forward(records):
        in_model.set()
        gate.wait(10)
        return np.full(len(records), 0.5)

    slow = ChurnService(make_lookup(store, "indexed"), slow_forward, model_version="fake")
    app = create_batched_app(slow, max_batch_size=8, max_queue_delay_ms=0.0, max_queue_size=1, dedup=False)
    batcher = app.state.batcher

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                first = asyncio.create_task(client.post("/predict", json=body(1)))
                await async_wait_until(
                    lambda: batcher.stats.batches == 0 and in_model.is_set(), what="first in the model call"
                )
                second = asyncio.create_task(client.post("/predict", json=body(2)))
                await async_wait_until(lambda: batcher.queue_len == 1, what="second waiting in the queue")
                rejected = await client.post("/predict", json=body(3))
                gate.set()
                answered = [await first, await second]
                state = (await client.get("/batcher")).json()
                return rejected, answered, state

    try:
        rejected, answered, state = run(main())
    finally:
        gate.set()
    assert rejected.status_code == 503
    assert rejected.headers["retry-after"] == "1"
    assert rejected.json()["error"] == "queue_full"
    assert [r.status_code for r in answered] == [200, 200]
    assert (state["stats"]["rejected_queue_full"], state["stats"]["completed"]) == (1, 2)


def test_a_failing_model_call_answers_500_naming_the_error(store):
    def broken_forward(records):
        raise RuntimeError("GPU fell off the bus")

    broken = ChurnService(make_lookup(store, "indexed"), broken_forward, model_version="fake")
    app = create_batched_app(broken, max_batch_size=4, max_queue_delay_ms=0.0)
    (response,) = run(call_app(app, [("POST", "/predict", body(1))]))
    assert response.status_code == 500
    assert response.json()["error"] == "model_error"
    assert "failed" in response.json()["message"]
    assert "GPU fell off the bus" not in response.text  # the exception goes to the log, not the client


def test_bad_batcher_knobs_are_refused_before_serving(service):
    with pytest.raises(ValueError, match="max_queue_delay_ms must be a finite number >= 0"):
        create_batched_app(service, max_queue_delay_ms=-1.0)


def test_customer_key_ignores_dict_order(store):
    record = store.get(customer_id(5, N_CUSTOMERS))
    assert customer_key(record) == customer_key(dict(reversed(list(record.items()))))


def test_churn_service_rejects_an_unknown_runtime(churn_model):
    with pytest.raises(ValueError, match="runtime must be one of 'xgboost', 'onnxruntime', got 'torch'"):
        churn_service("torch", churn_model=churn_model)


@pytest.fixture(scope="module")
def live_servers(store_folder):
    common = {
        "runtime": "onnxruntime",
        "n_customers": N_CUSTOMERS,
        "store_folder": store_folder,
        "lifetime_s": 120,
    }
    with run_servers(
        {
            "batched": {**common, "max_batch_size": 16, "max_queue_delay_ms": 25.0},
            "one call per request": {**common, "max_batch_size": 1, "max_queue_delay_ms": 0.0},
        }
    ) as urls:
        yield urls


@pytest.fixture(scope="module")
def live_server(live_servers):
    return live_servers["batched"]


def test_a_server_with_max_batch_size_1_scores_one_request_per_call(live_servers):
    async def main():
        async with httpx.AsyncClient(base_url=live_servers["one call per request"], timeout=10.0) as client:
            return await asyncio.gather(*(client.post("/predict", json=body(i)) for i in range(1, 9)))

    responses = run(main())
    assert [r.status_code for r in responses] == [200] * 8
    assert {r.json()["batch_size"] for r in responses} == {1}


def test_run_servers_refuses_an_unknown_runtime_before_starting_anything():
    with pytest.raises(ValueError, match="runtime must be one of"), run_servers({"x": {"runtime": "torch"}}):
        pass


def test_the_real_server_batches_concurrent_requests(live_server):
    async def main():
        async with httpx.AsyncClient(base_url=live_server, timeout=10.0) as client:
            return await asyncio.gather(*(client.post("/predict", json=body(i)) for i in range(1, 17)))

    responses = run(main())
    assert [r.status_code for r in responses] == [200] * 16
    sizes = [r.json()["batch_size"] for r in responses]
    assert max(sizes) > 1  # concurrent requests shared model calls
    assert sum(1 / s for s in sizes) < 16  # fewer model calls than requests
    assert {r.json()["runtime"] for r in responses} == {"onnxruntime"}


def test_the_real_server_refuses_malformed_json_and_keeps_answering(live_server):
    bad = httpx.post(
        live_server + "/predict", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400
    good = httpx.post(live_server + "/predict", json=body(1))
    assert good.status_code == 200
    state = httpx.get(live_server + "/batcher").json()
    assert (state["max_batch_size"], state["max_queue_delay_ms"]) == (16, 25.0)


def test_open_loop_load_over_http_is_answered_in_full(live_server):
    payloads = [body(i) for i in range(1, 41)]

    async def main():
        async with httpx.AsyncClient(timeout=10.0) as client:
            send = http_target(
                client, live_server + "/predict", payloads, fields=("batch_size", "queue_wait_ms")
            )
            return await run_open_loop(send, rate_rps=100.0, n_requests=40, max_duration_s=2.0, seed=4)

    result = run(main())
    summary = result.summary()
    assert summary["errors"] == 0
    assert summary["ok"] == len(result.requests)
    assert result.requests["batch_size"].between(1, 16).all()


def test_a_rate_sweep_over_http_records_how_each_request_was_served(live_server):
    payloads = [body(i) for i in range(1, 41)]
    sweep = run(
        in_process_climb(
            {"batched": http_client_target(live_server + "/predict", payloads)},
            [50.0],
            p99_limit_ms=1000.0,
            duration_s=0.5,
            seed=2,
        )
    )
    assert sweep["target"].tolist() == ["batched"]
    assert sweep.loc[0, "errors"] == 0
    assert 1 <= sweep.loc[0, "mean_batch_size"] <= 16
    assert capacity_table(sweep, baseline="batched").loc["batched", "gain"] == 1.0
