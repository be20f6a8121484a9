"""The churn scoring service, in three modules; this one re-exports their public names.

* ``course_lib.serving.service._pipeline``: the request's stages (parse, lookup, forward, format), run
  in-process by ``ChurnService``; the model-forward adapters ``native_forward`` / ``onnx_forward``.
* ``course_lib.serving.service._app``: the FastAPI app factory ``create_app`` (``POST /score``,
  ``GET /healthz``, ``GET /stats``) and the body reader ``read_json_body``.
* ``course_lib.serving.service._client``: ``ChurnClient``, which adds the transport stage on the client side.
* ``course_lib.serving.service._strict_json``: ``decode_json``, the strict request-body decoder the parse stage uses.

``from course_lib.serving.service import ChurnService, create_app, ChurnClient`` keeps working.
"""

from __future__ import annotations

from course_lib.serving.service._app import (
    AppCounters,
    ClientGoneError,
    DeadlineExceededError,
    cancel_on_disconnect,
    check_still_wanted,
    create_app,
    is_json_content_type,
    read_json_body,
    refuse,
)
from course_lib.serving.service._client import ChurnClient
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
    native_forward,
    onnx_forward,
)
from course_lib.serving.service._strict_json import JSONRefusedError, decode_json

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DRAIN_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NUMBER_DIGITS",
    "SERVER_STAGES",
    "STAGES",
    "AppCounters",
    "ChurnClient",
    "ChurnService",
    "ClientGoneError",
    "DeadlineExceededError",
    "JSONRefusedError",
    "RequestError",
    "ScoreRequest",
    "ServiceResponse",
    "cancel_on_disconnect",
    "check_still_wanted",
    "create_app",
    "decode_json",
    "is_json_content_type",
    "native_forward",
    "onnx_forward",
    "read_json_body",
    "refuse",
]
