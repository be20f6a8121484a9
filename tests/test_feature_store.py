"""Reading the SQLite feature store (indexed and un-indexed lookups) and the TTL cache in front of it."""

from __future__ import annotations

import math
import sqlite3

import pytest

from course_lib.churn.data import FEATURE_COLUMNS, ID_COLUMN, make_customers
from course_lib.serving.feature_store import (
    LOOKUP_MODES,
    CachedFeatureStore,
    FeatureStore,
    build_feature_store,
    feature_store_path,
    make_lookup,
)

N_CUSTOMERS = 5_000
SEED = 7


@pytest.fixture(scope="module")
def store_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("feature_store")
    build_feature_store(N_CUSTOMERS, SEED, folder=folder)
    return folder


@pytest.fixture(scope="module")
def store(store_folder):
    with FeatureStore.open(N_CUSTOMERS, SEED, folder=store_folder) as opened:
        yield opened


@pytest.fixture(scope="module")
def population():
    return make_customers(N_CUSTOMERS, SEED).set_index(ID_COLUMN)


class FakeTimer:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def assert_same_features(record, row):
    assert list(record) == list(FEATURE_COLUMNS)
    for col in FEATURE_COLUMNS:
        expected = row[col]
        if col == "total_charges" and math.isnan(expected):
            assert math.isnan(record[col])
        else:
            assert record[col] == expected, col


def test_missing_store_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="build_feature_store"):
        FeatureStore(tmp_path / "nope.sqlite")


@pytest.mark.parametrize("use_index", [True, False])
def test_lookup_returns_the_customers_features(store, population, use_index):
    for cid in ["SC-0000001", "SC-0002500", "SC-0005000", *store.sample_ids(20, seed=1)]:
        assert_same_features(store.get(cid, use_index=use_index), population.loc[cid])


def test_customers_not_yet_billed_have_nan_total_charges(store, population):
    new_customers = population.index[population["tenure"] == 0]
    assert len(new_customers) > 0
    assert math.isnan(store.get(new_customers[0])["total_charges"])


@pytest.mark.parametrize("use_index", [True, False])
@pytest.mark.parametrize("cid", ["SC-0005001", "SC-9999999", "sc-0000001", ""])
def test_unknown_customer_is_none_not_an_exception(store, cid, use_index):
    assert store.get(cid, use_index=use_index) is None


def test_non_string_customer_id_is_a_type_error(store):
    with pytest.raises(TypeError, match="customer_id must be a str"):
        store.get(42)


def test_query_plans_show_index_search_versus_full_scan(store):
    assert "USING INDEX" in store.query_plan(use_index=True)
    assert store.query_plan(use_index=False).startswith("SCAN")


def test_store_is_read_only(store):
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        store._con.execute("DELETE FROM features")


def test_sample_ids_are_seeded_and_inside_the_population(store):
    ids = store.sample_ids(50, seed=3)
    assert ids == store.sample_ids(50, seed=3)
    assert all(store.get(cid) is not None for cid in ids)


def test_cache_counts_a_miss_then_hits(store):
    cache = CachedFeatureStore(store)
    assert math.isnan(cache.hit_rate)
    first = cache.get("SC-0000042")
    second = cache.get("SC-0000042")
    assert first == second == store.get("SC-0000042")
    assert (cache.hits, cache.misses) == (1, 1)
    assert cache.hit_rate == 0.5


def test_cache_misses_can_fall_back_to_a_full_scan(store):
    cache = CachedFeatureStore(store, use_index=False)
    assert cache.get("SC-0004999") == store.get("SC-0004999")
    assert cache.get("SC-0004999") == store.get("SC-0004999")
    assert (cache.hits, cache.misses) == (1, 1)


def test_cache_entries_expire_after_the_ttl(store):
    timer = FakeTimer()
    cache = CachedFeatureStore(store, ttl_s=10.0, timer=timer)
    cache.get("SC-0000042")
    timer.now_s = 9.9
    cache.get("SC-0000042")
    timer.now_s = 10.1
    cache.get("SC-0000042")
    assert (cache.hits, cache.misses) == (1, 2)


def test_cache_holds_at_most_maxsize_customers(store):
    cache = CachedFeatureStore(store, maxsize=3)
    for cid in store.sample_ids(10, seed=5):
        cache.get(cid)
    assert len(cache) == 3


def test_unknown_ids_are_misses_every_time_and_not_cached(store):
    cache = CachedFeatureStore(store)
    assert cache.get("SC-9999999") is None
    assert cache.get("SC-9999999") is None
    assert (cache.hits, cache.misses, len(cache)) == (0, 2, 0)


def test_changing_a_returned_record_does_not_change_the_cache(store):
    cache = CachedFeatureStore(store)
    record = cache.get("SC-0000042")
    record["tenure"] = -1
    assert cache.get("SC-0000042")["tenure"] == store.get("SC-0000042")["tenure"]


def test_warm_fills_the_cache_without_counting(store):
    cache = CachedFeatureStore(store)
    assert cache.warm(["SC-0000001", "SC-0000002", "SC-9999999"]) == 2
    assert (cache.hits, cache.misses, len(cache)) == (0, 0, 2)
    cache.get("SC-0000001")
    cache.reset_counters()
    assert (cache.hits, cache.misses, len(cache)) == (0, 0, 2)
    cache.clear()
    assert len(cache) == 0


@pytest.mark.parametrize(("kwargs", "match"), [({"maxsize": 0}, "maxsize"), ({"ttl_s": 0}, "ttl_s")])
def test_cache_parameters_are_validated(store, kwargs, match):
    with pytest.raises(ValueError, match=match):
        CachedFeatureStore(store, **kwargs)


def test_cache_rejects_non_string_ids(store):
    with pytest.raises(TypeError, match="customer_id must be a str"):
        CachedFeatureStore(store).get(None)


@pytest.mark.parametrize("mode", LOOKUP_MODES)
def test_every_lookup_mode_returns_the_same_features(store, mode):
    lookup = make_lookup(store, mode)
    assert lookup("SC-0000042") == store.get("SC-0000042")
    assert lookup("SC-9999999") is None


def test_cached_lookup_uses_the_given_cache(store):
    cache = CachedFeatureStore(store)
    lookup = make_lookup(store, "cached", cache=cache)
    lookup("SC-0000042")
    lookup("SC-0000042")
    assert (cache.hits, cache.misses) == (1, 1)


def test_unknown_lookup_mode_is_rejected(store):
    with pytest.raises(ValueError, match="indexed"):
        make_lookup(store, "redis")


def test_cache_of_another_store_is_rejected(store, store_folder):
    with (
        FeatureStore(feature_store_path(N_CUSTOMERS, SEED, store_folder)) as other,
        pytest.raises(ValueError, match="same FeatureStore"),
    ):
        make_lookup(store, "cached", cache=CachedFeatureStore(other))
