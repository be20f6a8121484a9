"""The one rule for tests that need a system component (Redis, Chromium + Playwright, promtool, a sandbox).

``@pytest.mark.needs("redis-server")`` on a test, or ``require_component("redis-server")`` inside a fixture
or a test (``from components import require_component``). Where the component is missing the test is
skipped with the reason and the way to install it; under ``COURSE_CI=1``, which ``.ci/run`` exports, it
fails instead, so that CI never passes by skipping what it was meant to check.

A plain module, not ``conftest.py``: the fixture folders have conftest files of their own, and pytest
would give two modules the name ``conftest``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

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


def _serving_extras() -> str | None:
    from course_lib.offline.inference_servers import serving_unavailable_reason

    return serving_unavailable_reason()


#: Component name -> a check that returns why it cannot be used here, or None when it can.
COMPONENTS: dict[str, Callable[[], str | None]] = {
    "redis-server": _redis,
    "chromium": _chromium,
    "playwright": _playwright,
    "promtool": _promtool,
    "bwrap": _sandbox("bwrap"),
    "unshare": _sandbox("unshare"),
    "grading sandbox": _sandbox("auto"),
    "serving-extras": _serving_extras,
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
