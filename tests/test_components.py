"""The rule for tests that need a system component (``tests/components.py``): skipped with the reason where
it is missing, failed under ``COURSE_CI=1``; both ways, through the function and through the marker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from components import CI_ENV, COMPONENTS, require_component

ROOT = Path(__file__).resolve().parent.parent

INNER_TESTS = """
import pytest
from components import require_component


@pytest.fixture
def fake():
    require_component("fake-missing")


def test_through_a_fixture(fake):
    pass


@pytest.mark.needs("fake-missing")
def test_through_the_marker():
    pass


@pytest.mark.needs("fake-present")
def test_a_present_component_runs():
    pass
"""


@pytest.fixture
def fake_components(monkeypatch):
    monkeypatch.setitem(COMPONENTS, "fake-missing", lambda: "not installed here (install it with X)")
    monkeypatch.setitem(COMPONENTS, "fake-present", lambda: None)


def test_a_missing_component_skips_outside_ci(fake_components, monkeypatch):
    monkeypatch.delenv(CI_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"fake-missing is missing: not installed here \(install"):
        require_component("fake-missing")


def test_a_missing_component_fails_under_course_ci(fake_components, monkeypatch):
    monkeypatch.setenv(CI_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"fake-missing is missing: .*\(COURSE_CI=1"):
        require_component("fake-missing")


@pytest.mark.parametrize("ci", ["", "1"])
def test_a_present_component_passes_either_way(fake_components, monkeypatch, ci):
    monkeypatch.setenv(CI_ENV, ci)
    assert require_component("fake-present") is None


def test_an_unknown_component_is_a_mistake_not_a_skip():
    with pytest.raises(KeyError, match="known: "):
        require_component("redis")


def test_every_component_check_answers_here():
    """Each real check runs and returns None or a reason that says how to get the component."""
    for name, check in COMPONENTS.items():
        reason = check()
        assert reason is None or (isinstance(reason, str) and reason), name


def _inner_run(tmp_path: Path, ci: str) -> subprocess.CompletedProcess[str]:
    inner = tmp_path / "inner"
    inner.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", inner / "conftest.py")
    shutil.copy(ROOT / "tests" / "components.py", inner / "components.py")
    with (inner / "components.py").open("a") as f:
        f.write(
            '\nCOMPONENTS["fake-missing"] = lambda: "not installed here"\nCOMPONENTS["fake-present"] = lambda: None\n'
        )
    (inner / "test_inner.py").write_text(INNER_TESTS)
    env = {k: v for k, v in os.environ.items() if k != CI_ENV} | {CI_ENV: ci}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(inner)],
        cwd=inner,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_pytest_run_skips_outside_ci(tmp_path):
    done = _inner_run(tmp_path, ci="")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 2 skipped" in done.stdout, done.stdout
    assert done.stdout.count("fake-missing is missing: not installed here") == 2, done.stdout


def test_a_pytest_run_fails_under_course_ci(tmp_path):
    done = _inner_run(tmp_path, ci="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed, 2 errors" in done.stdout, done.stdout  # a failure in setup is an error
    assert "COURSE_CI=1" in done.stdout


def test_ci_exports_course_ci():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "export COURSE_CI=1" in ci.splitlines()
