"""uvicorn's two HTTP/1.1 protocols (h11 and httptools) with the same guards against abusive connections.

One concept: what a connection may cost the server. :func:`guarded_protocol` subclasses uvicorn's own
protocol class (``H11Protocol`` or ``HttpToolsProtocol``) and adds, identically for both:

* a **header read timeout**: a connection must deliver a request's complete headers within
  ``header_timeout_s`` of connecting (or of the previous answer), else it is closed (slowloris: uvicorn
  alone waits forever for headers);
* a **header size limit** (``_refusals.MAX_HEADER_BYTES``), so a head streamed quickly cannot fill
  memory: httptools counts the fields as it parses and the reads inside one head (it buffers a value
  until it ends), h11 bounds a head still incomplete after a read, and the door refuses a whole head
  over the limit that came in one read (h11 parses it whole); each answers 431;
* a **connection limit**: at most ``max_connections`` connections stay open; a new one beyond that
  closes the longest-open *idle* one (no request in flight: a slowloris, an idle keep-alive socket; not
  one already closing), or itself if every connection is busy, so idle sockets cannot use up the
  open-file limit;
* **no request lost to an idle timer**: a request whose bytes reached the kernel just before uvicorn's
  keep-alive timer (or the header timer) fired, unread by a busy loop, was dropped with a reset. A
  timer that finds bytes waiting (a poll, ``course_lib.core.sockets``) gives them ``IN_TIME_GRACE_S``
  once per idle spell; one that finds none sends the end of stream at once (unless an answer is still
  being sent), so a client that checks before reusing the connection (``WireClient``, urllib3) sees
  it. The rest is the client's to avoid, by an idle limit below the server's keep-alive (RFC 9112
  section 9.3.1). 100 clients sending exactly at a 1 s keep-alive (1,500 requests, December 2026, 2
  cores) lost 222 without these checks, 1-3 with the server's and the client's, none once the
  client's idle limit is below the keep-alive;
* a **bounded pipeline**: uvicorn resumes reading a connection whenever the app asks for body bytes,
  so a client that pipelines requests without reading answers makes it buffer without bound (h11 keeps
  them as bytes, httptools as parsed request objects). Reading pauses while more than
  ``PIPELINE_BUFFER_BYTES`` (h11) or ``max_pipeline_depth`` requests (httptools) wait; httptools parses
  a whole read (up to 256 KiB) at once, so requests past the depth in that read are not queued: the
  first of them is marked (``scope["extensions"]["course.pipeline_overflow"]``, the depth) and the
  runtime's door answers it 429 ``pipeline_too_deep`` with ``Connection: close`` after the queued
  ones, and the requests after it are not answered (RFC 9112 section 9.3.2: a client retries
  unanswered pipelined requests on a new connection; section 9.6: none are read after a close);
* **refusals in order, once, in the door's words**: a head the parser refuses (malformed: 400; too
  large: 431) is answered with the door's JSON error body after the answers owed to the requests
  before it (uvicorn alone writes plain text at once and closes, and those answers are lost), then
  the connection closes; it never reaches the app, so it is counted here in the door's
  ``DoorCounters`` (``client_errors``, or ``abandoned`` if the client left first). A body the parser
  refuses belongs to a request the door already holds: the door answers and counts it
  (``_refusals.BODY_REFUSAL_EXTENSION``). Empty lines before a request line are no refusal: both
  parsers skip them (RFC 9112 section 2.2; h11 alone refused them, ``_refusals.skip_empty_lines``);
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
import sys
from typing import Any

import h11
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from course_lib.core.sockets import end_stream_now, peek, readable
from course_lib.serving.server._config import DEFAULTS, ServerConfig
from course_lib.serving.server._refusals import (
    HEADERS_TOO_LARGE,
    MAX_HEADER_BYTES,
    HeadersTooLargeError,
    count_parser_refusal,
    refuse_body,
    skip_empty_lines,
    write_refusal,
)

#: Key of the connection handle in ``scope["extensions"]``.
CONNECTION_EXTENSION = "course.connection"
#: Key in ``scope["extensions"]`` of the first request past ``max_pipeline_depth`` (value: the depth).
PIPELINE_OVERFLOW_EXTENSION = "course.pipeline_overflow"
#: Unparsed bytes (pipelined requests) an h11 connection may hold before reading pauses.
PIPELINE_BUFFER_BYTES = 65_536
#: Time a request that reached the kernel as an idle connection's timer fired gets to be read (s).
IN_TIME_GRACE_S = 1.0


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
        self._eof = self._overflow = self._graced = False
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

    def _refuse_body(self, cycle: Any, why: str) -> None:
        """The parser refused ``cycle``'s body: nothing more is read; the door answers (``refuse_body``)."""
        self._overflow = True
        self.flow.pause_reading()
        refuse_body(self.transport, cycle, why)

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
        self._parse = self.conn.next_event  # every parse, also those inside uvicorn's own loop:
        self.conn.next_event = self._next_event  # type: ignore[method-assign]

    def send_400_response(self, msg: str) -> None:
        # called inside uvicorn's ``except h11.RemoteProtocolError``: its status hint tells a head (or
        # trailer) still incomplete past the limit, 431 ("Receive buffer too long"), from the rest
        too_large = getattr(sys.exc_info()[1], "error_status_hint", 400) == 431
        cycle = self.cycle
        if cycle is not None and cycle.more_body:
            self._refuse_body(cycle, "trailers_too_large" if too_large else "bad_body")
            return
        count_parser_refusal(self._inner_app, answered=not self.transport.is_closing())
        write_refusal(self.transport, self.server_state.default_headers, too_large=too_large)

    def _hold_reading(self) -> bool:
        # h11 keeps pipelined requests as unparsed bytes (its receive buffer; no public size)
        return self._overflow or len(self.conn._receive_buffer) > PIPELINE_BUFFER_BYTES

    def _next_event(self) -> Any:  # h11's, past the empty lines before a request line (RFC 9112 2.2)
        if skip_empty_lines(self.conn, self.flow):
            return h11.NEED_DATA  # a CR alone: its LF comes next
        return self._parse()

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
        self._framing_bytes = 0  # the reads inside the body since its last body byte
        self._body_in_read = False
        self._head_open = False
        self._in_body = False  # the parser is in the body of self.cycle (its head was handed on)
        self._messages = 0  # heads begun on this connection
        self._headers_too_large = False
        self._refusal_owed = False  # a refused request waits for the answers before it

    def send_400_response(self, msg: str) -> None:
        # uvicorn writes its 400 (a request the parser refused) at once and closes: the answers still
        # owed to the requests before it on this connection would be lost. It is written after them.
        if self._in_body:  # the body of a request already handed to the door
            self._refuse_body(self.cycle, "trailers_too_large" if self._headers_too_large else "bad_body")
            return
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
            if self.cycle.keep_alive:  # else the answer before it closed the connection: never read
                self._refuse()

    def _refuse(self) -> None:
        count_parser_refusal(self._inner_app, answered=not self.transport.is_closing())
        if not self.transport.is_closing():
            too_large = self._headers_too_large
            write_refusal(self.transport, self.server_state.default_headers, too_large=too_large)

    def _hold_reading(self) -> bool:
        return self._overflow or len(self.pipeline) >= self._max_pipeline_depth

    def _count_header_bytes(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            self._headers_too_large = True
            raise HeadersTooLargeError(HEADERS_TOO_LARGE)

    def data_received(self, data: bytes) -> None:
        # httptools buffers a header (or trailer) value until it ends, uncounted (78 MiB in 8 s): the
        # reads inside one head are counted, and those inside one body that carry no body bytes
        head_open, in_body, messages = self._head_open, self._in_body, self._messages
        self._body_in_read = False
        super().data_received(data)
        if self._overflow:
            return
        if self._head_open and (head_open or not in_body) and self._messages - messages == int(not head_open):
            # one head, from its read's start, or from its own (the empty lines before it are skipped)
            self._head_read_bytes += len(data) if head_open else len(data.lstrip(b"\r\n"))
            if self._head_read_bytes > MAX_HEADER_BYTES:
                self._headers_too_large = True
                self.send_400_response(HEADERS_TOO_LARGE)
        elif in_body and self._in_body and self._messages == messages:
            self._framing_bytes = 0 if self._body_in_read else self._framing_bytes + len(data)
            if self._framing_bytes > MAX_HEADER_BYTES:
                self._headers_too_large = True
                self.send_400_response(HEADERS_TOO_LARGE)

    def on_body(self, body: bytes) -> None:
        self._body_in_read = True
        super().on_body(body)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = self._head_read_bytes = self._framing_bytes = 0
        self._head_open, self._in_body = True, False
        self._messages += 1

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_open:
            self._count_header_bytes(len(name) + len(value) + 4)  # "name: value" CRLF
            super().on_header(name, value)
        # else a trailer field: uvicorn would append it to the request's headers, already handed to
        # the app (a trailer could pose as a header); ASGI has no request trailers, and h11's are dropped

    def on_headers_complete(self) -> None:
        self._disarm()
        # the request line's method, two spaces, "HTTP/1.1" and CRLF, and the blank line
        self._count_header_bytes(len(self.parser.get_method()) + 14)
        self._head_open = False
        queued = len(self.pipeline)
        super().on_headers_complete()
        self._in_body = True
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

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()


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
