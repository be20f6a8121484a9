"""Shared fixtures (the real data and the course model, built once per test session) and the one rule for
tests that need a system component.

A test that needs Redis, Chromium (with Playwright), promtool or a grading sandbox says so with
``@pytest.mark.needs("redis-server")`` or, inside a fixture or a test, ``require_component("redis-server")``
(``from conftest import require_component``). Where the component is missing the test is skipped with the
reason and the way to install it; under ``COURSE_CI=1``, which ``.ci/run`` exports, it fails instead, so
that CI never passes by skipping what it was meant to check.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Lessons are stored with inline plots; a non-interactive MPLBACKEND (e.g. Agg) inherited by nbval's kernels
# would make every plot cell produce no output and fail strict comparison.
os.environ.pop("MPLBACKEND", None)

#: The environment variable that turns a missing component from a skip into a failure.
CI_ENV = "COURSE_CI"
#: Debian's Chromium, which the browser test drives through Playwright (no browser download).
CHROMIUM = Path("/usr/bin/chromium")
SYSTEM_DEPS = "`make system-deps` installs it"


def _redis() -> str | None:
    from course_lib.serving.cache.redis_server import redis_unavailable_reason

    return redis_unavailable_reason()


def _chromium() -> str | None:
    return (
        None if CHROMIUM.exists() else f"{CHROMIUM} is not installed ({SYSTEM_DEPS}: Debian package chromium)"
    )


def _playwright() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (it is in requirements.lock: make install)"
    return None


def _promtool() -> str | None:
    from course_lib.operate.promtool import promtool_path

    return (
        None if promtool_path() else f"promtool is not installed ({SYSTEM_DEPS}: Debian package prometheus)"
    )


def _sandbox(mechanism: str) -> Callable[[], str | None]:
    def reason() -> str | None:
        from course_lib.grading.sandbox import find_sandbox

        check = find_sandbox(mechanism)
        return None if check.mechanism is not None else check.reason

    return reason


#: Component name -> a check that returns why it cannot be used here, or None when it can.
COMPONENTS: dict[str, Callable[[], str | None]] = {
    "redis-server": _redis,
    "chromium": _chromium,
    "playwright": _playwright,
    "promtool": _promtool,
    "bwrap": _sandbox("bwrap"),
    "unshare": _sandbox("unshare"),
    "grading sandbox": _sandbox("auto"),
}


def in_ci() -> bool:
    """True when a missing component must fail its tests (``COURSE_CI=1``, set by ``.ci/run``)."""
    return os.environ.get(CI_ENV, "") == "1"


def missing(component: str, reason: str) -> None:
    """Skip the running test because ``component`` is missing, or fail it under ``COURSE_CI=1``."""
    message = f"{component} is missing: {reason}"
    if in_ci():
        pytest.fail(
            f"{message} ({CI_ENV}=1: CI must run every real-component test, not skip it)", pytrace=False
        )
    pytest.skip(message)


def require_component(component: str) -> None:
    """Return if ``component`` (a key of :data:`COMPONENTS`) works here; else skip, or fail under CI.

    Raises
    ------
    KeyError
        If ``component`` is not a key of :data:`COMPONENTS` (the message lists them).
    """
    if component not in COMPONENTS:
        raise KeyError(f"unknown component {component!r}; known: {sorted(COMPONENTS)}")
    reason = COMPONENTS[component]()
    if reason is not None:
        missing(component, reason)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(*components): the test needs these system components (conftest.COMPONENTS); skipped where "
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
    from course_lib.core.waiting import wait_until
    from course_lib.serving.replica import ReplicaConfig, start_replica

    slow = start_replica(
        replica_files.onnx_path,
        replica_files.store_path,
        replica_files.model_version,
        config=ReplicaConfig(slow_fraction=1.0, slow_ms=20_000.0),
        max_lifetime_s=300,
    )
    fast = start_replica(
        replica_files.onnx_path, replica_files.store_path, replica_files.model_version, max_lifetime_s=300
    )
    try:
        wait_until(lambda: slow.is_ready() and fast.is_ready(), timeout_s=60, what="both replicas ready")
        yield slow, fast
    finally:
        slow.stop()
        fast.stop()
