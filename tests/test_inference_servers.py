"""Real Triton and real MLServer serve the churn model (``course_lib.offline.inference_servers``).

Each server starts from ``.venv-serving`` (``make serving-extras``; skipped without it on a student's
machine, failed under ``COURSE_CI=1``), answers a V2 inference request with the course's scores,
batches concurrent requests, refuses a bad request with a 4xx, and stops when its parent dies.
"""

from __future__ import annotations

import textwrap
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from orphans import server_stops_with_its_parent

from course_lib.churn.model import features
from course_lib.core.checks import InvalidArgumentError
from course_lib.offline.inference_servers import (
    start_mlserver,
    start_triton,
    write_mlserver_settings,
    write_triton_repository,
)

pytestmark = pytest.mark.needs("serving-extras")
N_CONCURRENT = 24


def triton_body(X) -> dict:
    """A V2 request: one (n, 1) tensor per feature column, BYTES for strings, FP32 for numbers."""
    inputs = []
    for name in X.columns:
        numeric = X[name].dtype.kind in "fiub"
        data = X[name].astype(float if numeric else str).tolist()
        inputs.append(
            {"name": name, "shape": [len(X), 1], "datatype": "FP32" if numeric else "BYTES", "data": data}
        )
    return {"inputs": inputs, "outputs": [{"name": "probabilities"}]}


def triton_scores(client: httpx.Client, url: str, X) -> np.ndarray:
    response = client.post(url, json=triton_body(X), timeout=60)
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    return np.asarray(out["data"], dtype=float).reshape(out["shape"])[:, 1]


def mlserver_body(encoded: np.ndarray) -> dict:
    inputs = [
        {
            "name": "features",
            "shape": list(encoded.shape),
            "datatype": "FP32",
            "data": encoded.ravel().tolist(),
        }
    ]
    return {"inputs": inputs, "outputs": [{"name": "predict_proba"}]}


def mlserver_scores(client: httpx.Client, url: str, encoded: np.ndarray) -> np.ndarray:
    response = client.post(url, json=mlserver_body(encoded), timeout=60)
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    return np.asarray(out["data"], dtype=float).reshape(out["shape"])[:, 1]


@pytest.fixture(scope="module")
def customers(churn_model):
    X = features(churn_model.split.test).head(N_CONCURRENT)
    return X, churn_model.predict_proba(X)


@pytest.fixture(scope="module")
def triton(churn_model, onnx_model, tmp_path_factory):
    repository = tmp_path_factory.mktemp("triton") / "models"
    # A long queue delay and a preferred size: under concurrent load the batcher waits for company.
    write_triton_repository(repository, onnx_model, max_batch_size=32, preferred_batch_sizes=(8,),
                            max_queue_delay_us=200_000)  # fmt: skip
    with start_triton(repository) as server:
        yield server


@pytest.fixture(scope="module")
def mlserver(churn_model, tmp_path_factory):
    folder = write_mlserver_settings(tmp_path_factory.mktemp("mlserver"), churn_model.pipeline, max_batch_size=8,
                                     max_batch_time_s=0.05)  # fmt: skip
    with start_mlserver(folder) as server:
        yield server


def test_triton_answers_with_the_course_scores(triton, customers):
    X, expected = customers
    with httpx.Client() as client:
        got = triton_scores(client, triton.infer_url(), X)
    np.testing.assert_allclose(got, expected, atol=1e-5)  # float32 on both sides
    assert triton.version().startswith("triton ")


def _stats(server) -> tuple[int, int]:
    stats = httpx.get(f"{server.url}/v2/models/{server.model}/stats", timeout=10).json()["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_triton_batches_concurrent_requests(triton, customers):
    X, expected = customers
    before = _stats(triton)
    with (
        httpx.Client(limits=httpx.Limits(max_connections=N_CONCURRENT)) as client,
        ThreadPoolExecutor(N_CONCURRENT) as pool,
    ):
        rows = list(
            pool.map(lambda i: triton_scores(client, triton.infer_url(), X.iloc[[i]])[0], range(len(X)))
        )
    np.testing.assert_allclose(rows, expected, atol=1e-5)
    inferences, executions = (a - b for a, b in zip(_stats(triton), before, strict=True))
    assert inferences == len(X)
    assert inferences / executions > 1, f"{inferences} rows in {executions} model executions: no batch formed"


def test_triton_refuses_a_bad_request(triton, customers):
    """A missing feature or a wrong type is a 400; data Triton cannot parse as the declared type, or a
    categorical level the graph does not know (ONNX Runtime fails in the model), is a 500 instead."""
    X, _ = customers
    body = triton_body(X.head(2))
    body["inputs"] = body["inputs"][1:]  # a feature is missing
    assert 400 <= httpx.post(triton.infer_url(), json=body, timeout=30).status_code < 500
    body = triton_body(X.head(2))
    body["inputs"][0].update(datatype="INT8", data=[0, 1])  # the wrong type for the column
    assert 400 <= httpx.post(triton.infer_url(), json=body, timeout=30).status_code < 500


def test_mlserver_answers_concurrent_requests_with_the_course_scores(mlserver, churn_model, customers):
    X, expected = customers
    encoded = churn_model.pipeline[:-1].transform(X).astype(np.float32)
    with httpx.Client(limits=httpx.Limits(max_connections=N_CONCURRENT)) as client:
        np.testing.assert_allclose(
            mlserver_scores(client, mlserver.infer_url(), encoded), expected, atol=1e-5
        )
        with ThreadPoolExecutor(N_CONCURRENT) as pool:  # adaptive batching on: each answer is its own row's
            rows = list(pool.map(lambda i: mlserver_scores(client, mlserver.infer_url(), encoded[[i]])[0],
                                 range(len(X))))  # fmt: skip
    np.testing.assert_allclose(rows, expected, atol=1e-5)
    assert mlserver.version().startswith("mlserver ")


def test_mlserver_refuses_a_bad_request(mlserver):
    """An output the XGBoost runtime does not have is a 400; a row of the wrong width, or data that is not
    numbers, fails inside the runtime and is a 500."""
    body = mlserver_body(np.zeros((1, 40), dtype=np.float32))
    body["outputs"][0]["name"] = "leaf_indices"
    assert 400 <= httpx.post(mlserver.infer_url(), json=body, timeout=30).status_code < 500


def test_bad_settings_are_refused(onnx_model, churn_model, tmp_path):
    with pytest.raises(InvalidArgumentError):
        write_triton_repository(tmp_path, onnx_model, max_batch_size=0)
    with pytest.raises(InvalidArgumentError):
        write_mlserver_settings(tmp_path, churn_model.pipeline, max_batch_time_s=-1)


@pytest.mark.parametrize("server", ["triton", "mlserver"])
def test_a_server_stops_when_its_parent_dies(server, onnx_model, churn_model, tmp_path):
    if server == "triton":
        write_triton_repository(tmp_path / "models", onnx_model)
        start = f"start_triton({str(tmp_path / 'models')!r})"
    else:
        write_mlserver_settings(tmp_path, churn_model.pipeline)
        start = f"start_mlserver({str(tmp_path)!r})"
    script = textwrap.dedent(
        f"""
        import time
        from course_lib.offline.inference_servers import start_mlserver, start_triton
        server = {start}
        print(server.url, flush=True)
        time.sleep(600)
        """
    )
    server_stops_with_its_parent(script, "/v2/health/ready", what=server, timeout_s=60)
