"""The offline store a batch job reads: customers and their 19 features in a Parquet file, in chunks.

One concept: where the batch job's rows come from. :func:`build_parquet_store` writes a synthetic
population to one Parquet file with row groups (a reader, or one Dask task, takes one range without
reading the rest); :func:`iter_store_chunks` reads that file, or the Lesson 2 SQLite feature store (by
``rowid`` range; much slower, since every value crosses into Python), ``chunk_rows`` at a time, so memory
is bounded by the chunk. ``course_lib.offline.job`` re-exports these names.

References
----------
Apache Parquet format (row groups); pyarrow documentation, ``ParquetWriter`` and
``ParquetFile.iter_batches``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from course_lib.churn.data import CATEGORICAL_LEVELS, DATA_DIR, FEATURE_COLUMNS, ID_COLUMN, make_customers
from course_lib.serving.feature_store import TABLE

__all__ = ["DEFAULT_CHUNK_ROWS", "build_parquet_store", "check_store", "iter_store_chunks"]

DEFAULT_CHUNK_ROWS = 100_000


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
    check_store(path, chunk_rows)
    columns = [ID_COLUMN, *FEATURE_COLUMNS]
    if path.suffix == ".parquet":
        batches = pq.ParquetFile(path).iter_batches(batch_size=chunk_rows, columns=columns)
        for i, batch in enumerate(batches):
            yield i, batch.to_pandas()
    elif path.suffix == ".sqlite":
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            last = con.execute(f"SELECT MAX(rowid) FROM {TABLE}").fetchone()[0] or 0
            sql = f"SELECT {', '.join(columns)} FROM {TABLE} WHERE rowid > ? AND rowid <= ? ORDER BY rowid"
            for i, lo in enumerate(range(0, last, chunk_rows)):
                yield i, pd.DataFrame(con.execute(sql, (lo, lo + chunk_rows)).fetchall(), columns=columns)
        finally:
            con.close()


def check_store(source: str | Path, chunk_rows: int) -> None:
    """Refuse a missing store, a bad chunk size or a store without the id and feature columns.

    Raises ``FileNotFoundError`` for a missing file, ``ValueError`` for ``chunk_rows < 1``, a suffix
    other than ``.parquet``/``.sqlite`` or a store that lacks ``customer_id`` or one of the features.
    """
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
            names = {row[1] for row in con.execute(f"PRAGMA table_info({TABLE})")}
        finally:
            con.close()
    else:
        raise ValueError(f"source must be a .parquet or .sqlite store, got {path.name!r}")
    missing = [c for c in (ID_COLUMN, *FEATURE_COLUMNS) if c not in names]
    if missing:
        raise ValueError(f"store {path.name} lacks the columns {missing}")
