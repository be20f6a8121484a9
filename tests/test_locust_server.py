"""Real components: the load-test server in its own process, Locust headless against it, levers checked."""

from __future__ import annotations

import json

import httpx
import pytest

from course_lib.measure.generators import GeneratorPool
from course_lib.measure.ladder import knees, step_table
from course_lib.measure.load_tools.locust import run_locust
from course_lib.measure.server_probes import wait_idle
from course_lib.serving.prototype import serve_churn
from course_lib.serving.service import ChurnService, ScoreRequest


@pytest.fixture(scope="module")
def server():
    with serve_churn(lifetime_s=240, max_queue_size=64) as handle:
        yield handle


def test_locust_headless_against_the_real_server_writes_rows_and_no_failures(server, tmp_path):
    stats = run_locust(
        server.url,
        users=2,
        spawn_rate=10,
        run_time_s=3,
        csv_prefix=tmp_path / "churn",
        env={"CHURN_PATH": "/score", "CHURN_PACING_S": "0.2"},  # about 10 requests/s in all
    )
    row = stats.set_index("Name").loc["/score"]
    assert row["Request Count"] > 0
    assert row["Failure Count"] == 0
    assert stats.set_index("Name").loc["Aggregated", "Request Count"] == row["Request Count"]
    assert (tmp_path / "churn_stats_history.csv").exists()


def test_generator_processes_drive_the_real_server_and_count_every_request(server):
    customers = [{"customer_id": "SC-0000042"}, {"customer_id": "SC-0000007"}]
    wait_idle(server.url, quick_ms=1000.0)
    with GeneratorPool(2) as pool:
        result = pool.run(
            server.url + "/predict", customers, rate_rps=20.0, duration_s=1.0, fields=("batch_size",)
        )
    s = result.summary()
    assert s["sent"] == s["ok"] + s["shed"] + s["timeouts"] + s["other_errors"] > 0
    table = step_table([result], p99_limit_ms=60_000.0)
    assert list(table["rate_rps"]) == [20.0]
    assert knees(table).iloc[0]["knee_rps"] in (0.0, 20.0)
    assert result.requests.loc[result.requests["ok"], "batch_size"].ge(1).all()


def test_bad_requests_get_a_4xx_and_the_server_keeps_serving(server):
    assert httpx.post(server.url + "/score", json={"customer_id": "nope"}).status_code == 422
    assert httpx.post(server.url + "/score", json={"customer_id": "SC-0000042"}).status_code == 200


def test_orjson_answer_is_the_same_json():
    service = ChurnService(
        lambda cid: {}, lambda records: [0.5], model_version="v1", lookup_mode="m", runtime="r"
    )
    fast = ChurnService(
        lambda cid: {},
        lambda records: [0.5],
        model_version="v1",
        lookup_mode="m",
        runtime="r",
        encoder="orjson",
    )
    request = ScoreRequest(customer_id="SC-0000042")
    assert json.loads(fast.format(request, 0.1234567)) == json.loads(service.format(request, 0.1234567))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"http": "fast"}, "http must be one of"), ({"workers": 0}, "workers must be an integer >= 1")],
)
def test_bad_levers_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message), serve_churn(**kwargs):
        pass
