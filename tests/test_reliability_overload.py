"""Overload, recovery and abandoned clients, against real server processes on the course's runtime (issue 28).

Each server is the course's own app over the real (ONNX) model with its capacity lowered on purpose
(``tests/reliability_servers.py --service-ms``: every model call also sleeps, holding no lock), so that
4x its capacity is a few hundred requests/s which two generator processes offer and the server parses
on a busy 2-core machine: the test then measures the door's shedding, not the machine.

How the bounds are sized (the only absolute times asserted are the issue's own two):

* ``CLIENT_TIMEOUT_S`` 2 s is the issue's client timeout; a 503 from the door costs the server
  microseconds (measured p99 15 ms, max 42 ms, on a shared 2-core machine at load 7), so >= 95 %
  within 2 s has a margin of about 50x.
* ``SLO_P99_MS`` 1,000 ms: an admitted request waits behind at most ``MAX_IN_FLIGHT - 1`` others of
  ``SERVICE_MS`` each, about 100 ms (measured accepted p99 107 ms on that machine): a 10x margin.
* ``RECOVERY_BOUND_S`` 2 s is the issue's bound (measured: 0 s, the accepted p99 never left the SLO).
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from course_lib.core.percentiles import percentile
from course_lib.core.waiting import wait_until
from course_lib.measure.generators import GeneratorPool
from course_lib.measure.knee import recovery_time_s, rolling_p99
from course_lib.serving.feature_store import customer_id
from course_lib.serving.server import DEFAULTS, run_processes, to_argv
from course_lib.simulate.traffic import spike_schedule

ROOT = Path(__file__).resolve().parent.parent
SERVICE_MS = 20.0
MAX_IN_FLIGHT = 4
CLIENT_TIMEOUT_S = 2.0
SLO_P99_MS = 1000.0
RECOVERY_BOUND_S = 2.0
OVERLOAD = 4.0
BEFORE_S, SPIKE_S, AFTER_S = 1.0, 10.0, 4.0
PAYLOADS = [{"customer_id": customer_id(i, 2000)} for i in range(1, 400)]
LOWERED = DEFAULTS.replace(
    max_in_flight=MAX_IN_FLIGHT, max_batch_size=1, max_queue_delay_ms=0.0, lifetime_s=300.0
)


def server_command(kind: str, files, *, service_ms: float = SERVICE_MS, config=LOWERED) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "tests" / "reliability_servers.py"),
        kind,
        f"--onnx={files.onnx_path}",
        f"--store={files.store_path}",
        f"--model-version={files.model_version}",
        f"--service-ms={service_ms}",
        *to_argv(config),
    ]


def outcomes(url: str) -> dict[str, int]:
    return httpx.get(url + "/stats", timeout=10).json()["outcomes"]


def delta(after: dict, before: dict) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if isinstance(after[k], int)}


@pytest.fixture(scope="module")
def pool():
    with GeneratorPool(2) as generators:
        yield generators


@pytest.fixture(scope="module")
def lowered(replica_files):
    with run_processes({"s": server_command("batched", replica_files)}) as urls:
        yield urls["s"]


@pytest.fixture(scope="module")
def capacity_rps(lowered, pool):
    """Requests/s the lowered server completes, from the model-call time it reports (warm-up run)."""
    warm = pool.run(
        lowered + "/predict",
        PAYLOADS,
        rate_rps=10,
        duration_s=1.5,
        fields=("service_ms",),
        warm_connections=0,
    )
    service_ms = float(np.median(warm.requests.loc[warm.requests["ok"], "service_ms"]))
    assert SERVICE_MS <= service_ms < 5 * SERVICE_MS, service_ms  # the sleep dominates the model
    return 1000.0 / service_ms


@pytest.mark.parametrize("path", ["/predict", "/score"])
def test_overload_is_shed_at_the_door_and_the_p99_recovers_at_once(lowered, pool, capacity_rps, path):
    """4x capacity for 10 s: >= 95 % of the 503s reach their clients within 2 s; accepted p99 back in 2 s."""
    schedule = spike_schedule(
        base_rps=0.5 * capacity_rps,
        spike_rps=OVERLOAD * capacity_rps,
        before_s=BEFORE_S,
        spike_s=SPIKE_S,
        after_s=AFTER_S,
        seed=3,
    )
    before = outcomes(lowered)
    result = pool.run(
        lowered + path,
        PAYLOADS,
        rate_rps=capacity_rps,
        duration_s=BEFORE_S + SPIKE_S + AFTER_S,
        schedule_ms=schedule,
        request_timeout_s=CLIENT_TIMEOUT_S,
        warm_connections=0,
    )
    server = delta(outcomes(lowered), before)
    seen = result.requests["outcome"].value_counts().to_dict()
    client = {k: seen.get(k, 0) for k in ("ok", "shed", "timeout", "error")}
    # every request counted once (the client idles no connection as long as the server keeps it alive)
    assert server["requests"] == len(result.requests) == sum(client.values()), (server, client)
    spike = (
        (result.requests["scheduled_ms"] >= 1000 * BEFORE_S)
        & (result.requests["scheduled_ms"] < 1000 * (BEFORE_S + SPIKE_S))
    ).sum()
    assert server["shed"] >= 0.5 * spike, (server, spike)  # 4x: about 3/4 of the spike is refused
    assert server["shed_at_door"] == server["shed"]  # refused by admission, before any work
    assert client["shed"] >= 0.95 * server["shed"], (client, server)  # the 503s reached their clients
    # what the server counted is what the clients saw (an answer written after a client's timeout is
    # counted ok by the server and timeout by the client: at most the timeouts apart)
    assert 0 <= server["ok"] - client["ok"] <= client["timeout"], (server, client)
    assert server["server_errors"] == server["client_errors"] == client["error"] == 0
    accepted = result.requests[result.requests["ok"]]
    rolling = rolling_p99(accepted, window_ms=1000.0, step_ms=100.0)
    end_ms = 1000.0 * (BEFORE_S + SPIKE_S)
    recovery = recovery_time_s(rolling, spike_end_ms=end_ms, p99_limit_ms=SLO_P99_MS)
    assert recovery <= RECOVERY_BOUND_S, rolling[rolling["t_ms"] >= end_ms].head(30)
    late = accepted[accepted["scheduled_ms"] >= end_ms + 1000 * RECOVERY_BOUND_S]
    assert len(late) >= 10 and percentile(late["latency_ms"], 99) <= SLO_P99_MS


def _send(url: str, path: str, i: int) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    body = json.dumps(PAYLOADS[i]).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def _read_answer(sock: socket.socket) -> bytes:
    """One whole HTTP answer (head and Content-Length body): a client that stops at the head left early."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("path", ["/predict", "/score"])
def test_clients_that_leave_are_never_scored_and_are_counted(replica_files, path):
    """One client waits for its answer while its model call runs (500 ms); eleven others send and
    leave. Issue 28: Lesson 2 scored all 1,500 requests of which 1,157 clients had gone, and counted
    none. Here the eleven never reach the model (the batcher's queue drops them, or the last check
    before a model call on the event loop does) and are counted as abandoned."""
    n = 12
    slow = LOWERED.replace(max_in_flight=64)
    with run_processes(
        {"s": server_command("batched", replica_files, service_ms=500.0, config=slow)}
    ) as urls:
        url = urls["s"]
        httpx.post(url + path, json=PAYLOADS[0], timeout=30)  # warm, not counted below
        before, app_before = outcomes(url), httpx.get(url + "/stats").json()
        batcher_before = httpx.get(url + "/batcher").json()["stats"]
        waiter = _send(url, path, 1)
        leavers = [_send(url, path, i) for i in range(2, n + 1)]
        if path == "/predict":  # the event loop is free: see them queued behind the model call first
            wait_until(lambda: httpx.get(url + "/batcher").json()["queue_len"] == n - 1, what="eleven queued")
        for sock in leavers:
            sock.close()
        answer = _read_answer(waiter)
        waiter.close()
        wait_until(
            lambda: delta(outcomes(url), before)["requests"] == n and outcomes(url)["in_flight"] == 0,
            timeout_s=30,
            what=f"every {path} request to end on the server",
        )
        server = delta(outcomes(url), before)
        batcher = httpx.get(url + "/batcher").json()["stats"]
        app = httpx.get(url + "/stats").json()
    assert answer.startswith(b"HTTP/1.1 200")
    assert (server["ok"], server["abandoned"]) == (1, n - 1), server
    if path == "/predict":
        assert batcher["items_scored"] - batcher_before["items_scored"] == 1  # only the waiter's
        assert batcher["cancelled_by_caller"] - batcher_before["cancelled_by_caller"] == n - 1
    else:  # each leaver was dropped at the door or right before its model call
        dropped = app["client_disconnects"] - app_before["client_disconnects"] + server["abandoned_at_door"]
        assert dropped == n - 1, (server, app)


def test_the_monitored_apps_metrics_agree_with_its_clients_under_overload(replica_files, pool):
    """Issue 28: Lesson 9's /metrics showed 20,513 x 200 with p99 <= 5 ms while clients saw 14,074 failures."""
    with run_processes({"m": server_command("monitored", replica_files)}) as urls:
        url = urls["m"]
        capacity = 1000.0 / SERVICE_MS
        schedule = spike_schedule(
            base_rps=0.5 * capacity,
            spike_rps=OVERLOAD * capacity,
            before_s=0.5,
            spike_s=5.0,
            after_s=1.0,
            seed=5,
        )
        result = pool.run(
            url + "/score",
            PAYLOADS,
            rate_rps=capacity,
            duration_s=6.5,
            schedule_ms=schedule,
            request_timeout_s=CLIENT_TIMEOUT_S,
            warm_connections=0,
        )
        page = httpx.get(url + "/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(page)}
    served = {
        s.labels["outcome"]: s.value
        for s in families["churn_http_requests"].samples
        if s.name.endswith("_total")
    }
    seen = result.requests["outcome"].value_counts().to_dict()
    assert sum(served.values()) == len(result.requests)
    t = result.requests["scheduled_ms"]
    spike = int(((t >= 500) & (t < 5500)).sum())
    assert served["shed"] >= 0.5 * spike, (served, spike)  # 4x: about 3/4 of the spike is refused
    assert seen.get("shed", 0) >= 0.95 * served["shed"]
    assert 0 <= served["ok"] - seen.get("ok", 0) <= seen.get("timeout", 0)
    scored = sum(
        s.value
        for s in families["churn_requests"].samples
        if s.name.endswith("_total") and s.labels["status"] == "200"
    )
    assert served["ok"] <= scored <= served["ok"] + served["abandoned"]  # scored = answered, or client left
    count = next(
        s.value for s in families["churn_http_request_duration_seconds"].samples if s.name.endswith("_count")
    )
    assert count == served["ok"]  # the latency histogram covers exactly the answered requests


def test_a_model_call_on_the_event_loop_behind_a_full_door_is_shed_by_its_wait(replica_files, pool):
    """Lesson 6's prototype runs its model call on the event loop (here: /score's 20 ms sleep, inline).
    Behind the default door of 128 that is a 2.6 s queue, longer than the client's 2 s timeout: in the
    issue 28 probe of the prototype, 1,140 of 1,589 requests timed out and the p99 had not recovered
    4 s after the spike. ``max_queue_wait_s`` refuses instead, once the oldest admitted request has
    waited 0.5 s: the clients get 503s, none times out, and the p99 is back within 2 s."""
    capacity = 1000.0 / SERVICE_MS  # one inline 20 ms call at a time
    counted = DEFAULTS.replace(max_batch_size=1, max_queue_delay_ms=0.0, lifetime_s=300.0)
    configs = {"count only": counted, "count and wait": counted.replace(max_queue_wait_s=0.5)}
    with run_processes(
        {k: server_command("batched", replica_files, config=c) for k, c in configs.items()}
    ) as urls:
        schedule = spike_schedule(
            base_rps=0.5 * capacity,
            spike_rps=OVERLOAD * capacity,
            before_s=1.0,
            spike_s=6.0,
            after_s=4.0,
            seed=7,
        )
        runs = {
            name: pool.run(
                url + "/score",
                PAYLOADS,
                rate_rps=capacity,
                duration_s=11.0,
                schedule_ms=schedule,
                request_timeout_s=CLIENT_TIMEOUT_S,
                warm_connections=0,
            ).requests
            for name, url in urls.items()
        }
    seen = {name: r["outcome"].value_counts().to_dict() for name, r in runs.items()}
    assert seen["count only"].get("timeout", 0) > 0, seen  # what the wait bound is for
    assert seen["count and wait"].get("timeout", 0) == 0, seen
    assert seen["count and wait"].get("shed", 0) > 0 and seen["count and wait"].get("error", 0) == 0, seen
    accepted = runs["count and wait"][runs["count and wait"]["ok"]]
    rolling = rolling_p99(accepted, window_ms=1000.0, step_ms=100.0)
    recovery = recovery_time_s(rolling, spike_end_ms=7000.0, p99_limit_ms=SLO_P99_MS)
    assert recovery <= RECOVERY_BOUND_S, rolling[rolling["t_ms"] >= 7000.0].head(30)
