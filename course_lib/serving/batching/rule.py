"""Triton's dynamic-batching rule, in one place: the batching simulator and the asyncio batcher share it.

The rule (``next_batch_size``) decides, for a free model instance and a FIFO queue, how many requests
to send now:

* if the queue holds a preferred batch size (by default the only preferred size is
  ``max_batch_size``), send the largest preferred size it can fill, at once;
* otherwise wait, but never let the oldest queued request wait longer than ``max_queue_delay_ms``:
  when that delay runs out, send what is queued (up to ``max_batch_size``) as it is;
* with ``max_queue_delay_ms = 0`` nothing waits: a free instance takes what is queued at once.

Three modules import it from here: the discrete-event simulator (:mod:`course_lib.simulate.batching`),
the real asyncio batcher (:mod:`course_lib.serving.batching.batcher`) and, for the arrival times of
open-loop traffic (``poisson_arrivals_ms``), the load generator (:mod:`course_lib.measure.loadgen`).
Change the rule here and
``python -m course_lib.lesson_map --changed course_lib/serving/batching/rule.py`` names the lessons
to re-run.

References
----------
NVIDIA Triton Inference Server documentation, "Batchers: Dynamic Batcher" (sections "Preferred
Batch Sizes" and "Delayed Batching"), and ``src/dynamic_batch_scheduler.cc`` (``GetDynamicBatch``) in
github.com/triton-inference-server/core; ``model_config_utils.cc`` sets the preferred batch size to
``max_batch_size`` when none is configured. Poisson arrivals: exponential inter-arrival gaps (e.g.
Harchol-Balter, "Performance Modeling and Design of Computer Systems", 2013, ch. 11).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from course_lib.core.checks import integer, integers, positive_number

__all__ = ["TRIGGERS", "check_batching_params", "next_batch_size"]

#: Why a batch left the queue when it did.
#: ``max_batch_size``: the batch is full. ``preferred_batch_size``: the queue reached a preferred size
#: smaller than the maximum. ``max_queue_delay``: the oldest request had waited ``max_queue_delay_ms``
#: (0 ms with no delay) while an instance was free. ``instance_free``: the oldest request's delay
#: had already run out while every instance was busy, and the batch left as soon as one freed.
TRIGGERS: tuple[str, ...] = ("max_batch_size", "preferred_batch_size", "max_queue_delay", "instance_free")


def check_batching_params(
    max_batch_size: int, max_queue_delay_ms: float, preferred_batch_sizes: Iterable[int] = ()
) -> tuple[int, float, tuple[int, ...]]:
    """Validate the three dynamic-batching knobs and return them normalised.

    Parameters
    ----------
    max_batch_size : int >= 1
    max_queue_delay_ms : float >= 0, finite
    preferred_batch_sizes : iterable of int in [1, max_batch_size]
        Empty means Triton's default, ``(max_batch_size,)``.

    Returns
    -------
    (max_batch_size, max_queue_delay_ms, preferred_batch_sizes) with the preferred sizes sorted,
    de-duplicated and defaulted.

    Raises
    ------
    ValueError
        For a size below 1, a negative / NaN / infinite delay, or a preferred size outside
        [1, max_batch_size].
    """
    max_batch_size = integer("max_batch_size", max_batch_size, min=1)
    max_queue_delay_ms = positive_number("max_queue_delay_ms", max_queue_delay_ms, allow_zero=True)
    preferred = set(
        integers("preferred_batch_sizes", preferred_batch_sizes, min=1, max=max_batch_size, allow_empty=True)
    )
    return max_batch_size, max_queue_delay_ms, tuple(sorted(preferred)) or (max_batch_size,)


def next_batch_size(
    queue_len: int,
    now_ms: float,
    oldest_arrival_ms: float,
    *,
    max_batch_size: int,
    max_queue_delay_ms: float,
    preferred_batch_sizes: Sequence[int],
) -> tuple[int, str | None]:
    """Triton's decision for a free model instance: how many queued requests to send now.

    Call it only when an instance is free and the queue is not empty. Parameters must already be
    normalised by ``check_batching_params`` (preferred sizes sorted, never empty).

    Parameters
    ----------
    queue_len : int >= 1
        Requests waiting, oldest first.
    now_ms : float
        Current time, ms.
    oldest_arrival_ms : float
        When the oldest queued request arrived, ms.
    max_batch_size, max_queue_delay_ms, preferred_batch_sizes
        The batcher's knobs.

    Returns
    -------
    (size, trigger)
        ``size`` requests (the oldest ones) form the next batch; ``(0, None)`` means wait until a
        new request arrives or the oldest request's delay runs out at
        ``oldest_arrival_ms + max_queue_delay_ms``. ``trigger`` is ``"max_batch_size"``,
        ``"preferred_batch_size"`` or ``"max_queue_delay"``.

    References
    ----------
    ``DynamicBatchScheduler::GetDynamicBatch`` in triton-inference-server/core: a preferred size is
    sent at once unless the delay is exceeded; once it is exceeded (or with no delay configured),
    everything pending up to ``max_batch_size`` is sent as it is.
    """
    pending = min(queue_len, max_batch_size)
    best = 0
    for size in preferred_batch_sizes:
        if size <= pending:
            best = size
    exceeded = max_queue_delay_ms > 0 and now_ms >= oldest_arrival_ms + max_queue_delay_ms
    if best and not exceeded:
        return best, ("max_batch_size" if best == max_batch_size else "preferred_batch_size")
    if exceeded or max_queue_delay_ms == 0:
        return pending, ("max_batch_size" if pending == max_batch_size else "max_queue_delay")
    return 0, None
