"""Comparing worker counts (course_lib.offline.scaling) and the model-only floor (course_lib.offline.floor)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from course_lib.offline.floor import model_floor
from course_lib.offline.rows import check_rows, encode_rows
from course_lib.offline.scaling import alternating_pairs, median_ratio
from course_lib.offline.scorers import scorer_spec
from course_lib.offline.store import build_parquet_store, plan_chunks, read_chunk


def _coverage(n: int, k: int) -> float:
    return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2**n


@pytest.mark.parametrize(("n", "confidence", "k"), [(5, 0.9, 1), (8, 0.9, 2), (10, 0.95, 2), (20, 0.95, 6)])
def test_median_interval_uses_conovers_order_statistics(n, confidence, k):
    # Conover (1999), table A3 / eq. 3.2.x: [x_(k), x_(n+1-k)] with coverage 1 - 2 P(B <= k - 1)
    ratios = list(np.linspace(0.5, 2.0, n)[::-1])  # any order: the function sorts
    got = median_ratio(ratios, confidence=confidence)
    ordered = sorted(ratios)
    assert (got.low, got.high) == (ordered[k - 1], ordered[n - k])
    assert got.confidence == pytest.approx(_coverage(n, k)) and got.confidence >= confidence
    assert _coverage(n, k + 1) < confidence, "the narrowest interval that still covers"
    assert got.median == pytest.approx(float(np.median(ratios)))


def test_a_direction_word_only_when_the_interval_excludes_one():
    assert (
        median_ratio([1.8, 1.9, 2.0, 2.1, 1.7])
        .verdict(what="two workers")
        .startswith("two workers: 1.90x faster")
    )
    assert "slower" in median_ratio([0.5, 0.6, 0.55, 0.52, 0.58]).verdict()
    mixed = median_ratio([0.9, 1.2, 1.1, 0.95, 1.3]).verdict()
    assert "no difference this run can resolve" in mixed and "faster" not in mixed and "slower" not in mixed
    with pytest.raises(ValueError, match="ratios"):
        median_ratio([1.0])
    with pytest.raises(ValueError, match="confidence"):
        median_ratio([1.0, 2.0], confidence=1.0)


def test_alternating_pairs_warm_both_and_swap_the_order():
    calls: list[str] = []

    def run(name: str, seconds: float):
        return lambda: calls.append(name) or seconds

    table = alternating_pairs(run("a", 2.0), run("b", 1.0), repeats=4)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert list(table["first"]) == ["a", "b", "a", "b"] and (table["a_over_b"] == 2.0).all()
    with pytest.raises(ValueError, match="repeats"):
        alternating_pairs(run("a", 1.0), run("b", 1.0), repeats=1)


def test_the_floor_runs_the_same_scorer_in_every_process(churn_model, tmp_path):
    store = build_parquet_store(4_000, 2, folder=tmp_path, row_group_rows=4_000)
    spec = scorer_spec(churn_model, "xgboost")
    X = encode_rows(check_rows(read_chunk(plan_chunks(store, 4_000), 0)), spec.encoding)
    floor = model_floor(spec, X, processes=2, calls=3)
    assert (floor.runtime, floor.processes, floor.rows) == ("xgboost", 2, 2 * 3 * 4_000)
    assert floor.rows_per_s == pytest.approx(floor.rows / floor.seconds)
    assert len(floor.per_process_rows_per_s) == 2 and min(floor.per_process_rows_per_s) > 0
    with pytest.raises(ValueError, match="float32"):
        model_floor(spec, X.astype(np.float64), processes=1)
    with pytest.raises(ValueError, match="processes"):
        model_floor(spec, X, processes=0)
