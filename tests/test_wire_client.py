"""course_lib.measure.targets.wire_client and targets.wire_target against real servers on 127.0.0.1.

The scripted server (asyncio.start_server) answers each request as the test tells it: Content-Length,
chunked, ``Connection: close``, a 503, garbage, silence. No timing thresholds: ``wire_ms`` is checked
for its ordering against the client's own clock only.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from course_lib.core.checks import InvalidArgumentError
from course_lib.core.waiting import wait_until
from course_lib.measure.generators import serve_null
from course_lib.measure.targets import WIRE_FIELD, wire_target
from course_lib.measure.targets.wire_client import WireClient
from course_lib.serving.service import HttpStatusError


def run(coro, timeout_s: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def _answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


async def _scripted_server(script):
    """A server whose ``script(request_body, n)`` answers request n.

    The script returns the answer's bytes, ``(delay_s, bytes)``, or None to hang up.
    """
    seen = {"requests": 0, "connections": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(
                        b":"
                    )[1]
                )
                body = await reader.readexactly(length)
                seen["requests"] += 1
                out = script(json.loads(body), seen["requests"])
                if isinstance(out, tuple):  # (delay_s, answer): answer late
                    await asyncio.sleep(out[0])
                    out = out[1]
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
                if b"Connection: close" in out:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/score", seen


def test_answers_are_parsed_and_connections_reused():
    async def main():
        server, url, seen = await _scripted_server(
            lambda body, n: _answer(json.dumps({"echo": body, "n": n}).encode())
        )
        async with server, WireClient(url, max_connections=4) as client:
            before = time.perf_counter()
            first = await client.post({"customer_id": "a"})
            elapsed_ms = 1000 * (time.perf_counter() - before)
            assert first.status == 200 and json.loads(first.body) == {"echo": {"customer_id": "a"}, "n": 1}
            assert first.headers["content-type"] == "application/json"
            assert 0 < first.wire_ms <= elapsed_ms  # stamped inside the client's own span
            answers = [await client.post({"i": i}) for i in range(5)]
            assert [json.loads(a.body)["echo"] for a in answers] == [{"i": i} for i in range(5)]
            assert seen["connections"] == 1  # one after another: one keep-alive connection
            many = await asyncio.gather(*(client.post({"i": i}) for i in range(20)))
            assert sorted(json.loads(a.body)["echo"]["i"] for a in many) == list(range(20))
            assert seen["connections"] <= 4  # never more than max_connections at once

    run(main())


def test_chunked_answers_close_and_hang_ups():
    chunked = (
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n'
    )

    def script(body, n):
        if body == "chunked":
            return chunked
        if body == "close":
            return _answer(b"{}", extra="Connection: close\r\n")
        if body == "hang up":
            return None
        if body == "garbage":
            return b"NOT HTTP AT ALL\r\n\r\n"
        return _answer(b"{}")

    async def main():
        server, url, seen = await _scripted_server(script)
        async with server, WireClient(url) as client:
            assert json.loads((await client.post("chunked")).body) == {"a": 1}
            assert (await client.post("close")).status == 200
            assert (await client.post("after close")).status == 200  # a new connection, transparently
            assert seen["connections"] == 2
            with pytest.raises(ConnectionError, match="closed the connection"):
                await client.post("hang up")
            with pytest.raises(ConnectionError, match="unparseable"):
                await client.post("garbage")
            assert (await client.post("still serving")).status == 200

    run(main())


def test_a_cancelled_request_closes_its_connection_so_no_one_reads_its_answer():
    def script(body, n):
        answer = _answer(json.dumps({"n": n}).encode())
        return (2.0, answer) if body == "slow" else answer

    async def main():
        server, url, seen = await _scripted_server(script)
        # "slow" is answered after 2 s; the client gives up first.
        async with server, WireClient(url) as client:
            await client.post("warm")
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await client.post("slow")
            after = await client.post("next")
            assert json.loads(after.body) == {"n": 3}  # its own answer, on a fresh connection
            assert seen["connections"] == 2

    run(main())


def test_wire_target_raises_for_non_2xx_and_records_fields():
    def script(body, n):
        if body == {"customer_id": "shed"}:
            return _answer(
                b'{"detail": "overloaded"}', status="503 Service Unavailable", extra="Retry-After: 1\r\n"
            )
        return _answer(json.dumps({"queue_wait_ms": 0.5, "other": 1}).encode())

    async def main():
        server, url, _ = await _scripted_server(script)
        payloads = [{"customer_id": "ok"}, {"customer_id": "shed"}]
        async with server, wire_target(url, payloads, fields=("queue_wait_ms", WIRE_FIELD))() as send:
            row = await send(0)
            assert row["queue_wait_ms"] == 0.5 and "other" not in row and row[WIRE_FIELD] > 0
            with pytest.raises(HttpStatusError) as shed:
                await send(1)
            assert shed.value.status == 503 and "overloaded" in str(shed.value)

    run(main())


def test_against_the_course_null_server():
    async def main(url):
        async with WireClient(url + "/anything?x=1") as client:
            answers = await asyncio.gather(*(client.post({}) for _ in range(50)))
        assert {a.status for a in answers} == {200} and {a.body for a in answers} == {b"{}"}

    with serve_null(lifetime_s=60) as url:
        run(main(url))


def test_answers_nobody_asked_for_never_reach_a_request():
    def script(body, n):
        if body == "two":  # its own answer and a second one in the same write
            return _answer(b'"first"', extra="X-Which: first\r\n") + _answer(
                b'"extra"', extra="X-Which: extra\r\n"
            )
        if body == "continue":
            return b"HTTP/1.1 100 Continue\r\n\r\n" + _answer(b'"final"')
        if body == "upgrade":
            return b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        return _answer(json.dumps(body).encode())

    async def main():
        server, url, seen = await _scripted_server(script)
        async with server, WireClient(url) as client:
            first = await client.post("two")
            assert first.body == b'"first"' and first.headers["x-which"] == "first"
            later = [await client.post(f"req{i}") for i in range(3)]
            assert [a.body for a in later] == [b'"req0"', b'"req1"', b'"req2"']  # never the stray "extra"
            assert seen["connections"] == 2  # the connection with the stray answer was dropped
            final = await client.post("continue")
            assert (final.status, final.body) == (200, b'"final"')  # the interim 100 is skipped
            with pytest.raises(ConnectionError, match="switched protocols"):
                await client.post("upgrade")
            assert (await client.post("after")).body == b'"after"'

    run(main())


def test_a_closed_client_refuses_to_send_and_a_refused_connection_is_a_connection_error():
    async def main():
        server, url, _ = await _scripted_server(lambda body, n: _answer(b"{}"))
        async with server:
            client = WireClient(url)
            async with client:
                assert (await client.post({})).status == 200
            with pytest.raises(RuntimeError, match="inside `async with"):
                await client.post({})
            with pytest.raises(RuntimeError, match="entered once"):
                async with client:
                    pass
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with WireClient(f"http://127.0.0.1:{port}/score") as closed_port:
            with pytest.raises(ConnectionError, match="cannot connect"):
                await closed_port.post({})

    run(main())


def test_bad_arguments_are_named():
    for url in ("http://user:pw@127.0.0.1/score", "http://127.0.0.1/a b", "http://127.0.0.1/caf\u00e9"):
        with pytest.raises(ValueError, match="url must be http"):
            WireClient(url)
    with pytest.raises(ValueError, match="url must be http"):
        WireClient("https://127.0.0.1/score")
    with pytest.raises(ValueError, match="url must be http"):
        wire_target("127.0.0.1:80/score", [{}])
    with pytest.raises(InvalidArgumentError, match="max_connections"):
        WireClient("http://127.0.0.1/score", max_connections=0)
    for idle in (0, -1.0, float("nan")):
        with pytest.raises(InvalidArgumentError, match="max_idle_s"):
            WireClient("http://127.0.0.1/score", max_idle_s=idle)
    with pytest.raises(ValueError, match="payloads"):
        wire_target("http://127.0.0.1/score", [])
    with pytest.raises(RuntimeError, match="async with"):
        run(WireClient("http://127.0.0.1:9/score").post({}))


def test_open_connections_sends_nothing_and_the_requests_use_them():
    async def main():
        server, url, seen = await _scripted_server(lambda body, n: _answer(b"{}"))
        async with server, WireClient(url, max_connections=4) as client:
            assert await client.open_connections(3) == 3
            for _ in range(1000):  # the server's handler runs a loop turn after each accept
                if seen["connections"] == 3:
                    break
                await asyncio.sleep(0.001)
            assert seen == {"connections": 3, "requests": 0}
            await asyncio.gather(*(client.post({"i": i}) for i in range(3)))
            assert seen == {"connections": 3, "requests": 3}  # no handshake left for the requests
            with pytest.raises(InvalidArgumentError, match="n must be an integer >= 0 and <= 4, got 10"):
                await client.open_connections(10)  # more than max_connections
            with pytest.raises(InvalidArgumentError, match="n must"):
                await client.open_connections(-1)

    run(main())


def test_a_generator_run_sends_no_warm_up_requests():
    """The generator opens its keep-alive connections without requests: a slow server (the prototype)
    used to be handed 8 warm-up requests per process before the common start, and a process finished
    them late, adding its lateness to every request's send lag."""
    import http.server
    import threading

    from course_lib.measure.generators import GeneratorPool

    received = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            received.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with GeneratorPool(2) as pool:
            result = pool.run(
                f"http://127.0.0.1:{server.server_port}/score", [{}], rate_rps=20, duration_s=0.5
            )
    finally:
        server.shutdown()
        server.server_close()
    assert len(received) == len(result.requests) > 0


def test_open_connections_drops_closed_ones_caps_and_bounds():
    async def main():
        server, url, _seen = await _scripted_server(lambda body, n: _answer(b"{}"))
        async with server, WireClient(url, max_connections=2) as client:
            assert await client.open_connections(2) == 2
            for conn in list(client._idle):  # as if the server had closed them while idle
                conn.abort()
            assert await client.open_connections(2) == 2  # refilled with fresh ones
            assert len(client._all) == 2
            with pytest.raises(InvalidArgumentError, match="n must"):
                await client.open_connections(3)  # above max_connections
            # a post called while connections are being opened waits for them instead of opening its own
            results = await asyncio.gather(client.open_connections(2), client.post({}), client.post({}))
            assert results[0] == 2 and len(client._all) == 2
            for conn in list(client._idle):
                conn.abort()
            with pytest.raises(RuntimeError, match="no other call is opening"):
                await asyncio.gather(client.open_connections(2), client.open_connections(2))

    run(main())


def test_a_server_that_never_accepts_does_not_hold_the_run():
    """wire_target bounds the opening (best effort): the requests then time out as the run's own."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # fill the backlog: later connects wait for an accept that never comes
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)

        async def main():
            async with wire_target(
                f"http://127.0.0.1:{port}/score", [{}], open_connections=4, open_timeout_s=0.3
            )():
                return True

        assert run(main(), timeout_s=10)  # entered: bounded by open_timeout_s, not the kernel's ~2 minutes
    finally:
        for s in fillers:
            s.close()
        listener.close()


def test_a_connection_idle_longer_than_max_idle_s_is_not_reused():
    """The server closes a connection after its keep-alive time; the client stops reusing it before."""

    async def main(max_idle_s: float) -> int:
        server, url, seen = await _scripted_server(lambda body, n: _answer(b"{}"))
        async with server, WireClient(url, max_idle_s=max_idle_s) as client:
            await client.post({})
            await asyncio.sleep(0.2)  # the behaviour under test is a time limit
            await client.post({})
        return seen["connections"]

    assert run(main(0.05)) == 2
    assert run(main(60.0)) == 1


def test_an_idle_connection_the_server_just_closed_is_not_written_to():
    """The server closes a kept-alive connection after answering; the client's loop has not yet read the
    end of stream when it sends again: the request goes on a new connection instead of being lost."""
    answered, closed = threading.Event(), threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    served = []

    def serve() -> None:
        with listener:
            for n in range(2):
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(10)
                    head = b""
                    while b"\r\n\r\n" not in head:
                        head += conn.recv(4096)
                    conn.sendall(_answer(b'{"n": %d}' % n))
                    served.append(n)
                    if n == 0:
                        answered.wait(10)  # the client has its answer and the connection is idle
                        conn.shutdown(socket.SHUT_RDWR)
            closed.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def main() -> list[int]:
        async with WireClient(f"http://127.0.0.1:{port}/score") as client:
            first = await client.post({})
            answered.set()
            wait_until(lambda: len(served) == 1 and _peer_shut(port), timeout_s=10, what="the close")
            second = await client.post({})  # no loop pass since the close: only a peek can see it
        return [json.loads(first.body)["n"], json.loads(second.body)["n"]]

    assert run(main()) == [0, 1]
    thread.join(10)


def _peer_shut(port: int) -> bool:
    """True once the server's side of its first connection on ``port`` has shut down (the kernel's view)."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    local = f"{port:04X}"
    # the server's socket (local port = port) leaves ESTABLISHED (01) after its shutdown: FIN_WAIT (04, 05)
    return any(
        line.split()[1].endswith(":" + local) and line.split()[3] in ("04", "05", "06", "07", "08", "0B")
        for line in lines
    )
