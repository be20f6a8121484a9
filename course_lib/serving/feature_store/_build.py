"""Building the churn feature store: the features of a ``make_customers`` population written to SQLite.

One concept: the file. ``build_feature_store`` writes every customer's 19 features to one SQLite table
whose ``customer_id`` is the primary key (so SQLite keeps a B-tree index on it), atomically and
idempotently, and ``feature_store_path`` says where the file of a population lives. Reading it is
``course_lib.serving.feature_store._lookup`` (which re-exports these names).

References
----------
SQLite documentation, "CREATE TABLE" (rowid tables and the PRIMARY KEY index), "PRAGMA journal_mode".
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from course_lib.churn.data import (
    CATEGORICAL_LEVELS,
    DATA_DIR,
    FEATURE_COLUMNS,
    ID_COLUMN,
    make_customers,
)
from course_lib.core.checks import integer
from course_lib.core.files import atomic_path, leftover_temporaries

DEFAULT_N_CUSTOMERS = 1_000_000
DEFAULT_SEED = 0
#: Bump when the table layout changes; part of the file name, so an old file is never misread.
SCHEMA_VERSION = 1

#: The table that holds one row per customer.
TABLE = "features"
_REAL_COLUMNS = ("monthly_charges", "total_charges")


def _sql_type(column: str) -> str:
    if column in CATEGORICAL_LEVELS:
        return "TEXT NOT NULL"
    if column == "total_charges":
        return "REAL"  # NULL for customers with tenure 0, as in IBM's file
    if column in _REAL_COLUMNS:
        return "REAL NOT NULL"
    return "INTEGER NOT NULL"


def customer_id(index: int, n_customers: int) -> str:
    """The id ``make_customers(n_customers)`` gives its ``index``-th customer (1-based), e.g. ``SC-0000042``.

    Raises
    ------
    ValueError
        If ``index`` is not in 1..n_customers.
    """
    index = integer("index", index, min=1, max=n_customers)
    width = max(7, len(str(n_customers)))  # the width make_customers uses
    return f"SC-{index:0{width}d}"


def feature_store_path(
    n_customers: int = DEFAULT_N_CUSTOMERS, seed: int = DEFAULT_SEED, folder: str | Path | None = None
) -> Path:
    """Where the store of population (n_customers, seed) lives: ``build/feature_store/`` by default."""
    n_customers, seed = integer("n_customers", n_customers, min=1), integer("seed", seed, min=0)
    base = Path(folder) if folder is not None else DATA_DIR.parent / "build" / "feature_store"
    return base / f"customers_n{n_customers}_seed{seed}_v{SCHEMA_VERSION}.sqlite"


@dataclass(frozen=True)
class FeatureStoreBuild:
    """What ``build_feature_store`` did: the file, whether it was built or reused, and how long it took."""

    path: Path
    n_customers: int
    seed: int
    built: bool
    seconds: float
    size_bytes: int


def read_meta(path: Path) -> dict[str, str] | None:
    """The ``meta`` table of a store file as a dict, or None if the file is absent or not a store."""
    if not path.is_file():
        return None
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return dict(con.execute("SELECT key, value FROM meta").fetchall())
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return None


def _is_complete(path: Path, n_customers: int, seed: int) -> bool:
    meta = read_meta(path) or {}
    expected = {
        "complete": "1",
        "schema_version": str(SCHEMA_VERSION),
        "n_customers": str(n_customers),
        "seed": str(seed),
        "rows": str(n_customers),
    }
    return all(meta.get(key) == value for key, value in expected.items())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _remove_stale_temporaries(path: Path) -> list[Path]:
    """Delete half-written temporary stores (``course_lib.core.files.atomic_path``) whose builder has gone.

    A kernel restarted in the middle of a build leaves its temporary file (~150 MB) behind; a build
    still running in another live process keeps its own.
    """
    removed = []
    for tmp, pid in leftover_temporaries(path):
        if pid != os.getpid() and _pid_alive(pid):
            continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def build_feature_store(
    n_customers: int = DEFAULT_N_CUSTOMERS,
    seed: int = DEFAULT_SEED,
    *,
    folder: str | Path | None = None,
    rebuild: bool = False,
) -> FeatureStoreBuild:
    """Write the features of ``make_customers(n_customers, seed)`` to SQLite, unless already there.

    Idempotent: a finished store for the same (n_customers, seed, schema) is reused. The database is
    written to a temporary file and renamed into place only when complete, so an interrupted build
    never leaves a half-filled store behind; the next build deletes temporaries that an interrupted
    build (a restarted kernel) left behind. 1,000,000 customers take a few seconds and ~150 MB.

    Parameters
    ----------
    n_customers : int
        Population size, >= 1.
    seed : int
        Seed of ``make_customers``, >= 0.
    folder : str or Path, optional
        Directory for the file; default ``build/feature_store`` in the repository.
    rebuild : bool
        Build again even if a finished store exists.

    Returns
    -------
    FeatureStoreBuild

    Raises
    ------
    ValueError
        If ``n_customers`` or ``seed`` is not a valid integer.
    """
    n_customers, seed = integer("n_customers", n_customers, min=1), integer("seed", seed, min=0)
    path = feature_store_path(n_customers, seed, folder)
    start = time.perf_counter()
    if not rebuild and _is_complete(path, n_customers, seed):
        return FeatureStoreBuild(
            path, n_customers, seed, False, time.perf_counter() - start, path.stat().st_size
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(path)
    with atomic_path(path) as tmp:
        _write_store(tmp, n_customers, seed)
    return FeatureStoreBuild(path, n_customers, seed, True, time.perf_counter() - start, path.stat().st_size)


def _write_store(tmp: Path, n_customers: int, seed: int) -> None:
    """The whole SQLite store of ``make_customers(n_customers, seed)`` into the new file ``tmp``."""
    frame = make_customers(n_customers, seed)
    columns: list[list[object]] = [frame[ID_COLUMN].astype(object).tolist()]
    for col in FEATURE_COLUMNS:
        values = frame[col]
        if col in CATEGORICAL_LEVELS:
            columns.append(values.astype(object).tolist())
        elif col == "total_charges":
            columns.append([None if math.isnan(v) else v for v in values.tolist()])
        else:
            columns.append(values.tolist())
    del frame
    con = sqlite3.connect(tmp)
    try:
        con.execute("PRAGMA journal_mode=OFF")  # a fresh temp file: nothing to roll back to
        con.execute("PRAGMA synchronous=OFF")
        ddl = ", ".join(f"{col} {_sql_type(col)}" for col in FEATURE_COLUMNS)
        con.execute(f"CREATE TABLE {TABLE} ({ID_COLUMN} TEXT PRIMARY KEY NOT NULL, {ddl})")
        con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        placeholders = ", ".join("?" * (len(FEATURE_COLUMNS) + 1))
        with con:
            con.executemany(f"INSERT INTO {TABLE} VALUES ({placeholders})", zip(*columns, strict=True))
            meta = {
                "schema_version": SCHEMA_VERSION,
                "n_customers": n_customers,
                "seed": seed,
                "rows": con.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0],
                "complete": 1,
            }
            con.executemany("INSERT INTO meta VALUES (?, ?)", [(k, str(v)) for k, v in meta.items()])
    finally:
        con.close()
