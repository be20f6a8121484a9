"""The SQLite feature store (indexed and un-indexed lookups) and the TTL cache in front of it."""

from __future__ import annotations

import math
import sqlite3

import pytest

from course_lib.data import FEATURE_COLUMNS, ID_COLUMN, make_customers
from course_lib.feature_store import (
    LOOKUP_MODES,
    CachedFeatureStore,
    FeatureStore,
    build_feature_store,
    customer_id,
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


def test_build_is_idempotent_and_reuses_a_finished_store(store_folder):
    again = build_feature_store(N_CUSTOMERS, SEED, folder=store_folder)
    assert again.built is False
    assert again.path == feature_store_path(N_CUSTOMERS, SEED, store_folder)
    assert again.size_bytes > 0


def test_rebuild_writes_a_new_file_with_the_same_content(tmp_path):
    first = build_feature_store(300, 1, folder=tmp_path)
    second = build_feature_store(300, 1, folder=tmp_path, rebuild=True)
    assert first.built and second.built
    with FeatureStore(second.path) as fresh:
        assert fresh.get("SC-0000300") is not None
    assert [p.name for p in tmp_path.iterdir()] == [second.path.name]  # no temporary file left


def test_a_half_written_file_is_not_reused_but_rebuilt(tmp_path):
    path = feature_store_path(200, 3, tmp_path)
    path.write_bytes(b"not a database")
    with pytest.raises(ValueError, match="not a finished feature store"):
        FeatureStore(path)
    result = build_feature_store(200, 3, folder=tmp_path)
    assert result.built is True
    with FeatureStore(result.path) as fresh:
        assert fresh.n_customers == 200


def test_a_build_removes_temporaries_left_by_an_interrupted_build(tmp_path):
    import os
    import subprocess
    import sys

    path = feature_store_path(200, 3, tmp_path)
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone_pid = int(finished.stdout)  # a process that has exited: its half-written file is stale
    stale = path.with_name(f"{path.name}.{gone_pid}.1.tmp")
    stale.write_bytes(b"x" * 1000)
    live = path.with_name(f"{path.name}.{os.getppid()}.1.tmp")  # a live process may still be building
    live.write_bytes(b"y")
    other_store = tmp_path / "customers_n999_seed3_v1.sqlite.123.1.tmp"
    other_store.write_bytes(b"z")
    assert build_feature_store(200, 3, folder=tmp_path).built
    assert not stale.exists()
    assert live.exists() and other_store.exists()


def test_missing_store_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="build_feature_store"):
        FeatureStore(tmp_path / "nope.sqlite")


@pytest.mark.parametrize(("n", "seed"), [(0, 0), (-5, 0), (2.5, 0), (True, 0), (10, -1)])
def test_bad_population_parameters_are_rejected(n, seed, tmp_path):
    with pytest.raises(ValueError, match=r"n_customers|seed"):
        build_feature_store(n, seed, folder=tmp_path)


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


def test_customer_ids_match_make_customers():
    frame = make_customers(120, 0)
    assert [customer_id(i, 120) for i in (1, 120)] == [frame[ID_COLUMN].iloc[0], frame[ID_COLUMN].iloc[-1]]
    assert customer_id(1, 10_000_000) == "SC-00000001"
    with pytest.raises(ValueError, match=r"1\.\.120"):
        customer_id(121, 120)


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
