"""The churn scoring request pipeline: five timed stages, run in-process (the app and client live beside it).

One concept, one module: the pipeline's stages and the service that times them are one request path.

A request is the JSON body ``{"customer_id": "SC-0000042"}``. It goes through the five stages of
the source lesson's latency budget, each one real and each one timed:

1. ``transport``: the HTTP round trip outside the app (client library, loopback TCP, uvicorn's HTTP
   parsing, the ASGI framework), measured by the client as its wall time minus the server's stages;
2. ``parse``: JSON decoding and schema validation with pydantic;
3. ``lookup``: the customer's features from the feature store (indexed, un-indexed or cached);
4. ``forward``: the model (native XGBoost pipeline or ONNX Runtime);
5. ``format``: building the JSON response body.

``ChurnService.handle`` runs stages 2-5 in-process (no network);
``course_lib.serving.service._app.create_app`` serves the same stages over HTTP and reports them in a
``Server-Timing`` header;
``course_lib.serving.service._client.ChurnClient`` adds the transport stage on the client side; the
model-forward adapters are ``course_lib.serving.service._forward``'s (``course_lib.serving.service``
re-exports them all). Bad requests are answered with a 4xx whose JSON body
says why (400 bad JSON or a duplicate key, 404 unknown customer, 413 body too large, 415 not JSON,
422 wrong or missing fields, or customer features outside ``course_lib.churn.schema``).

The JSON parser (``course_lib.serving.service._strict_json.decode_json``) is strict (RFC 8259):
UTF-8 only (a leading UTF-8 byte-order mark is ignored, as section 8.1 allows), no
``NaN``/``Infinity``, no key twice in one object (RFC 8259 section 4 leaves duplicates undefined, so
we refuse them), at most ``MAX_JSON_DEPTH`` nested containers and numbers of
at most ``MAX_NUMBER_DIGITS`` digits; every refusal is a 400 with the course's own short reason.

References
----------
MLOps course lesson 19, "Inference Engineering Basics" (source 000): the five-stage budget table.
W3C, "Server Timing" (the response header). FastAPI and pydantic documentation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from course_lib.churn.schema import check_records
from course_lib.core.checks import callable_, one_of
from course_lib.core.vocabulary import ANSWER_ENCODERS
from course_lib.serving.profiling import RequestProfile
from course_lib.serving.service._forward import AsyncForward, Forward, Lookup
from course_lib.serving.service._strict_json import JSONRefusedError, decode_json

#: The five stages, in request order.
STAGES: tuple[str, ...] = ("transport", "parse", "lookup", "forward", "format")
#: The stages the server times itself (and reports in ``Server-Timing``).
SERVER_STAGES: tuple[str, ...] = STAGES[1:]
#: Largest request body accepted; a body of one customer id is ~30 bytes.
MAX_BODY_BYTES = 16_384
#: A refused body is still read (and thrown away) up to this size, so the client gets its 413.
MAX_DRAIN_BYTES = 8 * 1024 * 1024
#: Deepest nesting of JSON arrays/objects accepted (a request needs 1; Python's parser recurses).
MAX_JSON_DEPTH = 32
#: Longest JSON number accepted, in characters (Python refuses integers over 4,300 digits).
MAX_NUMBER_DIGITS = 64

T = TypeVar("T")


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


#: At most this many field problems are listed in a 422, each field name cut to ``_MAX_LOC_CHARS``.
MAX_ERROR_DETAILS = 5
_MAX_LOC_CHARS = 40


def _shorten(text: str, limit: int = _MAX_LOC_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _validation_details(exc: ValidationError) -> list[dict[str, object]]:
    """The first ``MAX_ERROR_DETAILS`` problems, names shortened: a 422 never echoes a request in full."""
    return [
        {"loc": _shorten(".".join(map(str, e["loc"])) or "body"), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False)[:MAX_ERROR_DETAILS]
    ]


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


def run_without_event_loop(coro: Coroutine[object, None, T]) -> T:
    """Run a coroutine that never suspends to its end, here, in this thread, and return its result.

    ``ChurnService.handle_async`` with the synchronous forward awaits nothing that waits: every stage
    is a plain call, so its first step runs it to the end, and no event loop is needed (a lesson
    calls ``handle`` from a notebook, whose own loop is already running, so ``asyncio.run`` would
    refuse).

    Raises
    ------
    RuntimeError
        If the coroutine suspends (it awaited an async forward, which needs an event loop); it is
        closed first.

    References
    ----------
    Python documentation, "Coroutine objects" (``coroutine.send``: a coroutine that returns raises
    ``StopIteration`` carrying its value).
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError(
        "the coroutine suspended: it awaits something that needs an event loop; await it instead"
    )


def encode_answer(answer: Mapping[str, object], encoder: str = "json") -> bytes:
    """An answer's fields as JSON bytes, encoded once: ``json.dumps(...).encode()`` or ``orjson.dumps(...)``.

    Both give the same JSON value (same keys and numbers; the standard module puts a space after
    ``:`` and ``,``, orjson none).

    Raises
    ------
    ValueError
        For an ``encoder`` not in ``course_lib.core.vocabulary.ANSWER_ENCODERS``.

    References
    ----------
    orjson README (``orjson.dumps`` returns bytes).
    """
    if encoder == "json":
        return json.dumps(answer).encode()
    if encoder == "orjson":
        return orjson.dumps(answer)
    one_of("encoder", encoder, ANSWER_ENCODERS)  # raises: neither of the two
    raise AssertionError("unreachable")


class ChurnService:
    """The scoring pipeline's stages, shared by the in-process path and the HTTP app.

    Parameters
    ----------
    lookup : callable
        customer_id -> feature dict or ``None`` (``course_lib.serving.feature_store._lookup.make_lookup``).
    forward : callable
        records -> probabilities, shape (n,) (``native_forward`` or ``onnx_forward``).
    model_version : str
        Echoed in every answer, so a caller knows which model scored it.
    lookup_mode, runtime : str
        Labels echoed in the answer (e.g. ``"indexed"``, ``"onnx"``).
    encoder : {"json", "orjson"}
        How the format stage encodes the answer (``encode_answer``); the same JSON either way.

    Raises
    ------
    ValueError
        For an ``encoder`` not in ``course_lib.core.vocabulary.ANSWER_ENCODERS``.
    TypeError
        If ``lookup`` or ``forward`` is not callable.
    """

    def __init__(
        self,
        lookup: Lookup,
        forward: Forward,
        *,
        model_version: str,
        lookup_mode: str = "",
        runtime: str = "",
        encoder: str = "json",
    ):
        callable_("lookup", lookup)
        callable_("forward", forward)
        self.lookup_features = lookup
        self.forward = forward
        self.model_version = model_version
        self.lookup_mode = lookup_mode
        self.runtime = runtime
        self.encoder = one_of("encoder", encoder, ANSWER_ENCODERS)

    def health(self) -> dict[str, object]:
        """What ``GET /healthz`` reports besides the model version: ``{"status": "ok"}`` here; a
        service with a dependency that can fail (a cache) says ``"degraded"`` while it serves without it."""
        return {"status": "ok"}

    # -- stages -------------------------------------------------------------------------------
    def parse(self, body: bytes) -> ScoreRequest:
        """Stage 2: decode and validate the JSON body.

        Raises
        ------
        RequestError
            413 if the body is over ``MAX_BODY_BYTES``; 400 if ``decode_json`` refuses it;
            422 for a body that is JSON but not ``{"customer_id": "SC-<7 to 9 digits>"}``.
        """
        if len(body) > MAX_BODY_BYTES:
            raise RequestError(
                413,
                "body_too_large",
                f"request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES} bytes",
            )
        try:
            payload = decode_json(body, max_depth=MAX_JSON_DEPTH, max_number_chars=MAX_NUMBER_DIGITS)
        except JSONRefusedError as exc:
            raise RequestError(400, "bad_json", str(exc)) from None
        return self.validate(payload)

    def validate(self, payload: object) -> ScoreRequest:
        """The second half of stage 2: a decoded body checked against ``ScoreRequest``.

        Raises
        ------
        RequestError
            422 for anything but ``{"customer_id": "SC-<7 to 9 digits>"}``.
        """
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
            more = exc.error_count() - len(details)
            if more > 0:
                summary += f"; and {more} more"
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

    @staticmethod
    def check_features(record: dict[str, object]) -> None:
        """First step of stage 4: the record must fit ``course_lib.churn.schema`` before any model sees it.

        Raises
        ------
        RequestError
            422 ``invalid_features`` naming the column, the value and the allowed range. A bad
            record is refused alone: it never reaches the model, nor a batch shared with others.
        """
        try:
            check_records([record])
        except ValueError as exc:  # FeatureError, or a record with missing/extra fields
            raise RequestError(422, "invalid_features", str(exc)) from None

    def answer(self, request: ScoreRequest, churn_probability: float) -> dict[str, object]:
        """The answer's fields: ``customer_id``, ``churn_probability`` (rounded to 6 decimals),
        ``model_version``, ``runtime`` and ``lookup``, before any encoding.

        Raises
        ------
        RequestError
            500 if the model returned a probability outside [0, 1] or NaN (never sent on silently).
        """
        p = float(churn_probability)
        if not (math.isfinite(p) and 0.0 <= p <= 1.0):
            raise RequestError(500, "model_error", f"model returned churn probability {p!r}, outside [0, 1]")
        return {
            "customer_id": request.customer_id,
            "churn_probability": round(p, 6),
            "model_version": self.model_version,
            "runtime": self.runtime,
            "lookup": self.lookup_mode,
        }

    def format(self, request: ScoreRequest, churn_probability: float) -> bytes:
        """Stage 5: the JSON answer ``{"customer_id", "churn_probability", "model_version", ...}``
        (``answer`` encoded once with ``self.encoder``: ``encode_answer``).

        Raises
        ------
        RequestError
            500 if the model returned a probability outside [0, 1] or NaN (never sent on silently).
        """
        return encode_answer(self.answer(request, churn_probability), self.encoder)

    # -- whole requests -----------------------------------------------------------------------
    def handle(self, body: bytes, *, request_id: str = "") -> ServiceResponse:
        """Run stages 2-5 in-process on a raw request body (no network, no event loop).

        Returns
        -------
        ServiceResponse
            200 with the score, or the 4xx/5xx of the first stage that refused; the profile holds
            every stage that ran, in ms.

        Notes
        -----
        The stages are written once, in :meth:`handle_async`; here they run with ``self.forward``
        called directly, through :func:`run_without_event_loop`. A subclass that changes the stages
        (``course_lib.serving.cache.service.CachedChurnService``) overrides ``handle_async`` alone.
        """
        return run_without_event_loop(self.handle_async(body, request_id=request_id))

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

        Notes
        -----
        The timing is :func:`course_lib.serving.profiling.core.time_stages` (read ``perf_counter_ns``
        around each stage, keep the differences in order) plus what a server needs: the forward stage
        may be awaited (a batcher), the record is checked against the schema inside ``forward``, a
        refused request still answers with the stages that ran (a 4xx carries its ``Server-Timing``),
        and ``RequestProfile`` holds the times in ms and refuses a stage timed twice.
        """
        profile = RequestProfile(request_id)
        try:
            with profile.stage("parse"):
                request = self.parse(body)
            with profile.stage("lookup"):
                record = self.lookup(request)
            with profile.stage("forward"):
                self.check_features(record)
                p = (await forward([record]))[0] if forward is not None else self.forward([record])[0]
            with profile.stage("format"):
                out = self.format(request, p)
        except RequestError as err:
            return ServiceResponse(err.status_code, err.body(), profile)
        return ServiceResponse(200, out, profile)
