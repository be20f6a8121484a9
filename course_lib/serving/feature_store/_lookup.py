"""Reading the churn feature store: SQLite lookups with and without the index, plus a TTL cache.

The features of every customer of a ``make_customers`` population live in one SQLite table whose
``customer_id`` is the primary key, so SQLite keeps a B-tree index on it. ``FeatureStore.get`` looks a
customer up through that index (``use_index=True``: a B-tree search, O(log n)) or with the index
switched off by SQLite's ``NOT INDEXED`` clause (``use_index=False``: a full table scan, O(n)) - the
same table and the same query, so the difference you measure is the index alone.
``CachedFeatureStore`` puts a ``cachetools.TTLCache`` keyed by customer id in front and counts hits
and misses.

An unknown customer id is an ordinary outcome, not an error: ``get`` returns ``None``. Building the
file is ``course_lib.serving.feature_store._build``; its public names are re-exported here.

References
----------
SQLite documentation, "The INDEXED BY clause" (``NOT INDEXED``) and "EXPLAIN QUERY PLAN".
cachetools documentation, ``TTLCache``.
MLOps course lesson 19 (source 000): "un-indexed feature store queries", cache hit vs miss latency.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cachetools import TTLCache

from course_lib.churn.data import FEATURE_COLUMNS, ID_COLUMN
from course_lib.core.checks import InvalidArgumentError, instance_of, integer, one_of, positive_number
from course_lib.serving.feature_store._build import (
    DEFAULT_N_CUSTOMERS,
    DEFAULT_SEED,
    SCHEMA_VERSION,
    TABLE,
    build_feature_store,
    customer_id,
    read_meta,
)

#: The three ways the service can fetch features.
LOOKUP_MODES: tuple[str, ...] = ("indexed", "unindexed", "cached")
DEFAULT_CACHE_MAXSIZE = 100_000
DEFAULT_CACHE_TTL_S = 300.0


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
        meta = read_meta(self.path)
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
            True: f"SELECT {select} FROM {TABLE} WHERE {ID_COLUMN} = ?",
            False: f"SELECT {select} FROM {TABLE} NOT INDEXED WHERE {ID_COLUMN} = ?",
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
        k = integer("k", k, min=1)
        picks = np.random.default_rng(seed).integers(1, self.n_customers + 1, size=k)
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
        instance_of("customer_id", customer_id, str)
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
        maxsize = integer("maxsize", maxsize, min=1)
        ttl_s = positive_number("ttl_s", ttl_s)
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
        instance_of("customer_id", customer_id, str)
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
        """Load ``customer_ids`` into the cache without counting hits or misses; the number found."""
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
    one_of("mode", mode, LOOKUP_MODES)
    if mode == "indexed":
        return lambda cid: store.get(cid, use_index=True)
    if mode == "unindexed":
        return lambda cid: store.get(cid, use_index=False)
    front = cache if cache is not None else CachedFeatureStore(store)
    if front.store is not store:
        raise InvalidArgumentError("cache must front the same FeatureStore that was passed as store")
    return front.get
