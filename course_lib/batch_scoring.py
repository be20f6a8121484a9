"""Score every customer as a batch job: chunked, resumable, bad rows rejected with a reason, Parquet out.

The weekly job of source lesson 000's fourth architecture ("score 1,000,000 customer records in a
scheduled Sunday batch job on a spot instance"), run for real:

* **Read** customers in chunks of ``chunk_rows`` from an offline store: a Parquet file
  (:func:`build_parquet_store`, read with ``pyarrow`` row batch by row batch) or the Lesson 2 SQLite
  feature store (by ``rowid`` range; much slower to read, since every value crosses into Python).
* **Check** every row against the one feature schema (:mod:`course_lib.feature_schema`): a row with a
  missing or out-of-range feature is never scored and never dropped silently; it goes to a reject file
  with its reason.
* **Score** with XGBoost (the pipeline's own ``predict_proba``, which uses the booster's served
  iteration range) or ONNX Runtime, whichever :func:`choose_runtime` measures faster on one chunk.
* **Write** ``part-00000.parquet``, ... with ``customer_id, churn_probability, model_version,
  scored_at`` (and ``rejects-00000.parquet``): each file is written under a temporary name and renamed
  when complete, the rejects before the part, so a part file's presence means its chunk is done. A job
  that is interrupted restarts from the first missing part: no row is scored twice or lost.
  ``_SUCCESS`` (a JSON summary) is written last.

Memory is bounded by the chunk, not by the population.

Command line: ``python -m course_lib.batch_scoring --customers 1000000 --out build/scores``
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
import sqlite3
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from course_lib.bench import compare_latency
from course_lib.data import CATEGORICAL_LEVELS, DATA_DIR, FEATURE_COLUMNS, ID_COLUMN, make_customers
from course_lib.feature_schema import NUMERIC_SCHEMA

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "RUNTIMES",
    "SEED_000_ROWS_PER_S",
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

DEFAULT_CHUNK_ROWS = 100_000
RUNTIMES = ("xgboost", "onnxruntime")
#: Source lesson 000: 1,000,000 records in 12 minutes.
SEED_000_ROWS_PER_S = 1_000_000 / (12 * 60)
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


def build_parquet_store(
    n_customers: int = 1_000_000,
    seed: int = 0,
    *,
    folder: str | Path | None = None,
    generate_rows: int = 1_000_000,
    row_group_rows: int = DEFAULT_CHUNK_ROWS,
) -> Path:
    """Write a synthetic population's ids and 19 features to one Parquet file (reused if present).

    Customers are generated ``generate_rows`` at a time: block ``k`` is ``make_customers(rows, seed + k)``
    with ids continuing from the previous block, so up to ``generate_rows`` customers the store holds
    exactly the population of the Lesson 2 SQLite store, and larger stores need only one block in
    memory. Written to a temporary file and renamed when complete. Row groups of ``row_group_rows``
    let a reader (or a Dask task) take one range without reading the rest.

    Raises ``ValueError`` for non-positive sizes.
    """
    for name, value in (
        ("n_customers", n_customers),
        ("generate_rows", generate_rows),
        ("row_group_rows", row_group_rows),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    base = Path(folder) if folder is not None else DATA_DIR.parent / "build" / "offline_store"
    path = base / f"customers_n{n_customers}_seed{seed}_rg{row_group_rows}.parquet"
    if path.is_file():
        return path
    base.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    width = max(7, len(str(n_customers)))
    schema = None
    with pq.ParquetWriter(tmp, _store_schema()) as writer:
        for k, start in enumerate(range(0, n_customers, generate_rows)):
            rows = min(generate_rows, n_customers - start)
            block = make_customers(rows, seed + k)[[ID_COLUMN, *FEATURE_COLUMNS]]
            block[ID_COLUMN] = [f"SC-{i:0{width}d}" for i in range(start + 1, start + rows + 1)]
            table = pa.Table.from_pandas(block, schema=schema or _store_schema(), preserve_index=False)
            writer.write_table(table, row_group_size=row_group_rows)
    os.replace(tmp, path)
    return path


def _store_schema() -> pa.Schema:
    fields = [pa.field(ID_COLUMN, pa.string())]
    for name in FEATURE_COLUMNS:
        if name in CATEGORICAL_LEVELS:
            fields.append(pa.field(name, pa.string()))
        elif name in ("monthly_charges", "total_charges"):
            fields.append(pa.field(name, pa.float64()))
        else:
            fields.append(pa.field(name, pa.int64()))
    return pa.schema(fields)


def iter_store_chunks(
    source: str | Path, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> Iterator[tuple[int, pd.DataFrame]]:
    """Yield ``(chunk_index, frame)`` with ``customer_id`` and the 19 features, ``chunk_rows`` at a time.

    ``source`` is a ``.parquet`` offline store or a ``.sqlite`` feature store. Raises
    ``FileNotFoundError`` if it does not exist and ``ValueError`` for another suffix or ``chunk_rows < 1``.
    """
    path = Path(source)
    _check_store(path, chunk_rows)
    columns = [ID_COLUMN, *FEATURE_COLUMNS]
    if path.suffix == ".parquet":
        batches = pq.ParquetFile(path).iter_batches(batch_size=chunk_rows, columns=columns)
        for i, batch in enumerate(batches):
            yield i, batch.to_pandas()
    elif path.suffix == ".sqlite":
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            last = con.execute("SELECT MAX(rowid) FROM features").fetchone()[0] or 0
            sql = f"SELECT {', '.join(columns)} FROM features WHERE rowid > ? AND rowid <= ? ORDER BY rowid"
            for i, lo in enumerate(range(0, last, chunk_rows)):
                yield i, pd.DataFrame(con.execute(sql, (lo, lo + chunk_rows)).fetchall(), columns=columns)
        finally:
            con.close()


def _shown(value: object) -> str:
    plain = value.item() if isinstance(value, np.generic) else value
    return repr(plain)


def row_problems(X: pd.DataFrame) -> np.ndarray:
    """Per row, the first schema violation as text (``None`` for a valid row), shape ``(len(X),)``.

    The same ranges as :func:`course_lib.feature_schema.check_frame`, row by row instead of raising on
    the first: a missing or repeated ``customer_id`` (within the chunk; ids are unique across a store
    built by :func:`build_parquet_store`), a missing flag or category, an unknown category, a number outside its range, a
    non-integer where an integer is required. Missing ``tenure``/charges are allowed (the model
    handles them), as the schema says.
    """
    reasons = np.full(len(X), None, dtype=object)
    ids = X[ID_COLUMN]
    reasons[ids.isna().to_numpy()] = f"{ID_COLUMN} is missing"
    repeated = ids.duplicated(keep="first").to_numpy() & ids.notna().to_numpy()
    reasons[repeated] = f"{ID_COLUMN} appears earlier in the same chunk"
    for name, spec in NUMERIC_SCHEMA.items():
        values = pd.to_numeric(X[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        not_number = X[name].notna().to_numpy() & np.isnan(values)
        missing = X[name].isna().to_numpy()
        bad = not_number | (
            ~np.isnan(values) & ((values < spec.low) | (values > spec.high) | ~np.isfinite(values))
        )
        if spec.integer:
            bad |= ~np.isnan(values) & np.isfinite(values) & (values != np.round(values))
        if not spec.missing_allowed:
            bad |= missing
        for i in np.flatnonzero(bad & (reasons == None)):  # noqa: E711 (elementwise on an object array)
            reasons[i] = f"{name}={_shown(X[name].iloc[i])}: must be {spec.describe()}"
    for name, levels in CATEGORICAL_LEVELS.items():
        bad = ~X[name].isin(levels).to_numpy()
        for i in np.flatnonzero(bad & (reasons == None)):  # noqa: E711
            reasons[i] = f"{name}={_shown(X[name].iloc[i])}: must be one of {list(levels)}"
    return reasons


def _served_iteration_range(clf: object) -> tuple[int, int]:
    """The trees ``predict_proba`` uses: up to the best iteration of an early-stopped model, else all."""
    try:
        return 0, int(clf.best_iteration) + 1
    except AttributeError:  # trained without early stopping
        return 0, 0


def _xgboost_batch_scorer(pipeline: object, threads: int):
    """Encode with the fitted one-hot categories in NumPy, then ``inplace_predict`` on the booster.

    The same numbers as ``pipeline.predict_proba`` (a test checks it), several times faster on large
    chunks: scikit-learn's ``OneHotEncoder.transform`` maps strings to codes one value at a time in
    Python, ``pandas.Categorical`` does it in C. Only rows that passed :func:`row_problems` reach it.
    """
    pre, clf = pipeline.named_steps["preprocess"], pipeline[-1]
    (_, encoder, cat_cols), (_, _, num_cols) = pre.transformers_[0], pre.transformers_[1]
    categories = [list(c) for c in encoder.categories_]
    width = sum(len(c) for c in categories) + len(num_cols)
    booster, iterations = clf.get_booster().copy(), _served_iteration_range(clf)
    booster.set_param({"nthread": threads})  # a copy: the served model keeps its own thread setting

    def score(X: pd.DataFrame) -> np.ndarray:
        encoded = np.zeros((len(X), width), dtype=np.float32)
        col = 0
        for name, levels in zip(cat_cols, categories, strict=True):
            codes = pd.Categorical(X[name], categories=levels).codes
            if (codes < 0).any():
                raise ValueError(
                    f"column {name!r} holds a level outside {levels}; check rows with row_problems"
                )
            encoded[np.arange(len(X)), col + codes] = 1.0
            col += len(levels)
        encoded[:, col:] = X[list(num_cols)].to_numpy(dtype=np.float32, na_value=np.nan)
        margin = booster.inplace_predict(encoded, iteration_range=iterations, predict_type="value")
        return np.asarray(margin, dtype=np.float64).reshape(len(X), -1)[:, -1]

    return score


def make_scorer(model: object, runtime: str, *, onnx_model: object | None = None, threads: int = 1):
    """A function ``DataFrame of the 19 features -> churn probabilities (float64, shape (n,))``.

    ``runtime="xgboost"``: the fitted pipeline's encoding and booster (:func:`_xgboost_batch_scorer`);
    ``"onnxruntime"``: a pinned one-thread session of ``onnx_model`` (exported from the pipeline if not
    given). ``threads``: XGBoost ``nthread`` or ONNX Runtime ``intra_op_num_threads`` (a batch job that
    owns the machine may use every core; the online service stays at 1). Raises ``ValueError`` for
    another runtime or ``threads < 1``.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if runtime == "xgboost":
        return _xgboost_batch_scorer(model.pipeline, threads)
    if runtime == "onnxruntime":
        from course_lib.export import OnnxChurnScorer, make_session, pipeline_to_onnx

        onnx_model = onnx_model if onnx_model is not None else pipeline_to_onnx(model.pipeline)
        scorer = OnnxChurnScorer(make_session(onnx_model, intra_op_num_threads=threads))
        return lambda X: np.asarray(scorer.predict_proba(X), dtype=np.float64)
    raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")


def choose_runtime(
    model: object, sample: pd.DataFrame, *, rounds: int = 3, threads: int = 1
) -> tuple[str, pd.DataFrame]:
    """Time both runtimes on ``sample`` (one chunk) side by side; return the faster and the table.

    Uses :func:`course_lib.bench.compare_latency` (interleaved rounds, one warm-up call each).
    """
    X = sample[list(FEATURE_COLUMNS)]
    scorers = {r: make_scorer(model, r, threads=threads) for r in RUNTIMES}
    table = compare_latency(
        {r: (lambda f=f: f(X)) for r, f in scorers.items()},
        n_calls=1,
        rounds=rounds,
        warmup_calls=1,
        items_per_call=len(X),
    )
    return str(table["median_us"].idxmin()), table


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


def _check_store(source: str | Path, chunk_rows: int) -> None:
    """Refuse a missing store, a bad chunk size or a store without the id and feature columns."""
    path = Path(source)
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive integer, got {chunk_rows!r}")
    if not path.is_file():
        raise FileNotFoundError(f"store not found: {path}")
    if path.suffix == ".parquet":
        names = set(pq.ParquetFile(path).schema_arrow.names)
    elif path.suffix == ".sqlite":
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            names = {row[1] for row in con.execute("PRAGMA table_info(features)")}
        finally:
            con.close()
    else:
        raise ValueError(f"source must be a .parquet or .sqlite store, got {path.name!r}")
    missing = [c for c in (ID_COLUMN, *FEATURE_COLUMNS) if c not in names]
    if missing:
        raise ValueError(f"store {path.name} lacks the columns {missing}")


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
    a resumed job never mixes two models. ``model`` is a :class:`course_lib.model.ChurnModel`.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    scorer = make_scorer(model, runtime, threads=threads)
    _check_store(source, chunk_rows)
    plan = {
        "source": str(Path(source).resolve()),
        "chunk_rows": chunk_rows,
        "model_version": model.model_version,
        "runtime": runtime,
    }
    out = claim_output_dir(out_dir, plan)
    scorer = make_scorer(model, runtime, threads=threads)
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
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.batch_scoring", description=__doc__.split("\n")[0]
    )
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
    from course_lib.model import load_or_train_churn_model

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
