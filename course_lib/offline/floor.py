"""The model-only floor: how fast the job could go if reading, checking, encoding and writing were free.

One concept: the yardstick for the batch job's overhead. :func:`model_floor` runs only the model call,
the same runtime and scorer the job uses, on a matrix encoded beforehand, in as many processes as the
job uses (this process plus ``processes - 1`` workers from :func:`course_lib.offline.workers.worker_pool`),
all starting at one agreed instant. Its rows per second is the most the job can reach on these cores
with this runtime; the job's end-to-end rows per second divided by it says how much of the time goes
to everything around the model.

References
----------
Python documentation, ``concurrent.futures.ProcessPoolExecutor``; ``time.time`` (one clock every
process on a machine shares) for the common start.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from course_lib.core.checks import integer
from course_lib.offline.chunk import scorer_for
from course_lib.offline.scorers import ScorerSpec
from course_lib.offline.workers import worker_pool

__all__ = ["FloorResult", "model_floor"]

#: Seconds between handing out the timed work and its common start (after a warm-up call everywhere).
_START_MARGIN_S = 0.2


@dataclass(frozen=True)
class FloorResult:
    """Model-only throughput on ``processes`` processes.

    ``rows_per_s`` = all rows scored / (last process's end - the common start); ``per_process_rows_per_s``
    is each process's own rate (rows / its own seconds).
    """

    runtime: str
    processes: int
    rows: int
    seconds: float
    rows_per_s: float
    per_process_rows_per_s: tuple[float, ...]


def _model_only(
    spec: ScorerSpec, X: np.ndarray, calls: int, start_at: float
) -> tuple[int, float, float, int]:
    """In one process: warm up, wait for the common start, call the model ``calls`` times on ``X``."""
    score = scorer_for(spec)
    score(X)  # warm-up: builds the scorer's buffers; not timed
    time.sleep(max(0.0, start_at - time.time()))
    began = time.time()
    for _ in range(calls):
        score(X)
    return calls * len(X), began, time.time(), os.getpid()


def _ready() -> bool:
    return True


def model_floor(spec: ScorerSpec, X: np.ndarray, *, processes: int, calls: int = 5) -> FloorResult:
    """Model-only rows/s of ``spec``'s runtime on ``processes`` processes, each scoring ``X`` ``calls`` times.

    Parameters
    ----------
    spec : ScorerSpec
        The runtime and model the job uses (:func:`course_lib.offline.scorers.scorer_spec`).
    X : numpy.ndarray of float32, shape (n, spec.encoding.width), C-contiguous
        Encoded rows (:func:`course_lib.offline.rows.encode_rows` of one chunk).
    processes : int >= 1
        This process plus ``processes - 1`` worker processes, as the job runs.
    calls : int >= 1
        Timed model calls per process.

    Raises
    ------
    ValueError
        For counts below 1 or an ``X`` that is not a C-contiguous float32 matrix of the model's width.
    """
    processes = integer("processes", processes, min=1)
    calls = integer("calls", calls, min=1)
    if (
        X.dtype != np.float32
        or X.ndim != 2
        or X.shape[1] != spec.encoding.width
        or not X.flags["C_CONTIGUOUS"]
    ):
        raise ValueError(
            f"X must be a C-contiguous float32 matrix of shape (n, {spec.encoding.width}), "
            f"got {X.dtype} {X.shape}"
        )
    pool = worker_pool(processes - 1) if processes > 1 else None
    try:
        if pool is not None:  # every worker running before the clock starts
            for ready in [pool.submit(_ready) for _ in range(processes - 1)]:
                ready.result()
        start_at = time.time() + _START_MARGIN_S * (processes > 1)
        futures = (
            [pool.submit(_model_only, spec, X, calls, start_at) for _ in range(processes - 1)] if pool else []
        )
        results = [_model_only(spec, X, calls, start_at)] + [f.result() for f in futures]
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    if len({r[3] for r in results}) != processes:
        raise RuntimeError(f"the timed work ran in fewer than {processes} processes; measure again")
    rows = sum(r[0] for r in results)
    seconds = max(r[2] for r in results) - min(r[1] for r in results)
    per_process = tuple(r[0] / (r[2] - r[1]) for r in results)
    return FloorResult(spec.runtime, processes, rows, seconds, rows / seconds, per_process)
