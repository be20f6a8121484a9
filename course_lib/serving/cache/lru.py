"""The prediction cache's core: an LRU keyed by model version and feature snapshot.

``VersionedLru`` is the idea of Lesson 8 in about 30 lines, with no hardening: a score is stored under
``(model_version, snapshot, customer_id)``, a read moves its key to the most recently used end, and a
store into a full cache evicts the least recently used key. A new model version or a new feature
snapshot misses by construction (its keys were never stored). The course's hardened cache,
:class:`course_lib.serving.cache.stores.InProcessPredictionCache`, is the same rule on
``cachetools.TTLCache`` plus what a service needs (see its docstring); a unit test checks that both give
the same hits, misses, evictions and keys on the same access traces.

References
----------
Python documentation, ``collections.OrderedDict`` (``move_to_end``, ``popitem(last=False)``: its
LRU recipe). cachetools documentation, ``LRUCache`` and ``TTLCache``.
"""

from __future__ import annotations

from collections import OrderedDict

from course_lib.core.checks import integer

__all__ = ["VersionedLru"]


class VersionedLru:
    """LRU cache of churn scores keyed by (model_version, snapshot, customer_id).

    Parameters
    ----------
    maxsize : int >= 1
        Entries held; storing one more evicts the least recently used.

    Attributes
    ----------
    hits, misses, evictions : int
        Counters since creation.

    Raises
    ------
    ValueError
        If ``maxsize`` < 1.
    """

    def __init__(self, maxsize: int):
        self.maxsize = integer("maxsize", maxsize, min=1)
        self.entries: OrderedDict[tuple[str, str, str], float] = OrderedDict()  # oldest use first
        self.hits = self.misses = self.evictions = 0

    def get(self, model_version: str, snapshot: str, customer_id: str) -> float | None:
        """The stored score, or None (a miss); a hit makes the key the most recently used."""
        key = (model_version, snapshot, customer_id)
        if key not in self.entries:
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(key)
        return self.entries[key]

    def put(self, model_version: str, snapshot: str, customer_id: str, score: float) -> None:
        """Store a score as the most recently used; evict the least recently used when over maxsize."""
        key = (model_version, snapshot, customer_id)
        self.entries[key] = score
        self.entries.move_to_end(key)
        if len(self.entries) > self.maxsize:
            self.entries.popitem(last=False)
            self.evictions += 1
