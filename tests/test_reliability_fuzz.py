"""2,000 fuzzed bodies per endpoint against every app the course serves, on its one runtime (issue 28).

Endpoints: Lesson 3's ``/score`` and ``/predict`` (a server process), Lesson 8's cached ``/score`` over
a real Redis (a server process), Lesson 9's monitored ``/score`` (a server process), Lesson 7's replica
``/score`` and Lesson 2's app served in a thread. Every answer must be below 500, carry no traceback,
and an error answer must stay within the runtime's error-body cap; each server still answers afterwards.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.churn.export import OnnxChurnScorer, make_session
from course_lib.serving.cache.redis_server import redis_server, redis_unavailable_reason
from course_lib.serving.feature_store import FeatureStore, customer_id, make_lookup
from course_lib.serving.replica import start_replica
from course_lib.serving.server import DEFAULTS, run_processes, serve_in_thread, to_argv
from course_lib.serving.service import ChurnService, create_app, onnx_forward

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = 2000
CAP = DEFAULTS.max_error_body_bytes
GOOD = {"customer_id": customer_id(5, 2000)}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=40), inner, max_size=6),
    max_leaves=16,
)
bodies = st.one_of(
    st.binary(max_size=400),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["customer_id", "id", "x", "k" * 300]), json_values, max_size=4).map(
        lambda v: json.dumps(v).encode()
    ),
    st.from_regex(r"SC-[0-9]{0,12}", fullmatch=True).map(lambda c: json.dumps({"customer_id": c}).encode()),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 8000).map(lambda n: b'{"customer_id": ' + b"9" * n + b"}"),
    json_values.map(lambda v: b"\xef\xbb\xbf" + json.dumps(v).encode()),
    json_values.map(lambda v: json.dumps(v).encode("utf-16")),
    st.integers(1, 40_000).map(lambda n: b'{"customer_id": "' + b"A" * n + b'"}'),
)
content_types = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "application/vnd.x+json", "text/plain", ""]
)


def command(kind: str, files, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "tests" / "reliability_servers.py"),
        kind,
        f"--onnx={files.onnx_path}",
        f"--store={files.store_path}",
        f"--model-version={files.model_version}",
        *extra,
        *to_argv(DEFAULTS.replace(lifetime_s=600.0)),
    ]


@pytest.fixture(scope="module")
def endpoints(replica_files):
    """name -> URL of every endpoint fuzzed (servers started together, stopped at the end)."""
    files = replica_files
    service = ChurnService(
        make_lookup(FeatureStore(files.store_path), "indexed"),
        onnx_forward(OnnxChurnScorer(make_session(str(files.onnx_path)))),
        model_version=files.model_version,
    )
    with (
        redis_server(max_lifetime_s=600) as redis,
        run_processes(
            {
                "batched": command("batched", files),
                "monitored": command("monitored", files),
                "cached": command("cached", files, f"--redis-port={redis.port}"),
            },
            env={"COURSE_TEST_REDIS_PASSWORD": redis.password},
        ) as urls,
        start_replica(files.onnx_path, files.store_path, files.model_version, max_lifetime_s=600) as replica,
        serve_in_thread(create_app(service), max_lifetime_s=600) as lesson2,
    ):
        yield {
            "Lesson 3 /score": urls["batched"] + "/score",
            "Lesson 3 /predict": urls["batched"] + "/predict",
            "Lesson 8 cached /score": urls["cached"] + "/score",
            "Lesson 9 monitored /score": urls["monitored"] + "/score",
            "Lesson 7 replica /score": replica.url + "/score",
            "Lesson 2 /score (thread)": lesson2.url + "/score",
        }


pytestmark = pytest.mark.skipif(
    redis_unavailable_reason() is not None, reason=str(redis_unavailable_reason())
)


@pytest.mark.parametrize(
    "name",
    [
        "Lesson 3 /score",
        "Lesson 3 /predict",
        "Lesson 8 cached /score",
        "Lesson 9 monitored /score",
        "Lesson 7 replica /score",
        "Lesson 2 /score (thread)",
    ],
)
def test_fuzzed_bodies_never_get_a_5xx_a_traceback_or_a_long_error(endpoints, name):
    url = endpoints[name]
    statuses: dict[int, int] = {}
    with httpx.Client(timeout=30) as client:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(body=bodies, content_type=content_types)
        def fuzz(body: bytes, content_type: str) -> None:
            headers = {"content-type": content_type} if content_type else {}
            answer = client.post(url, content=body, headers=headers)
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            assert answer.status_code < 500, (answer.status_code, answer.text[:300])
            assert "Traceback" not in answer.text
            if answer.status_code >= 400:
                assert len(answer.content) <= CAP, (answer.status_code, len(answer.content))

        fuzz()
        assert client.post(url, json=GOOD).status_code == 200  # still serving
    assert sum(statuses.values()) >= EXAMPLES and set(statuses) - {200, 400, 404, 413, 415, 422} == set(), (
        statuses
    )
