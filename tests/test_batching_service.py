"""The batched /predict endpoint: in-process through ASGI, and the real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from course_lib.batching_service import (
    create_batching_app,
    customer_key,
    make_record_scorer,
    run_server,
    to_payload,
)
from course_lib.loadgen import capacity_table, http_client_target, http_target, run_open_loop, sweep_rates
from course_lib.model import features


@pytest.fixture(scope="module")
def payloads(telco):
    return to_payload(features(telco.head(64)))


def run(coro, timeout_s: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def call_app(app, requests):
    """Run the app's lifespan and send (method, path, json) requests concurrently through ASGI."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await asyncio.gather(*(client.request(m, p, json=body) for m, p, body in requests))


def features_from(records):
    """The DataFrame the native pipeline expects, rebuilt from JSON records."""
    import pandas as pd

    from course_lib.data import FEATURE_COLUMNS

    frame = pd.DataFrame.from_records(records, columns=list(FEATURE_COLUMNS))
    frame["total_charges"] = frame["total_charges"].astype(float)
    return frame


def test_payloads_are_json_ready_with_missing_charges_as_null(telco):
    frame = features(telco.head(3)).copy()
    frame.loc[frame.index[0], "total_charges"] = np.nan
    records = to_payload(frame)
    assert records[0]["total_charges"] is None
    assert isinstance(records[1]["tenure"], int)
    json.dumps(records)  # serialisable as is
    assert customer_key(records[1]) == customer_key(dict(records[1]))


@pytest.mark.parametrize("runtime", ["xgboost", "onnxruntime"])
def test_record_scorers_match_the_pipeline_on_the_same_customers(runtime, churn_model, onnx_scorer, telco):
    X = features(telco.head(50))
    score = make_record_scorer(runtime, pipeline=churn_model.pipeline, onnx_scorer=onnx_scorer)
    np.testing.assert_allclose(score(to_payload(X)), churn_model.pipeline.predict_proba(X)[:, 1], atol=1e-5)


def test_unknown_runtime_is_rejected():
    with pytest.raises(
        ValueError, match="runtime must be one of \\('xgboost', 'onnxruntime'\\), got 'torch'"
    ):
        make_record_scorer("torch", pipeline=object())


def test_predict_answers_with_the_score_and_how_it_was_batched(churn_model, payloads):
    app = create_batching_app("xgboost", churn_model=churn_model, max_batch_size=8, max_queue_delay_ms=20.0)
    responses = run(call_app(app, [("POST", "/predict", body) for body in payloads[:8]]))
    assert [r.status_code for r in responses] == [200] * 8
    bodies = [r.json() for r in responses]
    expected = churn_model.pipeline.predict_proba(features_from(payloads[:8]))[:, 1]
    np.testing.assert_allclose([b["churn_probability"] for b in bodies], expected, atol=1e-6)
    assert {b["batch_size"] for b in bodies} == {8}
    assert all(b["queue_wait_ms"] >= 0 and b["model_version"] == churn_model.model_version for b in bodies)


def test_identical_customers_waiting_together_are_scored_once(churn_model, payloads):
    app = create_batching_app("xgboost", churn_model=churn_model, max_batch_size=16, max_queue_delay_ms=20.0)
    requests = [("POST", "/predict", payloads[0])] * 5 + [
        ("POST", "/predict", payloads[1]),
        ("GET", "/stats", None),
    ]
    *predictions, stats = run(call_app(app, requests))
    bodies = [r.json() for r in predictions]
    assert sum(b["deduplicated"] for b in bodies) == 4
    assert {(b["batch_size"], b["batch_requests"]) for b in bodies} == {(2, 6)}
    assert len({b["churn_probability"] for b in bodies[:5]}) == 1
    assert stats.json()["deduplicated"] == 4


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"contract": "Weekly"}, "contract"),
        ({"tenure": "twelve"}, "tenure"),
        ({"female": 2}, "female"),
        ({"monthly_charges": -5.0}, "monthly_charges"),
        ({"shoe_size": 42}, "shoe_size"),
    ],
)
def test_a_bad_body_gets_422_naming_the_field_and_the_server_keeps_serving(
    churn_model, payloads, change, field
):
    app = create_batching_app("xgboost", churn_model=churn_model, max_batch_size=4, max_queue_delay_ms=0.0)
    bad, good = run(
        call_app(app, [("POST", "/predict", {**payloads[0], **change}), ("POST", "/predict", payloads[0])])
    )
    assert bad.status_code == 422
    assert field in {str(part) for err in bad.json()["detail"] for part in err["loc"]}
    assert good.status_code == 200


def test_a_missing_field_gets_422(churn_model, payloads):
    app = create_batching_app(
        "onnxruntime", churn_model=churn_model, max_batch_size=4, max_queue_delay_ms=0.0
    )
    body = {k: v for k, v in payloads[0].items() if k != "tenure"}
    (response,) = run(call_app(app, [("POST", "/predict", body)]))
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "tenure"]


def test_a_full_queue_answers_503_with_retry_after_and_nothing_is_lost(payloads):
    gate = threading.Event()

    class SlowPipeline:
        def predict_proba(self, frame):
            gate.wait(10)
            return np.column_stack([np.zeros(len(frame)), np.full(len(frame), 0.5)])

    fake_model = SimpleNamespace(pipeline=SlowPipeline(), model_version="fake")
    app = create_batching_app(
        "xgboost",
        churn_model=fake_model,
        max_batch_size=8,
        max_queue_delay_ms=0.0,
        max_queue_size=1,
        dedup=False,
    )

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                first = asyncio.create_task(client.post("/predict", json=payloads[0]))
                await asyncio.sleep(0.2)  # first is in the model call
                second = asyncio.create_task(client.post("/predict", json=payloads[1]))
                await asyncio.sleep(0.2)  # second waits in the queue
                rejected = await client.post("/predict", json=payloads[2])
                gate.set()
                answered = [await first, await second]
                stats = (await client.get("/stats")).json()
                return rejected, answered, stats

    try:
        rejected, answered, stats = run(main())
    finally:
        gate.set()
    assert rejected.status_code == 503
    assert rejected.headers["retry-after"] == "1"
    assert "queue full" in rejected.json()["detail"]
    assert [r.status_code for r in answered] == [200, 200]
    assert (stats["rejected_queue_full"], stats["completed"]) == (1, 2)


@pytest.fixture(scope="module")
def live_server():
    with run_server("xgboost", max_batch_size=16, max_queue_delay_ms=25.0, lifetime_s=120) as base_url:
        yield base_url


def test_the_real_server_batches_concurrent_requests(live_server, payloads):
    async def main():
        async with httpx.AsyncClient(base_url=live_server, timeout=10.0) as client:
            return await asyncio.gather(*(client.post("/predict", json=body) for body in payloads[:16]))

    responses = run(main())
    assert [r.status_code for r in responses] == [200] * 16
    sizes = [r.json()["batch_size"] for r in responses]
    assert max(sizes) > 1  # concurrent requests shared model calls
    assert sum(1 / s for s in sizes) < 16  # fewer model calls than requests


def test_the_real_server_rejects_malformed_json_and_keeps_answering(live_server, payloads):
    bad = httpx.post(
        live_server + "/predict", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 422
    good = httpx.post(live_server + "/predict", json=payloads[0])
    assert good.status_code == 200
    health = httpx.get(live_server + "/healthz").json()
    assert (health["runtime"], health["max_batch_size"], health["max_queue_delay_ms"]) == (
        "xgboost",
        16,
        25.0,
    )


def test_open_loop_load_over_http_is_answered_in_full(live_server, payloads):
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


def test_a_rate_sweep_over_http_records_how_each_request_was_served(live_server, payloads):
    sweep = run(
        sweep_rates(
            {"batched": lambda: http_client_target(live_server + "/predict", payloads)()},
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
