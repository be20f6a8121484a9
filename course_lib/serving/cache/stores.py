"""A prediction cache keyed by model version: one interface, an in-process and a Redis backend.

A cached churn score is only correct for the model that computed it and the features it was computed
from. The key therefore always holds three parts (``PredictionKey``): the model version, the
customer id and the version of the feature snapshot the score was computed from (or, instead of the
last two, a digest of the exact feature values: ``PredictionKey.for_features``). A new model version
or a refreshed feature snapshot makes every old entry unreachable, so an old model's score can never
be returned for the new one; the old entries simply age out (LRU / TTL).

The key and the feature digest are :mod:`course_lib.serving.cache.key` (re-exported here).

``PredictionCache`` is the interface: ``get(key) -> float | None``, ``set(key, value)``, ``clear()``,
``stats()``. Two backends implement it:

* ``InProcessPredictionCache``: a ``cachetools.TTLCache`` (least-recently-used eviction once
  ``maxsize`` entries are held, plus a time-to-live per entry counted from the moment it was stored)
  behind one lock, counting hits, misses, evictions and expirations. The clock is a parameter, so
  expiry can be tested and taught without waiting.
* ``RedisPredictionCache``: the same interface over a Redis server (``redis`` client; every key is
  written with its own time-to-live, ``SET key value PX ttl_ms``). Several replicas can share it, at
  the price of a network round trip per lookup. Redis bounds memory, not entries: with
  ``maxmemory`` and ``allkeys-lru`` it evicts by an *approximate* LRU (it samples a few keys).
  Every value carries an HMAC-SHA256 over key and score with a per-start secret, so a value written
  by anyone else is a miss (counted in ``rejected``), never an answer; every call has a short
  timeout and no retry, so a stalled or dead Redis fails fast (``CachedChurnService`` then scores
  without it).

Counters add up: ``hits + misses == lookups`` for both backends.

References
----------
cachetools documentation, ``TTLCache``. Redis documentation, ``SET`` (``PX``), "Key eviction"
(``maxmemory-policy allkeys-lru``, approximated LRU), ``INFO`` (``evicted_keys``, ``expired_keys``).
RFC 2104 (HMAC); Python ``hmac.compare_digest``. redis-py documentation, "Retries"
(``socket_timeout``, ``socket_connect_timeout``, ``Retry``).
Source lesson 000 (key ``hash(customer_id, model_version)`` with a 1-hour TTL) and 004 (a cache that
calls itself LRU but evicts in insertion order; see ``course_lib.simulate.cache.FifoCache``).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from cachetools import TTLCache
from redis.backoff import NoBackoff
from redis.retry import Retry

from course_lib.core.checks import callable_, instance_of, integer, number, positive_number
from course_lib.serving.cache.key import KEY_SEPARATOR, PredictionKey, check_key_part, features_digest

__all__ = [
    "CacheStats",
    "InProcessPredictionCache",
    "PredictionCache",
    "PredictionKey",
    "RedisPredictionCache",
    "features_digest",
]


@dataclass(frozen=True)
class CacheStats:
    """Counters of a prediction cache since it was created or its counters were reset.

    ``lookups == hits + misses``; ``sets`` counts stores; ``evictions`` entries pushed out because
    the cache was full; ``expirations`` entries removed because their time-to-live ran out (for Redis
    both are the server's counters, shared by every client of that server). ``size`` is the number
    of entries held now. ``rejected`` counts values whose HMAC did not match (written by someone
    else); each is also a miss.
    """

    lookups: int
    hits: int
    misses: int
    sets: int
    evictions: int
    expirations: int
    size: int
    rejected: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / lookups; NaN before the first lookup."""
        return self.hits / self.lookups if self.lookups else math.nan

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "hit_rate": self.hit_rate}


class PredictionCache(ABC):
    """The interface both backends implement (see the module docstring)."""

    @abstractmethod
    def get(self, key: PredictionKey) -> float | None:
        """The cached score for ``key`` (a hit), or ``None`` (a miss: absent or expired)."""

    @abstractmethod
    def set(self, key: PredictionKey, value: float) -> None:
        """Store ``value`` under ``key`` with the cache's time-to-live."""

    @abstractmethod
    def clear(self) -> None:
        """Drop every entry of this cache and zero the counters."""

    @abstractmethod
    def stats(self) -> CacheStats:
        """The counters now."""

    @abstractmethod
    def reset_stats(self) -> None:
        """Zero the counters (the entries stay)."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release resources (connections); the default does nothing."""

    def __enter__(self) -> PredictionCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _CountingTTLCache(TTLCache):
    """``TTLCache`` that counts LRU evictions (``popitem`` when full) and TTL expirations."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float]):
        super().__init__(maxsize=maxsize, ttl=ttl, timer=timer)
        self.evictions = 0
        self.expirations = 0

    def popitem(self) -> tuple[Any, Any]:
        item = super().popitem()
        self.evictions += 1
        return item

    def expire(self, time: float | None = None) -> list[tuple[Any, Any]]:
        expired = list(super().expire(time))
        self.expirations += len(expired)
        return expired


class InProcessPredictionCache(PredictionCache):
    """TTL + LRU prediction cache in this process (``cachetools.TTLCache``), thread-safe.

    Parameters
    ----------
    maxsize : int >= 1
        Entries held; storing one more evicts the least recently used (expired entries go first).
    ttl_s : float > 0
        Seconds an entry stays valid after it was stored (a hit does not extend it).
    timer : callable () -> float, optional
        The clock in seconds (default ``time.monotonic``); pass a controllable clock to test expiry.

    Raises
    ------
    ValueError
        If ``maxsize`` < 1 or ``ttl_s`` is not a finite number > 0.

    Notes
    -----
    The core of this cache is :class:`course_lib.serving.cache.lru.VersionedLru` (an ``OrderedDict``
    LRU, the same hits, misses and evictions on the same traces; a unit test checks it). Over the core
    this adds: a time-to-live per entry (bounds how old a served score can be), an injectable clock
    (expiry testable without waiting), a lock (safe under the HTTP server's threads), expiry counters in
    ``stats()``, and input checks on keys and values (a wrong type fails loudly, not as a miss).

    One lock guards the cache and the counters: ``TTLCache`` is not thread-safe (a read reorders
    its LRU list), and the HTTP server, the tests and the batcher call it from several threads.
    An entry is valid while ``now < stored_at + ttl_s`` (cachetools' rule).
    """

    def __init__(self, maxsize: int, ttl_s: float, *, timer: Callable[[], float] = time.monotonic):
        self.maxsize = integer("maxsize", maxsize, min=1)
        self.ttl_s = positive_number("ttl_s", ttl_s)
        callable_("timer", timer)
        self._cache = _CountingTTLCache(self.maxsize, self.ttl_s, timer)
        self._lock = threading.Lock()
        self._hits = self._misses = self._sets = 0

    def get(self, key: PredictionKey) -> float | None:
        instance_of("key", key, PredictionKey)
        with self._lock:
            value = self._cache.get(key)
            if value is None:
                self._misses += 1
            else:
                self._hits += 1
            return value

    def set(self, key: PredictionKey, value: float) -> None:
        instance_of("key", key, PredictionKey)
        checked = number("value", value, unit="a churn probability")
        with self._lock:
            self._cache[key] = checked
            self._sets += 1

    def keys_by_recency(self) -> list[PredictionKey]:
        """Keys held now (not expired), oldest *store* first: ``TTLCache`` iterates in expiry order.

        A read does not move a key in this list (it does move it in the LRU order that decides
        evictions), so compare it as a set; :class:`~course_lib.serving.cache.lru.VersionedLru` keeps
        its entries in use order.
        """
        with self._lock:
            return list(self._cache.keys())

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._reset_locked()

    def _reset_locked(self) -> None:
        self._hits = self._misses = self._sets = 0
        self._cache.evictions = self._cache.expirations = 0

    def reset_stats(self) -> None:
        with self._lock:
            self._reset_locked()

    def stats(self) -> CacheStats:
        with self._lock:
            self._cache.expire()
            return CacheStats(
                lookups=self._hits + self._misses,
                hits=self._hits,
                misses=self._misses,
                sets=self._sets,
                evictions=self._cache.evictions,
                expirations=self._cache.expirations,
                size=len(self._cache),
            )

    def __len__(self) -> int:
        with self._lock:
            self._cache.expire()
            return len(self._cache)

    def __repr__(self) -> str:
        return f"InProcessPredictionCache(maxsize={self.maxsize}, ttl_s={self.ttl_s:g})"


class RedisPredictionCache(PredictionCache):
    """The prediction cache in a Redis server: ``GET`` per lookup, ``SET key value PX ttl_ms`` per store.

    Parameters
    ----------
    client : redis.Redis
        A connected client (``course_lib.serving.cache.redis_server.RedisServer.client()``); redis-py's
        client is thread-safe (a connection pool). This cache takes over its timeouts and retries.
    ttl_s : float > 0
        Time-to-live of every entry, set on the server per key (millisecond resolution).
    namespace : str
        Prefix of every key, so several caches can share one server; ``clear`` deletes only these.
    secret : bytes, optional
        HMAC key of the stored values (at least 16 bytes); default 32 random bytes, new for every
        cache object. Replicas that share entries must share it.
    timeout_s : float > 0
        Socket and connect timeout of every call (default 0.1 s: a loopback ``GET`` takes about
        0.1 ms, so only a stalled or unreachable server reaches it); calls are never retried.

    Raises
    ------
    ValueError
        If ``ttl_s`` is not > 0 or below 1 ms, ``namespace`` is empty or contains ``"|"``, the secret
        is shorter than 16 bytes or ``timeout_s`` is not > 0.

    Notes
    -----
    Values are stored as ``"<repr(float)>|<hmac>"``; ``repr`` reads back to the identical float. A
    value without the right HMAC for its key is a miss (``rejected``). Hits and misses are counted by
    this client; evictions and expirations are the server's ``INFO stats`` counters (since this object
    was created or reset), shared by every client of that server.
    """

    def __init__(
        self,
        client: Any,
        ttl_s: float,
        *,
        namespace: str = "churn",
        secret: bytes | None = None,
        timeout_s: float = 0.1,
    ):

        self.ttl_s = positive_number("ttl_s", ttl_s)
        self.ttl_ms = round(self.ttl_s * 1000)
        if self.ttl_ms < 1:
            raise ValueError(f"ttl_s must be at least 0.001 s (Redis PX is in milliseconds), got {ttl_s!r}")
        self.namespace = check_key_part("namespace", namespace)
        self._secret = secrets.token_bytes(32) if secret is None else bytes(secret)
        if len(self._secret) < 16:
            raise ValueError(f"secret must hold at least 16 bytes, got {len(self._secret)}")
        self.timeout_s = positive_number("timeout_s", timeout_s)
        pool = client.connection_pool
        pool.connection_kwargs.update(socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s)
        client.set_retry(Retry(NoBackoff(), 0))  # one try: a failing cache must fail fast
        pool.disconnect()  # connections made before take the new timeouts when they reconnect
        self.client = client
        self._lock = threading.Lock()
        self._hits = self._misses = self._sets = self._rejected = 0
        self._server_base = self._server_counters()

    @property
    def rejected(self) -> int:
        """Values refused because their HMAC was not ours, since creation or the last reset."""
        return self._rejected

    def _mac(self, name: str, text: str) -> str:
        return hmac.new(self._secret, f"{name}\x00{text}".encode(), hashlib.sha256).hexdigest()

    def _server_counters(self) -> tuple[int, int]:
        info = self.client.info("stats")
        return int(info["evicted_keys"]), int(info["expired_keys"])

    def get(self, key: PredictionKey) -> float | None:
        name = instance_of("key", key, PredictionKey).as_str(self.namespace)
        raw = self.client.get(name)
        value = None if raw is None else self._verified(name, raw)
        with self._lock:
            if value is None:
                self._misses += 1
                self._rejected += raw is not None
                return None
            self._hits += 1
        return value

    def _verified(self, name: str, raw: bytes) -> float | None:
        """The score in ``raw`` if its HMAC is ours for ``name``, else None."""
        text, _, mac = raw.decode("utf-8", errors="replace").rpartition("|")
        if not text or not hmac.compare_digest(mac, self._mac(name, text)):
            return None
        return float(text)

    def set(self, key: PredictionKey, value: float) -> None:
        name = instance_of("key", key, PredictionKey).as_str(self.namespace)
        text = repr(number("value", value, unit="a churn probability"))
        self.client.set(name, f"{text}|{self._mac(name, text)}", px=self.ttl_ms)
        with self._lock:
            self._sets += 1

    def _own_keys(self) -> list[bytes]:
        return list(self.client.scan_iter(match=f"{self.namespace}{KEY_SEPARATOR}*", count=1000))

    def clear(self) -> None:
        keys = self._own_keys()
        for start in range(0, len(keys), 1000):
            self.client.delete(*keys[start : start + 1000])
        self.reset_stats()

    def reset_stats(self) -> None:
        base = self._server_counters()
        with self._lock:
            self._hits = self._misses = self._sets = self._rejected = 0
            self._server_base = base

    def stats(self) -> CacheStats:
        size = len(self._own_keys())  # first: a key evicted while counting is then in both numbers
        evicted, expired = self._server_counters()
        with self._lock:
            return CacheStats(
                lookups=self._hits + self._misses,
                hits=self._hits,
                misses=self._misses,
                sets=self._sets,
                evictions=evicted - self._server_base[0],
                expirations=expired - self._server_base[1],
                size=size,
                rejected=self._rejected,
            )

    def __len__(self) -> int:
        return len(self._own_keys())

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return (
            f"RedisPredictionCache(ttl_s={self.ttl_s:g}, namespace={self.namespace!r}, "
            f"timeout_s={self.timeout_s:g})"
        )
