"""The three install routes agree: pyproject ranges, the exact lock, and the conda environment file."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _pin(line: str) -> tuple[str, str]:
    req = Requirement(line)
    (spec,) = req.specifier
    assert spec.operator == "==", f"lock entries must be exact pins: {line}"
    return canonicalize_name(req.name), spec.version


def _lock() -> dict[str, str]:
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    return dict(_pin(line) for line in lines if line and not line.startswith("#"))


def _pyproject() -> list[Requirement]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [Requirement(d) for d in data["project"]["dependencies"]]


def _conda_pip() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return pip


def test_environment_yml_names_the_same_packages_as_pyproject():
    conda = {canonicalize_name(Requirement(p).name) for p in _conda_pip() if not p.startswith("-")}
    assert conda == {canonicalize_name(r.name) for r in _pyproject()}


def test_environment_yml_pins_equal_the_lock_and_installs_the_lock_and_package():
    lock = _lock()
    pip = _conda_pip()
    for entry in pip:
        if entry.startswith("-"):
            continue
        name, version = _pin(entry)
        assert lock[name] == version, name
    assert "-r requirements.lock" in pip and "-e ." in pip


def test_every_locked_direct_dependency_satisfies_its_range():
    lock = _lock()
    for req in _pyproject():
        version = lock.get(canonicalize_name(req.name))
        assert version is not None, f"{req.name} is missing from requirements.lock"
        assert req.specifier.contains(version, prereleases=True), (
            f"{req.name}=={version} violates {req.specifier}"
        )


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme
    assert re.search(r"^make test$", ci, flags=re.MULTILINE)
