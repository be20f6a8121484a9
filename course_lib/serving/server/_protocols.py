"""uvicorn's two HTTP/1.1 protocols (h11 and httptools) with the same guards against abusive connections.

One concept: what a connection may cost the server. :func:`guarded_protocol` subclasses uvicorn's own
protocol class (``H11Protocol`` or ``HttpToolsProtocol``) and adds, identically for both:

* a **header read timeout**: a connection must deliver a request's complete headers within
  ``header_timeout_s`` of connecting (or of the previous answer), else it is closed (slowloris: uvicorn
  alone waits forever for headers);
* a **header size limit**, :data:`MAX_HEADER_BYTES`, so headers streamed quickly cannot fill memory:
  httptools counts them as it parses, h11 bounds a head still incomplete after a read
  (``h11_max_incomplete_event_size``), and the door refuses a complete head over the limit that
  arrived in one read (h11 parses it whole); all three answer 431 with a JSON error body;
* a **connection limit**: at most ``max_connections`` connections stay open; a new one beyond that
  closes the longest-open *idle* one (no request in flight: a slowloris, an idle keep-alive socket; not
  one already closing), or itself if every connection is busy, so idle sockets cannot use up the
  open-file limit;
* **no request lost to an idle timer**: uvicorn closes a connection idle for ``timeout_keep_alive``
  (and the header timeout closes one idle for ``header_timeout_s``); a request whose bytes reached the
  kernel just before, not yet read by a busy loop, would be dropped with a reset and never answered
  (the client sees its kept-alive connection fail). A timer that finds such bytes waiting (a poll,
  ``course_lib.core._sockets``) gives them ``IN_TIME_GRACE_S`` to be read, once per idle spell; one
  that finds none sends the end of stream at once (unless an answer is still being sent to a slow
  reader), not a loop pass later when the transport closes the socket, so a client that checks
  before reusing the connection (the course's ``WireClient``, urllib3) sees it. What remains (bytes
  written in the microseconds between the poll and the end of stream) is the client's to avoid, by an
  idle limit below the server's keep-alive (RFC 9112 section 9.3.1: a kept-alive connection may close
  at any time). Measured with 100 clients each sending exactly at a 1 s keep-alive, 1,500 requests
  (December 2026, 2 cores): 222 lost without these checks, 1-3 with the server's and the client's;
  none once the client's idle limit is below the keep-alive;
* a **bounded pipeline**: uvicorn resumes reading a connection whenever the app asks for body bytes,
  so a client that pipelines requests without reading answers makes it buffer without bound (h11 keeps
  them as bytes, httptools as parsed request objects). Reading pauses while more than
  ``PIPELINE_BUFFER_BYTES`` (h11) or ``max_pipeline_depth`` requests (httptools) wait; httptools parses
  a whole read (up to 256 KiB) at once, so requests past the depth in that read are not queued: the
  first of them is marked (``scope["extensions"]["course.pipeline_overflow"]``, the depth) and the
  runtime's door answers it 429 ``pipeline_too_deep`` with ``Connection: close`` after the queued
  ones, and the requests after it are not answered (RFC 9112 section 9.3.2: a client retries
  unanswered pipelined requests on a new connection; section 9.6: none are read after a close);
* **answers in order**: a request the httptools parser refuses (malformed, headers too large) is
  answered 400 and the connection closed only after the answers owed to the requests before it on
  the connection (uvicorn alone answers it at once and closes, and those answers are lost);
* **answered and counted like the door's refusals**: such a request (either parser) never reaches the
  app, so the protocol answers it with the door's JSON error body (400 ``bad_request``, or 431
  ``headers_too_large``; uvicorn sends plain text) and counts it in the door's ``DoorCounters``: one more ``requests`` and ``client_errors`` (``abandoned`` if the client
  left before its 400 could be written), as ``/stats`` and ``/metrics`` report;
* a **connection handle** for the app: ``scope["extensions"]["course.connection"]`` is the protocol
  object, whose ``client_gone()`` says (by peeking at the socket, without reading the request) whether
  the client has closed its side, so work for a client that left can be dropped right before it
  reaches the model. An end of stream from the client counts as gone (as Go's ``net/http`` and
  nginx's 499 treat it).

References
----------
uvicorn source, ``uvicorn/protocols/http/h11_impl.py`` and ``httptools_impl.py`` (version pinned in
requirements.lock): ``FlowControl``, ``pipeline``, ``on_response_complete``. RFC 9112 section 9.3.2.
Linux ``recv(2)`` (``MSG_PEEK``, ``MSG_DONTWAIT``: 0 bytes means the peer shut down its side).
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from course_lib.core._sockets import end_stream_now, peek, readable
from course_lib.serving.server._config import DEFAULTS, ServerConfig
from course_lib.serving.server._request import DoorCounters

#: Key of the connection handle in ``scope["extensions"]``.
CONNECTION_EXTENSION = "course.connection"
#: Key in ``scope["extensions"]`` of the first request past ``max_pipeline_depth`` (value: the depth).
PIPELINE_OVERFLOW_EXTENSION = "course.pipeline_overflow"
#: Unparsed bytes (pipelined requests) an h11 connection may hold before reading pauses.
PIPELINE_BUFFER_BYTES = 65_536
#: Time a request that reached the kernel as an idle connection's timer fired gets to be read (s).
IN_TIME_GRACE_S = 1.0
#: Largest request target plus headers accepted (h11's own default for an incomplete head, 16 KiB);
#: a larger head is answered 431 (RFC 6585 section 5).
MAX_HEADER_BYTES = 16_384
#: The message of that 431.
HEADERS_TOO_LARGE = f"the request target and headers exceed {MAX_HEADER_BYTES} bytes"
#: The message of the 400 for a request the HTTP parser refuses.
NOT_HTTP = "the request is not valid HTTP/1.1, so the server cannot read it; this connection closes"


class HeadersTooLargeError(Exception):
    """Raised inside the httptools parser callbacks; the parser turns it into a 400 and a close."""


class _GuardedFlow(FlowControl):
    """uvicorn's flow control, except that reading stays paused while the connection holds too much."""

    def __init__(self, transport: asyncio.Transport, protocol: _Guard):
        super().__init__(transport)
        self._protocol = protocol

    def resume_reading(self) -> None:
        if not self._protocol._hold_reading():
            super().resume_reading()


class _Guard:
    """The guards shared by both protocol classes (mixed in before uvicorn's class)."""

    # set by guarded_protocol on the subclass
    _header_timeout_s: float = DEFAULTS.header_timeout_s
    _max_connections: int = DEFAULTS.max_connections
    _max_pipeline_depth: int = DEFAULTS.max_pipeline_depth
    # uvicorn's attributes, declared for the type checker
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    connections: set[Any]
    cycle: Any
    flow: FlowControl
    timeout_keep_alive_task: asyncio.TimerHandle | None
    app: Any
    server_state: Any

    def _guard_init(self) -> None:
        self._header_timer: asyncio.TimerHandle | None = None
        self._opened_at = 0.0
        self._eof = False
        self._overflow = False
        self._graced = False
        self._inner_app = self.app
        self.app = self._with_handle

    async def _with_handle(self, scope: Any, receive: Any, send: Any) -> None:
        scope.setdefault("extensions", {})[CONNECTION_EXTENSION] = self
        await self._inner_app(scope, receive, send)
        cycle = getattr(receive, "__self__", None)  # uvicorn's RequestResponseCycle
        if cycle is not None and not cycle.response_started and self.client_gone():
            cycle.disconnected = True  # nobody to answer: not a "returned without starting response"

    # -- what the app may ask -------------------------------------------------------------------
    def client_gone(self) -> bool:
        """True once the client closed (or reset) its side of the connection.

        Asks the kernel (``recv(MSG_PEEK | MSG_DONTWAIT)`` on the connection's own descriptor), so an
        end of stream that arrived while the event loop was busy is seen at once, not a loop pass
        later: a request whose client left during another request's model call is not scored.
        """
        if self._eof or self.transport is None or self.transport.is_closing():
            return True
        return peek(self.transport) in ("end", "reset")

    def _request_waiting(self) -> bool:
        """True when bytes the client sent (or its end of stream) wait in the kernel, not yet read by the loop."""
        if self._eof or self.transport is None or self.transport.is_closing():
            return False
        return readable(self.transport)

    def _count_parser_refusal(self, *, answered: bool) -> None:
        """Count a request the HTTP parser refused (uvicorn answers it 400 itself, outside the app) in
        the door's counters: ``client_errors`` when its 400 is written, ``abandoned`` when the client
        left before it could be."""
        app = self._inner_app
        for _ in range(8):  # the Door, or a middleware in front of it (an ASGI app's ``app``)
            counters = getattr(app, "counters", None)
            if isinstance(counters, DoorCounters):
                counters.requests += 1
                if answered:
                    counters.client_errors += 1
                else:
                    counters.abandoned += 1
                return
            app = getattr(app, "app", None)

    def _send_refusal(self, *, too_large: bool) -> None:
        """Answer a request the parser refused as the door answers the other refused heads (a JSON error
        body, ``connection: close``; uvicorn would send a plain-text 400), then close: 431 for a head over
        :data:`MAX_HEADER_BYTES` (RFC 6585 section 5), else 400."""
        status, error, message = (
            (431, "headers_too_large", HEADERS_TOO_LARGE) if too_large else (400, "bad_request", NOT_HTTP)
        )
        body = json.dumps({"error": error, "message": message, "details": []}).encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
        self.transport.write(b"".join([*head, b"connection: close\r\n\r\n", body]))
        self.transport.close()

    # -- state ------------------------------------------------------------------------------------
    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _hold_reading(self) -> bool:  # overridden per parser
        return self._overflow

    def _arm(self) -> None:
        self._disarm()
        self._graced = False
        self._header_timer = self.loop.call_later(self._header_timeout_s, self._header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._idle() and not self.transport.is_closing():
            if self._arrived_in_time():
                self._header_timer = self.loop.call_later(IN_TIME_GRACE_S, self._header_timeout)
                return
            end_stream_now(self.transport)  # the client sees it now, not a pass later
            self.transport.close()

    def _arrived_in_time(self) -> bool:
        """True once per idle spell when a request's bytes reached the kernel before a timer closed the
        connection but the loop has not read them: they get one more loop pass (:data:`IN_TIME_GRACE_S`)."""
        if self._graced or self.flow.read_paused or not self._request_waiting():
            return False
        self._graced = True
        return True

    def timeout_keep_alive_handler(self) -> None:
        # uvicorn closes a kept-alive connection idle for timeout_keep_alive; a request that reached
        # the kernel just before would be dropped with a reset, unread and unanswered
        if self._arrived_in_time():
            self.timeout_keep_alive_task = self.loop.call_later(  # cancelled once the request is read
                IN_TIME_GRACE_S, self.timeout_keep_alive_handler
            )
            return
        end_stream_now(self.transport)  # the client sees it now, not a pass later
        super().timeout_keep_alive_handler()  # type: ignore[misc]

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:  # an asyncio.Transport
        super().connection_made(transport)  # type: ignore[misc]
        self.flow = _GuardedFlow(transport, self)
        self._opened_at = self.loop.time()
        self._arm()
        if len(self.connections) > self._max_connections:
            # the longest-open idle one; not one already closing (a slow reader's answer still being
            # sent after its idle timer): closing it again frees nothing
            idle = [
                c for c in self.connections if c is not self and c._idle() and not c.transport.is_closing()
            ]
            victim = min(idle, key=lambda c: c._opened_at) if idle else self
            victim.transport.close()

    def eof_received(self) -> None:
        self._eof = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # what connection_lost does, one loop pass earlier
            self.cycle.message_event.set()
        super().eof_received()  # type: ignore[misc]  # None: asyncio closes the transport

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._eof = True
        super().connection_lost(exc)  # type: ignore[misc]


class _GuardedH11(_Guard, H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._guard_init()

    def send_400_response(self, msg: str) -> None:
        self._count_parser_refusal(answered=not self.transport.is_closing())
        # h11's "Receive buffer too long": a head still incomplete past the limit
        self._send_refusal(too_large=len(self.conn._receive_buffer) > MAX_HEADER_BYTES)

    def _hold_reading(self) -> bool:
        # h11 keeps pipelined requests as unparsed bytes (its receive buffer; no public size)
        return self._overflow or len(self.conn._receive_buffer) > PIPELINE_BUFFER_BYTES

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._idle():
            self._disarm()  # headers complete: the body timeout (the door's) takes over
        if self._hold_reading():
            self.flow.pause_reading()


class _GuardedHttpTools(_Guard, HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._guard_init()
        self._header_bytes = 0  # the request target and the complete headers, as the callbacks see them
        self._head_read_bytes = 0  # the reads that began and ended inside the head
        self._head_open = False
        self._headers_too_large = False
        self._refusal_owed = False  # a refused request waits for the answers before it

    def send_400_response(self, msg: str) -> None:
        # uvicorn writes its 400 (a request the parser refused) at once and closes: the answers still
        # owed to the requests before it on this connection would be lost. It is written after them.
        self._overflow = True  # the parser has failed: nothing more is read
        self.flow.pause_reading()
        last = self.pipeline[0][0] if self.pipeline else self.cycle
        if last is None or last.response_complete:
            self._refuse()
        elif last.keep_alive:  # else the connection closes after it, and nothing more is answered
            self._refusal_owed = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refusal_owed and not self.pipeline and self._idle():
            self._refusal_owed = False
            self._refuse()

    def _refuse(self) -> None:
        self._count_parser_refusal(answered=not self.transport.is_closing())
        if not self.transport.is_closing():
            self._send_refusal(too_large=self._headers_too_large)

    def _hold_reading(self) -> bool:
        return self._overflow or len(self.pipeline) >= self._max_pipeline_depth

    def _count_header_bytes(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            self._headers_too_large = True
            raise HeadersTooLargeError(HEADERS_TOO_LARGE)

    def data_received(self, data: bytes) -> None:
        head_open = self._head_open
        super().data_received(data)
        if head_open and self._head_open and not self._overflow:
            # a read that began and ended inside the head: httptools buffers a header value until it
            # ends, and calls no callback that could count it (78 MiB of one value in 8 s, unbounded)
            self._head_read_bytes += len(data)
            if self._head_read_bytes > MAX_HEADER_BYTES:
                self._headers_too_large = True
                self.send_400_response(HEADERS_TOO_LARGE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = self._head_read_bytes = 0
        self._head_open = True

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head_open = False
        queued = len(self.pipeline)
        super().on_headers_complete()
        if len(self.pipeline) > queued and self._overflow:
            self.pipeline.popleft()  # after the refused one: never queued, never answered
        elif len(self.pipeline) > queued and queued >= self._max_pipeline_depth:
            # the first past the depth: kept, so the door answers it 429 and the connection closes
            self._overflow = True
            self.flow.pause_reading()
            cycle = self.pipeline[0][0]  # (cycle, app)
            cycle.keep_alive = False
            scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]  # uvicorn's HTTPScope
            scope.setdefault("extensions", {})[PIPELINE_OVERFLOW_EXTENSION] = self._max_pipeline_depth
        elif self._hold_reading():
            self.flow.pause_reading()


def guarded_protocol(config: ServerConfig = DEFAULTS) -> type[asyncio.Protocol]:
    """uvicorn's protocol class for ``config.http`` with the guards of the module docstring.

    Parameters
    ----------
    config : ServerConfig
        ``http`` ("h11" or "httptools"), ``header_timeout_s``, ``max_connections``,
        ``max_pipeline_depth``.

    Returns
    -------
    A subclass of ``uvicorn.protocols.http.h11_impl.H11Protocol`` or of
    ``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``, for ``uvicorn.Config(http=...)``.
    """
    base = _GuardedH11 if config.http == "h11" else _GuardedHttpTools
    return type(
        f"Guarded{base.__name__.removeprefix('_Guarded')}Protocol",
        (base,),
        {
            "_header_timeout_s": config.header_timeout_s,
            "_max_connections": config.max_connections,
            "_max_pipeline_depth": config.max_pipeline_depth,
        },
    )
