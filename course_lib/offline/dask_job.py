"""The batch job on Dask: the same per-chunk scoring, spread over worker processes by a real scheduler.

Each Parquet row group of the offline store (a contiguous range of customer ids) is one task. A task
reads its row group, checks and scores it with :func:`course_lib.offline.job.score_frame` (the same
code as the single-process job) and writes ``part-NNNNN.parquet`` and ``rejects-NNNNN.parquet``, each
renamed into place when complete. The ONNX model is scattered to every worker once, and each worker
process builds **one** ONNX Runtime session, cached for all of its tasks (not one per chunk).

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
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
from distributed import Client, LocalCluster

from course_lib.churn.data import FEATURE_COLUMNS, ID_COLUMN
from course_lib.offline.job import RUNTIMES, _write_atomic, claim_output_dir, make_scorer, score_frame

__all__ = ["DaskJobSummary", "local_cluster", "score_on_dask"]

_SESSIONS: dict[tuple[str, str], object] = {}  # per worker process: (model version, runtime) -> scorer


@dataclass(frozen=True)
class DaskJobSummary:
    """What a Dask job did; ``sessions_per_worker`` maps each worker's pid to the sessions it built."""

    rows_read: int
    rows_scored: int
    rows_rejected: int
    partitions: int
    workers: int
    seconds: float
    rows_per_s: float
    sessions_per_worker: dict[int, int]


@contextlib.contextmanager
def local_cluster(n_workers: int, *, threads_per_worker: int = 1) -> Iterator[Client]:
    """A scheduler and ``n_workers`` worker processes on 127.0.0.1, closed on exit (also on error).

    No dashboard is started. Raises ``ValueError`` for ``n_workers < 1``.
    """
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"n_workers must be an integer >= 1, got {n_workers!r}")
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


def _worker_scorer(model_key: str, runtime: str, model: object):
    """One scorer per worker process and model: built on the first task, reused by the rest."""
    scorer = _SESSIONS.get((model_key, runtime))
    if scorer is None:
        if runtime == "onnxruntime":  # model: serialized ONNX bytes
            scorer = make_scorer(None, runtime, onnx_model=model)
        else:  # model: the fitted scikit-learn pipeline
            scorer = make_scorer(SimpleNamespace(pipeline=model), runtime)
        _SESSIONS[(model_key, runtime)] = scorer
    return scorer


def _score_partition(
    source: str,
    row_group: int,
    out_dir: str,
    model_key: str,
    runtime: str,
    model: object,
    scored_at: dt.datetime,
) -> dict[str, int]:
    frame = (
        pq.ParquetFile(source).read_row_group(row_group, columns=[ID_COLUMN, *FEATURE_COLUMNS]).to_pandas()
    )
    scorer = _worker_scorer(model_key, runtime, model)
    scores, rejects = score_frame(frame, scorer, model_version=model_key, scored_at=scored_at)
    out = Path(out_dir)
    _write_atomic(rejects, out / f"rejects-{row_group:05d}.parquet")
    _write_atomic(scores, out / f"part-{row_group:05d}.parquet")
    return {"read": len(frame), "scored": scores.num_rows, "rejected": rejects.num_rows, "pid": os.getpid(),
            "sessions": len(_SESSIONS)}  # fmt: skip


def score_on_dask(
    source: str | Path,
    out_dir: str | Path,
    model: bytes | object,
    *,
    model_version: str,
    client: Client,
    runtime: str = "onnxruntime",
) -> DaskJobSummary:
    """Score every row group of a Parquet store on the workers behind ``client``.

    Parameters
    ----------
    source : path to a ``.parquet`` store from :func:`course_lib.offline.job.build_parquet_store`.
    out_dir : folder for ``part-*.parquet`` / ``rejects-*.parquet`` (one pair per row group) and
        ``_SUCCESS``; a folder holding another job is refused (``claim_output_dir``).
    model : bytes or pipeline
        ``runtime="onnxruntime"``: the serialized ONNX pipeline (``pipeline_to_onnx(...).SerializeToString()``);
        ``runtime="xgboost"``: the fitted scikit-learn pipeline. Sent to each worker once.
    model_version : str
        Written into every output row.
    client : distributed.Client
    runtime : {"onnxruntime", "xgboost"}

    Raises ``FileNotFoundError`` for a missing store and ``ValueError`` for a non-Parquet source, an
    unknown runtime or an output folder that holds another job.
    """
    path = Path(source)
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    if not path.is_file():
        raise FileNotFoundError(f"store not found: {path}")
    if path.suffix != ".parquet":
        raise ValueError(
            f"source must be a .parquet store (row groups are the partitions), got {path.name!r}"
        )
    groups = pq.ParquetFile(path).num_row_groups
    plan = {
        "source": str(path.resolve()),
        "row_groups": groups,
        "model_version": model_version,
        "runtime": runtime,
    }
    out = claim_output_dir(out_dir, plan)
    # hash=False: a fresh key per job, so a second job on the same client never reuses a released one.
    shared = client.scatter(model, broadcast=True, hash=False)
    scored_at = dt.datetime.now(dt.UTC)
    start = time.perf_counter()
    futures = client.map(
        _score_partition, [str(path)] * groups, range(groups), [str(out)] * groups,
        [model_version] * groups, [runtime] * groups, [shared] * groups, [scored_at] * groups, pure=False,
    )  # fmt: skip
    results = client.gather(futures)
    seconds = time.perf_counter() - start
    sessions: dict[int, int] = {}
    for r in results:
        sessions[r["pid"]] = max(sessions.get(r["pid"], 0), r["sessions"])
    read = sum(r["read"] for r in results)
    summary = DaskJobSummary(
        read, sum(r["scored"] for r in results), sum(r["rejected"] for r in results), groups,
        len(client.scheduler_info()["workers"]), seconds, read / seconds, sessions,
    )  # fmt: skip
    (out / "_SUCCESS").write_text(json.dumps(asdict(summary), indent=1, default=str))
    return summary
