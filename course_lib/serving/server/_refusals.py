"""What a refused request is told: the refusals of the head and of the body, and their two writers.

One concept: the vocabulary shared by the door (:mod:`course_lib.serving.server._door`, which refuses
what the app would see) and the protocol (:mod:`course_lib.serving.server._protocols`, which refuses
what the HTTP parser cannot read): the head size limit and how a head is counted against it, the
empty lines before a head, which are skipped rather than refused (:func:`skip_empty_lines`), the
refusal of a body the parser gave up on, and one JSON error body, ``{"error", "message", "details"}``,
whether it is sent through ASGI (:func:`json_answer`) or written raw to the socket
(:func:`raw_answer`, for a request that never reaches the app).

References
----------
RFC 9112 sections 2.1-2.2 and 5 (the head: request line, field lines, CRLFs); RFC 6585 section 5
(431 Request Header Fields Too Large); RFC 9110 section 15.5.1 (400).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

import h11

from course_lib.serving.server._request import DoorCounters, Refusal

#: Largest request head accepted (bytes): the request line and the field lines with their CRLFs and the
#: blank line, as written with one space after each colon (h11's own default for an incomplete head,
#: 16 KiB). A larger head is answered 431. A head cut across reads is refused when its raw bytes pass
#: the limit, so whitespace padding beyond one space can make such a head refused.
MAX_HEADER_BYTES = 16_384
#: The message of that 431.
HEADERS_TOO_LARGE = f"the request line and headers exceed {MAX_HEADER_BYTES} bytes"
#: The message of the 400 for a request the HTTP parser refuses.
NOT_HTTP = "the request is not valid HTTP/1.1, so the server cannot read it; this connection closes"
#: Key in ``scope["extensions"]`` of a request whose body the parser refused while the app reads it
#: (value: "bad_body" or "trailers_too_large"); the door answers it (:func:`body_refusal`) and counts it.
BODY_REFUSAL_EXTENSION = "course.body_refusal"
#: The empty lines (CRLF, or LF alone) a server skips before a request line (RFC 9112 section 2.2).
_EMPTY_LINES = re.compile(rb"(?:\r?\n)*")


class HeadersTooLargeError(Exception):
    """Raised inside the httptools parser callbacks; the parser fails, and the head is answered 431."""


def head_bytes(method: str, raw_path: bytes, query: bytes, headers: Iterable[tuple[bytes, bytes]]) -> int:
    """Size of a head as :data:`MAX_HEADER_BYTES` counts it (bytes).

    ``METHOD SP target SP HTTP/1.x CRLF``, then ``name: value CRLF`` per field, then the blank line;
    the target is ``raw_path`` plus ``?query`` when there is a query.
    """
    size = len(method) + len(raw_path) + (len(query) + 1 if query else 0) + 14
    return size + sum(len(name) + len(value) + 4 for name, value in headers)


def body_refusal(why: str) -> Refusal:
    """The door's answer to a body the parser refused (``why``: the :data:`BODY_REFUSAL_EXTENSION` value)."""
    if why == "trailers_too_large":
        return Refusal(
            431, "trailers_too_large", f"the body's trailer fields exceed {MAX_HEADER_BYTES} bytes"
        )
    return Refusal(400, "bad_body", "the request body is not valid HTTP/1.1 chunked encoding")


def _body(refusal: Refusal) -> bytes:
    return json.dumps({"error": refusal.error, "message": refusal.message, "details": []}).encode()


def json_answer(refusal: Refusal, *, close: bool, retry_after_s: int | None = None) -> tuple[dict, dict]:
    """The ASGI ``http.response.start`` and ``http.response.body`` messages of ``refusal``."""
    body = _body(refusal)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    if close:
        headers.append((b"connection", b"close"))
    start = {"type": "http.response.start", "status": refusal.status, "headers": headers}
    return start, {"type": "http.response.body", "body": body}


def raw_answer(refusal: Refusal, default_headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """``refusal`` as HTTP/1.1 bytes with ``connection: close``, for a protocol to write and then close.

    ``default_headers``: uvicorn's ``server_state.default_headers`` (``date``), as its own answers carry.
    """
    body = _body(refusal)
    head = [b"HTTP/1.1 %d %s\r\n" % (refusal.status, HTTPStatus(refusal.status).phrase.encode())]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
    return b"".join([*head, b"connection: close\r\n\r\n", body])


def empty_lines(data: bytes | bytearray) -> int:
    """Length in bytes of the empty lines (CRLF, or LF alone) at the start of ``data``, which precede a
    request line and are skipped (RFC 9112 section 2.2); a CR that ends them is not counted (its LF
    may come next, or it is a bare CR, which is no empty line)."""
    if data[:1] not in (b"\r", b"\n"):
        return 0  # the usual case, checked first: lstrip copies the buffer (a pipeline of requests)
    n = len(data) - len(data.lstrip(b"\r\n"))  # C speed: a flood of them is skipped at memory speed
    n -= data[n - 1 : n] == b"\r"
    if data.count(b"\r", 0, n) == data.count(b"\r\n", 0, n):
        return n
    match = _EMPTY_LINES.match(data)  # a bare CR inside the run: only the empty lines before it
    return match.end() if match else 0


def skip_empty_lines(conn: h11.Connection, flow: Any) -> bool:
    """Drop the empty lines at the start of h11 ``conn``'s receive buffer where a request line is due
    (``their_state`` IDLE) or nothing more is (MUST_CLOSE: after a request that closes the connection),
    as RFC 9112 section 2.2 says a server should and httptools does (h11 refuses them), and resume
    ``flow``'s reading if they had paused it (uvicorn's ``FlowControl``). True if a CR alone is left,
    whose LF may come next: the caller waits for more bytes before h11 parses."""
    if conn.their_state not in (h11.IDLE, h11.MUST_CLOSE):
        return False
    buffer = conn._receive_buffer
    if n := empty_lines(buffer._data):
        buffer._extract(n)  # all at once: one CRLF at a time held the loop 0.1 s a 256 KiB read
        flow.resume_reading()
    return buffer._data == b"\r"


def write_refusal(transport: Any, default_headers: Iterable[tuple[bytes, bytes]], *, too_large: bool) -> None:
    """Write the answer to a head the parser refused (:func:`refused_by_parser`), then close ``transport``."""
    transport.write(raw_answer(refused_by_parser(too_large=too_large), default_headers))
    transport.close()


def short_error_body(status: int, cap_bytes: int) -> bytes:
    """A JSON error body naming ``status``'s phrase, cut to ``cap_bytes`` (an app's error body was too long)."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return json.dumps({"error": phrase.lower().replace(" ", "_"), "message": phrase}).encode()[:cap_bytes]


def refused_by_parser(*, too_large: bool) -> Refusal:
    """A request the HTTP parser refused: 431 for a head over :data:`MAX_HEADER_BYTES`, else 400."""
    if too_large:
        return Refusal(431, "headers_too_large", HEADERS_TOO_LARGE)
    return Refusal(400, "bad_request", NOT_HTTP)


def count_parser_refusal(app: Any, *, answered: bool) -> None:
    """Count a head the parser refused (it never reaches the app) in the counters of the door ``app``
    is, or stands in front of: one more request, a client error (``abandoned`` if not ``answered``)."""
    for _ in range(8):  # the Door, or a middleware in front of it (an ASGI app's ``app``)
        if isinstance(counters := getattr(app, "counters", None), DoorCounters):
            counters.requests += 1
            counters.client_errors += answered
            counters.abandoned += not answered
            return
        app = getattr(app, "app", None)


def refuse_body(transport: Any, cycle: Any, why: str) -> None:
    """Hand the refusal of uvicorn ``cycle``'s body (``why``: the :data:`BODY_REFUSAL_EXTENSION` value)
    to the door, which reads it at the app's next ``receive`` (woken here), answers it and counts it;
    if the request was answered already, ``transport`` just closes."""
    if cycle.response_complete:
        transport.close()
        return
    cycle.scope.setdefault("extensions", {})[BODY_REFUSAL_EXTENSION] = why
    cycle.message_event.set()
