"""The offline store a batch job reads: customers and their 19 features in a Parquet file, in chunks.

One concept: where the batch job's rows come from. :func:`build_parquet_store` writes a synthetic
population to one Parquet file with row groups (a reader, or one worker, takes one range without
reading the rest). :func:`plan_chunks` cuts a store into chunks of ``chunk_rows`` consecutive rows and
:func:`read_chunk` reads one of them as an Arrow table, the categorical columns as Arrow dictionaries
(so that mapping them to model codes costs one lookup per distinct value, not per row); any process can
read any chunk, so chunks can be scored in parallel and memory is bounded by the chunk.
:func:`iter_store_chunks` yields the chunks as pandas frames, for looking at them. The Lesson 2 SQLite
feature store is read by ``rowid`` range (much slower, since every value crosses into Python).
``course_lib.offline.job`` re-exports these names.

References
----------
Apache Parquet format (row groups); pyarrow documentation, ``ParquetWriter`` and
``ParquetFile.iter_batches``.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from course_lib.churn.data import CATEGORICAL_LEVELS, DATA_DIR, FEATURE_COLUMNS, ID_COLUMN, make_customers
from course_lib.core.checks import integer
from course_lib.core.files import atomic_path
from course_lib.serving.feature_store import TABLE

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "STORE_FORMAT",
    "ChunkPlan",
    "build_parquet_store",
    "check_store",
    "iter_store_chunks",
    "plan_chunks",
    "read_chunk",
]

DEFAULT_CHUNK_ROWS = 100_000


#: The layout ``build_parquet_store`` writes (raised whenever it changes: encodings, columns, row groups).
STORE_FORMAT = 2


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
    let a reader (or a Dask task) take one range without reading the rest. The file name holds the sizes,
    the seed and :data:`STORE_FORMAT`, so a store that older code wrote in another layout is not reused.

    Raises ``ValueError`` for non-positive sizes.
    """
    for name, value in (
        ("n_customers", n_customers),
        ("generate_rows", generate_rows),
        ("row_group_rows", row_group_rows),
    ):
        integer(name, value, min=1)
    base = Path(folder) if folder is not None else DATA_DIR.parent / "build" / "offline_store"
    path = base / f"customers_n{n_customers}_seed{seed}_rg{row_group_rows}_v{STORE_FORMAT}.parquet"
    if path.is_file():
        return path
    base.mkdir(parents=True, exist_ok=True)
    width = max(7, len(str(n_customers)))
    # every column dictionary-encoded except the unique ids, for which a dictionary only costs time
    with (
        atomic_path(path) as tmp,
        pq.ParquetWriter(tmp, _store_schema(), use_dictionary=list(FEATURE_COLUMNS)) as writer,
    ):
        for k, start in enumerate(range(0, n_customers, generate_rows)):
            rows = min(generate_rows, n_customers - start)
            block = make_customers(rows, seed + k)[[ID_COLUMN, *FEATURE_COLUMNS]]
            block[ID_COLUMN] = [f"SC-{i:0{width}d}" for i in range(start + 1, start + rows + 1)]
            table = pa.Table.from_pandas(block, schema=_store_schema(), preserve_index=False)
            writer.write_table(table, row_group_size=row_group_rows)
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
    chunk_rows = integer("chunk_rows", chunk_rows, min=1)
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


@dataclass(frozen=True)
class ChunkPlan:
    """A store cut into chunks of ``chunk_rows`` consecutive rows; chunk ``i`` is rows ``bounds(i)``.

    Attributes
    ----------
    source : str
        Absolute path of the ``.parquet`` or ``.sqlite`` store.
    rows : int
        Rows in a Parquet store; for SQLite the largest ``rowid`` (chunks are ``rowid`` ranges).
    chunk_rows : int
    """

    source: str
    rows: int
    chunk_rows: int

    @property
    def n_chunks(self) -> int:
        return -(-self.rows // self.chunk_rows)

    def bounds(self, i: int) -> tuple[int, int]:
        """``(start, stop)``: rows ``start <= r < stop`` (0-based; SQLite ``rowid`` = r + 1)."""
        if not 0 <= i < self.n_chunks:
            raise IndexError(f"chunk {i} outside 0..{self.n_chunks - 1}")
        return i * self.chunk_rows, min((i + 1) * self.chunk_rows, self.rows)


def plan_chunks(source: str | Path, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> ChunkPlan:
    """Cut ``source`` into chunks (see :class:`ChunkPlan`); the same errors as :func:`check_store`."""
    path = Path(source).resolve()
    check_store(path, chunk_rows)
    if path.suffix == ".parquet":
        rows = _parquet_file(str(path), *_identity(path)).metadata.num_rows
    else:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute(f"SELECT MAX(rowid) FROM {TABLE}").fetchone()[0] or 0
        finally:
            con.close()
    return ChunkPlan(str(path), int(rows), chunk_rows)


def _identity(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=4)
def _parquet_file(path: str, _mtime_ns: int, _size: int) -> pq.ParquetFile:
    """One open reader per store file and version, kept by each process (a worker reads many chunks)."""
    names = pq.read_schema(path)
    text = [f.name for f in names if f.name in CATEGORICAL_LEVELS and pa.types.is_string(f.type)]
    return pq.ParquetFile(path, read_dictionary=text)


def read_chunk(plan: ChunkPlan, i: int) -> pa.Table:
    """Chunk ``i`` of ``plan`` as an Arrow table: ``customer_id`` and the 19 features.

    Categorical string columns of a Parquet store come back as dictionary arrays (read straight from
    Parquet's own dictionary encoding, one thread). Only the row groups the chunk overlaps are read.
    """
    start, stop = plan.bounds(i)
    columns = [ID_COLUMN, *FEATURE_COLUMNS]
    path = Path(plan.source)
    if path.suffix == ".sqlite":
        sql = f"SELECT {', '.join(columns)} FROM {TABLE} WHERE rowid > ? AND rowid <= ? ORDER BY rowid"
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            frame = pd.DataFrame(con.execute(sql, (start, stop)).fetchall(), columns=columns)
        finally:
            con.close()
        return pa.Table.from_pandas(frame, preserve_index=False)
    reader = _parquet_file(str(path), *_identity(path))
    meta, groups, first, offset = reader.metadata, [], None, 0
    for g in range(meta.num_row_groups):
        size = meta.row_group(g).num_rows
        if offset < stop and offset + size > start:
            groups.append(g)
            first = offset if first is None else first
        offset += size
    table = reader.read_row_groups(groups, columns=columns, use_threads=False)
    return table.slice(start - (first or 0), stop - start)
