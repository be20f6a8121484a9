"""An online feature store for the churn service: SQLite on disk, with and without an index, plus a cache.

The features of every customer of a ``make_customers`` population live in one SQLite table whose
``customer_id`` is the primary key, so SQLite keeps a B-tree index on it. ``FeatureStore.get`` looks a
customer up through that index (``use_index=True``: a B-tree search, O(log n)) or with the index
switched off by SQLite's ``NOT INDEXED`` clause (``use_index=False``: a full table scan, O(n)) - the
same table and the same query, so the difference you measure is the index alone.
``CachedFeatureStore`` puts a ``cachetools.TTLCache`` keyed by customer id in front and counts hits
and misses.

An unknown customer id is an ordinary outcome, not an error: ``get`` returns ``None``.

References
----------
SQLite documentation, "The INDEXED BY clause" (``NOT INDEXED``) and "EXPLAIN QUERY PLAN".
cachetools documentation, ``TTLCache``.
MLOps course lesson 19 (source 000): "un-indexed feature store queries", cache hit vs miss latency.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cachetools import TTLCache

from course_lib.data import (
    CATEGORICAL_LEVELS,
    DATA_DIR,
    FEATURE_COLUMNS,
    ID_COLUMN,
    make_customers,
)

__all__ = [
    "DEFAULT_CACHE_MAXSIZE",
    "DEFAULT_CACHE_TTL_S",
    "DEFAULT_N_CUSTOMERS",
    "DEFAULT_SEED",
    "LOOKUP_MODES",
    "SCHEMA_VERSION",
    "CachedFeatureStore",
    "FeatureStore",
    "FeatureStoreBuild",
    "build_feature_store",
    "customer_id",
    "feature_store_path",
    "make_lookup",
]

DEFAULT_N_CUSTOMERS = 1_000_000
DEFAULT_SEED = 0
#: Bump when the table layout changes; part of the file name, so an old file is never misread.
SCHEMA_VERSION = 1
#: The three ways the service can fetch features.
LOOKUP_MODES: tuple[str, ...] = ("indexed", "unindexed", "cached")
DEFAULT_CACHE_MAXSIZE = 100_000
DEFAULT_CACHE_TTL_S = 300.0

_TABLE = "features"
_REAL_COLUMNS = ("monthly_charges", "total_charges")


def _sql_type(column: str) -> str:
    if column in CATEGORICAL_LEVELS:
        return "TEXT NOT NULL"
    if column == "total_charges":
        return "REAL"  # NULL for customers with tenure 0, as in IBM's file
    if column in _REAL_COLUMNS:
        return "REAL NOT NULL"
    return "INTEGER NOT NULL"


def _check_population(n_customers: object, seed: object) -> tuple[int, int]:
    if isinstance(n_customers, bool) or not isinstance(n_customers, (int, np.integer)) or n_customers < 1:
        raise ValueError(f"n_customers must be a positive integer, got {n_customers!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(n_customers), int(seed)


def customer_id(index: int, n_customers: int) -> str:
    """The id ``make_customers(n_customers)`` gives its ``index``-th customer (1-based), e.g. ``SC-0000042``.

    Raises
    ------
    ValueError
        If ``index`` is not in 1..n_customers.
    """
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 1 <= index <= n_customers:
        raise ValueError(f"index must be an integer in 1..{n_customers}, got {index!r}")
    width = max(7, len(str(n_customers)))  # the width make_customers uses
    return f"SC-{int(index):0{width}d}"


def feature_store_path(
    n_customers: int = DEFAULT_N_CUSTOMERS, seed: int = DEFAULT_SEED, folder: str | Path | None = None
) -> Path:
    """Where the store of population (n_customers, seed) lives: ``build/feature_store/`` by default."""
    n_customers, seed = _check_population(n_customers, seed)
    base = Path(folder) if folder is not None else DATA_DIR.parent / "build" / "feature_store"
    return base / f"customers_n{n_customers}_seed{seed}_v{SCHEMA_VERSION}.sqlite"


@dataclass(frozen=True)
class FeatureStoreBuild:
    """What ``build_feature_store`` did: the file, whether it was built now or reused, and how long it took."""

    path: Path
    n_customers: int
    seed: int
    built: bool
    seconds: float
    size_bytes: int


def _read_meta(path: Path) -> dict[str, str] | None:
    """The meta table of a finished store, or None if the file is absent or not a finished store."""
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
    meta = _read_meta(path) or {}
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
    """Delete half-written ``<store>.<pid>.<thread>.tmp`` files whose building process has gone.

    A kernel restarted in the middle of a build leaves its temporary file (~150 MB) behind; a build
    still running in another live process keeps its own.
    """
    removed = []
    for tmp in path.parent.glob(f"{path.name}.*.tmp"):
        pid_text = tmp.name[len(path.name) + 1 :].split(".", 1)[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and _pid_alive(int(pid_text)):
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
    n_customers, seed = _check_population(n_customers, seed)
    path = feature_store_path(n_customers, seed, folder)
    start = time.perf_counter()
    if not rebuild and _is_complete(path, n_customers, seed):
        return FeatureStoreBuild(
            path, n_customers, seed, False, time.perf_counter() - start, path.stat().st_size
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.unlink(missing_ok=True)
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
        con.execute(f"CREATE TABLE {_TABLE} ({ID_COLUMN} TEXT PRIMARY KEY NOT NULL, {ddl})")
        con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        placeholders = ", ".join("?" * (len(FEATURE_COLUMNS) + 1))
        with con:
            con.executemany(f"INSERT INTO {_TABLE} VALUES ({placeholders})", zip(*columns, strict=True))
            meta = {
                "schema_version": SCHEMA_VERSION,
                "n_customers": n_customers,
                "seed": seed,
                "rows": con.execute(f"SELECT COUNT(*) FROM {_TABLE}").fetchone()[0],
                "complete": 1,
            }
            con.executemany("INSERT INTO meta VALUES (?, ?)", [(k, str(v)) for k, v in meta.items()])
    finally:
        con.close()
    os.replace(tmp, path)
    return FeatureStoreBuild(path, n_customers, seed, True, time.perf_counter() - start, path.stat().st_size)


class FeatureStore:
    """Read-only access to a built feature store: one customer's 19 features by ``customer_id``.

    Parameters
    ----------
    path : str or Path
        A file written by ``build_feature_store``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not a finished feature store of this schema version.

    Notes
    -----
    One connection, shared by threads under a lock (the HTTP server runs in its own thread).
    Use ``FeatureStore.open(n_customers, seed)`` to build-or-reuse and open in one call.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"feature store not found: {self.path}; create it with build_feature_store()"
            )
        meta = _read_meta(self.path)
        if meta is None or meta.get("complete") != "1" or meta.get("schema_version") != str(SCHEMA_VERSION):
            raise ValueError(
                f"{self.path} is not a finished feature store of schema version {SCHEMA_VERSION} "
                f"(meta: {meta}); rebuild it with build_feature_store(..., rebuild=True)"
            )
        self.n_customers = int(meta["n_customers"])
        self.seed = int(meta["seed"])
        self._con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()
        select = ", ".join(FEATURE_COLUMNS)
        self._sql = {
            True: f"SELECT {select} FROM {_TABLE} WHERE {ID_COLUMN} = ?",
            False: f"SELECT {select} FROM {_TABLE} NOT INDEXED WHERE {ID_COLUMN} = ?",
        }

    @classmethod
    def open(
        cls,
        n_customers: int = DEFAULT_N_CUSTOMERS,
        seed: int = DEFAULT_SEED,
        *,
        folder: str | Path | None = None,
    ) -> FeatureStore:
        """Build the store for (n_customers, seed) if it is not there yet, then open it."""
        return cls(build_feature_store(n_customers, seed, folder=folder).path)

    def customer_id(self, index: int) -> str:
        """Id of the ``index``-th customer (1-based) of this store's population."""
        return customer_id(index, self.n_customers)

    def sample_ids(self, k: int, seed: int) -> list[str]:
        """``k`` customer ids drawn uniformly with replacement (seeded), for load loops."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        picks = np.random.default_rng(seed).integers(1, self.n_customers + 1, size=int(k))
        return [self.customer_id(int(i)) for i in picks]

    def get(self, customer_id: str, *, use_index: bool = True) -> dict[str, object] | None:
        """The customer's features, or ``None`` if the id is not in the store.

        Parameters
        ----------
        customer_id : str
            E.g. ``"SC-0000042"``.
        use_index : bool
            True: search the primary-key B-tree. False: ``NOT INDEXED``, a full scan of every row
            (SQLite cannot know the id is unique without its index, so it reads the whole table).

        Returns
        -------
        dict or None
            The 19 ``FEATURE_COLUMNS``: binary flags and ``tenure`` as int, categoricals as str,
            charges as float (``total_charges`` is NaN for a customer not yet billed).

        Raises
        ------
        TypeError
            If ``customer_id`` is not a str.
        LookupError
            If the id matches more than one row (a corrupted store; never expected).
        """
        if not isinstance(customer_id, str):
            raise TypeError(
                f"customer_id must be a str such as 'SC-0000042', got {type(customer_id).__name__}"
            )
        with self._lock:
            rows = self._con.execute(self._sql[bool(use_index)], (customer_id,)).fetchall()
        if not rows:
            return None
        if len(rows) > 1:
            raise LookupError(f"customer_id {customer_id!r} matches {len(rows)} rows in {self.path}")
        record = dict(zip(FEATURE_COLUMNS, rows[0], strict=True))
        if record["total_charges"] is None:
            record["total_charges"] = math.nan
        return record

    def query_plan(self, *, use_index: bool = True) -> str:
        """SQLite's ``EXPLAIN QUERY PLAN`` for the lookup, e.g. ``SEARCH features USING INDEX ...``."""
        with self._lock:
            plan = self._con.execute("EXPLAIN QUERY PLAN " + self._sql[bool(use_index)], ("",)).fetchall()
        return "; ".join(str(row[-1]) for row in plan)

    def close(self) -> None:
        """Close the connection (further ``get`` calls raise ``sqlite3.ProgrammingError``)."""
        self._con.close()

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FeatureStore({str(self.path)!r}, n_customers={self.n_customers}, seed={self.seed})"


class CachedFeatureStore:
    """A TTL cache keyed by customer id in front of the store, counting hits and misses.

    Parameters
    ----------
    store : FeatureStore
    use_index : bool
        How a miss reads the store: True (default) through the index; False with a full scan, to
        show how a cache in front of a slow store turns a few misses into the tail latency.
    maxsize : int
        Most customers held; beyond it the least recently used entry is evicted (``TTLCache``).
    ttl_s : float
        Seconds an entry stays valid (features change; a cache must not serve them forever).
    timer : callable, optional
        Clock in seconds for the TTL (default ``time.monotonic``; tests pass a fake clock).

    Notes
    -----
    Unknown ids are not cached: each one is a miss that reaches the store and returns ``None``.

    Raises
    ------
    ValueError
        If ``maxsize`` < 1 or ``ttl_s`` is not > 0.
    """

    def __init__(
        self,
        store: FeatureStore,
        *,
        use_index: bool = True,
        maxsize: int = DEFAULT_CACHE_MAXSIZE,
        ttl_s: float = DEFAULT_CACHE_TTL_S,
        timer: Callable[[], float] = time.monotonic,
    ):
        if isinstance(maxsize, bool) or not isinstance(maxsize, (int, np.integer)) or maxsize < 1:
            raise ValueError(f"maxsize must be a positive integer number of customers, got {maxsize!r}")
        if not isinstance(ttl_s, (int, float)) or not ttl_s > 0 or not math.isfinite(ttl_s):
            raise ValueError(f"ttl_s must be a finite number of seconds > 0, got {ttl_s!r}")
        self.store = store
        self.use_index = bool(use_index)
        self.maxsize, self.ttl_s = int(maxsize), float(ttl_s)
        self._cache: TTLCache[str, dict[str, object]] = TTLCache(
            maxsize=self.maxsize, ttl=self.ttl_s, timer=timer
        )
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, customer_id: str) -> dict[str, object] | None:
        """Features from the cache (a hit) or from the store (a miss, then cached).

        Returns a fresh dict each time, so a caller cannot alter what the cache holds; ``None`` for an
        unknown id. Raises ``TypeError`` like ``FeatureStore.get``.
        """
        if not isinstance(customer_id, str):
            raise TypeError(
                f"customer_id must be a str such as 'SC-0000042', got {type(customer_id).__name__}"
            )
        with self._lock:
            record = self._cache.get(customer_id)
            if record is not None:
                self.hits += 1
                return dict(record)
            self.misses += 1
        record = self.store.get(customer_id, use_index=self.use_index)
        if record is not None:
            with self._lock:
                self._cache[customer_id] = record
            return dict(record)
        return None

    def warm(self, customer_ids: list[str]) -> int:
        """Load ``customer_ids`` into the cache without counting hits or misses; returns how many were found."""
        found = 0
        for cid in customer_ids:
            record = self.store.get(cid, use_index=True)  # warming is set-up, not traffic: use the index
            if record is not None:
                with self._lock:
                    self._cache[cid] = record
                found += 1
        return found

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses); NaN before the first lookup."""
        total = self.hits + self.misses
        return self.hits / total if total else math.nan

    def reset_counters(self) -> None:
        """Zero the hit and miss counters (the cached entries stay)."""
        with self._lock:
            self.hits = self.misses = 0

    def clear(self) -> None:
        """Drop every cached entry and zero the counters."""
        with self._lock:
            self._cache.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)


def make_lookup(
    store: FeatureStore, mode: str, *, cache: CachedFeatureStore | None = None
) -> Callable[[str], dict[str, object] | None]:
    """The feature-lookup stage for ``mode``: a function customer_id -> features or ``None``.

    Parameters
    ----------
    store : FeatureStore
    mode : {"indexed", "unindexed", "cached"}
    cache : CachedFeatureStore, optional
        Used for ``"cached"``; a new one in front of ``store`` (default size and TTL) if omitted.

    Raises
    ------
    ValueError
        If ``mode`` is not one of ``LOOKUP_MODES``, or ``cache`` fronts a different store.
    """
    if mode == "indexed":
        return lambda cid: store.get(cid, use_index=True)
    if mode == "unindexed":
        return lambda cid: store.get(cid, use_index=False)
    if mode == "cached":
        front = cache if cache is not None else CachedFeatureStore(store)
        if front.store is not store:
            raise ValueError("cache must front the same FeatureStore that was passed as store")
        return front.get
    raise ValueError(f"mode must be one of {LOOKUP_MODES}, got {mode!r}")
