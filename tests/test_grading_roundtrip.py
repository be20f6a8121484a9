"""The nbgrader round-trip CI relies on before a class depends on the exercises.

A fresh copy of ``exercises/`` (no gradebook) goes through what an instructor does: generate the student
versions, collect the fixture class (``tests/fixtures/grading``), autograde, write feedback, export
grades. Slow steps run once per module; each test then checks one promise. ``nbgrader validate`` always
exits 0, so the notebooks' own tests are checked through nbgrader's ``Validator`` API instead.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from course_lib.grading import export_grades_csv, question_scores, run_nbgrader

REPO = Path(__file__).resolve().parents[1]
EXERCISES = REPO / "exercises"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "grading"
PROBLEM_SETS = ("ps1", "ps2", "ps3")
HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
SOLUTION = ("### BEGIN SOLUTION", "### END SOLUTION")
FAILED_STUDENT = "corrupt-json"


def _nbgrader_cells(nb, **flags) -> list:
    """Cells whose nbgrader metadata has every flag given (e.g. grade=True)."""
    return [
        cell
        for cell in nb.cells
        if all(cell.get("metadata", {}).get("nbgrader", {}).get(k) == v for k, v in flags.items())
    ]


def _cell(nb, grade_id: str):
    [cell] = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id]
    return cell


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _validate(path: Path) -> dict:
    """nbgrader's Validator on one notebook, with this checkout's course_lib importable by the kernel."""
    from nbgrader.validator import Validator

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "PYTHONPATH", os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)
        )
        return Validator().validate(str(path))


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A copy of the course root with the committed source and release, and no gradebook."""
    root = tmp_path_factory.mktemp("course") / "exercises"
    shutil.copytree(
        EXERCISES,
        root,
        ignore=shutil.ignore_patterns(
            "gradebook.db",
            "submitted",
            "autograded",
            "feedback",
            "*.csv",
            ".ipynb_checkpoints",
            "__pycache__",
        ),
    )
    assert not (root / "gradebook.db").exists()
    return root


@pytest.fixture(scope="module")
def generated(course) -> Path:
    """``nbgrader generate_assignment <ps> --force`` for every problem set (this creates the gradebook)."""
    for ps in PROBLEM_SETS:
        done = run_nbgrader("generate_assignment", ps, "--force", course_root=course)
        assert done.returncode == 0, f"generate_assignment {ps} failed:\n{done.stderr[-3000:]}"
    return course


@pytest.fixture(scope="module")
def graded(generated) -> dict:
    """Collect the fixture class, autograde each problem set once, write feedback and grades.csv."""
    shutil.copytree(FIXTURES / "submitted", generated / "submitted")
    autograde = {ps: run_nbgrader("autograde", ps, course_root=generated) for ps in PROBLEM_SETS}
    feedback = {ps: run_nbgrader("generate_feedback", ps, course_root=generated) for ps in PROBLEM_SETS}
    export = export_grades_csv(generated / "grades.csv", course_root=generated)
    return {"root": generated, "autograde": autograde, "feedback": feedback, "export": export}


def _submissions(ps: str) -> list[str]:
    return sorted(p.name for p in (FIXTURES / "submitted").iterdir() if (p / ps / f"{ps}.ipynb").exists())


# --- the exercises as committed -------------------------------------------------------------------------


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_source_notebook_passes_all_its_tests_including_hidden_ones(ps):
    source = EXERCISES / "source" / ps / f"{ps}.ipynb"
    grade_cells = _nbgrader_cells(_read(source), grade=True)
    assert len(grade_cells) >= 3, "each problem set has several graded questions"
    for cell in grade_cells:
        assert cell.metadata.nbgrader["locked"] and cell.metadata.nbgrader["points"] > 0, cell.metadata
        assert HIDDEN[0] in cell.source and HIDDEN[1] in cell.source, (
            f"{cell.metadata.nbgrader['grade_id']} lacks hidden tests"
        )
    assert _validate(source) == {}, "the instructor's solution must pass every visible and hidden test"


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_every_release_test_fails_on_the_stubs(ps):
    release = EXERCISES / "release" / ps / f"{ps}.ipynb"
    results = _validate(release)
    assert set(results) == {"failed"}, (
        f"expected only failures (no changed or retyped cells), got {set(results)}"
    )
    n_grade_cells = len(_nbgrader_cells(_read(release), grade=True))
    assert len(results["failed"]) == n_grade_cells, "a test that passes on an empty answer gives free points"


def _comparable(path: Path) -> dict:
    """What matters in a student version: format, notebook metadata and each cell (id, type, text, metadata)."""
    nb = _read(path)
    return {
        "nbformat": (nb.nbformat, nb.nbformat_minor),
        "metadata": nb.metadata,
        "cells": [
            {
                "id": cell.get("id"),
                "cell_type": cell.cell_type,
                "source": cell.source,
                "metadata": cell.metadata,
                "outputs": cell.get("outputs"),
            }
            for cell in nb.cells
        ],
    }


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_committed_release_is_what_generate_assignment_produces(generated, ps):
    committed, regenerated = EXERCISES / "release" / ps, generated / "release" / ps
    assert sorted(p.name for p in regenerated.iterdir()) == sorted(p.name for p in committed.iterdir())
    assert _comparable(regenerated / f"{ps}.ipynb") == _comparable(committed / f"{ps}.ipynb"), (
        f"exercises/release/{ps} is stale: run `make exercises` and commit the result"
    )


def _lines_inside(text: str, begin: str, end: str) -> tuple[set[str], set[str]]:
    """Stripped non-empty lines inside and outside ``begin``/``end`` regions."""
    inside, outside, within = set(), set(), False
    for line in text.split("\n"):
        stripped = line.strip()
        if begin in line:
            within = True
        elif end in line:
            within = False
        elif stripped:
            (inside if within else outside).add(stripped)
    return inside, outside


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_release_holds_no_solution_no_hidden_test_and_no_nbval_marker(ps):
    release_text = (EXERCISES / "release" / ps / f"{ps}.ipynb").read_text(encoding="utf-8")
    for marker in (*HIDDEN, *SOLUTION, "NBVAL"):
        assert marker not in release_text, f"{marker!r} leaked into the student version"
    release_lines = {
        line.strip()
        for cell in _read(EXERCISES / "release" / ps / f"{ps}.ipynb").cells
        for line in cell.source.split("\n")
    }
    source = _read(EXERCISES / "source" / ps / f"{ps}.ipynb")
    for begin, end in (HIDDEN, SOLUTION):
        inside, outside = set(), set()
        for cell in source.cells:
            cell_inside, cell_outside = _lines_inside(cell.source, begin, end)
            inside |= cell_inside
            outside |= cell_outside
        secret = inside - outside
        assert secret, f"the source of {ps} should have lines between {begin!r} and {end!r}"
        assert not secret & release_lines, (
            f"lines from {begin!r} regions leaked: {sorted(secret & release_lines)}"
        )


def test_exercises_hold_no_nbval_marker_and_use_the_python3_kernel():
    notebooks = sorted(EXERCISES.glob("*/*/*.ipynb"))
    assert len(notebooks) == 2 * len(PROBLEM_SETS)
    for path in [*notebooks, EXERCISES / "nbgrader_config.py"]:
        assert "NBVAL" not in path.read_text(encoding="utf-8"), path
    for path in notebooks:
        assert _read(path).metadata.kernelspec["name"] == "python3", path


def test_committed_fixture_class_is_exactly_what_make_fixtures_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(tmp_path)
    made = {
        p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "submitted").rglob("*") if p.is_file()
    }
    committed = {
        p.relative_to(FIXTURES): p.read_bytes() for p in (FIXTURES / "submitted").rglob("*") if p.is_file()
    }
    assert sorted(made) == sorted(committed)
    stale = [str(path) for path in made if made[path] != committed[path]]
    assert not stale, f"run `python tests/fixtures/grading/make_fixtures.py` and commit: {stale}"


# --- grading the fixture class --------------------------------------------------------------------------


def test_autograde_reports_the_corrupt_notebook_and_grades_everyone_else(graded):
    ps1 = graded["autograde"]["ps1"]
    assert ps1.returncode == 1, "nbgrader exits 1 when a submission could not be graded"
    assert f"There was an error processing assignment 'ps1' for student '{FAILED_STUDENT}'" in ps1.stderr
    for ps in ("ps2", "ps3"):
        assert graded["autograde"][ps].returncode == 0, graded["autograde"][ps].stderr[-3000:]
    for ps in PROBLEM_SETS:
        for student in _submissions(ps):
            autograded = graded["root"] / "autograded" / student / ps / f"{ps}.ipynb"
            assert autograded.exists() == (student != FAILED_STUDENT), autograded


def test_per_question_scores_match_the_expected_table_exactly(graded):
    table = question_scores(graded["root"])
    expected = (FIXTURES / "expected_question_scores.csv").read_text(encoding="utf-8")
    assert table.to_csv(index=False, lineterminator="\n") == expected


def test_exported_grades_csv_matches_the_expected_table_exactly(graded):
    assert len(graded["export"]) == 3 * len({p.name for p in (FIXTURES / "submitted").iterdir()})
    grades = pd.read_csv(graded["root"] / "grades.csv", dtype=str, keep_default_na=False)
    grades = grades.sort_values(["assignment", "student_id"])
    expected = (FIXTURES / "expected_grades.csv").read_text(encoding="utf-8")
    assert grades.to_csv(index=False, lineterminator="\n") == expected


def test_totals_in_grades_csv_are_the_sums_of_the_question_scores(graded):
    per_question = question_scores(graded["root"]).groupby(["assignment", "student_id"])["score"].sum()
    grades = pd.read_csv(graded["root"] / "grades.csv", dtype={"student_id": str}).set_index(
        ["assignment", "student_id"]
    )
    for key, total in per_question.items():
        assert grades.loc[key, "score"] == total, key


def test_an_infinite_loop_is_interrupted_and_the_other_questions_are_graded(graded):
    nb = _read(graded["root"] / "autograded" / "infinite-loop" / "ps3" / "ps3.ipynb")
    errors = {out.ename for out in _cell(nb, "q4_answer").outputs if out.output_type == "error"}
    assert "CellTimeoutError" in errors, errors
    scores = question_scores(graded["root"], "ps3").set_index(["student_id", "question"])["score"]
    assert [scores["infinite-loop", q] for q in ("q1", "q2", "q3", "q4")] == [2.0, 3.0, 3.0, 0.0]


def test_an_edited_test_cell_is_restored_from_the_gradebook(graded):
    submitted = _cell(_read(FIXTURES / "submitted" / "edited-test" / "ps1" / "ps1.ipynb"), "q2")
    assert submitted.source.endswith("assert True") and submitted.metadata.nbgrader["points"] == 10
    restored = _cell(_read(graded["root"] / "autograded" / "edited-test" / "ps1" / "ps1.ipynb"), "q2")
    original = _cell(_read(EXERCISES / "source" / "ps1" / "ps1.ipynb"), "q2")
    assert restored.source == original.source, "the instructor's test, hidden part included, is what ran"
    assert restored.metadata.nbgrader["points"] == 3
    assert any(out.output_type == "error" and out.ename == "AssertionError" for out in restored.outputs)


def test_a_deleted_test_cell_is_put_back_after_its_answer_and_graded(graded):
    submitted = _read(FIXTURES / "submitted" / "deleted-test" / "ps2" / "ps2.ipynb")
    assert "q3" not in [c.metadata.get("nbgrader", {}).get("grade_id") for c in submitted.cells]
    nb = _read(graded["root"] / "autograded" / "deleted-test" / "ps2" / "ps2.ipynb")
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    assert ids.index("q3") == ids.index("q3_answer") + 1
    original = _cell(_read(EXERCISES / "source" / "ps2" / "ps2.ipynb"), "q3")
    assert _cell(nb, "q3").source.endswith(original.source)
    row = (
        question_scores(graded["root"], "ps2")
        .set_index(["student_id", "question"])
        .loc[("deleted-test", "q3")]
    )
    assert (row["score"], row["autograded"], row["needs_manual_grade"]) == (2.0, True, False)


def test_feedback_is_written_for_every_graded_submission_with_its_score(graded):
    totals = (
        question_scores(graded["root"]).groupby(["assignment", "student_id"])[["score", "max_score"]].sum()
    )
    for ps in PROBLEM_SETS:
        assert graded["feedback"][ps].returncode == 0, graded["feedback"][ps].stderr[-3000:]
        for student in _submissions(ps):
            html = graded["root"] / "feedback" / student / ps / f"{ps}.html"
            assert html.exists() == (student != FAILED_STUDENT), html
            if student != FAILED_STUDENT:
                found = re.search(rf"{ps} \(Score: ([\d.]+) / ([\d.]+)\)", html.read_text(encoding="utf-8"))
                assert found, f"no score line in {html}"
                expected = totals.loc[(ps, student)]
                assert (float(found[1]), float(found[2])) == (expected["score"], expected["max_score"]), html


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_hard_coded_answers_pass_the_visible_checks_but_not_the_hidden_ones(graded, ps):
    assert _validate(FIXTURES / "submitted" / "hard-coded" / ps / f"{ps}.ipynb") == {}, "visible checks pass"
    scores = question_scores(graded["root"], ps).set_index(["student_id", "question"])["score"]
    hard_coded = {"ps1": ("q3", "q4"), "ps2": ("q1", "q2", "q3", "q4"), "ps3": ("q1", "q2", "q3", "q4")}[ps]
    assert all(scores["hard-coded", q] == 0.0 for q in hard_coded)
