"""The door every course server puts in front of its app: refuse early, admit a bounded number, count what clients saw.

One concept: :class:`Door`, a pure ASGI middleware (Starlette's middleware style, no
``BaseHTTPMiddleware``) that the runtime wraps around every app. Before any of a request's work starts:

* **the head**: exactly one well-formed ``Host`` (RFC 9112 section 3.2; 400), not both
  ``Content-Length`` and ``Transfer-Encoding`` (RFC 9112 section 6.1: the framing a proxy and this
  server could read differently, request smuggling; 400 and the connection closed, so bytes after
  the body are never read as a request), no ``Content-Encoding`` other than ``identity`` and no
  ``Transfer-Encoding`` other than ``chunked`` (415: nothing here decodes gzip, so it would be
  scored as garbage), a declared body within ``max_body_bytes`` (413), a well-formed ``x-request-timeout-ms`` if any (400),
  and not the first request past its connection's ``max_pipeline_depth`` (429 and the connection
  closed, RFC 6585 section 4; see :mod:`course_lib.serving.server._protocols`);
* **admission**: at most ``max_in_flight`` requests of this process are admitted at once (counted
  from the door to their last byte, across at least one event-loop pass, so requests that arrived
  together are counted together even when the app's handler never yields); one more is answered 503
  with ``Retry-After`` at once, oldest admitted first (health and stats probes are never refused);
  with ``max_queue_wait_s`` set, one is also refused while the oldest admitted request still in
  progress entered more than that long ago (a count cannot tell 1 ms requests from 10 ms ones; a
  request waiting for its client's body is not counted, so a slow uploader cannot make others shed),
  and an admitted request still waiting for its model call that long after admission is answered
  503 instead of being scored (the bound is its ``request_deadline``: requests admitted together,
  in one loop pass, are all admitted, and only the last check before the model sees their wait);
* **clients that left**: a request whose client has already closed its connection is dropped (it
  never reaches the app; the app checks again right before its model call, ``client_gone``);
* **deadlines**: ``x-request-timeout-ms: N`` (the client's own timeout) sets a deadline the app can
  read (``request_deadline``); work past it is dropped and answered 504.

While the app runs, the body is bounded in size and in time (``max_body_bytes``, ``body_timeout_s``
from the end of the headers): past either, the app's ``receive`` reports a disconnect and the client
gets 413 or 408 (``body_refusal`` tells the app which). An error answer to a body not yet read is
sent after reading and discarding the rest (up to ``max_drain_bytes``), so the client can read it
(a request refused at the head that carries ``Expect: 100-continue`` is answered at once and its
connection closed: its client sends no body until told to, RFC 9110 section 10.1.1);
error bodies are capped at ``max_error_body_bytes``; a 503 always carries ``Retry-After``. A request
still unanswered when the server's graceful shutdown ends (uvicorn cancels it, and would answer 500)
is answered 503 ``shutting_down``.

A head over ``MAX_HEADER_BYTES`` is refused 431 (one that arrived whole in a read: h11 bounds only
an incomplete head). ``DoorCounters`` counts every request once by what its client saw (the protocol
counts the requests its parser refused, which never reach the door): ``ok`` (2xx/3xx), ``shed``
(503), ``expired`` (504), ``client_errors`` (other 4xx), ``server_errors`` (other 5xx) or
``abandoned`` (the client had gone before its answer was written: an answer nobody read is not
counted as served), plus the latency of the ``ok`` answers from the door to the last byte written.
What the app may ask about its request, and the counters (``door_counters``: ``/stats``,
``/metrics``), are :mod:`course_lib.serving.server._request`.

References
----------
ASGI specification, "HTTP & WebSocket" (``http.request``, ``http.disconnect``); Starlette
documentation, "Middleware" (pure ASGI middleware); RFC 9110 sections 10.2.3 (``Retry-After``) and
15.5.14 (413), RFC 9112 sections 3.2 (Host) and 9.6 (closing while the client still sends).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from course_lib.serving.server._config import DEFAULTS, ServerConfig
from course_lib.serving.server._protocols import CONNECTION_EXTENSION, PIPELINE_OVERFLOW_EXTENSION
from course_lib.serving.server._refusals import (
    BODY_REFUSAL_EXTENSION,
    HEADERS_TOO_LARGE,
    MAX_HEADER_BYTES,
    body_refusal,
    head_bytes,
    json_answer,
    short_error_body,
)
from course_lib.serving.server._request import _CURRENT, DoorCounters, Refusal, _Exchange

#: The request header carrying the client's timeout in ms (the idea of Envoy's expected-timeout header).
DEADLINE_HEADER = b"x-request-timeout-ms"
#: GET/HEAD paths never refused by admission nor counted (health, readiness, counters...) if bodiless.
PROBE_PATHS: frozenset[str] = frozenset({"/healthz", "/readyz", "/stats", "/metrics", "/batcher"})
_HOST = re.compile(rb"^(?:[A-Za-z0-9.\-_~]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?$")
_MAX_DEADLINE_MS = 600_000.0


class Door:
    """ASGI middleware: the checks, admission control and counters of the module docstring.

    Parameters
    ----------
    app : ASGI application
    config : ServerConfig
        ``max_in_flight``, ``retry_after_s``, ``max_body_bytes``, ``max_drain_bytes``,
        ``body_timeout_s``, ``max_error_body_bytes``.

    Attributes
    ----------
    counters : DoorCounters
    """

    def __init__(self, app: Any, config: ServerConfig = DEFAULTS):
        self.app = app
        self.config = config
        self.counters = DoorCounters(max_in_flight=config.max_in_flight)
        # admitted, in progress and not waiting for its client's body: id(exchange) -> loop time admitted
        self._entered: dict[int, float] = {}

    # -- the head -------------------------------------------------------------------------------------
    def _check_head(self, scope: dict[str, Any]) -> tuple[Refusal | None, float | None]:
        depth = scope.get("extensions", {}).get(PIPELINE_OVERFLOW_EXTENSION)
        if depth is not None:
            return Refusal(
                429,
                "pipeline_too_deep",
                f"more than {depth} requests were pipelined on one connection; this connection closes "
                "and the requests sent after this one are not answered: send them again on a new connection",
            ), None
        hosts, encodings, length, timeout, transfer_encoded = [], [], None, None, False
        for name, value in scope.get("headers", ()):
            if name == b"host":
                hosts.append(value)
            elif name == b"content-encoding":
                encodings.append(value)
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                transfer_encoded = True
                encodings.extend(t for t in value.split(b",") if t.strip().lower() != b"chunked")
            elif name == DEADLINE_HEADER:
                timeout = value
        size = head_bytes(
            scope["method"], scope.get("raw_path") or b"", scope.get("query_string") or b"", scope["headers"]
        )
        if size > MAX_HEADER_BYTES:  # h11 checks only a head still incomplete after a read
            return Refusal(431, "headers_too_large", HEADERS_TOO_LARGE), None
        if len(hosts) > 1 or (not hosts and scope.get("http_version") != "1.0"):
            return Refusal(400, "bad_host", "a request must carry exactly one Host header"), None
        # both framings: two parsers may read the body differently (request smuggling)
        if transfer_encoded and length is not None:
            return Refusal(
                400, "bad_framing", "send either Content-Length or Transfer-Encoding, not both"
            ), None
        if hosts and not _HOST.match(hosts[0]):
            return Refusal(400, "bad_host", "the Host header is not a host name or address"), None
        if any(token.strip().lower() not in (b"", b"identity") for v in encodings for token in v.split(b",")):
            return Refusal(
                415,
                "unsupported_encoding",
                "send the body without Content-Encoding, and without a Transfer-Encoding other than chunked",
            ), None
        if length is not None and length.isdigit() and int(length) > self.config.max_body_bytes:
            return Refusal(
                413, "body_too_large", f"the request body exceeds {self.config.max_body_bytes} bytes"
            ), None
        deadline = None
        if timeout is not None:
            try:
                ms = float(timeout)
            except ValueError:
                ms = float("nan")
            if not 0 < ms <= _MAX_DEADLINE_MS:
                return Refusal(
                    400, "bad_timeout", f"{DEADLINE_HEADER.decode()} must be a number of ms in (0, 600000]"
                ), None
            deadline = asyncio.get_running_loop().time() + ms / 1000.0
        return None, deadline

    # -- the request ---------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        config, counters = self.config, self.counters
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        connection = scope.get("extensions", {}).get(CONNECTION_EXTENSION)
        probe = scope["method"] in ("GET", "HEAD") and scope["path"] in PROBE_PATHS
        probe = probe and not any(k in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"])
        refusal, deadline = self._check_head(scope)
        exchange = _Exchange(self, connection, deadline, loop.time() + config.body_timeout_s)
        exchange.extensions = scope.get("extensions", {})
        token = _CURRENT.set(exchange)
        try:
            if probe and refusal is None:
                return await self.app(scope, receive, send)
            counters.requests += 1
            if refusal is not None:
                # a client that waits for 100 Continue sends no body: answer now, never ask for it;
                # nor is a body read past the pipeline depth (the connection has stopped reading)
                waiting = refusal.error == "pipeline_too_deep" or any(
                    k == b"expect" and v.lower() == b"100-continue" for k, v in scope["headers"]
                )
                exchange.body_done = exchange.body_done or waiting
                await self._refuse(exchange, refusal, receive, send, close=waiting)
            elif counters.in_flight >= config.max_in_flight:
                counters.shed_at_door += 1
                shed = Refusal(503, "overloaded", f"{config.max_in_flight} requests are in progress here")
                await self._refuse(exchange, shed, receive, send)
            elif self._waited_too_long(loop.time()):
                counters.shed_at_door += 1
                shed = Refusal(
                    503, "overloaded", f"requests here have waited over {config.max_queue_wait_s:g} s"
                )
                await self._refuse(exchange, shed, receive, send)
            else:
                await self._admit(exchange, scope, receive, send)
        finally:
            _CURRENT.reset(token)
        if not probe or refusal is not None:
            self._count(exchange, time.perf_counter() - started)

    def _waited_too_long(self, now: float) -> bool:
        limit = self.config.max_queue_wait_s
        return bool(limit and self._entered and now - min(self._entered.values()) > limit)

    async def _admit(self, exchange: _Exchange, scope: dict[str, Any], receive: Any, send: Any) -> None:
        counters = self.counters
        counters.in_flight += 1
        now = asyncio.get_running_loop().time()
        self._entered[id(exchange)] = now
        exchange.admitted = True
        if self.config.max_queue_wait_s:  # the app's last check before its model call reads it
            exchange.client_deadline = exchange.deadline
            bound = now + self.config.max_queue_wait_s
            exchange.deadline = bound if exchange.deadline is None else min(exchange.deadline, bound)
        try:
            # Yield once: requests read together are admitted together. A handler that never yields
            # (a model called on the event loop) would otherwise finish each request before the next
            # is counted, the count would never pass 1, and the queue would grow unseen.
            await asyncio.sleep(0)
            if exchange.connection is not None and exchange.connection.client_gone():
                counters.abandoned_at_door += 1
                exchange.gone_at_answer = True
                return
            try:
                await self.app(
                    scope, self._receiver(exchange, receive), self._sender(exchange, receive, send)
                )
            except asyncio.CancelledError:
                # uvicorn cancels the requests still running when its graceful shutdown is over and
                # would answer them 500; a request not yet answered is refused instead, so its
                # client knows to retry elsewhere (nothing else here cancels a request's task)
                if exchange.status is not None:
                    raise
                exchange.refusal = Refusal(503, "shutting_down", "the server is stopping; retry")
            except Exception:
                gone = exchange.connection is not None and exchange.connection.client_gone()
                if exchange.refusal is None and not gone:
                    raise  # a real failure: uvicorn logs it and answers 500
                # else the app failed only because the door cut its body or its client left
            if exchange.refusal is not None and exchange.status is None:
                await self._refuse(exchange, exchange.refusal, receive, send)
        finally:
            counters.in_flight -= 1
            exchange.admitted = False
            self._entered.pop(id(exchange), None)

    def _receiver(self, exchange: _Exchange, receive: Any) -> Any:
        config = self.config

        async def bounded_receive() -> dict[str, Any]:
            if exchange.refusal is not None:
                return {"type": "http.disconnect"}
            if exchange.body_done:
                return await receive()
            if self._body_refused(exchange):
                return {"type": "http.disconnect"}
            remaining = exchange.body_deadline - asyncio.get_running_loop().time()
            # waiting for the client's body is not waiting for this server (nor a reason to shed others)
            entered = self._entered.pop(id(exchange), None)
            try:
                async with asyncio.timeout(max(remaining, 0.0)):
                    message = await receive()
            except TimeoutError:
                exchange.refusal = Refusal(
                    408, "body_timeout", f"the request body did not arrive within {config.body_timeout_s:g} s"
                )
                return {"type": "http.disconnect"}
            finally:
                if entered is not None and exchange.admitted:
                    self._entered[id(exchange)] = entered
            if self._body_refused(exchange):
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                exchange.body_bytes += len(message.get("body", b""))
                exchange.body_done = not message.get("more_body", False)
                if exchange.body_bytes > config.max_body_bytes:
                    exchange.refusal = Refusal(
                        413, "body_too_large", f"the request body exceeds {config.max_body_bytes} bytes"
                    )
                    return {"type": "http.disconnect"}
            else:
                exchange.body_done = True
            return message

        return bounded_receive

    def _sender(self, exchange: _Exchange, receive: Any, send: Any) -> Any:
        config = self.config

        async def checked_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                queue_bound = config.max_queue_wait_s and exchange.deadline != exchange.client_deadline
                if status == 504 and queue_bound and exchange.refusal is None:
                    # the queue-wait bound passed, not the client's deadline: overload, refused 503
                    self.counters.shed_at_door += 1
                    exchange.refusal = Refusal(
                        503, "overloaded", f"this request waited over {config.max_queue_wait_s:g} s here"
                    )
                    return None  # the door answers instead (see _admit)
                if exchange.refusal is not None and status != exchange.refusal.status:
                    return  # the door answers instead (see _admit)
                headers = list(message.get("headers", ()))
                if BODY_REFUSAL_EXTENSION in exchange.extensions or (  # the parser gave up on the body
                    status >= 400 and not exchange.body_done and not await self._drain(exchange, receive)
                ):
                    headers.append((b"connection", b"close"))
                if status == 503 and not any(k.lower() == b"retry-after" for k, _ in headers):
                    headers.append((b"retry-after", str(config.retry_after_s).encode()))
                length = next((v for k, v in headers if k.lower() == b"content-length"), b"")
                if status >= 400 and (not length.isdigit() or int(length) > config.max_error_body_bytes):
                    exchange.replace_body = True
                    body = short_error_body(status, self.config.max_error_body_bytes)
                    headers = [
                        (k, v)
                        for k, v in headers
                        if k.lower() not in (b"content-length", b"transfer-encoding")
                    ]
                    headers.append((b"content-length", str(len(body)).encode()))
                exchange.status = status
                return await send({**message, "headers": headers})
            if exchange.status is None or exchange.complete:
                return None
            final = not message.get("more_body", False)
            if final:
                exchange.complete = True
                exchange.gone_at_answer = (
                    exchange.connection is not None and exchange.connection.client_gone()
                )
            if exchange.replace_body:
                if final:
                    await send(
                        {
                            "type": "http.response.body",
                            "body": short_error_body(exchange.status, self.config.max_error_body_bytes),
                        }
                    )
                return None
            return await send(message)

        return checked_send

    def _body_refused(self, exchange: _Exchange) -> bool:
        """True (and ``exchange.refusal`` set) once the parser has refused the body the app is reading."""
        why = exchange.extensions.get(BODY_REFUSAL_EXTENSION)
        if why is None:
            return False
        exchange.body_done = True  # nothing more is read from this connection
        exchange.refusal = body_refusal(why)
        return True

    async def _drain(self, exchange: _Exchange, receive: Any) -> bool:
        """Read and discard the rest of the body (bounded); True if it all arrived."""
        loop = asyncio.get_running_loop()
        drained = exchange.body_bytes
        while not exchange.body_done and drained <= self.config.max_drain_bytes:
            remaining = exchange.body_deadline - loop.time()
            if remaining <= 0 or BODY_REFUSAL_EXTENSION in exchange.extensions:
                return False
            try:
                async with asyncio.timeout(remaining):
                    message = await receive()
            except TimeoutError:
                return False
            if message["type"] != "http.request":
                return False
            drained += len(message.get("body", b""))
            exchange.body_done = not message.get("more_body", False)
        return exchange.body_done

    async def _refuse(
        self, exchange: _Exchange, refusal: Refusal, receive: Any, send: Any, *, close: bool = False
    ) -> None:
        config = self.config
        exchange.body_done = exchange.body_done or refusal.status == 503
        drained = exchange.body_done or refusal.status in (408, 503) or await self._drain(exchange, receive)
        retry = config.retry_after_s if refusal.status == 503 else None
        close = close or not drained or refusal.status in (400, 431)
        start, body = json_answer(refusal, close=close, retry_after_s=retry)
        exchange.status = refusal.status
        exchange.gone_at_answer = exchange.connection is not None and exchange.connection.client_gone()
        exchange.complete = True
        await send(start)
        await send(body)

    def _count(self, exchange: _Exchange, seconds: float) -> None:
        counters, status = self.counters, exchange.status
        gone = exchange.connection is not None and exchange.connection.client_gone()
        if exchange.gone_at_answer or status == 499 or (not exchange.complete and gone):
            counters.abandoned += 1
        elif status is None or not exchange.complete:
            counters.server_errors += 1  # the app failed to answer; uvicorn answered 500 or closed
        elif status == 503:
            counters.shed += 1
        elif status == 504:
            counters.expired += 1
        elif status >= 500:
            counters.server_errors += 1
        elif status >= 400:
            counters.client_errors += 1
        else:
            counters.ok += 1
            counters._observe_ok(seconds)
