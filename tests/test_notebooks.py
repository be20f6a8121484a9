"""Static checks of the lessons (strict nbval executes them; these check what execution cannot)."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
from pathlib import Path

import pytest

import course_lib

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _exports() -> set[str]:
    names: set[str] = set(course_lib.__all__)
    for info in pkgutil.walk_packages(course_lib.__path__, prefix="course_lib."):
        module = importlib.import_module(info.name)
        names.update(getattr(module, "__all__", ()))
    return names - {"__version__"}


def _code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _defined_names(source: str) -> set[str]:
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    tree = ast.parse("\n".join(lines))
    return {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


def test_there_are_lessons():
    assert LESSONS, "no notebooks found in notebooks/"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_never_redefines_what_course_lib_exports(path):
    exported = _exports()
    clashes = sorted({name for src in _code_cells(path) for name in _defined_names(src)} & exported)
    assert not clashes, f"{path.name} defines {clashes}; import them from course_lib instead"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_is_committed_with_outputs_from_one_clean_run(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c.get("execution_count") for c in code]
    assert all(isinstance(n, int) for n in counts), "every code cell must have been executed"
    assert counts == list(range(1, len(counts) + 1)), "restart the kernel and run all before committing"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, "stored outputs contain an error"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_prints_the_environment_first(path):
    first_code = _code_cells(path)[:3]
    assert any("env_report()" in src for src in first_code), "print env_report() in the first code cells"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_plot_is_labelled_and_shown(path):
    for src in _code_cells(path):
        if "plt." in src or ".plot(" in src:
            if "plt.show()" not in src:
                continue  # helper cells that only prepare data
            assert "xlabel" in src or "set_xlabel" in src, f"unlabelled x axis in {path.name}:\n{src[:200]}"
            assert "ylabel" in src or "set_ylabel" in src, f"unlabelled y axis in {path.name}:\n{src[:200]}"
