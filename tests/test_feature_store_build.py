"""Building the feature store: idempotent, atomic, stale temporaries removed, bad populations refused."""

from __future__ import annotations

import pytest

from course_lib.churn.data import ID_COLUMN, make_customers
from course_lib.serving.feature_store import (
    FeatureStore,
    build_feature_store,
    customer_id,
    feature_store_path,
    read_meta,
)


def test_build_is_idempotent_and_reuses_a_finished_store(tmp_path):
    first = build_feature_store(300, 2, folder=tmp_path)
    again = build_feature_store(300, 2, folder=tmp_path)
    assert first.built is True and again.built is False
    assert again.path == first.path == feature_store_path(300, 2, tmp_path)
    assert again.size_bytes > 0
    assert read_meta(again.path) == {
        "schema_version": "1",
        "n_customers": "300",
        "seed": "2",
        "rows": "300",
        "complete": "1",
    }
    assert read_meta(tmp_path / "absent.sqlite") is None


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
    stale = path.with_name(
        f".{path.name}.{gone_pid}.0a1b2c3d.tmp"
    )  # course_lib.core.files.atomic_path's name
    stale.write_bytes(b"x" * 1000)
    live = path.with_name(f".{path.name}.{os.getppid()}.0a1b2c3d.tmp")  # a live process may still be building
    live.write_bytes(b"y")
    other_store = tmp_path / ".customers_n999_seed3_v1.sqlite.123.0a1b2c3d.tmp"
    other_store.write_bytes(b"z")
    assert build_feature_store(200, 3, folder=tmp_path).built
    assert not stale.exists()
    assert live.exists() and other_store.exists()


@pytest.mark.parametrize(("n", "seed"), [(0, 0), (-5, 0), (2.5, 0), (True, 0), (10, -1)])
def test_bad_population_parameters_are_rejected(n, seed, tmp_path):
    with pytest.raises(ValueError, match=r"n_customers|seed"):
        build_feature_store(n, seed, folder=tmp_path)


def test_customer_ids_match_make_customers():
    frame = make_customers(120, 0)
    assert [customer_id(i, 120) for i in (1, 120)] == [frame[ID_COLUMN].iloc[0], frame[ID_COLUMN].iloc[-1]]
    assert customer_id(1, 10_000_000) == "SC-00000001"
    with pytest.raises(ValueError, match="index must be an integer >= 1 and <= 120, got 121"):
        customer_id(121, 120)
