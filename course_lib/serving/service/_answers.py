"""What a course app answers when a request cannot be scored: the one mapping from error to HTTP answer.

Every app of the course (Lesson 2's ``create_app``, Lesson 3's batched ``POST /predict``, the monitored
app and the production app) runs its requests through ``course_lib.serving.service.answer_request``,
which hands any failure to ``error_answer``:

* ``ClientGoneError``: 499, no body (``client_disconnects``);
* ``DeadlineExceededError``: 504 ``deadline_exceeded`` (``deadline_expired``);
* ``RequestError``: its own status and body, with ``connection: close`` for 408, 413 and 415
  (``body_timeouts`` for a 408);
* ``QueueFullError``: 503 ``queue_full`` + ``Retry-After: 1`` (the batcher refused it before the model);
* ``BatcherClosedError``: 503 ``shutting_down`` + ``Retry-After: 1``;
* ``BatchScoringError``: 500 ``model_error`` (``internal_errors``);
* any other ``Exception``: 500 ``internal_error`` (``internal_errors``).

In brackets: the ``AppCounters`` field it increments (``GET /stats`` shows them).

A 499 is never delivered (the client is gone; the runtime's door counts it as abandoned). A 500's
exception goes to the server log, never to the client. ``connection: close`` follows a refused body:
the server stopped reading it, so the connection cannot carry another request.

References
----------
RFC 9110 sections 15.5.9 (408), 15.5.14 (413), 15.5.16 (415), 15.6.4 (503 and ``Retry-After``),
15.6.5 (504); nginx's non-standard 499 ("client closed request").
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from fastapi.responses import Response

from course_lib.serving.batching.batcher import BatcherClosedError, BatchScoringError, QueueFullError
from course_lib.serving.service._pipeline import RequestError

_log = logging.getLogger("course_lib.serving.service")
#: Refusals whose body the server stopped reading: the connection is closed after the answer.
CLOSE_AFTER_STATUSES: frozenset[int] = frozenset({408, 413, 415})
#: Seconds a shed client is asked to wait before it retries (``Retry-After``).
RETRY_AFTER_S = 1


class ClientGoneError(Exception):
    """The client disconnected before its answer was ready; nobody will read a response."""


class DeadlineExceededError(Exception):
    """The request's deadline (``x-request-timeout-ms``) passed before its answer was ready."""


@dataclass
class AppCounters:
    """Requests that ended without an answer the client could read (``GET /stats``)."""

    client_disconnects: int = 0
    body_timeouts: int = 0
    deadline_expired: int = 0
    internal_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def refuse(err: RequestError, headers: dict[str, str] | None = None) -> Response:
    """The JSON error response for ``err`` (its status, ``{"error": ..., "message": ...}``)."""
    return Response(err.body(), status_code=err.status_code, media_type="application/json", headers=headers)


def _shed(err: RequestError) -> Response:
    return refuse(err, {"retry-after": str(RETRY_AFTER_S)})


def queue_full_answer(exc: QueueFullError) -> Response:
    """503 ``queue_full`` + ``Retry-After``: the batcher refused the request before the model saw it."""
    size = "" if exc.max_queue_size is None else f" ({exc.max_queue_size} requests)"
    return _shed(RequestError(503, "queue_full", f"the batcher's queue is full{size}"))


def error_answer(exc: Exception, counters: AppCounters, *, path: str) -> Response:
    """The answer to a request that failed with ``exc``, counted in ``counters`` (see the module table).

    Parameters
    ----------
    exc : Exception
        What the request's work raised.
    counters : AppCounters
        The app's counters; the matching field is incremented.
    path : str
        The request's path, named in the server log for an unexpected error.

    Returns
    -------
    fastapi.responses.Response
    """
    if isinstance(exc, ClientGoneError):
        counters.client_disconnects += 1
        return Response(status_code=499)  # never delivered: the client is gone
    if isinstance(exc, DeadlineExceededError):
        counters.deadline_expired += 1
        return refuse(
            RequestError(504, "deadline_exceeded", "the request's deadline passed before it was scored")
        )
    if isinstance(exc, RequestError):
        if exc.status_code == 408:
            counters.body_timeouts += 1
        return refuse(exc, {"connection": "close"} if exc.status_code in CLOSE_AFTER_STATUSES else None)
    if isinstance(exc, QueueFullError):
        return queue_full_answer(exc)
    if isinstance(exc, BatcherClosedError):
        return _shed(RequestError(503, "shutting_down", "the server is shutting down"))
    counters.internal_errors += 1
    if isinstance(exc, BatchScoringError):
        _log.error("model call failed while answering %s", path, exc_info=exc)
        return refuse(RequestError(500, "model_error", "the model call for this request's batch failed"))
    _log.error("unexpected error while answering %s", path, exc_info=exc)
    return refuse(
        RequestError(500, "internal_error", "the service failed to answer; the error is in the server log")
    )
