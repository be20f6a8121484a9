"""Score every customer as a batch job: chunked, parallel, resumable, bad rows rejected with a reason, Parquet out.

The weekly job of source lesson 000's fourth architecture ("score 1,000,000 customer records in a
scheduled Sunday batch job on a spot instance"), run for real:

* **Plan** the store as chunks of ``chunk_rows`` consecutive rows (:func:`plan_chunks`): a Parquet
  file (:func:`build_parquet_store`) or the Lesson 2 SQLite feature store (by ``rowid`` range; much
  slower to read, since every value crosses into Python).
* **Score the chunks on every usable core**: this process and ``workers - 1`` worker processes take
  chunks from one queue (:mod:`course_lib.offline.workers`); each process reads, checks, encodes,
  scores and writes its own chunks (:func:`course_lib.offline.chunk.score_chunk`) with one scorer it
  builds once. Rows outside the feature schema are never scored and never dropped silently: they go to
  a reject file with their reason.
* **Runtime**: XGBoost's ``inplace_predict``, ONNX Runtime, or trees compiled by treelite + tl2cgen,
  whichever :func:`choose_runtime` measures fastest on one chunk.
* **Write** ``part-00000.parquet``, ... with ``customer_id, churn_probability, model_version,
  scored_at`` (and ``rejects-00000.parquet``), each renamed into place when complete, the rejects
  before the part, so a part file's presence means its chunk is done. An interrupted job restarts
  from the missing parts: no row is scored twice or lost, and ``scored_at`` is the time the job first
  started (recorded in ``_job.json``), so a resumed job's files equal an uninterrupted run's.
  ``_SUCCESS`` (a JSON summary) is written last.

Its core is :func:`course_lib.offline.resumable.score_resumable` (chunk, write atomically, skip what is
done). Over it this module adds, and why: a store read by row group (a million rows need not fit in
memory), worker processes (Python scores on one core per process), reject files (bad rows are counted,
never silently dropped), ``_job.json`` (a resume with other settings is refused, and a resumed job's
timestamp equals the first start's), leftovers of a killed run removed, and ``_SUCCESS`` written last.

The output does not depend on how many processes scored it: every chunk is scored by the same code on
the same input (tests check single-process, parallel and Dask outputs bit for bit). Memory is bounded
by the chunk per process, not by the population.

Command line: ``python -m course_lib.offline --customers 1000000 --out build/scores``
(``--help`` lists the options).

References
----------
Source lesson 000, "Cost per prediction modeling", architecture 4 (1,000,000 records in 12 minutes on
a c6i.2xlarge spot instance, i.e. about 1,389 rows/s). Apache Parquet format.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
from tqdm.auto import tqdm

from course_lib.core.bench import usable_cores
from course_lib.core.checks import integer, one_of
from course_lib.core.vocabulary import BATCH_RUNTIMES
from course_lib.offline.chunk import STAGES, ChunkResult, ChunkTask, peak_rss_mib, reset_peak_rss
from course_lib.offline.scorers import choose_runtime, make_scorer, row_problems, scorer_spec
from course_lib.offline.store import (
    DEFAULT_CHUNK_ROWS,
    build_parquet_store,
    iter_store_chunks,
    plan_chunks,
    read_chunk,
)
from course_lib.offline.workers import run_chunks, warm_up_workers

if TYPE_CHECKING:
    from course_lib.churn.model import ChurnModel

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "SOURCE000_ROWS_PER_S",
    "STAGES",
    "JobSummary",
    "build_parquet_store",
    "choose_runtime",
    "claim_output_dir",
    "default_workers",
    "iter_store_chunks",
    "make_scorer",
    "recorded_plan",
    "row_problems",
    "same_output",
    "score_store",
]

#: Source lesson 000: 1,000,000 records in 12 minutes.
SOURCE000_ROWS_PER_S = 1_000_000 / (12 * 60)


@dataclass(frozen=True)
class JobSummary:
    """What a batch job did.

    ``seconds`` runs from the first chunk started to the last written (worker start-up included);
    ``rows_per_s`` counts the rows read and scored or rejected in this run (resumed chunks excluded).
    ``stage_s`` sums each stage's seconds over the chunks of this run, across processes (so with two
    processes it can exceed ``seconds``). ``peak_rss_mib`` adds up the peak resident memory of every
    process (an upper bound on their simultaneous total; shared library pages count once per
    process); ``peak_rss_mib_by_process`` maps "this" and each worker pid to its own peak, and
    ``scorers_by_process`` to the scorers it built (one: each process reuses its scorer for every chunk).
    "this" is the calling process's peak during the job when ``peak_rss_reset`` (Linux: its high-water
    mark is reset at the start, :func:`~course_lib.offline.chunk.reset_peak_rss`), else its lifetime peak.
    """

    rows_read: int
    rows_scored: int
    rows_rejected: int
    chunks: int
    chunks_resumed: int
    seconds: float
    rows_per_s: float
    peak_rss_mib: float
    runtime: str
    model_version: str
    output_dir: str
    workers: int = 1
    threads: int = 1
    scored_at: str = ""
    stage_s: dict[str, float] = field(default_factory=dict)
    first_worker_result_s: float = float("nan")
    peak_rss_mib_by_process: dict[str, float] = field(default_factory=dict)
    scorers_by_process: dict[str, int] = field(default_factory=dict)
    peak_rss_reset: bool = False


def default_workers(threads: int = 1) -> int:
    """Processes that fill this machine's usable cores with ``threads`` scoring threads each (>= 1)."""
    return max(1, usable_cores() // integer("threads", threads, min=1))


def recorded_plan(out_dir: str | Path) -> dict | None:
    """The settings a job recorded in ``out_dir/_job.json`` (with its ``scored_at``), or None."""
    path = Path(out_dir) / "_job.json"
    return json.loads(path.read_text()) if path.is_file() else None


def claim_output_dir(
    out_dir: str | Path, plan: dict, *, scored_at: dt.datetime | None = None
) -> tuple[Path, dt.datetime]:
    """Create ``out_dir`` for a job with settings ``plan``, or accept it if it holds the same job.

    Records ``plan`` and the job's ``scored_at`` in ``_job.json``, removes ``_SUCCESS`` (the job is
    running again) and the temporary files of a killed run. Returns the folder and the ``scored_at``
    every part of this job carries: the recorded one when resuming, else ``scored_at`` or now (UTC, whole
    seconds).

    Raises
    ------
    ValueError
        If the folder holds a job with other settings (another model version, chunk size, source or
        runtime: a resumed job never mixes two, and a folder is never shared by two jobs), part files
        of an unknown job, or a recorded ``scored_at`` other than the one given. Call it only after
        every argument has been checked, so a refused call records nothing.
    """
    out = Path(out_dir)
    if scored_at is not None:
        if scored_at.tzinfo is None:
            raise ValueError(f"scored_at must carry a time zone (e.g. datetime.UTC), got {scored_at!r}")
        scored_at = scored_at.astimezone(dt.UTC).replace(microsecond=0)
    previous = recorded_plan(out)
    if previous is not None:
        recorded_at = previous.pop("scored_at", None)
        if previous != plan:
            raise ValueError(
                f"{out} holds a job with other settings {previous}; resume it with those or use a new out_dir"
            )
        if recorded_at is not None:
            recorded = dt.datetime.fromisoformat(recorded_at)
            if scored_at is not None and scored_at != recorded:
                raise ValueError(f"{out} holds a job scored_at {recorded_at}, not {scored_at.isoformat()}")
            scored_at = recorded
    elif out.is_dir() and any(out.glob("part-*.parquet")):
        raise ValueError(f"{out} holds part files of an unknown job; use a new out_dir")
    stamp = scored_at or dt.datetime.now(dt.UTC).replace(microsecond=0)
    out.mkdir(parents=True, exist_ok=True)
    (out / "_job.json").write_text(json.dumps({**plan, "scored_at": stamp.isoformat()}))
    (out / "_SUCCESS").unlink(missing_ok=True)
    for leftover in out.glob(".*.parquet.*.tmp"):
        leftover.unlink(missing_ok=True)
    return out, stamp


def same_output(a: str | Path, b: str | Path) -> bool:
    """Whether two job folders hold the same part and reject files (names and bytes).

    Two runs of one job with the same ``scored_at`` write identical files however many processes (or
    Dask workers) scored them, and a resumed run writes what an uninterrupted one would have.
    """

    def files(folder: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(Path(folder).glob("*.parquet"))}

    return files(Path(a)) == files(Path(b))


def _resumed_rows(task: ChunkTask) -> tuple[int, int]:
    """(scored, rejected) rows of a chunk finished by an earlier run, from its files' metadata."""
    scored = pq.ParquetFile(task.part_path()).metadata.num_rows
    rejects = task.rejects_path()
    return scored, pq.ParquetFile(rejects).metadata.num_rows if rejects.is_file() else 0


def _resumed_counts(tasks: list[ChunkTask]) -> dict[str, int]:
    """The job's row counts before it starts: ``scored``, ``rejected`` and ``resumed_rows`` of the parts
    already written (a resumed job), ``read`` 0 (rows this run reads)."""
    counts = {"read": 0, "scored": 0, "rejected": 0, "resumed_rows": 0}
    for task in tasks:
        if task.part_path().is_file():
            scored, rejected = _resumed_rows(task)
            counts["scored"] += scored
            counts["rejected"] += rejected
            counts["resumed_rows"] += scored + rejected
    return counts


@dataclass
class _Tally:
    """What the finished chunks add up to, as they arrive (``run_chunks``' ``on_result``): row counts,
    seconds per stage, each process's peak RSS (MiB) and scorers built, and the progress bar."""

    counts: dict[str, int]
    bar: tqdm
    stage_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    peaks: dict[str, float] = field(default_factory=dict)
    scorers: dict[str, int] = field(default_factory=dict)

    def record(self, result: ChunkResult) -> None:
        self.counts["read"] += result.rows
        self.counts["scored"] += result.scored
        self.counts["rejected"] += result.rejected
        for stage, seconds in result.stage_s.items():
            self.stage_s[stage] += seconds
        key = "this" if result.pid == os.getpid() else str(result.pid)
        self.peaks[key] = max(self.peaks.get(key, 0.0), result.peak_rss_mib)
        self.scorers[key] = result.scorers_built
        self.bar.update(result.rows)


def score_store(
    source: str | Path,
    out_dir: str | Path,
    model: ChurnModel,
    *,
    runtime: str = "xgboost",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    workers: int | None = None,
    threads: int = 1,
    scored_at: dt.datetime | None = None,
    progress: bool = True,
) -> JobSummary:
    """Run the batch job: every chunk of ``source`` scored into ``out_dir`` (see the module docstring).

    :func:`course_lib.offline.resumable.score_resumable` hardened (the module docstring says how).

    Parameters
    ----------
    source : path of a ``.parquet`` or ``.sqlite`` store.
    out_dir : path
        Output folder. Re-running with the same folder resumes: chunks whose part file exists are
        skipped; other settings in it are refused (:func:`claim_output_dir`).
    model : course_lib.churn.model.ChurnModel
    runtime : one of :data:`course_lib.core.vocabulary.BATCH_RUNTIMES`
    chunk_rows : int >= 1
        Rows per chunk (and per part file); a multiple of the store's row group size reads each row
        group once.
    workers : int >= 1, optional
        Processes scoring at once, this one included; default :func:`default_workers` (every usable
        core). ``1`` is the single-process job. The files do not depend on it.
    threads : int >= 1
        Scoring threads per process.
    scored_at : datetime, optional
        The job's timestamp, with a time zone (default: now, or the recorded one when resuming).
    progress : bool
        Show a tqdm bar.

    Notes
    -----
    With ``workers > 1`` a script that calls this needs multiprocessing's usual
    ``if __name__ == "__main__":`` guard: worker processes start from a fork server (or are spawned),
    which imports the script's module again.

    Raises
    ------
    ValueError
        For an unknown runtime, bad counts, or an output folder holding another job.
    FileNotFoundError
        If ``source`` does not exist.
    """
    one_of("runtime", runtime, BATCH_RUNTIMES)
    threads = integer("threads", threads, min=1)
    workers = default_workers(threads) if workers is None else integer("workers", workers, min=1)
    plan = plan_chunks(source, chunk_rows)
    spec = scorer_spec(model, runtime, threads=threads)
    settings = {"source": plan.source, "chunk_rows": chunk_rows, "model_version": model.model_version,
                "runtime": runtime}  # fmt: skip
    out, stamp = claim_output_dir(out_dir, settings, scored_at=scored_at)
    stamp_us = int(stamp.timestamp() * 1_000_000)
    tasks = [ChunkTask(plan, i, str(out), spec, stamp_us) for i in range(plan.n_chunks)]
    todo = [t for t in tasks if not t.part_path().is_file()]
    counts = _resumed_counts(tasks)
    bar = tqdm(total=plan.rows, initial=counts["resumed_rows"], unit="rows", unit_scale=True,
               disable=not progress, desc="scoring")  # fmt: skip
    tally = _Tally(counts, bar)
    stage_s, peaks, scorers = tally.stage_s, tally.peaks, tally.scorers
    peak_reset = reset_peak_rss()  # "this" process's peak is then the job's, not the caller's lifetime one
    start = time.perf_counter()
    with bar:
        pool = run_chunks(todo, workers=workers, on_result=tally.record)
    seconds = time.perf_counter() - start
    peaks["this"] = peak_rss_mib()
    summary = JobSummary(
        counts["read"] + counts["resumed_rows"], counts["scored"], counts["rejected"], plan.n_chunks,
        plan.n_chunks - len(todo), seconds, counts["read"] / seconds if seconds else float("nan"),
        sum(peaks.values()), runtime, model.model_version, str(out), 1 + pool["worker_processes"], threads,
        stamp.isoformat(), stage_s, pool["first_worker_result_s"], peaks, scorers, peak_reset,
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
    parser.add_argument("--runtime", choices=[*BATCH_RUNTIMES, "auto"], default="auto")
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--workers", type=int, default=None, help="processes (default: every usable core)")
    parser.add_argument("--threads", type=int, default=1, help="scoring threads per process (default 1)")
    parser.add_argument("--scored-at", type=dt.datetime.fromisoformat, default=None,
                        help="the job's timestamp, ISO 8601 with a time zone (default: now)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if (args.workers or default_workers(args.threads)) > 1:
        warm_up_workers()  # the fork server imports its modules while this process loads the model
    # the training stack (scikit-learn) loads only for the command, while the fork server starts
    from course_lib.churn.model import load_or_train_churn_model  # noqa: PLC0415 (heavy optional dependency)

    source = Path(args.source) if args.source else build_parquet_store(args.customers, args.seed)
    model = load_or_train_churn_model()
    runtime = args.runtime
    recorded = recorded_plan(args.out)
    if runtime == "auto" and recorded is not None:
        runtime = recorded["runtime"]  # resuming: keep the runtime the job started with
    if runtime == "auto":
        first = read_chunk(plan_chunks(source, min(args.chunk_rows, 50_000)), 0)
        runtime, _table = choose_runtime(model, first, threads=args.threads)
    summary = score_store(
        source,
        args.out,
        model,
        runtime=runtime,
        chunk_rows=args.chunk_rows,
        workers=args.workers,
        threads=args.threads,
        scored_at=args.scored_at,
        progress=not args.no_progress,
    )
    print(json.dumps(asdict(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
