"""A Redis cache that fails open, against a real Redis and Lesson 8's service in a server process (issue 28).

Issue 28 found: Redis stalled 8 s -> every request, /healthz included, waited 8 s; Redis dead -> 50/50
answered 500 while /healthz said ok; ``CONFIG SET maxmemory 1`` -> 100/100 x 500; no password, and a
forged ``SET`` was served as a hit; out-of-schema stored features answered 500. Here each answer comes
from the model within the issue's 2 s client timeout (the cache's own timeout is 0.1 s; after three
failures its breaker skips Redis), ``/healthz`` says degraded, and the failures are counted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import sys
from pathlib import Path

import httpx
import pytest

from course_lib.churn.export import OnnxChurnScorer, make_session
from course_lib.core.waiting import wait_until
from course_lib.serving.cache.redis_server import redis_server, redis_unavailable_reason
from course_lib.serving.cache.service import store_snapshot
from course_lib.serving.feature_store import FeatureStore, customer_id, make_lookup
from course_lib.serving.server import DEFAULTS, run_processes, to_argv
from course_lib.serving.service import ChurnService, onnx_forward

pytestmark = pytest.mark.skipif(
    redis_unavailable_reason() is not None, reason=str(redis_unavailable_reason())
)
ROOT = Path(__file__).resolve().parent.parent
CLIENT_TIMEOUT_S = 2.0
BREAKER_RESET_S = 1.0
IDS = [customer_id(i, 2000) for i in range(100, 130)]


def cached_server(files, redis, *, store_path=None):
    command = [
        sys.executable,
        str(ROOT / "tests" / "reliability_servers.py"),
        "cached",
        f"--onnx={files.onnx_path}",
        f"--store={store_path or files.store_path}",
        f"--model-version={files.model_version}",
        f"--redis-port={redis.port}",
        "--redis-timeout-s=0.1",
        f"--breaker-reset-s={BREAKER_RESET_S}",
        *to_argv(DEFAULTS.replace(lifetime_s=300.0)),
    ]
    return run_processes({"cached": command}, env={"COURSE_TEST_REDIS_PASSWORD": redis.password})


def score(client: httpx.Client, cid: str) -> dict:
    answer = client.post("/score", json={"customer_id": cid})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture
def redis():
    with redis_server(max_lifetime_s=300) as server:
        yield server


@pytest.fixture(scope="module")
def truth(replica_files):
    """The model's own scores, in this process: the same ONNX file and store, no cache."""
    service = ChurnService(
        make_lookup(FeatureStore(replica_files.store_path), "indexed"),
        onnx_forward(OnnxChurnScorer(make_session(str(replica_files.onnx_path)))),
        model_version=replica_files.model_version,
    )
    return {
        cid: service.handle(json.dumps({"customer_id": cid}).encode()).json()["churn_probability"]
        for cid in IDS
    }


def test_a_value_written_by_someone_else_is_a_miss_and_the_model_answers(replica_files, redis, truth):
    """The issue's forgery, with the server's real password: ``SET churn|<version>|<snapshot>|<id>``."""
    snapshot = store_snapshot(FeatureStore(replica_files.store_path))()
    forger = redis.client()
    for cid in IDS:
        name = f"churn|{replica_files.model_version}|{snapshot}|{cid}"
        forger.set(name, "0.999999")
        forger.set(name + "x", "0.999999|" + "0" * 64)  # a neighbour key, with a fake HMAC: also refused
    with cached_server(replica_files, redis) as urls, httpx.Client(base_url=urls["cached"], timeout=30) as c:
        answers = [score(c, cid) for cid in IDS]
        health = c.get("/healthz").json()
    assert [a["churn_probability"] for a in answers] == [truth[cid] for cid in IDS]  # not 0.999999
    assert {a["cache"] for a in answers} == {"miss"}
    assert health["cache"]["rejected"] == len(IDS) and health["status"] == "ok"


@pytest.mark.parametrize("failure", ["stalled", "killed", "maxmemory 1"])
def test_a_failing_redis_is_bypassed_the_model_answers_and_healthz_says_degraded(
    replica_files, redis, truth, failure
):
    with (
        cached_server(replica_files, redis) as urls,
        httpx.Client(base_url=urls["cached"], timeout=CLIENT_TIMEOUT_S) as c,
    ):
        assert c.get("/healthz").json()["status"] == "ok"
        if failure == "stalled":
            os.kill(redis.pid, signal.SIGSTOP)
        elif failure == "killed":
            os.kill(redis.pid, signal.SIGKILL)
        else:  # from another local process that has the password: every SET now fails (OOM)
            redis.client().config_set("maxmemory", 1)
            redis.client().flushall()
        try:
            answers = [score(c, cid) for cid in IDS]  # each within the 2 s client timeout
            health = c.get("/healthz").json()
            assert [a["churn_probability"] for a in answers] == [truth[cid] for cid in IDS]
            assert {a["cache"] for a in answers} == {"bypass"}
            assert health["status"] == "degraded" and health["cache"]["bypassed"] == len(IDS)
            if failure == "maxmemory 1":  # every SET fails at once (OOM): nothing to skip, all counted
                assert health["cache"]["errors"] == len(IDS)
            else:  # each call waits for the timeout or fails; after three the breaker skips Redis
                assert health["cache"]["breaker"] == "open" and health["cache"]["breaker_opened"] >= 1
                assert 1 <= health["cache"]["errors"] <= 3 * health["cache"]["breaker_opened"]
        finally:
            if failure == "stalled":
                os.kill(redis.pid, signal.SIGCONT)
        if failure != "killed":  # the cache comes back: the breaker's trial call closes it
            if failure == "maxmemory 1":
                redis.client().config_set("maxmemory", 0)
            wait_until(
                lambda: (
                    score(c, IDS[0])["cache"] in ("hit", "miss")
                    and c.get("/healthz").json()["status"] == "ok"
                ),
                timeout_s=30,
                interval_s=0.2,
                what="the cache to be used again",
            )


def test_stored_features_outside_the_schema_get_422_on_the_cached_path(replica_files, redis, tmp_path):
    store = tmp_path / "bad.sqlite"
    shutil.copy(replica_files.store_path, store)
    with sqlite3.connect(store) as con:
        con.execute("UPDATE features SET tenure = -5 WHERE customer_id = ?", (IDS[0],))
    with (
        cached_server(replica_files, redis, store_path=store) as urls,
        httpx.Client(base_url=urls["cached"], timeout=30) as c,
    ):
        answer = c.post("/score", json={"customer_id": IDS[0]})
        assert answer.status_code == 422 and answer.json()["error"] == "invalid_features"
        assert "tenure" in answer.json()["message"]
        assert score(c, IDS[1])["cache"] == "miss"  # the next customer is served
