"""The churn pipeline behind FastAPI: ``POST /score``, ``GET /healthz`` (readiness) and ``GET /stats``.

``create_app(service)`` is the app factory. It reads the request body (``read_json_body``), runs the
pipeline's stages (``course_lib.serving.service._pipeline.ChurnService.handle_async``) and answers with the
stages in a ``Server-Timing`` header. What it does whatever the client does:

* a body is read within ``body_timeout_s`` (408 otherwise) and up to ``MAX_BODY_BYTES`` (413);
* ``Content-Type`` must be ``application/json`` or any ``application/<type>+json`` (as FastAPI's
  own JSON detection, and RFC 6839's structured ``+json`` suffix), else 415;
* a client that disconnects (mid-upload or while its request waits) cancels its request: the work
  stops, nothing more reaches the model, and ``GET /stats`` counts it in ``client_disconnects``; so
  does a client found gone after its body was read, before any model call;
* a request whose deadline (the runtime's ``x-request-timeout-ms``) has passed is answered 504 and
  never reaches the model (``deadline_expired``); an async model call (a batcher) is cancelled at it;
* an unexpected failure is a 500 with a short reason; the exception goes to the server log, never to
  the client. Error bodies never echo what the client sent beyond a shortened name of a bad JSON key;
* no redirects: ``/score/`` is a 404, never a redirect built from the client's ``Host`` header.

``GET /stats`` also holds ``outcomes``: what the clients saw, counted by the runtime's door
(``course_lib.serving.server.DoorCounters``: ok, shed, expired, client and server errors,
abandoned), when the app runs behind it.

References
----------
FastAPI documentation, "Request body" (JSON detection); RFC 6839 section 3.1 (``+json``);
ASGI specification, HTTP ``http.disconnect`` event; Starlette ``Router(redirect_slashes=...)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from course_lib.serving.server import (
    DEFAULTS,
    body_refusal,
    client_gone,
    door_counters,
    request_deadline,
)
from course_lib.serving.service._answers import (
    AppCounters,
    ClientGoneError,
    DeadlineExceededError,
    error_answer,
)
from course_lib.serving.service._pipeline import (
    MAX_BODY_BYTES,
    MAX_DRAIN_BYTES,
    AsyncForward,
    ChurnService,
    RequestError,
)

T = TypeVar("T")
#: What an app runs once the request's body is read: body -> its answer.
Work = Callable[[bytes], Awaitable[Response]]


def is_json_content_type(value: str) -> bool:
    """True for ``application/json`` and ``application/<anything>+json``, parameters ignored."""
    media = value.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or (subtype.endswith("+json") and len(subtype) > 5))


async def read_json_body(request: Request, *, body_timeout_s: float = DEFAULTS.body_timeout_s) -> bytes:
    """The request body, or a ``RequestError``; a refused body is read and discarded (up to
    ``MAX_DRAIN_BYTES``) so that the client receives the 4xx instead of a reset connection.

    Raises
    ------
    RequestError
        413 over ``MAX_BODY_BYTES``; 415 for a content type that is not JSON; 408 if the body has not
        arrived within ``body_timeout_s``.
    ClientGoneError
        If the client disconnected before the body was complete.
    """
    refusal: RequestError | None = None
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        refusal = RequestError(
            413, "body_too_large", f"request body is {declared} bytes; the limit is {MAX_BODY_BYTES} bytes"
        )
    elif not is_json_content_type(request.headers.get("content-type", "")):
        refusal = RequestError(
            415,
            "unsupported_media_type",
            "Content-Type must be application/json (or application/<type>+json)",
        )
    chunks, size = [], 0
    try:
        async with asyncio.timeout(body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_DRAIN_BYTES:
                    break  # give up reading: the connection will be closed after the answer
                if refusal is None and size > MAX_BODY_BYTES:
                    refusal = RequestError(
                        413, "body_too_large", f"request body exceeds the limit of {MAX_BODY_BYTES} bytes"
                    )
                if refusal is None:
                    chunks.append(chunk)
    except TimeoutError:
        raise RequestError(
            408, "body_timeout", f"the request body did not arrive within {body_timeout_s:g} s"
        ) from None
    except ClientDisconnect:
        cut = body_refusal()  # the runtime's door cut the body: too large or too slow
        if cut is None:
            raise ClientGoneError() from None
        raise RequestError(cut.status, cut.error, cut.message) from None
    if refusal is not None:
        raise refusal
    return b"".join(chunks)


def check_still_wanted() -> None:
    """Raise if the current request's client has gone or its deadline has passed: the last check
    before the model (the runtime's door answers; outside it nothing is ever raised).

    Raises
    ------
    ClientGoneError, DeadlineExceededError
    """
    if client_gone():
        raise ClientGoneError()
    deadline = request_deadline()
    if deadline is not None and asyncio.get_running_loop().time() >= deadline:
        raise DeadlineExceededError()


async def _disconnected(request: Request) -> None:
    """Return when the client has gone (the ASGI server sends ``http.disconnect``)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` (after the body has been read), cancelling it if the client disconnects first.

    Raises
    ------
    ClientGoneError
        If the client went away; ``work`` was cancelled (a batcher drops the request from its queue).
    DeadlineExceededError
        If the request's deadline (``course_lib.serving.server.request_deadline``) passed first;
        ``work`` was cancelled the same way.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    deadline = request_deadline()
    timeout_s = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
    try:
        await asyncio.wait({task, watcher}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if not watcher.done():
            raise DeadlineExceededError()
        raise ClientGoneError()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def answer_request(
    request: Request,
    work: Work,
    counters: AppCounters,
    *,
    body_timeout_s: float = DEFAULTS.body_timeout_s,
    cancellable: bool = True,
) -> Response:
    """Read the body, run ``work(body)`` and answer; every failure becomes its answer (``error_answer``).

    Parameters
    ----------
    request : starlette.requests.Request
    work : async callable, body bytes -> Response
        The endpoint's work once the body is read (its model stage runs ``check_still_wanted`` first).
    counters : AppCounters
        Incremented for a disconnect, a deadline, a body timeout or an internal error.
    body_timeout_s : float
        Longest wait for the request body (408 after it).
    cancellable : bool
        True: ``work`` is cancelled when the client disconnects or the deadline passes
        (``cancel_on_disconnect``). False: it is awaited directly; work without a suspension point
        then runs to its end before the event loop could notice a disconnect.

    Returns
    -------
    fastapi.responses.Response
        ``work``'s answer, or the answer to its failure (the 4xx/5xx of
        ``course_lib.serving.service._answers``); nothing is raised but ``asyncio.CancelledError``.
    """
    try:
        body = await read_json_body(request, body_timeout_s=body_timeout_s)
        return await (cancel_on_disconnect(request, work(body)) if cancellable else work(body))
    except Exception as exc:  # a failing stage must not take the server down
        return error_answer(exc, counters, path=request.url.path)


def create_app(
    service: ChurnService,
    *,
    forward: AsyncForward | None = None,
    body_timeout_s: float = DEFAULTS.body_timeout_s,
) -> FastAPI:
    """The FastAPI app serving ``service`` at ``POST /score`` (plus ``GET /healthz`` and ``GET /stats``).

    Parameters
    ----------
    service : ChurnService
    forward : async callable, optional
        Replaces the model-forward stage (records -> probabilities, awaited); e.g. a dynamic
        batcher. ``app.state.service`` and ``app.state.forward`` hold both, so another endpoint
        (say ``/predict`` behind a batcher) can call ``await service.handle_async(body, forward=...)``.
    body_timeout_s : float
        Longest wait for a request body (408 after it).

    Returns
    -------
    fastapi.FastAPI
        Every answer of ``/score`` carries ``Server-Timing: parse;dur=.., lookup;dur=.., ...``.
        ``GET /healthz`` answers 200 ``{"status": "ok", "model_version": ...}`` (readiness;
        ``"degraded"``, still 200, while ``service.health()`` says so: a cache that fails open);
        ``GET /stats`` the ``AppCounters``. ``app.state.counters`` holds them; ``app.state.handle``
        is the request runner that endpoints added later share (body, disconnects, errors).
    """
    app = FastAPI(title="churn scoring", docs_url=None, redoc_url=None, openapi_url=None)
    app.router.redirect_slashes = False  # a redirect would be built from the client's Host header
    app.state.service = service
    app.state.forward = forward
    app.state.counters = counters = AppCounters()

    async def handle(request: Request, run: Work) -> Response:
        """Read the body, run ``run(body)`` until done or the client leaves, map failures to 4xx/5xx."""
        return await answer_request(request, run, counters, body_timeout_s=body_timeout_s)

    app.state.handle = handle

    async def model(records: list[dict[str, object]]) -> Any:
        """The model stage behind the last check (a synchronous forward still runs inline, no thread)."""
        check_still_wanted()
        forward = app.state.forward
        return await forward(records) if forward is not None else service.forward(records)

    async def score_body(body: bytes) -> Response:
        result = await service.handle_async(body, forward=model)
        return Response(result.body, status_code=result.status_code, headers=result.headers)

    @app.post("/score")
    async def score(request: Request) -> Response:
        return await handle(request, run=score_body)

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {**service.health(), "model_version": service.model_version}

    @app.get("/stats")
    async def stats() -> dict[str, object]:
        outcomes = door_counters()
        return {**counters.as_dict(), "outcomes": None if outcomes is None else outcomes.as_dict()}

    return app
