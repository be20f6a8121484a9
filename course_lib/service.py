"""The churn scoring request pipeline: five timed stages, in-process or behind FastAPI.

A request is the JSON body ``{"customer_id": "SC-0000042"}``. It goes through the five stages of
the source lesson's latency budget, each one real and each one timed:

1. ``transport``: the HTTP round trip outside the app (client library, loopback TCP, uvicorn's HTTP
   parsing, the ASGI framework), measured by the client as its wall time minus the server's stages;
2. ``parse``: JSON decoding and schema validation with pydantic;
3. ``lookup``: the customer's features from the feature store (indexed, un-indexed or cached);
4. ``forward``: the model (native XGBoost pipeline or ONNX Runtime);
5. ``format``: building the JSON response body.

``ChurnService.handle`` runs stages 2-5 in-process (no network); ``create_app`` serves the same
stages over HTTP and reports them in a ``Server-Timing`` header; ``ChurnClient`` adds the
transport stage on the client side. Bad requests are answered with a 4xx whose JSON body says why
(400 bad JSON, 404 unknown customer, 413 body too large, 415 not JSON, 422 wrong or missing fields).

References
----------
MLOps course lesson 19, "Inference Engineering Basics" (source 000): the five-stage budget table.
W3C, "Server Timing" (the response header). FastAPI and pydantic documentation.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
import pandas as pd
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from course_lib.data import FEATURE_COLUMNS
from course_lib.profiling import RequestProfile, parse_server_timing

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DRAIN_BYTES",
    "SERVER_STAGES",
    "STAGES",
    "ChurnClient",
    "ChurnService",
    "RequestError",
    "ScoreRequest",
    "ServiceResponse",
    "create_app",
    "native_forward",
    "onnx_forward",
    "read_json_body",
]

#: The five stages, in request order.
STAGES: tuple[str, ...] = ("transport", "parse", "lookup", "forward", "format")
#: The stages the server times itself (and reports in ``Server-Timing``).
SERVER_STAGES: tuple[str, ...] = STAGES[1:]
#: Largest request body accepted; a body of one customer id is ~30 bytes.
MAX_BODY_BYTES = 16_384
#: A refused body is still read (and thrown away) up to this size, so the client gets its 413.
MAX_DRAIN_BYTES = 8 * 1024 * 1024

Lookup = Callable[[str], "dict[str, object] | None"]
Forward = Callable[[list[dict[str, object]]], np.ndarray]
AsyncForward = Callable[[list[dict[str, object]]], Awaitable[np.ndarray]]


class ScoreRequest(BaseModel):
    """The request schema: one customer id such as ``SC-0000042`` and nothing else (strict types)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    customer_id: Annotated[str, StringConstraints(pattern=r"^SC-[0-9]{7,9}$", max_length=12)]


class RequestError(Exception):
    """A request the service must refuse, with the HTTP status and a message that says why.

    Parameters
    ----------
    status_code : int
        A 4xx status (5xx for failures of the service itself).
    error : str
        Short machine-readable kind, e.g. ``"not_found"``.
    message : str
        Human-readable reason.
    details : list of dict, optional
        Per-field problems (from pydantic), each with ``loc``, ``msg`` and ``type``.
    """

    def __init__(
        self, status_code: int, error: str, message: str, details: list[dict[str, object]] | None = None
    ):
        super().__init__(message)
        self.status_code = status_code
        self.error = error
        self.message = message
        self.details = details or []

    def body(self) -> bytes:
        """The JSON error body: ``{"error": ..., "message": ..., "details": [...]}``."""
        return json.dumps({"error": self.error, "message": self.message, "details": self.details}).encode()


def _validation_details(exc: ValidationError) -> list[dict[str, object]]:
    return [
        {"loc": ".".join(map(str, e["loc"])) or "body", "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False)
    ]


def native_forward(pipeline: object) -> Forward:
    """Model-forward stage with the native scikit-learn + XGBoost pipeline.

    Parameters
    ----------
    pipeline : fitted sklearn Pipeline (``ChurnModel.pipeline``).

    Returns
    -------
    callable
        records (list of n feature dicts) -> churn probabilities, float array of shape (n,). Each
        call builds a DataFrame of the records: that and the pipeline's per-call overhead is what a
        Python-native model costs per request.

    Raises
    ------
    TypeError
        If ``pipeline`` has no ``predict_proba``.
    """
    if not hasattr(pipeline, "predict_proba"):
        raise TypeError(f"pipeline must have predict_proba, got {type(pipeline).__name__}")
    columns = list(FEATURE_COLUMNS)

    def forward(records: list[dict[str, object]]) -> np.ndarray:
        frame = pd.DataFrame.from_records(records, columns=columns)
        return pipeline.predict_proba(frame)[:, 1]

    return forward


def onnx_forward(scorer: object) -> Forward:
    """Model-forward stage with ONNX Runtime: ``scorer.run(scorer.feeds_from_records(records))``.

    Parameters
    ----------
    scorer : course_lib.export.OnnxChurnScorer

    Returns
    -------
    callable
        records (list of n feature dicts) -> churn probabilities, float32 array of shape (n,).
        A malformed record raises ``ValueError`` from ``feeds_from_records``.

    Raises
    ------
    TypeError
        If ``scorer`` has no ``feeds_from_records``.
    """
    if not hasattr(scorer, "feeds_from_records"):
        raise TypeError(f"scorer must be an OnnxChurnScorer, got {type(scorer).__name__}")

    def forward(records: list[dict[str, object]]) -> np.ndarray:
        return scorer.run(scorer.feeds_from_records(records))

    return forward


@dataclass
class ServiceResponse:
    """What the service answers: status, JSON body and the profile of the stages that ran."""

    status_code: int
    body: bytes
    profile: RequestProfile = field(default_factory=RequestProfile)

    @property
    def headers(self) -> dict[str, str]:
        """``content-type`` and ``server-timing`` (the stages as ``name;dur=ms``)."""
        return {"content-type": "application/json", "server-timing": self.profile.server_timing()}

    def json(self) -> dict[str, object]:
        """The body decoded."""
        return json.loads(self.body)


class ChurnService:
    """The scoring pipeline's stages, shared by the in-process path and the HTTP app.

    Parameters
    ----------
    lookup : callable
        customer_id -> feature dict or ``None`` (``course_lib.feature_store.make_lookup``).
    forward : callable
        records -> probabilities, shape (n,) (``native_forward`` or ``onnx_forward``).
    model_version : str
        Echoed in every answer, so a caller knows which model scored it.
    lookup_mode, runtime : str
        Labels echoed in the answer (e.g. ``"indexed"``, ``"onnx"``).
    """

    def __init__(
        self,
        lookup: Lookup,
        forward: Forward,
        *,
        model_version: str,
        lookup_mode: str = "",
        runtime: str = "",
    ):
        if not callable(lookup) or not callable(forward):
            raise TypeError("lookup and forward must both be callables")
        self.lookup_features = lookup
        self.forward = forward
        self.model_version = model_version
        self.lookup_mode = lookup_mode
        self.runtime = runtime

    # -- stages -------------------------------------------------------------------------------
    def parse(self, body: bytes) -> ScoreRequest:
        """Stage 2: decode and validate the JSON body.

        Raises
        ------
        RequestError
            413 if the body is over ``MAX_BODY_BYTES``; 400 if it is not JSON (or not UTF-8);
            422 for a body that is JSON but not ``{"customer_id": "SC-<7 to 9 digits>"}``.
        """
        if len(body) > MAX_BODY_BYTES:
            raise RequestError(
                413,
                "body_too_large",
                f"request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES} bytes",
            )
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RequestError(400, "bad_json", f"request body is not valid JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise RequestError(
                422,
                "invalid_request",
                f'request body must be a JSON object like {{"customer_id": "SC-0000042"}}, '
                f"got a JSON {type(payload).__name__}",
            )
        try:
            return ScoreRequest.model_validate(payload)
        except ValidationError as exc:
            details = _validation_details(exc)
            summary = "; ".join(f"{d['loc']}: {d['msg']}" for d in details)
            raise RequestError(
                422, "invalid_request", f"request does not match the schema: {summary}", details
            ) from None

    def lookup(self, request: ScoreRequest) -> dict[str, object]:
        """Stage 3: the customer's features.

        Raises
        ------
        RequestError
            404 if the customer id is not in the feature store.
        """
        record = self.lookup_features(request.customer_id)
        if record is None:
            raise RequestError(
                404, "not_found", f"customer_id {request.customer_id!r} is not in the feature store"
            )
        return record

    def format(self, request: ScoreRequest, churn_probability: float) -> bytes:
        """Stage 5: the JSON answer ``{"customer_id", "churn_probability", "model_version", ...}``.

        Raises
        ------
        RequestError
            500 if the model returned a probability outside [0, 1] or NaN (never sent on silently).
        """
        p = float(churn_probability)
        if not (math.isfinite(p) and 0.0 <= p <= 1.0):
            raise RequestError(500, "model_error", f"model returned churn probability {p!r}, outside [0, 1]")
        return json.dumps(
            {
                "customer_id": request.customer_id,
                "churn_probability": round(p, 6),
                "model_version": self.model_version,
                "runtime": self.runtime,
                "lookup": self.lookup_mode,
            }
        ).encode()

    # -- whole requests -----------------------------------------------------------------------
    def handle(self, body: bytes, *, request_id: str = "") -> ServiceResponse:
        """Run stages 2-5 in-process on a raw request body (no network, no event loop).

        Returns
        -------
        ServiceResponse
            200 with the score, or the 4xx/5xx of the first stage that refused; the profile holds
            every stage that ran, in ms.
        """
        # With the synchronous forward, handle_async never suspends: one send() runs it to the end.
        coro = self.handle_async(body, request_id=request_id)
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        coro.close()
        raise RuntimeError("handle_async suspended without an async forward; use it from an event loop")

    def timed_score(self, customer_id: str) -> RequestProfile:
        """Score one customer in-process and return the stage profile (for ``profile_requests``).

        Raises
        ------
        RequestError
            If the answer is not 200 (a refused request is not a latency sample).
        """
        result = self.handle(json.dumps({"customer_id": customer_id}).encode(), request_id=customer_id)
        if result.status_code != 200:
            raise RequestError(result.status_code, "request_failed", result.body.decode(errors="replace"))
        return result.profile

    async def handle_async(
        self, body: bytes, *, forward: AsyncForward | None = None, request_id: str = ""
    ) -> ServiceResponse:
        """``handle`` for an event loop: the same stages, with an awaitable model-forward step.

        Parameters
        ----------
        forward : async callable, optional
            records -> probabilities, awaited in the ``forward`` stage (e.g. a dynamic batcher's
            submit). Default: ``self.forward`` called directly.
        """
        profile = RequestProfile(request_id)
        try:
            with profile.stage("parse"):
                request = self.parse(body)
            with profile.stage("lookup"):
                record = self.lookup(request)
            with profile.stage("forward"):
                p = (await forward([record]))[0] if forward is not None else self.forward([record])[0]
            with profile.stage("format"):
                out = self.format(request, p)
        except RequestError as err:
            return ServiceResponse(err.status_code, err.body(), profile)
        return ServiceResponse(200, out, profile)


async def read_json_body(request: Request) -> bytes:
    """The request body, or a ``RequestError`` (415 for a non-JSON content type, 413 over
    ``MAX_BODY_BYTES``); a refused body is read and discarded (up to
    ``MAX_DRAIN_BYTES``) so the client receives the 4xx instead of a reset connection."""
    refusal: RequestError | None = None
    declared = request.headers.get("content-length", "")
    content_type = request.headers.get("content-type", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        refusal = RequestError(
            413,
            "body_too_large",
            f"request body is {declared} bytes; the limit is {MAX_BODY_BYTES} bytes",
        )
    elif content_type.split(";")[0].strip().lower() != "application/json":
        refusal = RequestError(
            415, "unsupported_media_type", f"Content-Type must be application/json, got {content_type!r}"
        )
    chunks, size = [], 0
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
    if refusal is not None:
        raise refusal
    return b"".join(chunks)


def create_app(service: ChurnService, *, forward: AsyncForward | None = None) -> FastAPI:
    """The FastAPI app serving ``service`` at ``POST /score`` (plus ``GET /healthz``).

    Parameters
    ----------
    service : ChurnService
    forward : async callable, optional
        Replaces the model-forward stage (records -> probabilities, awaited); e.g. a dynamic
        batcher. ``app.state.service`` and ``app.state.forward`` hold both, so another endpoint
        (say ``/predict`` behind a batcher) can call ``await service.handle_async(body, forward=...)``.

    Returns
    -------
    fastapi.FastAPI
        Every answer of ``/score`` carries ``Server-Timing: parse;dur=.., lookup;dur=.., ...``.
        Bodies over ``MAX_BODY_BYTES`` are refused with 413 (and discarded, not stored); a
        ``Content-Type`` other than ``application/json`` gets 415; an unexpected exception in a
        stage gets a 500 that names it, and the server keeps serving.
    """
    app = FastAPI(title="churn scoring", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    app.state.forward = forward

    def refuse(err: RequestError) -> Response:
        return Response(err.body(), status_code=err.status_code, media_type="application/json")

    @app.post("/score")
    async def score(request: Request) -> Response:
        try:
            body = await read_json_body(request)
        except RequestError as err:
            response = refuse(err)
            response.headers["connection"] = "close"
            return response
        try:
            result = await service.handle_async(body, forward=app.state.forward)
        except Exception as exc:  # a failing stage must not take the server down
            return refuse(RequestError(500, "internal_error", f"{type(exc).__name__}: {exc}"))
        return Response(result.body, status_code=result.status_code, headers=result.headers)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "model_version": service.model_version}

    return app


class ChurnClient:
    """An HTTP client for ``POST /score`` that adds the ``transport`` stage to the server's profile.

    Parameters
    ----------
    base_url : str
        E.g. ``http://127.0.0.1:8123`` (from ``course_lib.server.serve_in_thread``).
    timeout_s : float
        Per-request timeout; a hung server fails the call instead of hanging the lesson.

    Notes
    -----
    ``transport`` = the client's wall time around the POST minus the stages the server reports,
    i.e. everything outside the app: the client library, loopback TCP, uvicorn's HTTP parsing,
    the ASGI framework and the copy of the answer back.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 10.0):
        import httpx

        self._http = httpx.Client(base_url=base_url, timeout=timeout_s)

    def post(self, body: bytes, *, content_type: str = "application/json") -> object:
        """POST raw bytes to ``/score``; returns the ``httpx.Response`` (for malformed-request tests)."""
        return self._http.post("/score", content=body, headers={"content-type": content_type})

    def score(self, customer_id: str, *, request_id: str = "") -> tuple[object, RequestProfile]:
        """Score one customer over HTTP and profile all five stages.

        Returns
        -------
        (httpx.Response, RequestProfile)
            The profile holds ``transport`` then the server's stages from ``Server-Timing``.

        Raises
        ------
        ValueError
            If the answer lacks a ``Server-Timing`` header or its stages exceed the client's wall
            time (a clock problem, never expected).
        """
        body = json.dumps({"customer_id": customer_id}).encode()
        start = time.perf_counter_ns()
        response = self._http.post("/score", content=body, headers={"content-type": "application/json"})
        wall_ms = (time.perf_counter_ns() - start) / 1e6
        header = response.headers.get("server-timing")
        if header is None:
            raise ValueError(f"response {response.status_code} has no Server-Timing header")
        server_ms = parse_server_timing(header)
        transport_ms = wall_ms - sum(server_ms.values())
        if transport_ms < 0:
            raise ValueError(
                f"server stages ({server_ms}) add up to more than the wall time {wall_ms:.3f} ms"
            )
        return response, RequestProfile(request_id or customer_id, {"transport": transport_ms, **server_ms})

    def timed_score(self, customer_id: str) -> RequestProfile:
        """``score`` that returns only the five-stage profile, raising ``RequestError`` unless 200."""
        response, profile = self.score(customer_id)
        if response.status_code != 200:
            raise RequestError(response.status_code, "request_failed", response.text)
        return profile

    def close(self) -> None:
        """Close the keep-alive connection."""
        self._http.close()

    def __enter__(self) -> ChurnClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
