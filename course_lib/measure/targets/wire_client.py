"""A lean keep-alive HTTP/1.1 client that times each request on the wire, as k6 does.

Until December 2026 the course generator's requests went through aiohttp, whose answer reaches the
sending task one or two event-loop turns after its last byte was parsed; on a busy 2-core machine those turns
hold other requests' work, so a time taken in the task is longer than the request spent on the wire. k6 times
``http_req_duration`` from its write to its read in Go's own runtime. :class:`WireClient` takes both
stamps where the bytes move: just before ``transport.write`` and in ``data_received``, the moment the
answer's last byte is parsed (``httptools``, the C parser uvicorn uses), before any task resumes.

It is deliberately small: POST with a JSON body, ``Content-Length`` or chunked answers, a pool of
keep-alive connections (one request in flight per connection, as k6's virtual users and aiohttp's pool
do), a connection the server closes or that is abandoned mid-answer (a timeout) is discarded, and an
idle connection is checked before it is reused (the server may have closed it a moment ago, as
urllib3 checks its pooled connections).

References
----------
k6 documentation, "Built-in metrics" (``http_req_duration`` = sending + waiting + receiving).
RFC 9112 (HTTP/1.1 message syntax: ``Content-Length``, chunked transfer coding, persistent connections).
httptools documentation (``HttpResponseParser`` callbacks).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from course_lib.core.checks import integer, positive_number
from course_lib.core.sockets import readable

__all__ = ["WireAnswer", "WireClient"]


@dataclass(frozen=True)
class WireAnswer:
    """One answer: ``status`` (int), ``body`` (bytes), ``headers`` (lower-case name -> value, str) and
    ``wire_ms``, the time from the request's write to its answer's last byte parsed, in ms."""

    status: int
    body: bytes
    headers: dict[str, str]
    wire_ms: float


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``exchange`` writes a request and waits for its parsed answer.

    Bytes that arrive while no request waits (an answer nobody asked for, a second answer in the same
    read) abort the connection, so no later request can read them as its own.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = time.monotonic()  # opened, or its last answer read
        self._waiter: asyncio.Future[WireAnswer] | None = None
        self._sent = 0.0
        self._body: list[bytes] = []
        self._headers: dict[str, str] = {}

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # nothing asked for these bytes
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(
                ConnectionError("the server switched protocols (101); this client speaks HTTP/1.1 only")
            )
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"unparseable HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        # An answer delimited by the close itself (no Content-Length, not chunked; RFC 9112 section 6.3)
        # is not read: httptools has no end-of-input call, and the course's servers always give a length.
        self._fail(ConnectionError(f"the server closed the connection{f': {exc}' if exc else ''}"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self._waiter is None:  # a second answer in one read: nobody asked for it
            self.abort()
        self._body, self._headers = [], {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        done = time.perf_counter()  # the last byte parsed: k6's end of "receiving"
        status = self.parser.get_status_code()
        if (
            100 <= status < 200 and status != 101
        ):  # interim answer (100 Continue, 103): wait for the final one
            return
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            self.abort()
            return
        if status == 101:
            self.abort()
            waiter.set_exception(
                ConnectionError("the server switched protocols (101); this client speaks HTTP/1.1 only")
            )
            return
        if not self.parser.should_keep_alive():
            self.abort()  # the whole answer is in: nothing left to send or read
        waiter.set_result(
            WireAnswer(
                status=status,
                body=b"".join(self._body),
                headers=dict(self._headers),
                wire_ms=1000.0 * (done - self._sent),
            )
        )

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def server_closed(self) -> bool:
        """True if the server closed or reset this idle connection, even when the loop has not yet
        read its end of stream (a poll, as urllib3 checks a pooled connection before reusing it):
        a request written after that close would be lost with a reset."""
        if self.closed or self.transport is None:
            return True
        return readable(self.transport)  # an end of stream, a reset, or bytes nobody asked for

    def abort(self) -> None:
        """Drop the connection now, with whatever is still buffered (``transport.close`` waits for it)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def exchange(self, request: bytes) -> WireAnswer:
        if self.transport is None or self._waiter is not None or self.closed:
            raise ConnectionError("this connection is closed or busy")
        self._waiter = asyncio.get_running_loop().create_future()
        self._body, self._headers = [], {}
        self._sent = time.perf_counter()  # k6's start of "sending"
        self.transport.write(request)
        return await self._waiter


class WireClient:
    """POST JSON bodies to one ``http://host:port/path`` over a pool of keep-alive connections.

    Use as an async context manager, once (the connections close on exit; ``post`` is refused after).
    ``post(body)`` sends one request on an idle connection (a new one while fewer than
    ``max_connections`` are open, else it waits for one) and returns a :class:`WireAnswer`; interim
    1xx answers are skipped. A request cancelled mid-flight (a timeout), an answer that does not parse
    or bytes nobody asked for abort their connection, so no later request reads another's answer. The
    request is not retried, even when a kept-alive connection was closed by the server as it was sent:
    so that this does not happen, a connection idle for longer than ``max_idle_s`` is closed rather than
    reused (the server closes it after its own keep-alive time), and an idle connection the server has
    closed a moment ago, before the loop has read its end of stream, is found by a poll and not used.

    Parameters
    ----------
    url : str
        ``http://host[:port]/path[?query]`` (no TLS, no user info; the path in ASCII without spaces).
    max_connections : int >= 1
    max_idle_s : float > 0
        Longest time a connection stays idle in the pool and is still reused, s. The default, 4 s, is
        below uvicorn's default ``timeout_keep_alive`` of 5 s, which the course's servers keep
        (``ServerConfig.keep_alive_s``): a client's idle timeout is set below its server's keep-alive,
        as a load balancer's is below its targets' (AWS, "Application Load Balancers", connection idle
        timeout), so that the server never closes a connection the client may be writing to.

    Raises
    ------
    ValueError
        For a URL outside that form; ``InvalidArgumentError`` for ``max_connections`` < 1 or
        ``max_idle_s`` not > 0.
    ConnectionError
        From ``post``: the connection could not be made, closed, switched protocols or sent an
        answer that does not parse.
    RuntimeError
        From ``post`` outside the ``async with`` block.
    """

    def __init__(self, url: str, *, max_connections: int = 512, max_idle_s: float = 4.0) -> None:
        parts = urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if (
            parts.scheme != "http"
            or not parts.hostname
            or parts.username is not None
            or not path.isascii()
            or any(ch.isspace() for ch in path)
        ):
            raise ValueError(
                "url must be http://host[:port]/path (no user info, an ASCII path without spaces), "
                f"got {url!r}"
            )
        self.host, self.port, self.path = parts.hostname, parts.port or 80, path
        self.max_connections = integer("max_connections", max_connections, min=1)
        self.max_idle_s = positive_number("max_idle_s", max_idle_s, unit="s")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {host}:{self.port}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode("ascii")
        self._idle: deque[_Connection] = deque()
        self._slots: asyncio.Semaphore | None = None
        self._all: set[_Connection] = set()
        self._warming: asyncio.Event | None = None  # set while open_connections opens
        self._state = "new"

    def request_bytes(self, payload: Any) -> bytes:
        """The whole request for ``payload`` (JSON-encoded), headers and body."""
        body = json.dumps(payload).encode()
        return self._head + str(len(body)).encode("ascii") + b"\r\n\r\n" + body

    async def __aenter__(self) -> WireClient:
        if self._state != "new":
            raise RuntimeError("a WireClient is entered once; make a new one")
        self._slots, self._state = asyncio.Semaphore(self.max_connections), "open"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._state = "closed"
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()

    async def _connection(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the pool is ordered by idle_since
            if time.monotonic() - conn.idle_since > self.max_idle_s:
                for old in (conn, *self._idle):  # it and every one below it idled too long
                    old.abort()
                    self._all.discard(old)
                self._idle.clear()
                break
            if not conn.server_closed():
                return conn
            conn.abort()
            self._all.discard(conn)
        made = await self._new_connection()
        if made is None:
            raise RuntimeError("the WireClient closed while this request was connecting")
        self._all.add(made)
        return made

    async def _new_connection(self) -> _Connection | None:
        """Connect to the server; None (the connection aborted) if the block was left meanwhile.

        Raises
        ------
        ConnectionError
            If the connection could not be made.
        """
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Connection, self.host, self.port)
        except OSError as exc:
            raise ConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        if self._state != "open":  # the block was left while this connection was being made
            conn.abort()
            return None
        return conn

    async def open_connections(self, n: int) -> int:
        """Open connections (no request sent) until ``n`` idle ones wait in the pool; return how many do.

        A run that should not pay TCP handshakes opens them first; sending warm-up requests instead
        would leave a slow server working on them when the run starts. The connections are opened
        together; a ``post`` called meanwhile waits for them. Closed idle connections are dropped first.
        Bound it with ``asyncio.wait_for``: a server that never accepts leaves a connect waiting until
        the kernel gives up.

        Raises
        ------
        InvalidArgumentError
            For ``n`` < 0 or above ``max_connections``.
        RuntimeError
            Outside the ``async with`` block, while a request is in flight or while another call opens.
        ConnectionError
            If a connection could not be made (those that were made stay in the pool).
        """
        want = integer("n", n, min=0, max=self.max_connections)
        if self._slots is None or self._state != "open":
            raise RuntimeError("use WireClient inside `async with WireClient(url) as client:`")
        if self._warming is not None or len(self._all) > len(self._idle):
            raise RuntimeError(
                "open_connections runs while no request is in flight and no other call is opening"
            )
        for conn in [c for c in self._idle if c.closed]:
            self._all.discard(conn)
        self._idle = deque(c for c in self._idle if not c.closed)
        missing = want - len(self._idle)
        if missing <= 0:
            return len(self._idle)
        self._warming = warming = asyncio.Event()

        async def one() -> None:
            conn = await self._new_connection()
            if conn is None:
                return
            self._all.add(conn)
            self._idle.append(conn)

        try:
            results = await asyncio.gather(*(one() for _ in range(missing)), return_exceptions=True)
        finally:
            self._warming = None
            warming.set()
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        if self._state != "open":
            raise RuntimeError("the WireClient closed while its connections were being opened")
        return len(self._idle)

    async def post(self, payload: Any = None, *, request: bytes | None = None) -> WireAnswer:
        """Send one POST (``payload`` as JSON, or the ready ``request`` bytes) and return its answer."""
        if self._slots is None or self._state != "open":
            raise RuntimeError("use WireClient inside `async with WireClient(url) as client:`")
        data = self.request_bytes(payload) if request is None else request
        if self._warming is not None:  # open_connections is opening: use its connections, not new ones
            await self._warming.wait()
        async with self._slots:
            conn = await self._connection()
            done = False
            try:
                answer = await conn.exchange(data)
                done = True
            finally:
                if done and not conn.closed and self._state == "open":
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                else:  # cancelled, failed, or the client closed meanwhile: nobody reads this connection again
                    conn.abort()
                    self._all.discard(conn)
        return answer
