"""Shared fixtures (the real data and the course model, built once per test session) and the ``needs`` marker.

A test that needs Redis, Chromium (with Playwright), promtool or a grading sandbox says so with
``@pytest.mark.needs("redis-server")`` or ``components.require_component`` (see ``tests/components.py``).
"""

from __future__ import annotations

import os

import pytest
from components import require_component

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Lessons are stored with inline plots; a non-interactive MPLBACKEND (e.g. Agg) inherited by nbval's kernels
# would make every plot cell produce no output and fail strict comparison.
os.environ.pop("MPLBACKEND", None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(*components): the test needs these system components (tests/components.py); skipped where "
        "one is missing, failed under COURSE_CI=1",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        for component in mark.args:
            require_component(component)


@pytest.fixture(scope="session")
def telco():
    from course_lib.churn.data import load_telco

    return load_telco()


@pytest.fixture(scope="session")
def churn_model():
    """The course XGBoost pipeline, trained once (deterministic, one thread)."""
    from course_lib.churn.model import train_churn_model

    return train_churn_model()


@pytest.fixture(scope="session")
def onnx_model(churn_model):
    from course_lib.churn.export import pipeline_to_onnx

    return pipeline_to_onnx(churn_model.pipeline)


@pytest.fixture(scope="session")
def onnx_scorer(onnx_model):
    from course_lib.churn.export import OnnxChurnScorer, make_session

    return OnnxChurnScorer(make_session(onnx_model))


@pytest.fixture(scope="session")
def replica_files(tmp_path_factory):
    """An exported model and a small feature store for replica processes (course_lib.serving.replica._replica)."""
    from course_lib.serving.replica import prepare_replica_files

    return prepare_replica_files(tmp_path_factory.mktemp("replica_files"), n_customers=2_000)


@pytest.fixture(scope="session")
def ids(replica_files):
    from course_lib.serving.feature_store import FeatureStore

    with FeatureStore(replica_files.store_path) as store:
        return store.sample_ids(200, seed=1)


@pytest.fixture(scope="session")
def slow_and_fast_replicas(replica_files):
    """Two replica processes: the first stalls every request by 20 s, the second never stalls."""
    from replicas import running_replicas

    from course_lib.serving.replica import ReplicaConfig

    slow_config = ReplicaConfig(slow_fraction=1.0, slow_ms=20_000.0)
    with running_replicas(replica_files, [slow_config, None]) as (slow, fast):
        yield slow, fast
