"""Zipf traffic, exact LRU hit rates from stack distances, the TTL replay and the source's FIFO cache."""

from __future__ import annotations

import math
from collections import OrderedDict

import cachetools
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.serving.cache.stores import InProcessPredictionCache, PredictionKey
from course_lib.simulate.cache import (
    FifoCache,
    ideal_hit_rates,
    lru_hit_rates,
    lru_stack_distances,
    lru_stack_distances_core,
    simulate_ttl_lru,
    size_for_hit_rate,
)
from course_lib.simulate.traffic import zipf_trace, zipf_weights


def lru_replay_hits(keys: list[int], size: int) -> int:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for k in keys:
        if k in cache:
            hits += 1
            cache.move_to_end(k)
        else:
            if len(cache) >= size:
                cache.popitem(last=False)
            cache[k] = None
    return hits


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 25), max_size=300))
def test_stack_distances_match_their_core_an_lru_stack_replay(keys):
    assert lru_stack_distances(np.array(keys, dtype=np.int64)).tolist() == lru_stack_distances_core(keys)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=400), st.integers(1, 45))
def test_hit_rates_equal_an_lru_replay_for_every_size(keys, size):
    assert lru_hit_rates(keys, [size])[0] * len(keys) == pytest.approx(lru_replay_hits(keys, size))


def test_string_keys_work_too():
    assert lru_stack_distances(["a", "b", "a", "a"]).tolist() == [-1, -1, 1, 0]


def test_zipf_weights_and_trace():
    w = zipf_weights(1000, 1.1)
    assert w.sum() == pytest.approx(1.0) and np.all(np.diff(w) <= 0)
    assert w[0] / w[9] == pytest.approx(10**1.1)
    assert np.allclose(zipf_weights(10, 0.0), 0.1)
    trace = zipf_trace(20_000, 1.1, n_customers=1000, seed=5)
    assert trace.min() >= 1 and trace.max() <= 1000
    assert np.array_equal(trace, zipf_trace(20_000, 1.1, n_customers=1000, seed=5))
    # the most requested customer is the same for every exponent with the same seed
    top = np.bincount(trace).argmax()
    assert np.bincount(zipf_trace(20_000, 0.9, n_customers=1000, seed=5)).argmax() == top
    assert np.mean(trace == top) == pytest.approx(w[0], abs=0.01)
    with pytest.raises(ValueError, match="s must be"):
        zipf_weights(10, -1.0)
    with pytest.raises(ValueError, match="seed"):
        zipf_trace(10, 1.0, seed=-1)


def test_ideal_hit_rate_is_a_ceiling_for_lru():
    w = zipf_weights(2000, 0.9)
    trace = zipf_trace(50_000, 0.9, n_customers=2000, seed=1)
    sizes = [10, 100, 500]
    assert np.all(lru_hit_rates(trace, sizes) <= ideal_hit_rates(w, sizes) + 0.01)
    assert ideal_hit_rates(w, [2000, 5000]).tolist() == pytest.approx([1.0, 1.0])
    assert size_for_hit_rate([1, 2, 3], [0.1, 0.8, 0.9], 0.8) == 2
    assert size_for_hit_rate([1, 2], [0.1, 0.2], 0.8) is None


def test_ttl_replay_matches_the_real_in_process_cache():
    """Same requests, same clock: the replay and InProcessPredictionCache (cachetools) agree on every request."""
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 40, size=3000).tolist()
    times = np.cumsum(rng.exponential(0.5, size=3000))
    flush = [1500]
    expected = simulate_ttl_lru(keys, times, maxsize=15, ttl_s=20.0, flush_at=flush)
    now = [0.0]
    cache = InProcessPredictionCache(maxsize=15, ttl_s=20.0, timer=lambda: now[0])
    got = []
    for i, (k, t) in enumerate(zip(keys, times, strict=True)):
        now[0] = float(t)
        if i in flush:
            cache.clear()
        key = PredictionKey("v1", f"SC-{k:07d}", "s")
        hit = cache.get(key) is not None
        if not hit:
            cache.set(key, 0.5)
        got.append(hit)
    assert got == expected.tolist()
    assert 0.2 < expected.mean() < 0.9  # both expiry and eviction happened
    no_ttl = simulate_ttl_lru(keys, times, maxsize=15, ttl_s=math.inf)
    assert no_ttl.sum() == round(lru_hit_rates(keys, [15])[0] * len(keys))


def test_ttl_replay_refuses_bad_input():
    with pytest.raises(ValueError, match="non-decreasing"):
        simulate_ttl_lru([1, 2], [1.0, 0.5], maxsize=1, ttl_s=1.0)
    with pytest.raises(ValueError, match="entries"):
        simulate_ttl_lru([1, 2], [1.0], maxsize=1, ttl_s=1.0)
    with pytest.raises(ValueError, match="ttl_s"):
        simulate_ttl_lru([1], [1.0], maxsize=1, ttl_s=0)


def test_issue_vectors_fifo_versus_lru():
    """Capacity 3; set a, b, c; get a; set d: LRU keeps {a, c, d}, the source's FIFO keeps {b, c, d}."""
    fifo, lru = FifoCache(3), cachetools.LRUCache(3)
    for name in "abc":
        fifo.set(name, 1)
        lru[name] = 1
    assert fifo.get("a") == 1 and lru["a"] == 1
    fifo.set("d", 1)
    lru["d"] = 1
    assert set(fifo.keys()) == {"b", "c", "d"}
    assert set(lru.keys()) == {"a", "c", "d"}
    # second vector: get b, get c, set d, set e -> LRU keeps {c, d, e} (FIFO happens to agree)
    fifo, lru = FifoCache(3), cachetools.LRUCache(3)
    for name in "abc":
        fifo.set(name, 1)
        lru[name] = 1
    for name in "bc":
        fifo.get(name)
        lru[name]
    for name in "de":
        fifo.set(name, 1)
        lru[name] = 1
    assert set(lru.keys()) == {"c", "d", "e"} == set(fifo.keys())


def test_fifo_cache_agrees_with_cachetools_fifo():
    rng = np.random.default_rng(2)
    ours, reference = FifoCache(10), cachetools.FIFOCache(10)
    for k in rng.integers(0, 30, size=2000).tolist():
        hit = ours.get(k) is not None
        assert hit == (k in reference)
        if not hit:
            ours.set(k, 1)
            reference[k] = 1
    assert ours.keys() == list(reference.keys())
    assert ours.hits + ours.misses == 2000
