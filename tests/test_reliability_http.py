"""Abusive connections against real server processes on the course's runtime, both HTTP parsers (issue 28).

Slowloris, an idle-connection flood at a lowered open-file limit, aborted uploads, pipelining without
reading, huge and stalled bodies, and the head checks (Host, Content-Encoding, redirects, error body
size). Memory is the server's resident set (psutil) sampled while the probe runs; the bounds are a
few times what the server needs (tens of MB), far below what the unbounded cases took (issue 28:
685 MB for one 400 MiB body, 1,029 MB for 300,000 pipelined requests).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from course_lib.core.waiting import wait_until
from course_lib.measure.server_probes import sample_rss
from course_lib.serving.feature_store import customer_id
from course_lib.serving.replica import ReplicaConfig, start_replica
from course_lib.serving.server import DEFAULTS, MAX_HEADER_BYTES, run_processes, to_argv
from course_lib.serving.server._refusals import empty_lines

ROOT = Path(__file__).resolve().parent.parent
MAX_CONNECTIONS = 48
LIMITS = DEFAULTS.replace(
    header_timeout_s=1.0, body_timeout_s=1.0, max_connections=MAX_CONNECTIONS, backlog=32, lifetime_s=300.0
)
OPEN_FILES = LIMITS.files_needed  # the fewest the config allows: 48 + 3 x 32 + 64 = 208
LIMITS = LIMITS.replace(open_files_limit=OPEN_FILES)
GOOD = json.dumps({"customer_id": customer_id(7, 2000)}).encode()
MEMORY_BOUND_BYTES = 64 * 2**20  # growth allowed during a probe


def command(files, config) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "tests" / "reliability_servers.py"),
        "batched",
        f"--onnx={files.onnx_path}",
        f"--store={files.store_path}",
        f"--model-version={files.model_version}",
        *to_argv(config),
    ]


@pytest.fixture(scope="module")
def servers(replica_files):
    with run_processes(
        {http: command(replica_files, LIMITS.replace(http=http)) for http in ("h11", "httptools")}
    ) as urls:
        yield urls


@pytest.fixture(scope="module")
def slow_servers(replica_files):
    """Both parsers, with every model call stretched to 300 ms (a request stays in flight)."""
    config = {
        http: [*command(replica_files, LIMITS.replace(http=http)), "--service-ms=300"]
        for http in ("h11", "httptools")
    }
    with run_processes(config) as urls:
        yield urls


@pytest.fixture(params=["h11", "httptools"])
def server(request, servers):
    url = servers[request.param]
    return url, servers.processes[request.param].pid


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return data


def request(path: str = "/predict", body: bytes = GOOD, extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def serving(url: str) -> bool:
    with httpx.Client(base_url=url, timeout=30) as c:
        return (
            c.get("/healthz").status_code == 200
            and c.post("/predict", content=GOOD, headers={"content-type": "application/json"}).status_code
            == 200
        )


def outcomes(url: str) -> dict:
    return httpx.get(url + "/stats", timeout=30).json()["outcomes"]


def test_slowloris_connections_are_closed_after_the_header_timeout(server):
    url, _ = server
    loris = [connect(url) for _ in range(40)]
    try:
        for sock in loris:
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: t\r\nX-a: ")  # headers never finished
        assert serving(url)
        closed = [read_until_closed(sock) == b"" for sock in loris]
        assert all(closed)  # every one closed by the server (the read returns only at the close)
    finally:
        for sock in loris:
            sock.close()
    assert serving(url)


def test_an_idle_flood_past_the_open_file_limit_locks_nobody_out(server):
    url, pid = server
    idle = []
    try:
        for _ in range(OPEN_FILES + 40):  # more than the server could hold open at its fd limit
            idle.append(connect(url))
        assert serving(url)  # a new client past the limit: the oldest idle connections were evicted
        files = psutil.Process(pid).num_fds()
        assert files <= OPEN_FILES, files
        assert sum(read_until_closed(sock) == b"" for sock in idle[:50]) == 50  # the oldest were closed
    finally:
        for sock in idle:
            sock.close()
    assert serving(url)


def test_aborted_uploads_are_counted_and_logged_nowhere(server, servers):
    url, _ = server
    before = outcomes(url)["abandoned"]
    for k in range(1, 31):
        with connect(url) as sock:
            sock.sendall(request(body=b"{" + b" " * 10)[:-8])  # Content-Length promises more than comes
        wait_until(lambda k=k: outcomes(url)["abandoned"] == before + k, what=f"aborted upload {k}")
    assert serving(url)
    name = next(n for n, u in servers.items() if u == url)
    assert "Traceback" not in servers.workers[name][0].tail(20_000)


def _flood(sock: socket.socket, data: bytes, stop: threading.Event) -> None:
    sock.settimeout(0.5)
    view = memoryview(data)
    while view and not stop.is_set():
        try:
            sent = sock.send(view[:65536])
        except TimeoutError:
            continue  # the server stopped reading: back-pressure
        except OSError:
            return  # the server closed the connection (httptools past its pipeline depth)
        view = view[sent:]


def flood_and_read(url: str, pid: int, data: bytes) -> tuple[bytes, int]:
    """Send ``data`` from a thread while the answer is read until the server closes; the answer and the
    growth of the server's resident set meanwhile (bytes)."""
    sock, stop = connect(url), threading.Event()
    sender = threading.Thread(target=_flood, args=(sock, data, stop), daemon=True)
    try:
        with sample_rss(pid, interval_s=0.02) as rss:
            sender.start()
            answer = read_until_closed(sock)
    finally:
        stop.set()
        sock.close()
        sender.join(10)
    return answer, max(rss) - rss[0]


def test_pipelining_without_reading_keeps_memory_bounded(server):
    url, pid = server
    burst = request() * 100_000  # 12 MB of requests, none of whose answers is read
    sock, stop = connect(url), threading.Event()
    sender = threading.Thread(target=_flood, args=(sock, burst, stop), daemon=True)
    try:
        with sample_rss(pid, interval_s=0.02) as rss:
            sender.start()
            sender.join(5.0)  # blocked by back-pressure, or done because the server closed
            assert serving(url)
        assert max(rss) - rss[0] < MEMORY_BOUND_BYTES, (rss[0], max(rss))
    finally:
        stop.set()
        sock.close()
        sender.join(10)


def read_answers(sock: socket.socket, n: int) -> bytes:
    """Read until ``n`` answers (status lines) have come and the last JSON body is complete."""
    data = b""
    while data.count(b"HTTP/1.1 ") < n or not data.endswith(b"}"):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data.count(b'HTTP/1.1 ')} of {n} answers"
        data += chunk
    return data


def test_requests_past_the_pipeline_depth_get_a_429_that_says_why_then_a_close(server, servers):
    """h11 pauses reading and answers every request; httptools answers the queued ones, then 429."""
    url, _ = server
    httptools = servers["httptools"] == url
    burst = request() * 2_000  # ~240 KB sent at once: the first read holds far more than the depth
    with connect(url) as sock:
        sender = threading.Thread(target=sock.sendall, args=(burst,), daemon=True)
        sender.start()
        answers = read_until_closed(sock) if httptools else read_answers(sock, 2_000)
        sender.join(10)
    statuses = [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", answers)]
    if not httptools:
        assert statuses == [200] * 2_000
    else:
        # the one answered at once, the queued ones, then the refusal, in order; nothing after it
        assert statuses == [200] * (1 + DEFAULTS.max_pipeline_depth) + [429], statuses[-3:]
        refusal = answers.split(b"HTTP/1.1 429 ")[1]
        assert b"connection: close" in refusal.lower()
        body = json.loads(refusal.split(b"\r\n\r\n", 1)[1])
        assert body["error"] == "pipeline_too_deep" and str(DEFAULTS.max_pipeline_depth) in body["message"]
    assert serving(url)


@pytest.mark.parametrize("depth", [3, 40], ids=["within-the-depth", "past-the-depth"])
def test_a_malformed_request_after_pipelined_ones_is_answered_400_after_them(server, servers, depth):
    """The requests before a malformed one keep their answers; after a 429 nothing more is answered."""
    url, _ = server
    past = servers["httptools"] == url and depth > DEFAULTS.max_pipeline_depth + 1
    before = outcomes(url)
    with connect(url) as sock:
        sock.sendall(request() * depth + b"GARBAGE \x00\x01 NOT HTTP\r\n\r\n")
        answers = read_until_closed(sock)
    statuses = [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", answers)]
    if past:
        assert statuses == [200] * (1 + DEFAULTS.max_pipeline_depth) + [429], statuses
    else:
        assert statuses == [200] * depth + [400], statuses
    # every answer the client read is counted once, the parser's 400 too (it never reaches the app)
    seen = {
        "requests": len(statuses),
        "ok": statuses.count(200),
        "client_errors": len(statuses) - statuses.count(200),
    }
    wait_until(
        lambda: {k: outcomes(url)[k] - before[k] for k in seen} == seen, what=f"the door's counts of {seen}"
    )
    assert serving(url)


def test_a_request_the_parser_refuses_is_counted_as_a_client_error(server):
    """uvicorn answers a request its parser refuses without the app; the door's counters still count it."""
    url, _ = server
    before = outcomes(url)
    for bad in (b"GARBAGE \x00\x01 NOT HTTP\r\n\r\n", b"GET / HTTP/1.1\r\nHost: t\r\nBad Name: x"):
        with connect(url) as sock:
            sock.sendall(bad + b"\r\n\r\n")
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 400 ") and b"connection: close" in answer.lower(), answer[:200]
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])  # the door's error shape, not uvicorn's text
        assert body["error"] == "bad_request" and "not valid HTTP/1.1" in body["message"], body
    wait_until(
        lambda: outcomes(url)["client_errors"] - before["client_errors"] == 2, what="two client errors"
    )
    after = outcomes(url)
    assert after["requests"] - before["requests"] == 2 and after["ok"] == before["ok"]
    assert serving(url)


@pytest.mark.parametrize("declared", [400 * 2**20, None], ids=["huge", "chunked"])
def test_a_huge_body_is_refused_with_memory_bounded(server, declared):
    url, pid = server
    head = (f"Content-Length: {declared}\r\n" if declared else "Transfer-Encoding: chunked\r\n").encode()
    chunk = b"x" * 65536
    piece = chunk if declared else b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    start = b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + head + b"\r\n"
    answer, growth = flood_and_read(url, pid, start + piece * 512)  # 32 MiB
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert growth < MEMORY_BOUND_BYTES, growth
    assert serving(url)


def test_a_stalled_body_gets_408_after_the_body_timeout(server):
    url, _ = server
    with connect(url) as sock:
        sock.sendall(
            request(body=b'{"customer_id": "SC-0000007"}' + b" " * 100)[:-90]
        )  # part of it, then nothing
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /predict HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", 400),
        (b"POST /predict HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 2\r\n\r\n{}", 400),
        (b"POST /predict HTTP/1.1\r\nHost: a b\r\nContent-Length: 2\r\n\r\n{}", 400),
        (request(extra=b"Content-Encoding: gzip\r\n"), 415),
        (request(extra=b"x-request-timeout-ms: soon\r\n"), 400),
        (
            request("/predict/", extra=b"Connection: close\r\n").replace(b"Host: t", b"Host: evil.example"),
            404,
        ),
        (  # request smuggling: h11 read the chunked body, kept the connection and served the rest
            b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 4\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(GOOD), GOOD) + request(),
            400,
        ),
        (  # httptools ignored the gzip and scored the plain body (h11's parser refuses it, 400)
            b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(GOOD), GOOD),
            (400, 415),
        ),
    ],
    ids=[
        "no-host",
        "two-hosts",
        "bad-host",
        "gzip",
        "bad-deadline",
        "trailing-slash",
        "cl-and-te",
        "te-gzip",
    ],
)
def test_the_head_is_checked_before_any_work(server, raw, status):
    url, _ = server
    with connect(url) as sock:
        sock.sendall(raw)
        answer = read_until_closed(sock) if b"close" in raw or status == 400 else sock.recv(65536)
    assert any(answer.startswith(f"HTTP/1.1 {s}".encode()) for s in np.atleast_1d(status)), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1, answer  # one request sent, one answer
    assert b"evil.example" not in answer and b"location" not in answer.lower()
    assert serving(url)


@pytest.mark.parametrize("complete", [True, False], ids=["whole-head", "head-still-coming"])
def test_a_head_over_the_size_limit_gets_a_431_that_says_why(server, complete):
    """Both parsers: a head that arrived whole in one read (h11 alone parsed and served it) and one whose
    header value keeps coming (httptools alone buffered 78 MiB of it in 8 s, unbounded, until the header
    timeout), with memory bounded; the refusal is counted like any other client error."""
    url, pid = server
    before = outcomes(url)["client_errors"]
    head = request(extra=b"X-Filler: " + b"a" * (MAX_HEADER_BYTES + 100) + b"\r\n")
    if not complete:  # a value that never ends, 32 MiB of it, sent while the answer is read
        head = request().split(b"\r\n\r\n")[0] + b"\r\nX-Filler: " + b"a" * (32 * 2**20)
    answer, growth = flood_and_read(url, pid, head)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1 and b"connection: close" in answer.lower()
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"] == "headers_too_large" and str(MAX_HEADER_BYTES) in body["message"], body
    assert growth < MEMORY_BOUND_BYTES, growth
    wait_until(lambda: outcomes(url)["client_errors"] == before + 1, what="the 431 counted")
    assert serving(url)


def test_a_head_just_under_the_size_limit_is_served_however_it_is_cut(server):
    """The size limit counts the head, not the reads: 512-byte pieces of a head of almost 16 KiB."""
    url, _ = server
    raw = request(extra=b"Connection: close\r\nX-Filler: " + b"a" * (MAX_HEADER_BYTES - 400) + b"\r\n")
    with connect(url) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(0, len(raw), 512):
            sock.sendall(raw[i : i + 512])
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def _server_has_read(sock: socket.socket) -> bool:
    """True when the server's end of ``sock`` has nothing left in its kernel receive queue (Linux)."""
    here, there = sock.getsockname(), sock.getpeername()
    local, remote = f"{there[1]:04X}", f"{here[1]:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(":" + local) and fields[2].endswith(":" + remote):
            return int(fields[4].split(":")[1], 16) == 0
    return True  # closed


def send_in_reads(url: str, data: bytes, cuts: list[int]) -> list[int]:
    """Send ``data`` cut at ``cuts``, each piece only once the server has read the one before (so each is
    its own read); the statuses of the answers, read until the server closes."""
    with connect(url) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
            sock.sendall(data[start:end])
            wait_until(lambda: _server_has_read(sock), what="the server to read a piece")
        return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", read_until_closed(sock))]


def test_heads_within_the_limit_are_served_however_reads_cut_them(server, servers):
    """From a breaker: httptools counted a read that began in one pipelined head and ended in the next
    as head bytes (9 kB heads got a 431), and both parsers counted the request line and CRLFs of a
    head cut across reads but not of a whole one (a head at the limit got a 431 when cut)."""
    url, _ = server
    cookie = request(extra=b"Cookie: " + b"c" * 9000 + b"\r\n")
    two = cookie + cookie.replace(b"Content-Type", b"Connection: close\r\nContent-Type")
    end_of_second = len(cookie) + two[len(cookie) :].index(b"\r\n\r\n")
    assert send_in_reads(url, two, [10, end_of_second - 10]) == [200, 200]
    filler = request(extra=b"Connection: close\r\nX-Filler: \r\n")
    at_limit = filler.replace(
        b"X-Filler: ", b"X-Filler: " + b"a" * (MAX_HEADER_BYTES - filler.index(b"\r\n\r\n") - 4)
    )
    head_end = at_limit.index(b"\r\n\r\n") + 4
    assert head_end == MAX_HEADER_BYTES
    assert send_in_reads(url, at_limit, [1, head_end - 10]) == [200]
    # RFC 9112 section 2.2: empty lines before a request line are skipped, and not counted (a third
    # breaker: a head at the limit after one got a 431 on httptools when a read ended inside it)
    assert send_in_reads(url, b"\r\n" + at_limit, [head_end + 1]) == [200]
    assert send_in_reads(url, at_limit, []) == [200]
    assert send_in_reads(url, at_limit.replace(b"X-Filler: ", b"X-Filler: a"), []) == [431]


def test_empty_lines_before_a_request_line_are_skipped_on_both_parsers(server):
    """RFC 9112 section 2.2: a server SHOULD ignore at least one empty line (CRLF) before a request line,
    such as the CRLF some clients write after a POST body. httptools does; h11 refused the request with a
    400 ("no request line received"), and a CR alone at the end of a read ("illegal request line")."""
    url, _ = server
    before = outcomes(url)
    last = request(extra=b"Connection: close\r\n")
    assert send_in_reads(url, b"\r\n\r\n" + request() + b"\r\n" + request() + b"\n" + last, []) == [200] * 3
    cut = len(request()) + 1  # a read that ends between the CR and the LF after the first request's body
    assert send_in_reads(url, request() + b"\r\n" + last, [1, cut]) == [200, 200]
    # behind a request, more empty lines than h11 buffers before it pauses reading: reading resumes
    many = request() + b"\r\n" * 2**16 + last  # 128 KiB: over PIPELINE_BUFFER_BYTES (64 KiB)
    assert send_in_reads(url, many, [len(many) - len(last)]) == [200, 200]
    seen = {"requests": 7, "ok": 7, "client_errors": 0}
    wait_until(lambda: {k: outcomes(url)[k] - before[k] for k in seen} == seen, what=f"counts {seen}")
    assert send_in_reads(url, b"\r\n \r\n" + last, []) == [400]  # a line of a space is not empty


@pytest.mark.parametrize(
    ("data", "skipped"),
    [(b"", 0), (b"\r\n", 2), (b"\n\n\nX", 3), (b"\n\r\n", 3), (b"\r\n\r\nGET", 4), (b"GET", 0),
     (b"\r", 0), (b"\r\n\r", 2), (b"\rX", 0), (b"\r\r\n", 0), (b"\r\n\r\rX", 2)],
)  # fmt: skip
def test_empty_lines_counts_crlf_and_lf_lines_but_never_a_bare_cr(data, skipped):
    """A CR that ends the data may wait for its LF; a CR followed by anything else is no empty line."""
    assert empty_lines(data) == empty_lines(bytearray(data)) == skipped


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_empty_lines_after_a_request_are_skipped_whatever_state_h11_is_in(slow_servers, http):
    """From a breaker: h11 skipped empty lines only where uvicorn asked for the next request. After a request
    that closes the connection (HTTP/1.0), a CRLF that came while it was in flight got a 400 and the 200 was
    lost; after a body read once its answer was sent, the request behind a CRLF was dropped unanswered."""
    url = slow_servers[http]
    before = outcomes(url)
    closing = request().replace(b"HTTP/1.1", b"HTTP/1.0")  # its model call takes 300 ms
    assert send_in_reads(url, closing + b"\r\n", [len(closing)]) == [200]
    early = b"GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n"  # answered, body unread
    last = b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    assert send_in_reads(url, early + b"hello\r\n" + last, [len(early)]) == [200, 200]
    seen = {"requests": 2, "ok": 2, "client_errors": 0, "abandoned": 0}  # a probe with a body is counted
    wait_until(lambda: {k: outcomes(url)[k] - before[k] for k in seen} == seen, what=f"counts {seen}")


def test_a_flood_of_empty_lines_is_closed_by_the_header_timeout_with_memory_bounded(server):
    """Skipped empty lines are no way around the header timeout or the memory bound: 32 MiB of CRLFs get
    no answer, the connection closes (at the header timeout if the flood outlasts it), and nothing is counted."""
    url, pid = server
    before = outcomes(url)
    with connect(url) as sock, sample_rss(pid, interval_s=0.02) as rss:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # the header timeout came first
            sock.sendall(b"\r\n" * (16 * 2**20))
        answer = read_until_closed(sock)
    assert answer == b"", answer[:200]
    assert max(rss) - rss[0] < MEMORY_BOUND_BYTES, (rss[0], max(rss))
    assert serving(url)
    assert outcomes(url)["requests"] - before["requests"] == 1  # serving()'s own request


def test_a_body_the_parser_refuses_is_answered_400_at_once_and_counted_once(server):
    """From a breaker: a malformed chunk was counted twice (the door's request and the protocol's
    refusal), and on httptools answered 408 only after the body timeout."""
    url, _ = server
    before = outcomes(url)
    raw = b'POST /predict HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"cus\r\nZZ\r\n'
    with connect(url) as sock:
        sock.sendall(raw)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 ") and len(re.findall(rb"HTTP/1\.1 \d{3} ", answer)) == 1, answer
    assert b"connection: close" in answer.lower()
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "bad_body"
    seen = {"requests": 1, "client_errors": 1, "abandoned": 0, "ok": 0}
    wait_until(lambda: {k: outcomes(url)[k] - before[k] for k in seen} == seen, what=f"counts {seen}")
    assert serving(url)


def test_from_a_second_breaker_refusals_are_prompt_and_counted_once(server, servers):
    """httptools: a too-large head that came in the connection's first read and never ended got no
    answer until the header timeout; a malformed request pipelined after one whose answer closed the
    connection was counted as abandoned, though never read; a probe path with a bad chunked body was
    answered 200 and the connection held open (and a bad chunk after its answer got an unrequested 400)."""
    url, _ = server
    with connect(url) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: t\r\nX-F: " + b"a" * 60_000)
        assert read_until_closed(sock).startswith(b"HTTP/1.1 431 ")
    before = outcomes(url)
    with connect(url) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: a b\r\nContent-Length: 2\r\n\r\n{}GARBAGE\x00\r\n\r\n")
        answers = read_until_closed(sock)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answers) == [b"400"] and b"bad_host" in answers
    with connect(url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" in answer.lower(), answer[:300]
    with connect(url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)
        sock.sendall(b"ZZ\r\n")  # a bad chunk after the answer: the connection closes, nothing more
        rest = read_until_closed(sock)
    assert head.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1" not in rest, rest
    seen = {"requests": 3, "client_errors": 1, "ok": 2, "abandoned": 0}
    wait_until(lambda: {k: outcomes(url)[k] - before[k] for k in seen} == seen, what=f"counts {seen}")
    assert serving(url)


def test_a_trailer_value_that_never_ends_is_refused_with_memory_bounded(server):
    """From a second breaker: httptools buffered it until the body timeout (151 MiB on one connection)."""
    url, pid = server
    start = request(body=b"").replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    data = start + b"2\r\n{}\r\n0\r\nX-T: " + b"a" * (32 * 2**20)
    answer, growth = flood_and_read(url, pid, data)
    assert answer.startswith(b"HTTP/1.1 431 ") and b"trailers_too_large" in answer, answer[:300]
    assert growth < MEMORY_BOUND_BYTES, growth
    assert serving(url)


def test_a_malformed_request_with_a_large_body_is_a_400_not_a_431(server):
    """From a breaker: h11 answered 431 to any refused request while its buffer held over 16 KiB."""
    url, _ = server
    raw = request(body=b"x" * 20_000).replace(b"Content-Length: 20000", b"Content-Length: abc")
    with connect(url) as sock:
        sock.sendall(raw)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert serving(url)


def test_a_refused_head_that_expects_100_continue_is_answered_without_asking_for_the_body(server):
    """The client waits for 100 Continue before sending its body: the door must not ask for the body
    (reading it makes uvicorn send 100 Continue) and then wait the body timeout for it."""
    url, _ = server
    raw = request(body=b"", extra=b"Expect: 100-continue\r\n")
    with connect(url) as sock:
        sock.sendall(raw.replace(b"Content-Length: 0", b"Content-Length: 50000000"))
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"100 Continue" not in answer and b"connection: close" in answer.lower()
    assert outcomes(url)["client_errors"] >= 1 and serving(url)


def test_error_bodies_never_echo_a_large_request(server):
    url, _ = server
    keys = {f"{'k' * 200}{i}": i for i in range(60)}  # a 12 KB body of 60 unknown keys
    with httpx.Client(base_url=url, timeout=30) as c:
        answer = c.post("/predict", json={"customer_id": "SC-0000007", **keys})
    assert answer.status_code == 422
    assert len(answer.content) <= LIMITS.max_error_body_bytes
    assert "k" * 200 not in answer.text and "more" in answer.json()["message"]


def test_the_replica_bounds_a_stalled_huge_body(replica_files):
    """Issue 28: one 400 MiB body took the replica from 276 to 685 MB; its stall middleware buffered it."""
    with start_replica(
        replica_files.onnx_path,
        replica_files.store_path,
        replica_files.model_version,
        config=ReplicaConfig(slow_fraction=1.0, slow_ms=10.0),
        server_config=LIMITS,
        max_lifetime_s=120,
    ) as replica:
        pid = replica.process.pid
        sock, stop = connect(replica.url), threading.Event()
        start = b"POST /score HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nx-request-id: r1\r\n"
        start += f"Content-Length: {400 * 2**20}\r\n\r\n".encode()
        sender = threading.Thread(target=_flood, args=(sock, start + b"x" * 32 * 2**20, stop), daemon=True)
        try:
            with sample_rss(pid, interval_s=0.02) as rss:
                sender.start()
                answer = read_until_closed(sock)
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
            assert max(rss) - rss[0] < MEMORY_BOUND_BYTES, (rss[0], max(rss))
        finally:
            stop.set()
            sock.close()
            sender.join(10)
        assert (
            httpx.post(
                replica.url + "/score", content=GOOD, headers={"content-type": "application/json"}
            ).status_code
            == 200
        )


def test_sigterm_with_requests_in_flight_answers_each_one_or_refuses_it_503(replica_files):
    """Issue 28 (graceful shutdown): uvicorn cancels what is still running when its grace period is
    over and answered those requests 500; each must get its answer or a 503 with Retry-After."""
    n_requests, service_ms = 12, 400  # one at a time, 4.8 s of work against a 1 s grace period
    config = LIMITS.replace(max_batch_size=1, max_queue_delay_ms=0.0, graceful_shutdown_s=1.0)
    answers: list[bytes] = []
    with run_processes({"s": [*command(replica_files, config), f"--service-ms={service_ms}"]}) as urls:
        url = urls["s"]

        def send(i: int) -> None:
            body = json.dumps({"customer_id": customer_id(i + 1, 2000)}).encode()  # no duplicates
            with connect(url) as sock:
                sock.sendall(request(body=body, extra=b"Connection: close\r\n"))
                answers.append(read_until_closed(sock))

        senders = [threading.Thread(target=send, args=(i,)) for i in range(n_requests)]
        for sender in senders:
            sender.start()
        wait_until(lambda: outcomes(url)["in_flight"] == n_requests, timeout_s=30, what="all in flight")
        urls.processes["s"].send_signal(signal.SIGTERM)
        for sender in senders:
            sender.join(30)
    statuses = sorted(answer[9:12] for answer in answers)
    assert len(answers) == n_requests and set(statuses) <= {b"200", b"503"}, statuses
    refused = [answer for answer in answers if answer.startswith(b"HTTP/1.1 503")]
    assert refused, statuses  # the grace period ended with requests still queued
    assert all(b"retry-after" in answer.lower() and b"shutting_down" in answer for answer in refused)


@pytest.mark.parametrize("timer", ["keep_alive", "header"])
@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_request_that_arrives_as_an_idle_timer_fires_is_answered(replica_files, http, timer):
    """The server is stopped (SIGSTOP) past its idle timer and a request is sent meanwhile: on waking,
    uvloop runs the due timer before it reads the socket, so the timer finds the request waiting in the
    kernel. It must be read and answered, not dropped with a reset (RFC 9112 section 9.3.1's race,
    closed on the server's side)."""
    idle = {"keep_alive_s": 1.0, "header_timeout_s": 30.0}
    if timer == "header":
        idle = {"keep_alive_s": 30.0, "header_timeout_s": 1.0}
    config = LIMITS.replace(http=http, loop="uvloop", **idle)
    with run_processes({"s": command(replica_files, config)}) as urls:
        pid = urls.processes["s"].pid
        with connect(urls["s"]) as sock:
            sock.sendall(request())
            assert b" 200 " in read_answers(sock, 1)
            answered = time.monotonic()
            # the timer is armed as the answer completes; the behaviour under test is a time limit
            wait_until(lambda: time.monotonic() > answered + 0.5, timeout_s=5, what="the server to idle")
            psutil.Process(pid).suspend()
            try:
                wait_until(lambda: time.monotonic() > answered + 1.6, timeout_s=5, what="the timer to be due")
                sock.sendall(request())
            finally:
                psutil.Process(pid).resume()
            assert b" 200 " in read_answers(sock, 1)
        assert serving(urls["s"])


@pytest.mark.parametrize("timer", ["keep_alive", "header"])
@pytest.mark.parametrize("http,loop", [("h11", "asyncio"), ("httptools", "uvloop")])
def test_a_slow_reader_gets_its_whole_answer_when_an_idle_timer_fires(replica_files, http, loop, timer):
    """An 8 MiB answer read slowly for longer than the idle timer: the timer's close waits for the
    answer to be sent (an end of stream sent at once would cut it short, silently)."""
    from reliability_servers import BULK_BYTES

    idle = {"keep_alive_s": 1.0, "header_timeout_s": 30.0}
    if timer == "header":
        idle = {"keep_alive_s": 30.0, "header_timeout_s": 1.0}
    config = LIMITS.replace(http=http, loop=loop, **idle)
    command_line = [*command(replica_files, config)]
    command_line[command_line.index("batched")] = "bulk"
    with run_processes({"s": command_line}) as urls:
        host, port = urls["s"].removeprefix("http://").split(":")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16_384)
            sock.settimeout(30)
            sock.connect((host, int(port)))
            sock.sendall(b"GET /bulk HTTP/1.1\r\nHost: t\r\n\r\n")
            received, started = b"", time.monotonic()
            while len(received.partition(b"\r\n\r\n")[2]) < BULK_BYTES:
                chunk = sock.recv(65_536)
                if not chunk:
                    break  # the server closed: the answer ends here
                received += chunk
                if time.monotonic() - started < 3.0:  # a slow reader past the 1 s timer; the
                    time.sleep(0.05)  # behaviour under test is a time limit
        assert len(received.partition(b"\r\n\r\n")[2]) == BULK_BYTES
        assert serving(urls["s"])


def test_the_connection_limit_never_picks_a_connection_that_is_already_closing(replica_files):
    """A reader that never reads a large answer leaves its connection closing (still sending) after its
    idle timer; the limit must close other idle connections, not that one again (which frees nothing).
    The bulk answer (8 MiB) is larger than the socket buffers, so it is still being sent."""
    limit = 4
    config = LIMITS.replace(
        http="httptools", loop="uvloop", keep_alive_s=1.0, header_timeout_s=60.0, max_connections=limit
    )
    command_line = [*command(replica_files, config)]
    command_line[command_line.index("batched")] = "bulk"
    with run_processes({"s": command_line}) as urls:
        pid = urls.processes["s"].pid
        stuck = connect(urls["s"])
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16_384)
        stuck.sendall(b"GET /bulk HTTP/1.1\r\nHost: t\r\n\r\n")  # its answer is never read
        asked = time.monotonic()
        wait_until(lambda: time.monotonic() > asked + 2.0, timeout_s=10, what="its idle timer")
        idle = [connect(urls["s"]) for _ in range(5 * limit)]
        try:
            # all but `limit` - 1 of them closed by the server, beside the closing one (connection times
            # tie within a millisecond, so which idle ones were closed is not asserted, only how many)
            wait_until(
                lambda: sum(map(_closed_by_server, idle)) >= len(idle) - (limit - 1),
                timeout_s=10,
                what="the server to close the oldest idle connections",
            )
            held = [c for c in psutil.Process(pid).net_connections("tcp") if c.status == "ESTABLISHED"]
            assert len(held) <= limit, held
        finally:
            for sock in [stuck, *idle]:
                sock.close()


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)  # a socket with a timeout would wait for the peek
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
