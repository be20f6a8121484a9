"""Score every customer as a batch job: chunked, resumable, bad rows rejected with a reason, Parquet out.

The weekly job of source lesson 000's fourth architecture ("score 1,000,000 customer records in a
scheduled Sunday batch job on a spot instance"), run for real:

* **Read** customers in chunks of ``chunk_rows`` from an offline store: a Parquet file
  (:func:`build_parquet_store`, read with ``pyarrow`` row batch by row batch) or the Lesson 2 SQLite
  feature store (by ``rowid`` range; much slower to read, since every value crosses into Python).
* **Check** every row against the one feature schema (:mod:`course_lib.churn.schema`): a row with a
  missing or out-of-range feature is never scored and never dropped silently; it goes to a reject file
  with its reason.
* **Score** with XGBoost (the pipeline's own ``predict_proba``, which uses the booster's served
  iteration range) or ONNX Runtime, whichever :func:`choose_runtime` measures faster on one chunk.
* **Write** ``part-00000.parquet``, ... with ``customer_id, churn_probability, model_version,
  scored_at`` (and ``rejects-00000.parquet``): each file is written under a temporary name and renamed
  when complete, the rejects before the part, so a part file's presence means its chunk is done. A job
  that is interrupted restarts from the first missing part: no row is scored twice or lost.
  ``_SUCCESS`` (a JSON summary) is written last.

Memory is bounded by the chunk, not by the population. This module is the job (plan, resume, write);
reading the store is :mod:`course_lib.offline.store`, checking rows and scoring a chunk is
:mod:`course_lib.offline.scorers`; their public names are re-exported here.

Command line: ``python -m course_lib.offline --customers 1000000 --out build/scores``
(``--help`` lists the options).

References
----------
Source lesson 000, "Cost per prediction modeling", architecture 4 (1,000,000 records in 12 minutes on
a c6i.2xlarge spot instance, i.e. about 1,389 rows/s). Apache Parquet format; pyarrow documentation,
``ParquetFile.iter_batches``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from course_lib.churn.data import FEATURE_COLUMNS, ID_COLUMN
from course_lib.offline.scorers import RUNTIMES, choose_runtime, make_scorer, row_problems
from course_lib.offline.store import DEFAULT_CHUNK_ROWS, build_parquet_store, check_store, iter_store_chunks

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "RUNTIMES",
    "SOURCE000_ROWS_PER_S",
    "JobSummary",
    "build_parquet_store",
    "choose_runtime",
    "claim_output_dir",
    "iter_store_chunks",
    "make_scorer",
    "recorded_plan",
    "row_problems",
    "score_frame",
    "score_store",
]

#: Source lesson 000: 1,000,000 records in 12 minutes.
SOURCE000_ROWS_PER_S = 1_000_000 / (12 * 60)
_OUT_SCHEMA = pa.schema(
    [
        (ID_COLUMN, pa.string()),
        ("churn_probability", pa.float64()),
        ("model_version", pa.string()),
        ("scored_at", pa.timestamp("us", tz="UTC")),
    ]
)
_REJECT_SCHEMA = pa.schema([(ID_COLUMN, pa.string()), ("reason", pa.string())])


@dataclass(frozen=True)
class JobSummary:
    """What a batch job did. ``peak_rss_mib`` is the process's peak resident memory so far."""

    rows_read: int
    rows_scored: int
    rows_rejected: int
    chunks: int
    chunks_resumed: int
    seconds: float
    rows_per_s: float  # rows read and scored or rejected in this run (resumed chunks excluded), per second
    peak_rss_mib: float
    runtime: str
    model_version: str
    output_dir: str


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def score_frame(
    frame: pd.DataFrame, scorer, *, model_version: str, scored_at: dt.datetime
) -> tuple[pa.Table, pa.Table]:
    """Score the valid rows of one chunk; return ``(scores, rejects)`` as Arrow tables.

    Every input row is in exactly one of the two tables.
    """
    reasons = row_problems(frame)
    ok = pd.isna(reasons)
    good = frame.loc[ok]
    p = scorer(good[list(FEATURE_COLUMNS)]) if len(good) else np.empty(0)
    scores = pa.table(
        {
            ID_COLUMN: good[ID_COLUMN].astype(str).to_numpy(),
            "churn_probability": p,
            "model_version": [model_version] * len(good),
            "scored_at": pa.array([scored_at] * len(good), type=pa.timestamp("us", tz="UTC")),
        },
        schema=_OUT_SCHEMA,
    )
    rejects = pa.table(
        {
            ID_COLUMN: [None if pd.isna(v) else str(v) for v in frame.loc[~ok, ID_COLUMN]],
            "reason": reasons[~ok].astype(str),
        },
        schema=_REJECT_SCHEMA,
    )
    return scores, rejects


def recorded_plan(out_dir: str | Path) -> dict | None:
    """The settings a job recorded in ``out_dir/_job.json``, or None if there is none."""
    path = Path(out_dir) / "_job.json"
    return json.loads(path.read_text()) if path.is_file() else None


def claim_output_dir(out_dir: str | Path, plan: dict) -> Path:
    """Create ``out_dir`` for a job with settings ``plan``, or accept it if it holds the same job.

    Records ``plan`` in ``_job.json`` and removes ``_SUCCESS`` (the job is running again). Raises
    ``ValueError`` if the folder holds a job with other settings (another model version, chunk size,
    source or runtime): a resumed job never mixes two, and a folder is never shared by two jobs.
    Call it only after every argument has been checked, so a refused call records nothing.
    """
    out = Path(out_dir)
    previous = recorded_plan(out)
    if previous is not None and previous != plan:
        raise ValueError(
            f"{out} holds a job with other settings {previous}; resume it with those or use a new out_dir"
        )
    if previous is None and out.is_dir() and any(out.glob("part-*.parquet")):
        raise ValueError(f"{out} holds part files of an unknown job; use a new out_dir")
    out.mkdir(parents=True, exist_ok=True)
    (out / "_job.json").write_text(json.dumps(plan))
    (out / "_SUCCESS").unlink(missing_ok=True)
    return out


def _write_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def score_store(
    source: str | Path,
    out_dir: str | Path,
    model: object,
    *,
    runtime: str = "xgboost",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    threads: int = 1,
    progress: bool = True,
) -> JobSummary:
    """Run the batch job: every chunk of ``source`` scored into ``out_dir`` (see the module docstring).

    Re-running with the same ``out_dir`` resumes: chunks whose part file exists are skipped. A
    different model version or chunk size in an existing ``out_dir`` is refused (``ValueError``), so
    a resumed job never mixes two models. ``model`` is a :class:`course_lib.churn.model.ChurnModel`.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    scorer = make_scorer(model, runtime, threads=threads)
    check_store(source, chunk_rows)
    plan = {
        "source": str(Path(source).resolve()),
        "chunk_rows": chunk_rows,
        "model_version": model.model_version,
        "runtime": runtime,
    }
    out = claim_output_dir(out_dir, plan)
    scored_at = dt.datetime.now(dt.UTC)
    counts = {"read": 0, "scored": 0, "rejected": 0, "chunks": 0, "resumed": 0, "resumed_rows": 0}
    start = time.perf_counter()
    total = pq.ParquetFile(source).metadata.num_rows if str(source).endswith(".parquet") else None
    with tqdm(total=total, unit="rows", unit_scale=True, disable=not progress, desc="scoring") as bar:
        for i, frame in iter_store_chunks(source, chunk_rows):
            part, rejects_path = out / f"part-{i:05d}.parquet", out / f"rejects-{i:05d}.parquet"
            counts["chunks"] += 1
            counts["read"] += len(frame)
            if part.is_file():
                done = pq.ParquetFile(part).metadata.num_rows
                counts["resumed"] += 1
                counts["resumed_rows"] += len(frame)
                counts["scored"] += done
                counts["rejected"] += len(frame) - done
            else:
                scores, rejects = score_frame(
                    frame, scorer, model_version=model.model_version, scored_at=scored_at
                )
                _write_atomic(rejects, rejects_path)
                _write_atomic(scores, part)
                counts["scored"] += scores.num_rows
                counts["rejected"] += rejects.num_rows
            bar.update(len(frame))
    seconds = time.perf_counter() - start
    summary = JobSummary(
        counts["read"], counts["scored"], counts["rejected"], counts["chunks"], counts["resumed"],
        seconds, (counts["read"] - counts["resumed_rows"]) / seconds if seconds else float("nan"), _peak_rss_mib(), runtime,
        model.model_version, str(out),
    )  # fmt: skip
    (out / "_SUCCESS").write_text(json.dumps(asdict(summary), indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command line: build (if needed) or read a store, score it, print the summary as JSON."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.offline", description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--source", help="a .parquet or .sqlite store to score")
    where.add_argument(
        "--customers", type=int, help="build (or reuse) a Parquet store of this many customers"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output folder (re-run the same command to resume)")
    parser.add_argument("--runtime", choices=[*RUNTIMES, "auto"], default="auto")
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--threads", type=int, default=1, help="scoring threads (default 1)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    from course_lib.churn.model import load_or_train_churn_model

    source = Path(args.source) if args.source else build_parquet_store(args.customers, args.seed)
    model = load_or_train_churn_model()
    runtime = args.runtime
    recorded = recorded_plan(args.out)
    if runtime == "auto" and recorded is not None:
        runtime = recorded["runtime"]  # resuming: keep the runtime the job started with
    if runtime == "auto":
        _, first = next(iter_store_chunks(source, min(args.chunk_rows, 50_000)))
        runtime, _table = choose_runtime(model, first, threads=args.threads)
    summary = score_store(
        source,
        args.out,
        model,
        runtime=runtime,
        chunk_rows=args.chunk_rows,
        threads=args.threads,
        progress=not args.no_progress,
    )
    print(json.dumps(asdict(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
