"""The batch job on Dask: the same chunks, scored by the same function, spread over workers by a real scheduler.

Each chunk of the offline store (by default one Parquet row group, a contiguous range of customer ids)
is one task, and the task is :func:`course_lib.offline.chunk.score_chunk`, the code the single-process
job and its worker processes run: read, check, encode, score, write ``part-NNNNN.parquet`` and
``rejects-NNNNN.parquet`` renamed into place when complete. So a folder scored on Dask holds the same
files, bit for bit, as one scored by :func:`course_lib.offline.job.score_store` with the same chunk
size, and either can resume the other's job. The model (a :class:`~course_lib.offline.scorers.ScorerSpec`)
is scattered to every worker once, and each worker process builds **one** scorer, cached for all of
its tasks.

``dask.distributed.LocalCluster`` starts a scheduler and worker processes on this machine. On a
cluster the code is the same: start ``dask scheduler`` on one host and ``dask worker
tcp://SCHEDULER:8786`` on each of the others, then pass ``Client("tcp://SCHEDULER:8786")``; the store
and the output folder must then be on storage every worker can reach (an object store or a shared
file system).

References
----------
Dask documentation, "dask.distributed: LocalCluster", "Futures" (``Client.map``, ``Client.scatter``
with ``broadcast=True``), and "Deploy Dask Clusters" (``dask scheduler`` / ``dask worker``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
from distributed import Client, LocalCluster

from course_lib.core.checks import integer, one_of
from course_lib.core.vocabulary import BATCH_RUNTIMES
from course_lib.offline.chunk import STAGES, ChunkResult, ChunkTask, score_chunk
from course_lib.offline.job import claim_output_dir
from course_lib.offline.scorers import ScorerSpec, scorer_spec
from course_lib.offline.store import ChunkPlan, plan_chunks

if TYPE_CHECKING:
    from course_lib.churn.model import ChurnModel

__all__ = ["DaskJobSummary", "local_cluster", "score_on_dask"]


@dataclass(frozen=True)
class DaskJobSummary:
    """What a Dask job did; ``sessions_per_worker`` maps each worker's pid to the scorers it built.

    ``seconds`` runs from submitting the first task to the last result; ``stage_s`` sums each stage
    over the tasks (see :data:`course_lib.offline.chunk.STAGES`).
    """

    rows_read: int
    rows_scored: int
    rows_rejected: int
    partitions: int
    workers: int
    seconds: float
    rows_per_s: float
    sessions_per_worker: dict[int, int]
    chunks_resumed: int = 0
    stage_s: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def local_cluster(n_workers: int, *, threads_per_worker: int = 1) -> Iterator[Client]:
    """A scheduler and ``n_workers`` worker processes on 127.0.0.1, closed on exit (also on error).

    No dashboard is started. Raises ``ValueError`` for ``n_workers < 1``.
    """
    n_workers = integer("n_workers", n_workers, min=1)
    cluster = LocalCluster(
        n_workers=n_workers,
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def _score_task(
    plan: ChunkPlan, index: int, out_dir: str, spec: ScorerSpec, scored_at_us: int
) -> ChunkResult:
    return score_chunk(ChunkTask(plan, index, out_dir, spec, scored_at_us))


def _row_group_rows(path: Path) -> int:
    meta = pq.ParquetFile(path).metadata
    return meta.row_group(0).num_rows if meta.num_row_groups else 1


def score_on_dask(
    source: str | Path,
    out_dir: str | Path,
    model: ChurnModel,
    *,
    client: Client,
    runtime: str = "xgboost",
    chunk_rows: int | None = None,
    threads: int = 1,
    scored_at: dt.datetime | None = None,
    workers: list[str] | None = None,
) -> DaskJobSummary:
    """Score every chunk of a Parquet store on the workers behind ``client``.

    Parameters
    ----------
    source : path to a ``.parquet`` store from :func:`course_lib.offline.job.build_parquet_store`.
    out_dir : folder for ``part-*.parquet`` / ``rejects-*.parquet`` and ``_SUCCESS``; an existing
        folder of the same job resumes, a folder holding another job is refused (``claim_output_dir``).
    model : course_lib.churn.model.ChurnModel
        Prepared for ``runtime`` here and sent to each worker once.
    client : distributed.Client
    runtime : one of :data:`course_lib.core.vocabulary.BATCH_RUNTIMES`
    chunk_rows : int, optional
        Rows per task; default the store's row group size (one row group per task).
    threads : int
        Scoring threads per task.
    scored_at : datetime, optional
        As in ``score_store``.
    workers : list of worker addresses, optional
        Run every task on these workers only (e.g. one worker of a two-worker cluster, to compare one
        worker with two on the same warm processes); default any worker.

    Raises ``FileNotFoundError`` for a missing store and ``ValueError`` for a non-Parquet source, an
    unknown runtime or an output folder that holds another job.
    """
    path = Path(source)
    one_of("runtime", runtime, BATCH_RUNTIMES)
    if not path.is_file():
        raise FileNotFoundError(f"store not found: {path}")
    if path.suffix != ".parquet":
        raise ValueError(
            f"source must be a .parquet store (row groups are the partitions), got {path.name!r}"
        )
    rows = _row_group_rows(path) if chunk_rows is None else integer("chunk_rows", chunk_rows, min=1)
    plan = plan_chunks(path, rows)
    spec = scorer_spec(model, runtime, threads=threads)
    settings = {
        "source": plan.source,
        "chunk_rows": rows,
        "model_version": spec.model_version,
        "runtime": runtime,
    }
    out, stamp = claim_output_dir(out_dir, settings, scored_at=scored_at)
    todo = [
        i for i in range(plan.n_chunks) if not ChunkTask(plan, i, str(out), spec, 0).part_path().is_file()
    ]
    # hash=False: a fresh key per job, so a second job on the same client never reuses a released one.
    shared = client.scatter(spec, broadcast=True, hash=False)
    stamp_us = int(stamp.timestamp() * 1_000_000)
    start = time.perf_counter()
    futures = client.map(
        _score_task, [plan] * len(todo), todo, [str(out)] * len(todo), [shared] * len(todo),
        [stamp_us] * len(todo), pure=False, workers=workers, allow_other_workers=False,
    )  # fmt: skip
    results: list[ChunkResult] = client.gather(futures)
    seconds = time.perf_counter() - start
    sessions: dict[int, int] = {}
    for r in results:
        sessions[r.pid] = max(sessions.get(r.pid, 0), r.scorers_built)
    read = sum(r.rows for r in results)
    stage_s = {stage: sum(r.stage_s[stage] for r in results) for stage in STAGES}
    summary = DaskJobSummary(
        read, sum(r.scored for r in results), sum(r.rejected for r in results), plan.n_chunks,
        len(workers) if workers else len(client.scheduler_info()["workers"]), seconds, read / seconds if seconds else float("nan"), sessions,
        plan.n_chunks - len(todo), stage_s,
    )  # fmt: skip
    (out / "_SUCCESS").write_text(json.dumps(asdict(summary), indent=1, default=str))
    return summary
