"""The churn scoring service: request stages, the FastAPI app, the HTTP client, strict JSON decoding.

Its private modules; this package re-exports their public names:

* ``course_lib.serving.service._pipeline``: the request's stages (parse, lookup, forward, format), run
  in-process by ``ChurnService``, and ``encode_answer``, the one answer encoder (``json`` or ``orjson``).
* ``course_lib.serving.service._forward``: the model-forward adapters ``native_forward`` /
  ``onnx_forward`` and the stage types (``Forward``, ``AsyncForward``, ``Lookup``, ``Record``).
* ``course_lib.serving.service._answers``: ``error_answer``, the one mapping from a failed request to
  its HTTP answer (and the counters it keeps), for every course app.
* ``course_lib.serving.service._app``: the FastAPI app factory ``create_app`` (``POST /score``,
  ``GET /healthz``, ``GET /stats``), the body reader ``read_json_body`` and ``answer_request``,
  the request runner every app's endpoints share.
* ``course_lib.serving.service._client``: ``ChurnClient``, which adds the transport stage on the client side,
  and ``HttpStatusError`` / ``raise_for_status``, the one error every course client raises for a
  non-2xx answer (``.shed`` for 429/503).
* ``course_lib.serving.service._strict_json``: ``decode_json``, the strict request-body decoder the parse
  stage uses.
* ``course_lib.serving.service._factory``: ``churn_service``, the service for one model runtime over the
  course's feature store (imported on first use: it loads scikit-learn, XGBoost and ONNX).

``from course_lib.serving.service import ChurnService, create_app, ChurnClient`` keeps working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from course_lib.serving.service._answers import (
    AppCounters,
    ClientGoneError,
    DeadlineExceededError,
    error_answer,
    refuse,
)
from course_lib.serving.service._app import (
    Work,
    answer_request,
    cancel_on_disconnect,
    check_still_wanted,
    create_app,
    is_json_content_type,
    read_json_body,
)
from course_lib.serving.service._client import SHED_STATUSES, ChurnClient, HttpStatusError, raise_for_status
from course_lib.serving.service._forward import (
    AsyncForward,
    Forward,
    Lookup,
    ProbabilityModel,
    Record,
    RecordScorer,
    native_forward,
    onnx_forward,
)
from course_lib.serving.service._pipeline import (
    MAX_BODY_BYTES,
    MAX_DRAIN_BYTES,
    MAX_JSON_DEPTH,
    MAX_NUMBER_DIGITS,
    SERVER_STAGES,
    STAGES,
    ChurnService,
    RequestError,
    ScoreRequest,
    ServiceResponse,
    encode_answer,
    run_without_event_loop,
)
from course_lib.serving.service._strict_json import JSONRefusedError, decode_json

if TYPE_CHECKING:
    from course_lib.serving.service._factory import Runtime, churn_service

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DRAIN_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NUMBER_DIGITS",
    "SERVER_STAGES",
    "SHED_STATUSES",
    "STAGES",
    "AppCounters",
    "AsyncForward",
    "ChurnClient",
    "ChurnService",
    "ClientGoneError",
    "DeadlineExceededError",
    "Forward",
    "HttpStatusError",
    "JSONRefusedError",
    "Lookup",
    "ProbabilityModel",
    "Record",
    "RecordScorer",
    "RequestError",
    "Runtime",
    "ScoreRequest",
    "ServiceResponse",
    "Work",
    "answer_request",
    "cancel_on_disconnect",
    "check_still_wanted",
    "churn_service",
    "create_app",
    "decode_json",
    "encode_answer",
    "error_answer",
    "is_json_content_type",
    "native_forward",
    "onnx_forward",
    "raise_for_status",
    "read_json_body",
    "refuse",
    "run_without_event_loop",
]


def __getattr__(name: str) -> Any:
    """Import ``churn_service`` (and ``Runtime``) on first use: they load the model stack."""
    if name in ("churn_service", "Runtime"):
        from course_lib.serving.service import _factory  # noqa: PLC0415 (heavy optional dependency)

        return getattr(_factory, name)
    raise AttributeError(f"module 'course_lib.serving.service' has no attribute {name!r}")
