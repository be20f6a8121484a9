"""Open-loop generator targets: in-process coroutines, httpx, aiohttp, the wire client, a fresh batcher.

``course_lib.measure.loadgen.run_open_loop`` sends request ``i`` by awaiting ``send(i)``; these build such a
``send`` from what is under test. The ``*_target`` functions that return a factory (a zero-argument
async context manager yielding ``send``) give every run of a ladder (``course_lib.measure.ladder.open_loop_runs``)
a fresh client or batcher, so runs do not share a backlog.

References
----------
httpx documentation ("Async support", ``Limits``); aiohttp client documentation ("Connectors",
``TCPConnector(limit=...)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx

from course_lib.core.checks import instance_of, integer, non_empty, positive_number
from course_lib.measure.loadgen import SERVED_FIELDS, Send
from course_lib.measure.targets.wire_client import WireClient
from course_lib.serving.batching.batcher import DynamicBatcher
from course_lib.serving.service import HttpStatusError, raise_for_status

__all__ = [
    "WIRE_FIELD",
    "aiohttp_target",
    "batcher_target",
    "coroutine_target",
    "http_client_target",
    "http_target",
    "wire_target",
]


#: The field the HTTP targets record as each request's time on the wire (ms); ``wire_target`` times it as k6
#: does.
WIRE_FIELD = "wire_ms"


def _field_names(fields: Iterable[str]) -> tuple[str, ...]:
    """``fields`` as a tuple of names; a bare string (``("wire_ms")`` without its comma) is refused."""
    names: tuple[object, ...] = tuple(instance_of("fields", fields, (tuple, list, set, frozenset)))
    return tuple(instance_of("fields", n, str) for n in names)


def _raise_unless_2xx(status: int, body: bytes, retry_after: str | None) -> None:
    """Raise ``HttpStatusError`` for a non-2xx answer, naming the status and the body's start.

    For a 429 or 503 the error's ``shed`` is true: the load generator counts it as shed, not as an error.
    """
    if not 200 <= status < 300:
        raise HttpStatusError(status, body.decode("utf-8", errors="replace"), retry_after=retry_after)


def coroutine_target(
    submit: Callable[[Any], Awaitable[Any]], items: Sequence[Any], *, fields: Iterable[str] = ()
) -> Send:
    """Wrap an in-process coroutine (e.g. ``DynamicBatcher.submit``) as a load-generator target.

    Request ``i`` submits ``items[i % len(items)]``; the named fields of the result (attributes, or
    keys if it is a mapping; e.g. ``queue_wait_ms``, ``batch_size``) are recorded.

    Raises
    ------
    ValueError
        If ``items`` is empty.
    """
    non_empty("items", items)
    names = _field_names(fields)

    async def send(i: int) -> dict[str, Any]:
        result = await submit(items[i % len(items)])
        if isinstance(result, Mapping):
            return {name: result.get(name) for name in names}
        return {name: getattr(result, name) for name in names}

    return send


def http_target(client: Any, url: str, payloads: Sequence[Any], *, fields: Iterable[str] = ()) -> Send:
    """POST ``payloads[i % len(payloads)]`` as JSON to ``url`` with an ``httpx.AsyncClient``.

    A non-2xx answer raises ``course_lib.serving.service.HttpStatusError`` naming the status and the
    start of the body, so it is recorded as an error (or as shed, for 429/503) with its reason. The named
    fields of the JSON answer are recorded.

    Raises
    ------
    ValueError
        If ``payloads`` is empty.
    """
    names = _field_names(fields)

    async def post(payload: Any) -> Mapping[str, Any]:
        response = raise_for_status(await client.post(url, json=payload))
        return response.json() if names else {}

    return coroutine_target(post, payloads, fields=names)


def batcher_target(
    score_batch: Callable[[list[Any]], Sequence[Any]],
    items: Sequence[Any],
    *,
    fields: Iterable[str] = SERVED_FIELDS,
    **batcher_kwargs: Any,
) -> Callable[[], AbstractAsyncContextManager[Send]]:
    """Factory for ``course_lib.measure.ladder.open_loop_runs``: a fresh ``DynamicBatcher`` per run, in process (no HTTP).

    Parameters
    ----------
    score_batch : the batch score function.
    items : request payloads, sent round-robin.
    fields : attributes of ``BatchedResult`` to record.
    **batcher_kwargs : knobs of ``course_lib.serving.batching.batcher.DynamicBatcher``
        (``max_batch_size``, ...).
    """
    DynamicBatcher(score_batch, **batcher_kwargs)  # validate the knobs now, not mid-sweep
    names = _field_names(fields)

    @asynccontextmanager
    async def factory():
        async with DynamicBatcher(score_batch, **batcher_kwargs) as batcher:
            yield coroutine_target(batcher.submit, items, fields=names)

    return factory


def http_client_target(
    url: str, payloads: Sequence[Any], *, fields: Iterable[str] = SERVED_FIELDS, max_connections: int = 256
) -> Callable[[], AbstractAsyncContextManager[Send]]:
    """Factory for ``course_lib.measure.ladder.open_loop_runs``: a fresh ``httpx.AsyncClient`` per run, POSTing JSON to ``url``."""
    names = _field_names(fields)
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)

    @asynccontextmanager
    async def factory():
        async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
            yield http_target(client, url, payloads, fields=names)

    return factory


def aiohttp_target(
    url: str, payloads: Sequence[Any], *, fields: Iterable[str] = (), max_connections: int = 512
):
    """Factory (async context manager) yielding ``send(i)``: POST ``payloads[i % n]`` as JSON with aiohttp.

    A non-2xx answer raises ``course_lib.serving.service.HttpStatusError`` (429/503 count as shed). The named
    fields of the JSON answer are recorded. Same contract as ``http_client_target``.

    The field :data:`WIRE_FIELD` (``"wire_ms"``) is not read from the answer: it records each request's
    time from aiohttp writing its headers (``TraceConfig.on_request_headers_sent``) to the answer's body
    read in the sending task, so it also holds the event-loop turns the answer takes to reach that task;
    :func:`wire_target` (the course generator's client) stamps it where the bytes move, as k6's
    ``http_req_duration`` does.

    Raises
    ------
    ValueError
        If ``payloads`` is empty or ``max_connections`` < 1.
    """
    non_empty("payloads", payloads)
    max_connections = integer("max_connections", max_connections, min=1)
    names = _field_names(fields)
    wire = WIRE_FIELD in names
    answer_names = tuple(n for n in names if n != WIRE_FIELD)

    async def headers_sent(_session: Any, context: Any, _params: Any) -> None:
        context.trace_request_ctx["sent"] = time.perf_counter()

    import aiohttp  # noqa: PLC0415 (heavy optional dependency: the generator processes never need it)

    @asynccontextmanager
    async def factory():
        connector = aiohttp.TCPConnector(limit=max_connections, force_close=False)
        traces = [aiohttp.TraceConfig()] if wire else []
        for trace in traces:
            trace.on_request_headers_sent.append(headers_sent)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=60), trace_configs=traces or None
        ) as session:

            async def post(payload: Any) -> Mapping[str, Any]:
                marks: dict[str, float] = {}
                async with session.post(url, json=payload, trace_request_ctx=marks) as response:
                    body = await response.read()
                    done = time.perf_counter()
                    _raise_unless_2xx(response.status, body, response.headers.get("Retry-After"))
                    answer = json.loads(body) if answer_names else {}
                    if wire:
                        answer = {**answer, WIRE_FIELD: 1000.0 * (done - marks["sent"])}
                    return answer

            yield coroutine_target(post, payloads, fields=names)

    return factory


def wire_target(
    url: str,
    payloads: Sequence[Any],
    *,
    fields: Iterable[str] = (),
    max_connections: int = 512,
    open_connections: int = 0,
    open_timeout_s: float = 5.0,
) -> Callable[[], AbstractAsyncContextManager[Send]]:
    """Factory (async context manager) yielding ``send(i)``: POST ``payloads[i % n]`` as JSON with
    :class:`course_lib.measure.targets.wire_client.WireClient`. Same contract as :func:`aiohttp_target`.

    :data:`WIRE_FIELD` is stamped where the bytes move (before the write, as the answer's last byte is
    parsed), so it leaves out the event-loop turns that aiohttp's answer takes to reach its task: the
    like-for-like figure beside k6's ``http_req_duration``. Each payload is encoded once, up front.
    ``open_connections`` keep-alive connections are opened on entering, before ``send`` is yielded
    (no request sent: ``WireClient.open_connections``), so that a timed run does not pay their handshakes;
    best effort: those not open within ``open_timeout_s``, or refused, are made by the requests instead.

    Raises
    ------
    ValueError
        If ``payloads`` is empty, ``url`` is not ``http://...``, ``max_connections`` < 1,
        ``open_connections`` outside 0..``max_connections`` or ``open_timeout_s`` not > 0.
    """
    non_empty("payloads", payloads)
    integer("max_connections", max_connections, min=1)
    integer("open_connections", open_connections, min=0, max=max_connections)
    positive_number("open_timeout_s", open_timeout_s)
    names = _field_names(fields)
    wire = WIRE_FIELD in names
    answer_names = tuple(n for n in names if n != WIRE_FIELD)
    WireClient(url, max_connections=max_connections)  # validate now, not inside the run

    @asynccontextmanager
    async def factory():
        async with WireClient(url, max_connections=max_connections) as client:
            requests = [client.request_bytes(p) for p in payloads]
            if open_connections:  # best effort, bounded: a run must not wait on a server that never accepts
                with contextlib.suppress(TimeoutError, ConnectionError):
                    await asyncio.wait_for(client.open_connections(open_connections), open_timeout_s)

            async def send(i: int) -> dict[str, Any]:
                answer = await client.post(request=requests[i % len(requests)])
                _raise_unless_2xx(answer.status, answer.body, answer.headers.get("retry-after"))
                out = json.loads(answer.body) if answer_names else {}
                out = {name: out.get(name) for name in answer_names}
                if wire:
                    out[WIRE_FIELD] = answer.wire_ms
                return out

            yield send

    return factory
