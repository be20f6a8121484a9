"""The LRU core of Lesson 8 (VersionedLru) against the hardened cachetools cache on the same traces."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.serving.cache.lru import VersionedLru
from course_lib.serving.cache.stores import InProcessPredictionCache, PredictionKey

# (op, model_version, snapshot, customer_id); "get" misses are followed by a "put", as a service does
OPS = st.tuples(
    st.sampled_from(["get", "put"]),
    st.sampled_from(["v1", "v2"]),
    st.sampled_from(["s1", "s2"]),
    st.integers(0, 9),
)


def replay(trace, maxsize):
    core = VersionedLru(maxsize)
    hardened = InProcessPredictionCache(maxsize=maxsize, ttl_s=1e9, timer=lambda: 0.0)
    answers = []
    for op, version, snap, n in trace:
        cid = f"C{n}"
        if op == "get":
            a = core.get(version, snap, cid)
            b = hardened.get(PredictionKey(version, cid, snap))
            answers.append((a, b))
        else:
            core.put(version, snap, cid, n / 10)
            hardened.set(PredictionKey(version, cid, snap), n / 10)
    return core, hardened, answers


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=200), st.integers(1, 6))
def test_core_and_cachetools_cache_agree_on_every_trace(trace, maxsize):
    core, hardened, answers = replay(trace, maxsize)
    assert all(a == b for a, b in answers)
    stats = hardened.stats()
    assert (core.hits, core.misses, core.evictions) == (stats.hits, stats.misses, stats.evictions)
    held = {(k.model_version, k.feature_snapshot, k.customer_id) for k in hardened.keys_by_recency()}
    assert set(core.entries) == held  # same keys kept: the same evictions


def test_lesson_trace_by_hand():
    """Lesson 8's tiny trace: size 2; a read saves C1 from eviction; a new version misses."""
    trace = [
        ("put", "v1", "s1", 1),
        ("put", "v1", "s1", 2),
        ("get", "v1", "s1", 1),  # hit: C1 becomes most recent
        ("put", "v1", "s1", 3),  # evicts C2, the least recently used
        ("get", "v1", "s1", 2),  # miss
        ("get", "v1", "s1", 1),  # hit
        ("get", "v2", "s1", 1),  # new version: miss by construction
    ]
    core, _hardened, answers = replay(trace, 2)
    assert [a is not None for a, _ in answers] == [True, False, True, False]
    assert (core.hits, core.misses, core.evictions) == (2, 2, 1)
    assert list(core.entries) == [("v1", "s1", "C3"), ("v1", "s1", "C1")]
    assert all(a == b for a, b in answers)


def test_core_refuses_a_bad_size():
    with pytest.raises(ValueError):
        VersionedLru(0)
