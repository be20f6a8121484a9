"""The one error-to-answer mapping every course app uses (``course_lib.serving.service.error_answer``)."""

from __future__ import annotations

import asyncio
import json

import pytest

from course_lib.serving.batching.batcher import (
    BatcherClosedError,
    BatchScoringError,
    DynamicBatcher,
    QueueFullError,
)
from course_lib.serving.batching.predict import batched_forward
from course_lib.serving.service import (
    AppCounters,
    ClientGoneError,
    DeadlineExceededError,
    RequestError,
    error_answer,
)


def _answer(exc: Exception) -> tuple[int, str | None, dict[str, str], dict[str, int]]:
    counters = AppCounters()
    response = error_answer(exc, counters, path="/score")
    error = json.loads(response.body)["error"] if response.body else None
    headers = {k: v for k, v in response.headers.items() if k in ("connection", "retry-after")}
    return response.status_code, error, headers, {k: v for k, v in counters.as_dict().items() if v}


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ClientGoneError(), (499, None, {}, {"client_disconnects": 1})),
        (DeadlineExceededError(), (504, "deadline_exceeded", {}, {"deadline_expired": 1})),
        (
            RequestError(408, "body_timeout", "late"),
            (408, "body_timeout", {"connection": "close"}, {"body_timeouts": 1}),
        ),
        (RequestError(413, "body_too_large", "big"), (413, "body_too_large", {"connection": "close"}, {})),
        (RequestError(415, "bad_type", "xml"), (415, "bad_type", {"connection": "close"}, {})),
        (RequestError(404, "unknown_customer", "who"), (404, "unknown_customer", {}, {})),
        (QueueFullError("full", max_queue_size=8), (503, "queue_full", {"retry-after": "1"}, {})),
        (BatcherClosedError("stopped"), (503, "shutting_down", {"retry-after": "1"}, {})),
        (BatchScoringError("boom"), (500, "model_error", {}, {"internal_errors": 1})),
        (ZeroDivisionError("secret detail"), (500, "internal_error", {}, {"internal_errors": 1})),
    ],
)
def test_each_error_has_one_answer_and_one_counter(exc, expected):
    assert _answer(exc) == expected


def test_a_queue_full_answer_names_the_bound_and_no_answer_echoes_the_exception():
    full = error_answer(QueueFullError("x", max_queue_size=8), AppCounters(), path="/predict")
    assert json.loads(full.body)["message"] == "the batcher's queue is full (8 requests)"
    failed = error_answer(ZeroDivisionError("secret detail"), AppCounters(), path="/score")
    assert b"secret detail" not in failed.body and b"ZeroDivisionError" not in failed.body


def test_the_batched_forward_stage_starts_the_batcher_and_reports_how_it_was_served():
    async def main():
        batcher = DynamicBatcher(lambda rs: [len(r) for r in rs], max_batch_size=4, max_queue_delay_ms=0.0)
        served: list = []
        try:
            values = await batched_forward(batcher, served)([{"a": 1, "b": 2}])
        finally:
            await batcher.stop()
        return values, served

    values, served = asyncio.run(main())
    assert values == [2] and len(served) == 1 and served[0].batch_size == 1
