"""Hit, miss and no-cache requests measured side by side (course_lib.serving.cache.costs, Lesson 8)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from course_lib.serving.cache.costs import (
    KINDS,
    break_even_hit_rate,
    break_even_phrase,
    hit_miss_table,
    measure_hit_miss,
    miss_cost_decomposition,
    saving_at_hit_rate,
)
from course_lib.serving.cache.service import CachedChurnService
from course_lib.serving.cache.stores import InProcessPredictionCache
from course_lib.serving.feature_store import FeatureStore, build_feature_store, make_lookup
from course_lib.serving.service import ChurnService, onnx_forward


@pytest.fixture(scope="module")
def services(tmp_path_factory, churn_model, onnx_scorer):
    build = build_feature_store(2_000, seed=5, folder=tmp_path_factory.mktemp("store"))
    with FeatureStore(build.path) as store:
        plain = ChurnService(make_lookup(store, "indexed"), onnx_forward(onnx_scorer), model_version="m1")
        cached = CachedChurnService(
            plain, InProcessPredictionCache(maxsize=10_000, ttl_s=600), feature_snapshot="s1"
        )
        yield store, plain, cached


def test_the_three_kinds_alternate_in_equal_rounds_and_every_part_is_kept(services):
    store, plain, cached = services
    plain_ids = [store.customer_id(i) for i in range(1, 69)]
    cached_ids = [store.customer_id(i) for i in range(101, 169)]
    run = measure_hit_miss(plain, cached, plain_ids, cached_ids, rounds=6, warmup=8)
    assert run.groupby(["round", "kind"]).size().unstack().to_dict("list") == {
        k: [10] * 6 for k in sorted(KINDS)
    }
    hits = run[run["kind"] == "hit"]
    assert hits["lookup"].isna().all() and hits["cache_get"].notna().all()
    misses = run[run["kind"] == "miss"]
    assert misses[["lookup", "forward", "cache_set"]].notna().all().all()
    assert list(hits["customer_id"]) == list(misses["customer_id"])  # each hit repeats its miss
    stages = [
        c for c in run.columns if c not in ("round", "kind", "customer_id", "outside stages", "whole call")
    ]
    assert np.allclose(run[stages].sum(axis=1) + run["outside stages"], run["whole call"])
    # the service that goes first alternates: no-cache first in half the pairs
    order = run[run["kind"] != "hit"]["kind"].tolist()
    firsts = order[0::2]
    assert firsts.count("no cache") == firsts.count("miss") == 30
    table = hit_miss_table(run)
    assert {"no cache p50", "miss mean", "hit p99"} <= set(table.columns)
    assert np.isnan(table.loc["cache_get", "no cache p50"]) and np.isnan(table.loc["lookup", "hit mean"])


def test_measure_hit_miss_refuses_shared_customers_and_too_few(services):
    store, plain, cached = services
    ids = [store.customer_id(i) for i in range(1, 30)]
    with pytest.raises(ValueError, match="must not share"):
        measure_hit_miss(plain, cached, ids, ids)
    with pytest.raises(ValueError, match="at least"):
        measure_hit_miss(plain, cached, ids[:3], [store.customer_id(500)], rounds=6, warmup=0)


def _synthetic_run(no_cache_us, miss_us, hit_us, *, rounds=6, per_round=4):
    """A run with fixed whole-call times per kind (stages: miss adds cache_get/cache_set to no cache)."""
    rows = []
    for r in range(rounds):
        for _ in range(per_round):
            rows.append(
                {
                    "round": r,
                    "kind": "no cache",
                    "lookup": no_cache_us,
                    "outside stages": 0.0,
                    "whole call": no_cache_us,
                }
            )
            rows.append({"round": r, "kind": "miss", "lookup": no_cache_us, "cache_get": miss_us - no_cache_us,
                         "outside stages": 0.0, "whole call": miss_us})  # fmt: skip
            rows.append(
                {"round": r, "kind": "hit", "cache_get": hit_us, "outside stages": 0.0, "whole call": hit_us}
            )
    frame = pd.DataFrame(rows)
    frame.insert(2, "customer_id", "c")
    return frame


def test_break_even_is_the_mean_formula_and_is_worded_from_its_interval():
    run = _synthetic_run(300.0, 360.0, 60.0)
    result = break_even_hit_rate(run)
    assert result["break_even"] == pytest.approx((360 - 300) / (360 - 60)) == pytest.approx(0.2)
    assert result["low"] == result["high"] == pytest.approx(0.2)
    assert break_even_phrase(result).startswith("lowers the mean latency above a 20 % hit rate")
    never = break_even_hit_rate(_synthetic_run(100.0, 200.0, 150.0))
    assert never["break_even"] == pytest.approx(2.0) and break_even_phrase(never).startswith("never")
    always = break_even_hit_rate(_synthetic_run(300.0, 290.0, 50.0))
    assert always["break_even"] < 0 and break_even_phrase(always).startswith("lowers the mean latency at any")
    wide = {"break_even": 0.4, "low": -0.3, "high": 3.6, "confidence": 0.97}
    assert break_even_phrase(wide).startswith("break-even not resolved on this run")


def test_the_decomposition_adds_up_to_the_whole_call_and_saving_follows_the_means():
    run = _synthetic_run(300.0, 360.0, 60.0)
    parts = miss_cost_decomposition(run)
    assert parts.loc["whole call", "extra_us"] == pytest.approx(60.0)
    assert parts.drop(index="whole call")["extra_us"].sum() == pytest.approx(
        parts.loc["whole call", "extra_us"]
    )
    assert parts.loc["cache_get", "extra_us"] == pytest.approx(60.0) and parts.loc["lookup", "extra_us"] == 0
    saving = saving_at_hit_rate(run, 0.5)
    assert saving["mean_us"] == pytest.approx(0.5 * 60 + 0.5 * 360)
    assert saving["saving"] == pytest.approx(1 - 210 / 300)
    with pytest.raises(ValueError, match="hit_rate"):
        saving_at_hit_rate(run, 1.5)


def test_one_stalled_request_cannot_put_an_estimate_outside_its_own_interval():
    """A 100 ms stall in one no-cache request moves the pooled mean, not the median over rounds."""
    run = _synthetic_run(300.0, 360.0, 60.0, rounds=12)
    stalled = run.index[run["kind"] == "no cache"][0]
    run.loc[stalled, ["lookup", "whole call"]] += 100_000.0
    parts = miss_cost_decomposition(run)
    for part, row in parts.iterrows():
        assert row["low_us"] <= row["extra_us"] <= row["high_us"], part
    assert parts.loc["whole call", "extra_us"] == pytest.approx(60.0)
    assert parts.loc["whole call", "no_cache_us"] == pytest.approx(300.0)
    result = break_even_hit_rate(run)
    assert result["low"] <= result["break_even"] <= result["high"]
    assert result["no_cache_us"] == pytest.approx(300.0)
    saving = saving_at_hit_rate(run, 0.5)
    assert saving["low"] <= saving["saving"] <= saving["high"]
    assert saving["mean_us"] == pytest.approx(210.0) and saving["saving"] == pytest.approx(0.3)
