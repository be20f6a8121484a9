"""Exact cache simulation: how many requests a cache of a given size absorbs.

The skewed traffic itself (``zipf_weights``, ``zipf_trace``) is :mod:`course_lib.simulate.traffic`.

* ``lru_stack_distances`` / ``lru_hit_rates``: the exact hit rate of an LRU cache of *every* size in
  one pass. A request hits an LRU cache of size C exactly when fewer than C distinct other keys were
  requested since the same key's previous request (its stack distance; Mattson et al. 1970).
  The distances are counted with a merge-sort tree in numpy, O(n log^2 n).
* ``simulate_ttl_lru``: request-by-request replay of a TTL + LRU cache that follows cachetools'
  ``TTLCache`` rules exactly (an entry is valid while ``now < stored_at + ttl``; expired entries are
  dropped before the least recently used one is evicted), for time-to-live and cold-start questions.
* ``ideal_hit_rates``: the steady-state ceiling for independent requests: a cache holding the k most
  popular customers catches the sum of their probabilities, and no cache of size k does better.
* ``FifoCache``: the eviction rule of source 004's ``CachedModelServer``, which says "LRU" but removes
  the key stored first (``next(iter(dict))``), whatever was read since.

References
----------
Mattson, Gecsei, Slutz and Traiger (1970), "Evaluation techniques for storage hierarchies", IBM
Systems Journal 9(2) (stack distances). Breslau et al. (1999), "Web caching and Zipf-like
distributions", INFOCOM. cachetools documentation, ``TTLCache``, ``FIFOCache``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from course_lib.core.checks import integer, integers, non_empty, number

__all__ = [
    "FifoCache",
    "hit_rates_from_distances",
    "ideal_hit_rates",
    "lru_hit_rates",
    "lru_stack_distances",
    "lru_stack_distances_core",
    "simulate_ttl_lru",
    "size_for_hit_rate",
]


def _previous_occurrence(keys: np.ndarray) -> np.ndarray:
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    prev = np.full(len(keys), -1, dtype=np.int64)
    same = np.flatnonzero(ordered[1:] == ordered[:-1]) + 1
    prev[order[same]] = order[same - 1]
    return prev


def lru_stack_distances_core(keys: Iterable[Hashable]) -> list[int]:
    """Stack distances by their definition: replay an LRU stack, read each key's depth (the core).

    Parameters
    ----------
    keys : iterable of n hashable keys.

    Returns
    -------
    list of n ints
        For each request, how many distinct other keys were used since its key's previous request
        (its depth in the stack, most recent on top); -1 for a key's first request. The request hits
        an LRU cache of size C exactly when 0 <= d < C.

    Notes
    -----
    O(n x distinct keys): the definition, for reading and for tiny traces. :func:`lru_stack_distances`
    gives the same answers in O(n log^2 n) with a merge-sort tree (tests check both on the same traces).

    References
    ----------
    Mattson, Gecsei, Slutz and Traiger (1970), "Evaluation techniques for storage hierarchies".
    """
    stack: list[Hashable] = []  # least recently used first, most recent last
    out = []
    for key in keys:
        if key in stack:
            depth = len(stack) - 1 - stack.index(key)  # distinct keys used since, above it
            stack.remove(key)
        else:
            depth = -1  # never seen: a miss for every cache size
        out.append(depth)
        stack.append(key)
    return out


def lru_stack_distances(keys: Sequence[Hashable] | np.ndarray) -> np.ndarray:
    """For each request, how many distinct other keys were requested since its key's previous request.

    Parameters
    ----------
    keys : 1-D sequence of n hashable keys (integers are fastest).

    Returns
    -------
    numpy.ndarray of int64, shape (n,)
        The stack distance d; -1 for a key's first request (a miss for any cache size). The request
        hits an LRU cache of size C exactly when 0 <= d < C.

    Notes
    -----
    d(i) counts the requests j with prev(i) < j < i whose own previous request lies at or before
    prev(i): each distinct key in the window has exactly one such first request. The count runs on a
    merge-sort tree (one sorted copy of ``prev + 1`` per level, rebuilt level by level in numpy).
    """
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise ValueError(f"keys must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        arr = np.unique(arr, return_inverse=True)[1].astype(np.int64)
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    prev = _previous_occurrence(arr)
    queries = np.flatnonzero(prev >= 0)
    out = np.full(n, -1, dtype=np.int64)
    size = 1 << max(0, (n - 1).bit_length())
    shift = (n + 1).bit_length()  # key = block << shift | value; values prev + 1 lie in 0..n
    low = np.int64((1 << shift) - 1)
    values = np.full(size, n + 1, dtype=np.int64)
    values[:n] = prev + 1
    a = prev[queries] + 1  # each query counts over the request positions [a, b)
    b = queries.astype(np.int64)
    threshold = prev[queries] + 2  # count values < threshold, i.e. prev(j) <= prev(i)
    owner = np.arange(len(queries))  # which query each row of a, b, threshold belongs to
    counts = np.zeros(len(queries), dtype=np.int64)
    level_sorted = (np.arange(size, dtype=np.int64) << shift) | values  # level 0: one value per block
    width = 1
    keep = a < b  # a key requested twice in a row has an empty window: distance 0
    a, b, threshold, owner = a[keep], b[keep], threshold[keep], owner[keep]
    while len(owner):
        for side in ("a", "b"):
            idx = np.flatnonzero(((a if side == "a" else b) & 1) == 1)
            if side == "b":
                b[idx] -= 1
            blocks = a[idx] if side == "a" else b[idx]
            needles = (blocks << shift) + threshold[idx]
            order = np.argsort(needles)  # sorted needles make searchsorted several times faster
            found = np.empty_like(needles)
            found[order] = np.searchsorted(level_sorted, needles[order], side="left")
            counts[owner[idx]] += found - blocks * width
            if side == "a":
                a[idx] += 1
        a >>= 1
        b >>= 1
        keep = a < b
        a, b, threshold, owner = a[keep], b[keep], threshold[keep], owner[keep]
        width <<= 1
        if not len(owner) or width > size:
            break
        # next level: merge pairs of sorted blocks (timsort merges the two runs of each block)
        level_sorted = np.sort(((level_sorted >> (shift + 1)) << shift) | (level_sorted & low), kind="stable")
    out[queries] = counts
    return out


def lru_hit_rates(keys: Sequence[Hashable] | np.ndarray, sizes: Iterable[int]) -> np.ndarray:
    """Exact hit rate of an LRU cache of each size on this request sequence (starting empty).

    Returns
    -------
    numpy.ndarray of float64, one hit rate per size, in [0, 1].

    Raises
    ------
    ValueError
        If a size is not a positive integer or ``keys`` is empty.
    """
    return hit_rates_from_distances(lru_stack_distances(keys), sizes)


def hit_rates_from_distances(distances: np.ndarray, sizes: Iterable[int]) -> np.ndarray:
    """LRU hit rate for each size from precomputed ``lru_stack_distances`` (hit when 0 <= d < size).

    Raises
    ------
    ValueError
        If ``distances`` is empty or a size is not a positive integer.
    """
    checked = integers("sizes", sizes, min=1, allow_empty=True)
    distances = non_empty("distances", np.asarray(distances))
    reused = np.sort(distances[distances >= 0])
    return np.searchsorted(reused, np.asarray(checked), side="left") / len(distances)


def ideal_hit_rates(weights: np.ndarray, sizes: Iterable[int]) -> np.ndarray:
    """Steady-state hit rate of a cache holding the ``size`` most popular items (independent requests).

    ``weights`` are request probabilities (e.g. ``zipf_weights``); the result for each size is the sum
    of the largest ``size`` of them, the best any cache of that size can do in the long run.
    """
    ordered = np.cumsum(np.sort(np.asarray(weights, dtype=np.float64))[::-1])
    idx = np.minimum(np.asarray(integers("sizes", sizes, min=1, allow_empty=True)), len(ordered)) - 1
    return ordered[idx] / ordered[-1]


def size_for_hit_rate(sizes: Sequence[int], hit_rates: Sequence[float], target: float) -> int | None:
    """The smallest size whose hit rate reaches ``target`` (sizes ascending), or None if none does."""
    target = number("target", target, min=0, max=1, min_open=True)
    for size, rate in zip(sizes, hit_rates, strict=True):
        if rate >= target:
            return int(size)
    return None


def simulate_ttl_lru(
    keys: Sequence[Hashable] | np.ndarray,
    times_s: Sequence[float] | np.ndarray,
    *,
    maxsize: int,
    ttl_s: float,
    flush_at: Iterable[int] = (),
) -> np.ndarray:
    """Replay requests through a TTL + LRU cache (cachetools ``TTLCache`` rules); which ones hit.

    Each miss stores the key at the request's time. ``flush_at`` lists request positions before
    which the whole cache is emptied (e.g. a deploy that changes the model version: every old key
    becomes unreachable, which for hits is the same as empty).

    Parameters
    ----------
    keys : sequence of n hashable keys.
    times_s : sequence of n non-decreasing times in seconds.
    maxsize : int >= 1
    ttl_s : float > 0 (``math.inf`` for no expiry)

    Returns
    -------
    numpy.ndarray of bool, shape (n,): True where the request was a hit.

    Raises
    ------
    ValueError
        Mismatched lengths, times going backwards, or an invalid size or TTL.
    """
    size = integer("maxsize", maxsize, min=1)
    ttl_s = number("ttl_s", ttl_s, min=0, min_open=True, finite=False)
    times = np.asarray(times_s, dtype=np.float64)
    keys_list = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
    if len(times) != len(keys_list):
        raise ValueError(f"times_s has {len(times)} entries for {len(keys_list)} keys")
    if len(times) > 1 and np.any(np.diff(times) < 0):
        raise ValueError("times_s must be non-decreasing")
    flush = set(int(i) for i in flush_at)
    hits = np.zeros(len(keys_list), dtype=bool)
    cache: OrderedDict[Any, float] = OrderedDict()  # key -> expiry time, least recently used first
    stored: deque[tuple[float, Any]] = deque()  # (expiry, key) in storing order = expiry order
    for i, (key, now) in enumerate(zip(keys_list, times.tolist(), strict=True)):
        if i in flush:
            cache.clear()
            stored.clear()
        expires = cache.get(key)
        if expires is not None:
            cache.move_to_end(key)
            if now < expires:
                hits[i] = True
                continue
        while stored and not now < stored[0][0]:
            old_expiry, old_key = stored.popleft()
            if cache.get(old_key) == old_expiry:
                del cache[old_key]
        if len(cache) >= size:
            cache.popitem(last=False)
        cache[key] = now + ttl_s
        stored.append((now + ttl_s, key))
    return hits


class FifoCache:
    """What source 004's ``CachedModelServer`` does: a bounded dict that evicts the *first stored* key.

    Reads do not change the order, so a key read a moment ago is evicted before a key never read
    since it was stored. That is first-in-first-out, not least-recently-used. Kept small on purpose;
    ``cachetools.FIFOCache`` is the library equivalent (the tests check the two agree).

    Parameters
    ----------
    maxsize : int >= 1
    """

    def __init__(self, maxsize: int):
        self.maxsize = integer("maxsize", maxsize, min=1)
        self._data: dict[Hashable, Any] = {}
        self.hits = self.misses = 0

    def get(self, key: Hashable) -> Any | None:
        """The stored value (a hit, order unchanged) or None (a miss)."""
        if key in self._data:
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return None

    def set(self, key: Hashable, value: Any) -> None:
        """Store ``value``; when full, first remove the key that was stored earliest."""
        if key not in self._data and len(self._data) >= self.maxsize:
            del self._data[next(iter(self._data))]
        self._data[key] = value

    def keys(self) -> list[Hashable]:
        """Keys held, first stored first."""
        return list(self._data)
