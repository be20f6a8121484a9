"""What the dynamic batcher answers: each request's result, the errors a caller can get, the counters.

One concept: the batcher's contract with its callers. A request ends in exactly one of: a
:class:`BatchedResult` (its value with its queue wait and the batch it rode in), :class:`QueueFullError`
(rejected at once), :class:`BatcherClosedError` (not scored because the batcher stopped) or
:class:`BatchScoringError` (its batch's model call failed); :class:`BatcherStats` counts each outcome.
``course_lib.serving.batching.batcher`` re-exports these names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Generic, TypeVar

R = TypeVar("R")


class QueueFullError(RuntimeError):
    """The batcher's queue holds ``max_queue_size`` requests; this one was rejected, not queued.

    ``max_queue_size`` is the bound that was hit (None when the raiser did not say).
    """

    def __init__(self, message: str = "", *, max_queue_size: int | None = None):
        super().__init__(message)
        self.max_queue_size = max_queue_size


class BatcherClosedError(RuntimeError):
    """The batcher is stopped (or stopping): the request was not, or will not be, scored."""


class BatchScoringError(RuntimeError):
    """The model call for the batch this request rode in failed; ``__cause__`` holds the original error."""


@dataclass(frozen=True)
class BatchedResult(Generic[R]):
    """One request's answer and how it was served.

    Attributes
    ----------
    value : the score function's output for this request's item.
    queue_wait_ms : float
        From ``submit`` to the moment its batch was handed to the model, ms.
    service_ms : float
        Duration of the model call for the whole batch, ms.
    batch_size : int
        Items in that model call (distinct items: duplicates share one row).
    batch_requests : int
        Requests answered by that call (>= batch_size when duplicates joined).
    batch_id : int
        Sequence number of the batch, from 0.
    trigger : str
        Why the batch left when it did (see ``course_lib.simulate.batching.TRIGGERS``; ``"shutdown_drain"``
        when ``stop(drain=True)`` flushed it).
    deduplicated : bool
        True if this request joined an identical queued request instead of adding a row.
    """

    value: R
    queue_wait_ms: float
    service_ms: float
    batch_size: int
    batch_requests: int
    batch_id: int
    trigger: str
    deduplicated: bool


@dataclass
class BatcherStats:
    """Counters since start: every submitted request ends in exactly one of completed, failed,
    rejected_queue_full, closed_before_scoring or cancelled_by_caller (``deduplicated`` counts the
    submitted requests that joined an identical queued one)."""

    submitted: int = 0
    completed: int = 0
    failed: int = 0
    rejected_queue_full: int = 0
    closed_before_scoring: int = 0
    cancelled_by_caller: int = 0
    deduplicated: int = 0
    batches: int = 0
    items_scored: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
