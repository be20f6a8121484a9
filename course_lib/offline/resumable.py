"""The batch job's core: score a table in chunks, write each atomically, skip the done ones on restart.

One concept: resumability. :func:`score_resumable` is the loop Lesson 11 reads (about 15 lines);
:func:`course_lib.offline.job.score_store` is the same loop hardened for a Parquet store, several
processes, rejected rows and recorded settings, and the tests check both give the same scores.
:func:`chunk_scorer` turns a churn model into the loop's ``score``; :func:`interrupted_after` stands in
for a spot instance taken back mid-job.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from course_lib.churn.data import FEATURE_COLUMNS, ID_COLUMN
from course_lib.core.checks import instance_of, integer
from course_lib.core.files import atomic_path

if TYPE_CHECKING:
    from course_lib.churn.model import ChurnModel

__all__ = ["chunk_scorer", "interrupted_after", "score_resumable"]


def score_resumable(
    table: pa.Table, out_dir: str | Path, score: Callable[[pa.Table], pa.Table], *, chunk_rows: int
) -> list[int]:
    """The batch job's core: score ``table`` in chunks, each written atomically, resumable after a crash.

    Chunk ``i`` is rows ``[i x chunk_rows, (i + 1) x chunk_rows)``. For each chunk not done yet, call
    ``score`` on it and write what it returns to ``part-<i>.parquet`` under a temporary name, renamed
    into place only once complete (:func:`course_lib.core.files.atomic_path`): the part file is the
    record that the chunk is done. A call that raises part-way leaves the finished parts; the next call
    skips them and scores only the rest, so crash + resume gives the same files as one pass.
    :func:`course_lib.offline.job.score_store` is this loop hardened (see its docstring).

    Parameters
    ----------
    table : pyarrow.Table
        The rows to score, in order.
    out_dir : str or path
        Created if missing; holds ``part-00000.parquet``, ``part-00001.parquet``, ...
    score : callable
        ``pyarrow.Table -> pyarrow.Table``, one chunk in, its output rows out.
    chunk_rows : int >= 1

    Returns
    -------
    list of int
        The chunks this call scored (the others were already done).

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For ``chunk_rows`` < 1 or a ``table`` that is not a ``pyarrow.Table``; whatever ``score`` raises.

    References
    ----------
    POSIX ``rename(2)`` (atomic within a file system); source lesson 000, architecture 4 (a batch job on
    spot instances that can be taken back, so it must resume).
    """
    instance_of("table", table, pa.Table)
    chunk_rows = integer("chunk_rows", chunk_rows, min=1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scored = []
    for index, start in enumerate(range(0, table.num_rows, chunk_rows)):
        part = out / f"part-{index:05d}.parquet"
        if part.exists():  # done by an earlier run
            continue
        result = score(table.slice(start, chunk_rows))
        with atomic_path(part) as tmp:  # written under a temporary name, renamed when complete
            pq.write_table(result, tmp)
        scored.append(index)
    return scored


def chunk_scorer(model: ChurnModel) -> Callable[[pa.Table], pa.Table]:
    """A ``score`` for :func:`score_resumable`: a chunk of customers in, ids and churn probabilities out.

    Runs the model's scikit-learn pipeline on the chunk (its ``predict_proba``); the hardened job's
    runtimes give the same probabilities bit for bit (tested). The chunk needs ``customer_id`` and the
    feature columns.
    """

    def score(chunk: pa.Table) -> pa.Table:
        p = model.pipeline.predict_proba(chunk.to_pandas()[list(FEATURE_COLUMNS)])[:, 1]
        return pa.table({ID_COLUMN: chunk[ID_COLUMN], "churn_probability": pa.array(p, pa.float64())})

    return score


def interrupted_after(score: Callable[[pa.Table], pa.Table], calls: int) -> Callable[[pa.Table], pa.Table]:
    """``score`` that raises ``InterruptedError`` on call number ``calls + 1``: a crash to resume from.

    Stands in for a spot instance taken back mid-job in Lesson 11's demonstration of
    :func:`score_resumable`. Raises :class:`~course_lib.core.checks.InvalidArgumentError` for
    ``calls`` < 0.

    Examples
    --------
    >>> twice = interrupted_after(lambda t: t, 2)
    >>> twice(1), twice(2)
    (1, 2)
    >>> twice(3)
    Traceback (most recent call last):
    ...
    InterruptedError: interrupted after 2 chunks
    """
    calls = integer("calls", calls, min=0)
    done = [0]

    def wrapped(chunk: pa.Table) -> pa.Table:
        if done[0] == calls:
            raise InterruptedError(f"interrupted after {calls} chunks")
        done[0] += 1
        return score(chunk)

    return wrapped
