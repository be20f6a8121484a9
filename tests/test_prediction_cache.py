"""The prediction cache: one interface, tested against both backends (in process and a real Redis)."""

from __future__ import annotations

import math
import threading

import cachetools
import pytest
from components import missing, require_component

from course_lib.core.waiting import wait_until
from course_lib.serving.cache.redis_server import RedisUnavailableError, redis_server
from course_lib.serving.cache.stores import (
    CacheStats,
    InProcessPredictionCache,
    PredictionCache,
    PredictionKey,
    RedisPredictionCache,
)


class FakeClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def redis_srv():
    require_component("redis-server")
    try:
        with redis_server(max_lifetime_s=300) as server:
            yield server
    except RedisUnavailableError as err:  # pragma: no cover - only where the program exists but fails
        missing("redis-server", f"redis-server could not start: {err}")


@pytest.fixture(params=["in_process", "redis"])
def cache(request) -> PredictionCache:
    if request.param == "in_process":
        made: PredictionCache = InProcessPredictionCache(maxsize=1000, ttl_s=60.0)
    else:
        server = request.getfixturevalue("redis_srv")
        made = RedisPredictionCache(server.client(), ttl_s=60.0, namespace=f"t{threading.get_ident()}")
        made.clear()
    yield made
    made.clear()


def key(customer: str, version: str = "v1", snapshot: str = "snap1") -> PredictionKey:
    return PredictionKey(version, customer, snapshot)


# -- the interface, for both backends -------------------------------------------------------------
def test_get_set_round_trip_and_counters_add_up(cache):
    assert cache.get(key("SC-0000001")) is None
    cache.set(key("SC-0000001"), 0.123456789012345)
    cache.set(key("SC-0000002"), 0.0)  # a falsy score is still a hit
    assert cache.get(key("SC-0000001")) == 0.123456789012345  # exact float round trip
    assert cache.get(key("SC-0000002")) == 0.0
    assert cache.get(key("SC-0000003")) is None
    stats = cache.stats()
    assert isinstance(stats, CacheStats)
    assert (stats.lookups, stats.hits, stats.misses, stats.sets, stats.size) == (4, 2, 2, 2, 2)
    assert stats.hits + stats.misses == stats.lookups
    assert stats.hit_rate == 0.5
    cache.reset_stats()
    assert cache.stats().lookups == 0 and len(cache) == 2
    cache.clear()
    assert len(cache) == 0 and cache.get(key("SC-0000001")) is None


def test_model_version_change_never_returns_the_old_score(cache):
    cache.set(key("SC-0000042", version="old"), 0.9)
    assert cache.get(key("SC-0000042", version="new")) is None  # the new model must recompute
    cache.set(key("SC-0000042", version="new"), 0.2)
    assert cache.get(key("SC-0000042", version="new")) == 0.2
    assert cache.get(key("SC-0000042", version="old")) == 0.9  # old entries are only unreachable
    assert cache.get(key("SC-0000042", version="new", snapshot="snap2")) is None  # new features too


def test_bad_keys_and_values_are_refused(cache):
    with pytest.raises(TypeError, match="PredictionKey"):
        cache.get(("v1", "SC-0000001"))
    with pytest.raises(ValueError, match="finite"):
        cache.set(key("SC-0000001"), math.nan)
    with pytest.raises(TypeError, match="number"):
        cache.set(key("SC-0000001"), "0.5")
    assert cache.stats().lookups == 0


def test_concurrent_gets_and_sets_are_consistent(cache):
    """8 threads hammer 50 shared keys: no error, every read is a value some writer stored, counters add up."""
    n_threads, n_ops = 8, 300
    errors: list[BaseException] = []
    reads = [0] * n_threads

    def value_of(i: int) -> float:
        return i / 1000.0

    def worker(t: int) -> None:
        try:
            for j in range(n_ops):
                i = (t * 7 + j) % 50
                got = cache.get(key(f"SC-{i:07d}"))
                reads[t] += 1
                if got is None:
                    cache.set(key(f"SC-{i:07d}"), value_of(i))
                elif got != value_of(i):
                    raise AssertionError(f"key {i} read {got}, only {value_of(i)} was ever stored")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors[0]
    stats = cache.stats()
    assert stats.lookups == sum(reads) == n_threads * n_ops
    assert stats.hits + stats.misses == stats.lookups
    assert stats.sets == stats.misses  # every miss stored its value once
    assert stats.size == 50


# -- in process: LRU + TTL rules ------------------------------------------------------------------
def test_issue_vectors_lru_keeps_the_recently_read_keys():
    cache = InProcessPredictionCache(maxsize=3, ttl_s=60.0)
    for name in "abc":
        cache.set(key(name), 0.5)
    assert cache.get(key("a")) == 0.5
    cache.set(key("d"), 0.5)
    assert {k.customer_id for k in cache.keys_by_recency()} == {"a", "c", "d"}  # LRU evicted b
    assert cache.stats().evictions == 1

    cache = InProcessPredictionCache(maxsize=3, ttl_s=60.0)
    for name in "abc":
        cache.set(key(name), 0.5)
    cache.get(key("b"))
    cache.get(key("c"))
    cache.set(key("d"), 0.5)
    cache.set(key("e"), 0.5)
    assert {k.customer_id for k in cache.keys_by_recency()} == {"c", "d", "e"}
    assert cache.stats().evictions == 2


def test_ttl_expiry_with_a_controllable_clock():
    clock = FakeClock()
    cache = InProcessPredictionCache(maxsize=10, ttl_s=30.0, timer=clock)
    cache.set(key("a"), 0.1)
    clock.now += 29.999
    assert cache.get(key("a")) == 0.1  # a hit does not extend the lifetime
    clock.now += 0.001  # now == stored_at + ttl: expired (valid while now < stored_at + ttl)
    assert cache.get(key("a")) is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.expirations, stats.evictions, stats.size) == (1, 1, 1, 0, 0)


def test_expired_entries_go_before_lru_eviction():
    clock = FakeClock()
    cache = InProcessPredictionCache(maxsize=2, ttl_s=10.0, timer=clock)
    cache.set(key("old"), 0.1)
    clock.now += 5
    cache.set(key("young"), 0.2)
    cache.get(key("old"))  # old is now the most recently used ...
    clock.now += 5  # ... but expired
    cache.set(key("new"), 0.3)
    assert {k.customer_id for k in cache.keys_by_recency()} == {"young", "new"}
    stats = cache.stats()
    assert (stats.expirations, stats.evictions) == (1, 0)


def test_in_process_cache_agrees_with_cachetools_lru_on_a_random_sequence():
    import random

    rng = random.Random(3)
    ours = InProcessPredictionCache(maxsize=20, ttl_s=1e9)
    reference = cachetools.LRUCache(maxsize=20)
    for _ in range(3000):
        name = f"SC-{rng.randrange(60):07d}"
        got, expected = ours.get(key(name)), reference.get(name)
        assert got == expected
        if got is None:
            ours.set(key(name), 0.5)
            reference[name] = 0.5
    assert [k.customer_id for k in ours.keys_by_recency()] == list(reference.keys())


def test_constructor_errors_name_the_parameter():
    with pytest.raises(ValueError, match="maxsize"):
        InProcessPredictionCache(maxsize=0, ttl_s=1.0)
    with pytest.raises(ValueError, match="ttl_s"):
        InProcessPredictionCache(maxsize=1, ttl_s=0)
    with pytest.raises(ValueError, match="model_version"):
        PredictionKey("", "SC-0000001", "snap")
    with pytest.raises(ValueError, match="customer_id"):
        PredictionKey("v1", "a|b", "snap")


# -- Redis: TTL per key on the server, evictions counted by the server ---------------------------
def test_redis_ttl_is_set_per_key_on_the_server(redis_srv):
    client = redis_srv.client()
    cache = RedisPredictionCache(client, ttl_s=0.2, namespace="ttl")
    cache.set(key("a"), 0.5)
    remaining_ms = client.pttl(key("a").as_str("ttl"))
    assert 0 < remaining_ms <= 200
    wait_until(lambda: cache.get(key("a")) is None, timeout_s=10, what="the Redis key to expire")
    assert cache.stats().misses >= 1


@pytest.mark.needs("redis-server")
def test_redis_evicts_under_maxmemory_and_counts_it():
    with redis_server(maxmemory_bytes=2_000_000, max_lifetime_s=120) as server:
        cache = RedisPredictionCache(server.client(), ttl_s=600.0, namespace="evict")
        for i in range(40_000):
            cache.set(key(f"SC-{i:07d}"), 0.5)
        stats = cache.stats()
        assert stats.evictions > 0 and 0 < stats.size < stats.sets
        # nothing expired, so every key stored is held or was evicted; a server at its memory limit
        # keeps evicting while the keys are counted, so the sum can only over-count
        assert stats.size + stats.evictions >= stats.sets
