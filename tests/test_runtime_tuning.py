"""course_lib.optimize.runtime_tuning: optimisation levels x intra-op threads, and oversubscription across processes."""

from __future__ import annotations

import pytest

from course_lib.churn.export import OnnxChurnScorer, make_session
from course_lib.churn.model import features
from course_lib.optimize.runtime_tuning import (
    optimized_op_counts,
    oversubscription_ratio,
    oversubscription_table,
    tuning_ratio,
    tuning_table,
    usable_cores,
)


@pytest.fixture(scope="module")
def tree_file(onnx_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("tree") / "tree.onnx"
    path.write_bytes(onnx_model.SerializeToString())
    return path


@pytest.fixture(scope="module")
def feeds(onnx_model, churn_model):
    scorer = OnnxChurnScorer(make_session(onnx_model))
    X = features(churn_model.split.test)
    return {1: scorer.feeds(X.iloc[:1]), 64: scorer.feeds(X.iloc[:64])}


def test_tuning_table_times_every_setting_at_every_batch_size(tree_file, feeds):
    table = tuning_table(
        tree_file, feeds, levels=("disabled", "all"), intra_op_threads=(1, 2), n_calls={1: 5, 64: 3}, rounds=1
    )
    assert len(table) == 2 * 2 * 2
    assert table.index.names == ["batch_size", "graph_optimization_level", "intra_op_num_threads"]
    assert (table["median_us"] > 0).all()
    assert table.loc[(64, "disabled", 1), "speedup"] == 1.0
    assert table.loc[(64, "all", 2), "us_per_item"] == pytest.approx(
        table.loc[(64, "all", 2), "median_us"] / 64
    )


def test_tuning_table_rejects_bad_settings(tree_file, feeds):
    with pytest.raises(ValueError, match="levels"):
        tuning_table(tree_file, feeds, levels=("max",))
    with pytest.raises(ValueError, match="exactly 2"):
        tuning_table(tree_file, {2: feeds[1]})
    with pytest.raises(ValueError, match="intra_op_num_threads"):
        tuning_table(tree_file, feeds, intra_op_threads=(-1,))
    with pytest.raises(ValueError, match="feeds_by_batch must be non-empty"):
        tuning_table(tree_file, {})


def test_oversubscription_table_merges_workers_samples(tree_file, feeds):
    table = oversubscription_table(tree_file, feeds[1], [(1, 1), (2, 1)], n_calls=50, warmup_calls=5)
    assert list(table.index) == [(1, 1), (2, 1)]
    assert table.loc[(2, 1), "threads_total"] == 2
    assert table.loc[(2, 1), "threads_per_core"] == pytest.approx(2 / usable_cores())
    assert (table["p99_us"] >= table["p50_us"]).all() and (table["achieved_rps"] > 0).all()


def test_oversubscription_rejects_bad_configs(tree_file, feeds):
    with pytest.raises(ValueError, match="configs must be non-empty"):
        oversubscription_table(tree_file, feeds[1], [])
    with pytest.raises(ValueError, match=">= 1"):
        oversubscription_table(tree_file, feeds[1], [(0, 1)])
    with pytest.raises(ValueError, match=">= 0"):
        oversubscription_table(tree_file, feeds[1], [(1, -1)])


def test_tuning_ratio_pairs_the_rounds_of_two_settings(tree_file, feeds):
    table = tuning_table(
        tree_file, feeds, levels=("disabled", "all"), intra_op_threads=(1,), n_calls={1: 20, 64: 20}, rounds=6
    )
    same = tuning_ratio(table, (64, "all", 1), (64, "all", 1))
    assert (same.ratio, same.low, same.high, same.direction) == (1.0, 1.0, 1.0, 0)
    other = tuning_ratio(table, (64, "all", 1), (64, "disabled", 1))
    assert other.rounds == 6 and other.low <= other.ratio <= other.high
    with pytest.raises(ValueError, match="one batch size"):
        tuning_ratio(table, (1, "all", 1), (64, "all", 1))


def test_the_optimisation_levels_leave_the_tree_graph_as_it_is(tree_file):
    """A deterministic fact behind Lesson 4's reading of its timings: nothing to fuse in this graph."""
    ops = optimized_op_counts(tree_file)
    assert list(ops.index) == ["disabled", "basic", "extended", "all"]
    assert (ops.nunique() == 1).all()  # the same operators at every level
    assert ops.loc["all", "TreeEnsembleClassifier"] == 1


def test_oversubscription_repeats_take_turns_and_give_an_interval(tree_file, feeds):
    table = oversubscription_table(
        tree_file, feeds[1], [(1, 1), (2, 1)], n_calls=20, warmup_calls=2, repeats=6
    )
    reps = table.attrs["repeats"]
    assert {k: len(v["achieved_rps"]) for k, v in reps.items()} == {(1, 1): 6, (2, 1): 6}
    ratio = oversubscription_ratio(table, (2, 1), (1, 1), metric="p50_us")
    assert ratio.rounds == 6 and ratio.low <= ratio.ratio <= ratio.high
    with pytest.raises(ValueError, match="repeats"):
        oversubscription_table(tree_file, feeds[1], [(1, 1)], repeats=0)
