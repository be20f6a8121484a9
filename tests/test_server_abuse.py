"""Serving under abuse (issue 10, items 4, 8 and 10), against real uvicorn server processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import textwrap
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from orphans import server_stops_with_its_parent

from course_lib.core.waiting import wait_until
from course_lib.serving.batching.predict import run_servers
from course_lib.serving.feature_store import customer_id

ROOT = Path(__file__).resolve().parent.parent
N_CUSTOMERS = 2000
GOOD = {"customer_id": customer_id(1, N_CUSTOMERS)}
LIMITS = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "max_connections": 24, "lifetime_s": 300.0}


@pytest.fixture(scope="module")
def store_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("abuse_store")


@pytest.fixture(scope="module")
def servers(store_folder):
    common = {"runtime": "xgboost", "n_customers": N_CUSTOMERS, "store_folder": store_folder, **LIMITS}
    with run_servers(
        {
            "fast": common,
            # requests wait 1.5 s in a queue of 3: time for clients to give up while queued
            "slow": {**common, "max_queue_delay_ms": 1500.0, "max_queue_size": 3, "max_batch_size": 64},
        }
    ) as urls:
        yield urls


@pytest.fixture(scope="module")
def url(servers):
    return servers["fast"]


@pytest.fixture(scope="module")
def client(url):
    with httpx.Client(base_url=url, timeout=10.0) as c:
        yield c


def raw_connection(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def post(
    client: httpx.Client, path: str, body: bytes, content_type: str = "application/json"
) -> httpx.Response:
    return client.post(path, content=body, headers={"content-type": content_type})


def assert_serving(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 200
    assert post(client, "/predict", json.dumps(GOOD).encode()).status_code == 200


# -- item 10: aborted uploads and disconnects ---------------------------------------------------
def test_aborted_uploads_never_freeze_the_server_and_are_counted(url, client):
    """The vector: connections sending ``Content-Length: 100`` and a body of ``{``, then closing."""
    for k in range(1, 41):  # ~15 froze the server when its stderr was an unread pipe
        before = client.get("/stats").json()["outcomes"]["abandoned"]
        with raw_connection(url) as sock:
            sock.sendall(
                b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
        wait_until(
            lambda b=before: client.get("/stats").json()["outcomes"]["abandoned"] == b + 1,
            what=f"disconnect {k}",
        )
    assert_serving(client)


def test_clients_that_give_up_are_cancelled_their_slots_freed_and_never_scored(servers):
    """Items 4 and 10: three queued clients time out; a fourth is accepted (not 503) and scored."""
    slow = servers["slow"]

    async def give_up(i: int) -> None:
        async with httpx.AsyncClient(base_url=slow, timeout=0.3) as c:
            with pytest.raises(httpx.TimeoutException):
                await c.post("/predict", json={"customer_id": customer_id(10 + i, N_CUSTOMERS)})

    async def main():
        await asyncio.gather(*(give_up(i) for i in range(3)))

    with httpx.Client(base_url=slow, timeout=10.0) as c:
        before = c.get("/batcher").json()["stats"]
        asyncio.run(main())
        state = wait_until(
            lambda: (
                (s := c.get("/batcher").json())["stats"]["cancelled_by_caller"]
                >= before["cancelled_by_caller"] + 3
                and s
            ),
            what="three cancellations",
        )
        assert state["queue_len"] == 0
        fresh = c.post("/predict", json=GOOD)
        after = c.get("/batcher").json()["stats"]
    assert fresh.status_code == 200 and fresh.json()["batch_size"] == 1
    assert after["rejected_queue_full"] == before["rejected_queue_full"]
    assert after["items_scored"] - before["items_scored"] == 1  # the three who left never reached the model
    assert after["completed"] - before["completed"] == 1


# -- items 8 and 10: the JSON door --------------------------------------------------------------
@pytest.mark.parametrize("path", ["/predict", "/score"])
@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"[" * 1000 + b"]" * 1000, 400, "nested deeper than"),  # was a 500 RecursionError
        (b'{"customer_id": ' + b"9" * 4301 + b"}", 400, "4301 characters"),  # was a 500 ValueError
        (b'{"customer_id": "SC-0000001", "customer_id": "SC-0000002"}', 400, "'customer_id' appears twice"),
        (b'{"customer_id": NaN}', 400, "NaN is not a JSON number"),
        (b'{"customer_id": "SC-0000001"\xff}', 400, "not UTF-8"),
        (json.dumps(GOOD).encode("utf-16"), 400, "not UTF-8"),
        (b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), 200, None),  # a UTF-8 BOM is ignored (RFC 8259 8.1)
    ],
    ids=["1000-nested", "4301-nines", "duplicate-key", "nan", "invalid-utf8", "utf16", "utf8-bom"],
)
def test_parser_edges_get_400_with_the_courses_own_reason(client, path, body, status, reason):
    response = post(client, path, body)
    assert response.status_code == status
    if reason:
        assert reason in response.json()["message"]
        assert "Error" not in response.text and "Traceback" not in response.text
    assert_serving(client)


@pytest.mark.parametrize(
    "content_type",
    ["application/vnd.api+json", "application/merge-patch+json", "application/json; charset=utf-8"],
)
def test_every_json_media_type_is_accepted(client, content_type):
    response = post(client, "/predict", json.dumps(GOOD).encode(), content_type)
    assert response.status_code == 200 and response.json()["customer_id"] == GOOD["customer_id"]


def test_a_non_json_type_gets_415_without_echoing_it(client):
    response = post(client, "/score", json.dumps(GOOD).encode(), "text/x-evil-<script>")
    assert response.status_code == 415
    assert "evil" not in response.text and "application/json" in response.json()["message"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["customer_id", "id", "x"]), json_values, max_size=3).map(
        lambda v: json.dumps(v).encode()
    ),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 8000).map(lambda n: b'{"customer_id": ' + b"9" * n + b"}"),
    st.integers(1, 3000).map(lambda n: b'{"customer_id": 1' + b"0" * n + b".5e99999}"),
    json_values.map(lambda v: b"\xef\xbb\xbf" + json.dumps(v).encode()),
    json_values.map(lambda v: json.dumps(v).encode("utf-16")),
    json_values.map(lambda v: json.dumps(v).encode("utf-32")),
    st.text(max_size=40).map(
        lambda t: json.dumps({"customer_id": t}, ensure_ascii=False).encode("utf-8", "surrogatepass")
    ),
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies, path=st.sampled_from(["/predict", "/score"]))
def test_fuzzed_bodies_never_get_a_5xx_from_either_endpoint(client, body, path):
    response = post(client, path, body)
    assert response.status_code < 500, (response.status_code, response.text[:200])
    assert "Traceback" not in response.text


# -- item 10: timeouts, connection limit, shutdown, orphans -------------------------------------
def test_slow_headers_are_cut_off_and_the_server_keeps_serving(url, client):
    with raw_connection(url) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: t\r\n")  # headers never finished (slowloris)
        assert_serving(client)
        assert read_until_closed(sock) == b""  # closed by the server after header_timeout_s


def test_a_half_sent_body_gets_408_after_the_body_timeout(url, client):
    with raw_connection(url) as sock:
        sock.sendall(
            b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive within 1 s" in answer
    assert client.get("/stats").json()["body_timeouts"] >= 1


def test_idle_connections_beyond_the_limit_cannot_lock_anyone_out(url):
    idle = [raw_connection(url) for _ in range(LIMITS["max_connections"] + 16)]
    try:
        with httpx.Client(base_url=url, timeout=10.0) as fresh:  # a new connection, past the limit
            assert_serving(fresh)
        for sock in idle[:16]:  # the longest-idle connections were closed to make room
            assert read_until_closed(sock) == b""
    finally:
        for sock in idle:
            sock.close()


def test_a_server_stops_at_its_lifetime_even_with_a_half_sent_body(store_folder):
    with run_servers(
        {
            "short": {
                "runtime": "xgboost",
                "n_customers": N_CUSTOMERS,
                "store_folder": store_folder,
                "lifetime_s": 3.0,
                "body_timeout_s": 120.0,  # the body would keep it busy for 2 minutes
                "graceful_shutdown_s": 1.0,
            }
        }
    ) as urls:
        proc = urls.processes["short"]
        with raw_connection(urls["short"]) as sock:
            sock.sendall(
                b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: 50\r\n\r\n{"
            )
            wait_until(
                lambda: proc.poll() is not None, timeout_s=30, what="the server to exit at its lifetime"
            )
    # 0 or -SIGTERM (uvicorn re-raises the signal after its graceful shutdown); 3: our hard exit;
    # never -SIGKILL
    assert proc.returncode in (0, -signal.SIGTERM, 3)


def test_a_server_exits_when_its_parent_dies(store_folder, tmp_path):
    script = textwrap.dedent(
        f"""
        import time
        from course_lib.serving.batching.predict import run_servers
        with run_servers({{"s": {{"runtime": "xgboost", "n_customers": {N_CUSTOMERS},
                                 "store_folder": {str(store_folder)!r}, "parent_check_s": 0.2}}}}) as urls:
            print(urls["s"], urls.processes["s"].pid, flush=True)
            time.sleep(600)
        """
    )
    server_stops_with_its_parent(script, "/healthz", what="the server", timeout_s=30)


def test_timing_bounds_are_checked_before_anything_starts():
    with (
        pytest.raises(ValueError, match="header_timeout_s must be a finite number > 0"),
        run_servers({"x": {"header_timeout_s": 0}}),
    ):
        pass
    with (
        pytest.raises(TypeError, match="unknown server options \\['colour'\\]"),
        run_servers({"x": {"colour": "red"}}),
    ):
        pass
