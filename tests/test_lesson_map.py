"""The module -> lesson map: it runs, covers every course module a notebook imports, and follows imports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.lesson_map import ROOT, build_lesson_map, main

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "exercises" / "source").glob("*/*.ipynb")
)
# Independent of the module's AST reading: a plain pattern over the code cells.
IMPORT = re.compile(
    r"^\s*(?:from\s+(course_lib(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]+)|import\s+(course_lib(?:\.\w+)*))",
    re.M,
)


def _is_concept(dotted: str) -> bool:
    """A public module file or a package folder (not a private ``_x`` module)."""
    rel = ROOT / dotted.replace(".", "/")
    return not rel.name.startswith("_") and (
        rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()
    )


def _modules_by_regex(path: Path) -> set[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    found = set()
    for package_from, names, plain in IMPORT.findall(code):
        if plain:
            found.add(plain)
        else:
            for name in re.findall(r"\w+", re.sub(r"\s+as\s+\w+", "", names.split("#")[0])):
                found.add(f"{package_from}.{name}" if _is_concept(f"{package_from}.{name}") else package_from)
    return found


def test_the_command_runs_and_prints_every_module_a_notebook_uses():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "course_lib.lesson_map"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    printed = {line.split()[0] for line in done.stdout.splitlines()[1:]}
    used = set().union(*(_modules_by_regex(nb) for nb in NOTEBOOKS))
    assert used and used <= printed, sorted(used - printed)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_course_module_a_notebook_imports_maps_back_to_it(path):
    lesson_map = build_lesson_map()
    rel = path.relative_to(ROOT).as_posix()
    expected = _modules_by_regex(path)
    assert lesson_map.direct[rel] == expected
    for module in expected:
        assert _is_concept(module) or module == "course_lib", module
        assert rel in lesson_map.lessons_using(module)


def test_a_change_to_a_module_names_the_lessons_that_run_it_through_other_modules():
    lesson_map = build_lesson_map()
    # no lesson imports the batching rule itself; the simulator and the batcher do
    lessons, unmapped = lesson_map.to_re_execute(["course_lib/serving/batching/rule.py"])
    users_of_simulator = lesson_map.lessons_using("course_lib.simulate.batching")
    assert users_of_simulator and set(users_of_simulator) <= set(lessons)
    assert not unmapped
    assert not any("course_lib.serving.batching.rule" in mods for mods in lesson_map.direct.values())


def test_changed_notebooks_name_themselves_and_other_files_are_reported(capsys):
    lesson = "notebooks/01_churn_model.ipynb"
    assert main(["--changed", lesson, "README.md", str(ROOT / "course_lib" / "cost" / "fleet.py")]) == 0
    out, err = capsys.readouterr()
    assert lesson in out.splitlines()
    assert set(build_lesson_map().lessons_using("course_lib.cost.fleet")) <= set(out.splitlines())
    assert "README.md" in err


def test_an_empty_change_list_names_nothing_to_re_execute(capsys):
    assert main(["--changed"]) == 0
    assert capsys.readouterr().out.strip() == "no changed files: nothing to re-execute"


def test_a_private_module_names_the_lessons_of_its_package():
    lesson_map = build_lesson_map()
    lessons, unmapped = lesson_map.to_re_execute(["course_lib/serving/service/_app.py"])
    assert not unmapped
    assert lessons == lesson_map.lessons_using("course_lib.serving.service")
    assert "notebooks/02_latency_budget.ipynb" in lessons
