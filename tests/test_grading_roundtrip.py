"""The nbgrader round-trip CI relies on before a class depends on the exercises (every problem set, ps1-ps5).

A fresh copy of ``exercises/`` (no gradebook) goes through what an instructor does: generate the student
versions, collect the fixture class (``tests/fixtures/grading``), autograde (sandboxed, screened, graded
from errors only), write feedback, export grades. Slow steps run once per module; each test then checks
one promise. The class includes honest mistakes and cheats (``make_fixtures.py`` lists them); the
expected per-question scores of every student are the table ``expected_question_scores.csv`` (add a
problem set by adding it to ``PROBLEM_SETS``, its fixtures and its rows). Before and after grading the
test hashes the gradebook, ``source/``, ``course_lib`` and the virtual environment's site-packages.
``nbgrader validate`` always exits 0, so the notebooks' own tests are checked through nbgrader's
``Validator`` API instead.

The capstone's ps4 speed verdict (question 6) is measured by the hidden test itself, interleaving the
baseline and the submission's ``fast_scorer`` in one run; the reference solution is far above the 3x
threshold and the too-slow fixture far below it, so a busy machine does not flip either. Each ps4
submission runs the slow baseline a few dozen times (1 to 2 minutes for the class on a quiet 2-core
machine, several times that on a loaded one).
"""

from __future__ import annotations

import hashlib
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from components import require_component

from course_lib.grading import export_grades_csv, question_scores, run_nbgrader

REPO = Path(__file__).resolve().parents[1]
EXERCISES = REPO / "exercises"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "grading"
PROBLEM_SETS = ("ps1", "ps2", "ps3", "ps4", "ps5")
HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
SOLUTION = ("### BEGIN SOLUTION", "### END SOLUTION")
FAILED_STUDENT = "corrupt-json"
# Grading the whole fixture class takes several minutes on 2 cores (more on a busy machine), all of it in
# the module's fixture, which counts against the first test that uses it.
pytestmark = pytest.mark.timeout(3600)
AUTOGRADE_TIMEOUT_S = 2400.0
DAEMON_MARKER = b"GRADEBOOK-DAEMON-FIXTURE"
CLI_PS = "ps3"  # graded with `python -m course_lib.grading autograde`, the others with `nbgrader autograde`
#: Submissions the screen must hold for review (0 recorded, needs manual grade), with the scores the
#: autograder would have given them; every other submission must have no flag.
FLAGGED = {
    ("displayhook-hook", "ps1"): {"q1": 3.0, "q2": 0.0, "q3": 0.0, "q4": 0.0},
    ("displayhook-hook", "ps2"): {"q1": 0.0, "q2": 0.0, "q3": 0.0, "q4": 0.0},
    ("ast-transformer", "ps1"): {"q1": 0.0, "q2": 0.0, "q3": 0.0, "q4": 0.0},
    ("inspect-oracle", "ps1"): {"q1": 3.0, "q2": 3.0, "q3": 0.0, "q4": 0.0},
    ("gradebook-daemon", "ps1"): {"q1": 3.0, "q2": 3.0, "q3": 2.0, "q4": 2.0},
    ("sitecustomize", "ps2"): {"q1": 3.0, "q2": 2.0, "q3": 2.0, "q4": 3.0},
    ("course-lib-tamper", "ps1"): {"q1": 3.0, "q2": 3.0, "q3": 2.0, "q4": 2.0},
}
#: Submissions whose grade metadata the screen normalises: a phrase its report must contain.
NORMALISED = {
    ("dup-answer", "ps1"): "duplicated or split",
    ("split-cell", "ps2"): "duplicated or split",
    ("bonus-metadata", "ps3"): "is not a cell of this assignment",
}


def _nbgrader_cells(nb, **flags) -> list:
    """Cells whose nbgrader metadata has every flag given (e.g. grade=True)."""
    return [
        cell
        for cell in nb.cells
        if all(cell.get("metadata", {}).get("nbgrader", {}).get(k) == v for k, v in flags.items())
    ]


def _log_excerpt(stderr: str) -> str:
    """nbgrader's log from the first traceback on (where a submission failed), else its tail."""
    start = stderr.find("Traceback")
    return stderr[start : start + 6000] if start >= 0 else stderr[-3000:]


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
def baseline_store() -> None:
    """Build ps4's slow baseline (its feature store) before any ps4 notebook runs.

    The notebooks open the baseline in a cell limited to 15 s when graded; the instructor guide says to
    build it before autograding.
    """
    from course_lib.serving.slow_baseline import SlowChurnScorer

    SlowChurnScorer.open().close()


def _copy_course(root: Path) -> Path:
    """Copy the course root to ``root``: committed source and release, no gradebook or grading output."""
    shutil.copytree(
        EXERCISES,
        root,
        ignore=shutil.ignore_patterns(
            "gradebook.db",
            "submitted",
            "autograded",
            "feedback",
            "feedback_full",
            "reports",
            "*.csv",
            ".ipynb_checkpoints",
            "__pycache__",
        ),
    )
    assert not (root / "gradebook.db").exists()
    return root


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A copy of the course root with the committed source and release, and no gradebook."""
    return _copy_course(tmp_path_factory.mktemp("course") / "exercises")


@pytest.fixture(scope="module")
def generated(course) -> Path:
    """``nbgrader generate_assignment <ps> --force`` for every problem set (this creates the gradebook)."""
    for ps in PROBLEM_SETS:
        done = run_nbgrader("generate_assignment", ps, "--force", course_root=course)
        assert done.returncode == 0, f"generate_assignment {ps} failed:\n{done.stderr[-3000:]}"
    return course


def _digest_files(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (bytecode caches aside: any Python run may write them)."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def _digest_stats(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file under ``root``: cheap enough for a whole site-packages."""
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def _protected(root: Path) -> dict:
    site_packages = Path(sysconfig.get_paths()["purelib"])
    return {
        "source": _digest_files(root / "source"),
        "course_lib": _digest_files(REPO / "course_lib"),
        "site-packages": _digest_stats(site_packages),
    }


def _processes_with(marker: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _grading_command(*args: str) -> subprocess.CompletedProcess:
    """``python -m course_lib.grading ARGS`` as an instructor runs it, with this checkout's course_lib."""
    return subprocess.run(
        [sys.executable, "-m", "course_lib.grading", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=AUTOGRADE_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def graded(generated, baseline_store) -> dict:
    """Collect the fixture class, autograde each problem set once, write feedback and grades.csv."""
    require_component("grading sandbox")
    shutil.copytree(FIXTURES / "submitted", generated / "submitted")
    before = _protected(generated)
    # The instructor's command for one problem set (it checks the sandbox, then runs nbgrader with the
    # same configuration), nbgrader itself for the others.
    autograde = {
        ps: run_nbgrader("autograde", ps, course_root=generated, timeout_s=AUTOGRADE_TIMEOUT_S)
        for ps in PROBLEM_SETS
        if ps != CLI_PS
    }
    autograde[CLI_PS] = _grading_command("autograde", CLI_PS, "--course-root", str(generated))
    gradebook_after_autograde = hashlib.sha256((generated / "gradebook.db").read_bytes()).hexdigest()
    survivors = _processes_with(DAEMON_MARKER)
    feedback = {ps: run_nbgrader("generate_feedback", ps, course_root=generated) for ps in PROBLEM_SETS}
    export = export_grades_csv(generated / "grades.csv", course_root=generated)
    return {
        "root": generated,
        "autograde": autograde,
        "feedback": feedback,
        "export": export,
        "before": before,
        "after": _protected(generated),
        "gradebook_after_autograde": gradebook_after_autograde,
        "gradebook_at_end": hashlib.sha256((generated / "gradebook.db").read_bytes()).hexdigest(),
        "survivors": survivors,
    }


def _submissions(ps: str) -> list[str]:
    return sorted(p.name for p in (FIXTURES / "submitted").iterdir() if (p / ps / f"{ps}.ipynb").exists())


# --- the exercises as committed -------------------------------------------------------------------------


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_source_notebook_passes_all_its_tests_including_hidden_ones(baseline_store, ps):
    source = EXERCISES / "source" / ps / f"{ps}.ipynb"
    grade_cells = [cell for cell in _nbgrader_cells(_read(source), grade=True) if cell.cell_type == "code"]
    assert len(grade_cells) >= 3, "each problem set has several graded questions"
    for cell in grade_cells:
        meta = cell.metadata.nbgrader
        assert meta["locked"] and meta["points"] > 0 and meta["schema_version"] == 3, cell.metadata
        assert HIDDEN[0] in cell.source and HIDDEN[1] in cell.source, f"{meta['grade_id']} lacks hidden tests"
    assert _validate(source) == {}, "the instructor's solution must pass every visible and hidden test"


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_every_release_test_fails_on_the_stubs(baseline_store, ps):
    release = EXERCISES / "release" / ps / f"{ps}.ipynb"
    results = _validate(release)
    assert set(results) == {"failed"}, (
        f"expected only failures (no changed or retyped cells), got {set(results)}"
    )
    n_grade_cells = len(_nbgrader_cells(_read(release), grade=True))  # a blank written answer fails too
    assert len(results["failed"]) == n_grade_cells, "a test that passes on an empty answer gives free points"


def test_ps4_has_a_manually_graded_written_answer():
    cell = _cell(_read(EXERCISES / "source" / "ps4" / "ps4.ipynb"), "q7")
    meta = cell.metadata.nbgrader
    assert cell.cell_type == "markdown" and meta["grade"] and meta["solution"] and meta["points"] > 0


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
    for ps in PROBLEM_SETS[1:]:
        assert graded["autograde"][ps].returncode == 0, _log_excerpt(graded["autograde"][ps].stderr)
    for ps in PROBLEM_SETS:
        for student in _submissions(ps):
            autograded = graded["root"] / "autograded" / student / ps / f"{ps}.ipynb"
            assert autograded.exists() == (student != FAILED_STUDENT), autograded


def test_per_question_scores_match_the_expected_table_exactly(graded):
    table = question_scores(graded["root"])
    expected = (FIXTURES / "expected_question_scores.csv").read_text(encoding="utf-8")
    assert table.to_csv(index=False, lineterminator="\n") == expected


def test_exported_grades_csv_matches_the_expected_table_exactly(graded):
    students = {p.name for p in (FIXTURES / "submitted").iterdir()}
    assert len(graded["export"]) == len(PROBLEM_SETS) * len(students), "every student, every problem set"
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


@pytest.mark.parametrize(
    ("ps", "answer", "expected"),
    [
        ("ps3", "q4_answer", [2.0, 3.0, 3.0, 0.0]),
        ("ps4", "q5_answer", [2.0, 2.0, 3.0, 3.0, 0.0, 3.0, 0.0]),
        ("ps5", "q2_answer", [5.0, 0.0, 2.0]),
    ],
)
def test_an_infinite_loop_is_interrupted_and_the_other_questions_are_graded(graded, ps, answer, expected):
    nb = _read(graded["root"] / "autograded" / "infinite-loop" / ps / f"{ps}.ipynb")
    errors = {out.ename for out in _cell(nb, answer).outputs if out.output_type == "error"}
    assert "CellTimeoutError" in errors, errors
    scores = question_scores(graded["root"], ps).set_index("student_id").loc["infinite-loop", "score"]
    assert scores.tolist() == expected


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


HARD_CODED = {"ps1": ("q3", "q4"), "ps2": ("q1", "q2", "q3", "q4"), "ps3": ("q1", "q2", "q3", "q4")}


@pytest.mark.parametrize("ps", HARD_CODED)
def test_hard_coded_answers_pass_the_visible_checks_but_not_the_hidden_ones(graded, ps):
    assert _validate(FIXTURES / "submitted" / "hard-coded" / ps / f"{ps}.ipynb") == {}, "visible checks pass"
    scores = question_scores(graded["root"], ps).set_index(["student_id", "question"])["score"]
    assert all(scores["hard-coded", q] == 0.0 for q in HARD_CODED[ps])


def test_the_speed_test_separates_the_fast_scorer_from_the_too_slow_one(graded):
    scores = question_scores(graded["root"], "ps4").set_index(["student_id", "question"])["score"]
    assert scores["full-marks", "q6"] == 3.0 and scores["too-slow", "q6"] == 0.0
    assert scores["too-slow", "q4"] == 3.0, "the too-slow scorer's answers are right; only its speed fails"
    nb = _read(graded["root"] / "autograded" / "too-slow" / "ps4" / "ps4.ipynb")
    errors = [out for out in _cell(nb, "q6").outputs if out.output_type == "error"]
    assert errors and errors[0].ename == "AssertionError" and "below 3x" in errors[0].evalue


def test_the_slice_over_budget_costs_the_accuracy_question_only(graded):
    scores = question_scores(graded["root"], "ps4").set_index(["student_id", "question"])["score"]
    assert scores["slice-breaker", "q3"] == 0.0
    assert [scores["slice-breaker", q] for q in ("q1", "q2", "q4", "q5", "q6")] == [2.0, 2.0, 3.0, 1.0, 3.0]


def test_the_written_answer_waits_for_a_person(graded):
    rows = question_scores(graded["root"], "ps4").set_index(["student_id", "question"])
    assert bool(rows.loc[("full-marks", "q7"), "needs_manual_grade"])


# --- grading a real class safely -------------------------------------------------------------------------


def test_student_code_changed_no_protected_file(graded):
    for name in ("source", "course_lib", "site-packages"):
        changed = {
            path
            for path in graded["before"][name].keys() | graded["after"][name].keys()
            if graded["before"][name].get(path) != graded["after"][name].get(path)
        }
        assert not changed, f"{name} changed while grading: {sorted(changed)[:10]}"
    site_packages = Path(sysconfig.get_paths()["purelib"])
    assert not (site_packages / "sitecustomize.py").exists()


def test_no_student_process_outlives_its_kernel_and_the_gradebook_is_left_alone(graded):
    assert graded["survivors"] == [], "a detached process started by a submission is still running"
    assert graded["gradebook_at_end"] == graded["gradebook_after_autograde"], (
        "the gradebook changed after autograde finished"
    )
    table = question_scores(graded["root"])
    assert (table["score"] <= table["max_score"]).all(), "no grade above a question's points"


def _report(root: Path, ps: str, student: str) -> dict:
    path = root / "reports" / ps / f"{student}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def test_the_screen_holds_exactly_the_cheats_for_review_with_the_scores_they_would_have_had(graded):
    table = question_scores(graded["root"]).set_index(["student_id", "assignment"])
    written = {
        ps: {
            cell.metadata.nbgrader["grade_id"]
            for cell in _nbgrader_cells(_read(EXERCISES / "source" / ps / f"{ps}.ipynb"), grade=True)
            if cell.cell_type == "markdown"
        }
        for ps in PROBLEM_SETS
    }
    assert written["ps4"] == {"q7"}
    for ps in PROBLEM_SETS:
        for student in _submissions(ps):
            if student == FAILED_STUDENT:
                continue
            report = _report(graded["root"], ps, student)
            flags = report["notebooks"][ps]["flags"]
            rows = table.loc[(student, ps)]
            autograded = ~rows["question"].isin(written[ps])  # a written answer always waits for a person
            if (student, ps) in FLAGGED:
                assert flags, f"{student}/{ps} should be flagged"
                assert (rows["score"] == 0).all() and rows["needs_manual_grade"].all(), (student, ps)
                assert report["withheld_scores"][ps] == FLAGGED[(student, ps)], (student, ps)
            else:
                assert flags == [], f"{student}/{ps} flagged by mistake: {flags}"
                assert not rows.loc[autograded, "needs_manual_grade"].any(), (student, ps)


def test_duplicated_split_and_stray_grade_cells_are_normalised_reported_and_graded(graded):
    for (student, ps), phrase in NORMALISED.items():
        events = _report(graded["root"], ps, student)["notebooks"][ps]["events"]
        assert any(phrase in event for event in events), events
        assert (graded["root"] / "autograded" / student / ps / f"{ps}.ipynb").exists()
    scores = (
        question_scores(graded["root"]).groupby(["student_id", "assignment"])[["score", "max_score"]].sum()
    )
    for student, ps in NORMALISED:
        assert scores.loc[(student, ps), "score"] == scores.loc[(student, ps), "max_score"], (student, ps)
    assert "bonus" not in set(question_scores(graded["root"], "ps3")["question"])


def test_the_autograde_command_prints_the_screen_report_and_the_scores(graded):
    out = graded["autograde"][CLI_PS].stdout
    assert "Screen report for ps3" in out and "bonus-metadata" in out and "'bonus' is not a cell" in out
    assert re.search(r"^full-marks\s+2\.0\s+3\.0\s+3\.0\s+3\.0\s+11\.0$", out, re.M), out


def test_screen_report_command_lists_normalisations_flags_and_withheld_scores(graded):
    done = _grading_command("report", "ps1", "--course-root", str(graded["root"]))
    assert done.returncode == 0, done.stderr[-3000:]
    blocks = {block.split("\n")[0]: block for block in done.stdout.split("\n") if block}
    assert "gradebook-daemon" in done.stdout and "FLAGGED: cell" in done.stdout
    assert "starts processes (subprocess)" in done.stdout
    assert "held at 0 pending review; the autograder's scores were: q1 3, q2 3, q3 2, q4 2" in done.stdout
    assert "normalised: 'q2_answer' appears in 2 cells" in done.stdout
    assert blocks, done.stdout


def _cell_outputs_text(nb, grade_id: str) -> str:
    return "\n".join(
        f"{out.get('ename', '')}: {out.get('evalue', '')}{out.get('text', '')}"
        for out in _cell(nb, grade_id).outputs
    )


def test_a_cell_that_ignores_the_interrupt_or_kills_its_kernel_costs_only_its_questions(graded):
    hung = _read(graded["root"] / "autograded" / "ignore-interrupt" / "ps3" / "ps3.ipynb")
    assert "ignored it" in _cell_outputs_text(hung, "q4_answer")
    killed = _read(graded["root"] / "autograded" / "kill-kernel" / "ps1" / "ps1.ipynb")
    assert "DeadKernelError: the kernel died" in _cell_outputs_text(killed, "q2")
    scores = question_scores(graded["root"]).set_index(["student_id", "assignment", "question"])["score"]
    assert [scores["ignore-interrupt", "ps3", q] for q in ("q1", "q2", "q3", "q4")] == [2.0, 3.0, 3.0, 0.0]
    assert [scores["kill-kernel", "ps1", q] for q in ("q1", "q2", "q3", "q4")] == [3.0, 0.0, 2.0, 2.0]


def test_warnings_and_log_messages_do_not_cost_points(graded):
    for student, ps, grade_id in (("warning", "ps3", "q4"), ("logging", "ps2", "q4")):
        nb = _read(graded["root"] / "autograded" / student / ps / f"{ps}.ipynb")
        streams = [out for out in _cell(nb, grade_id).outputs if out.output_type == "stream"]
        assert any(out.name == "stderr" for out in streams), "the submission really wrote to stderr"
        table = question_scores(graded["root"], ps).set_index("student_id").loc[student]
        assert table["score"].sum() == table["max_score"].sum(), (student, ps)


def _secret_lines(ps: str) -> set[str]:
    """Hidden-test lines of ``ps`` that appear nowhere a student can see (at least 12 characters)."""
    inside, outside = set(), set()
    for cell in _read(EXERCISES / "source" / ps / f"{ps}.ipynb").cells:
        cell_inside, cell_outside = _lines_inside(cell.source, *HIDDEN)
        inside |= cell_inside
        outside |= cell_outside
    release = {
        line.strip()
        for c in _read(EXERCISES / "release" / ps / f"{ps}.ipynb").cells
        for line in c.source.split("\n")
    }
    return {line for line in inside - outside - release if len(line) >= 12}


def _assignment_lines(ps: str) -> set[str]:
    """Distinctive lines of the instructor's ``ps`` notebook (at least 30 characters)."""
    return {
        line.strip()
        for cell in _read(EXERCISES / "source" / ps / f"{ps}.ipynb").cells
        for line in cell.source.split("\n")
        if len(line.strip()) >= 30
    }


def _html_text(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def test_no_feedback_holds_a_hidden_test_line_or_another_assignments_content(graded):
    scanned = 0
    for ps in PROBLEM_SETS:
        own_text = "\n".join(
            cell.source
            for kind in ("source", "release")
            for cell in _read(EXERCISES / kind / ps / f"{ps}.ipynb").cells
            if not any(marker in cell.source for marker in HIDDEN)
        )
        secret = {line for line in _secret_lines(ps) if line not in own_text}
        others = set().union(*(_assignment_lines(o) for o in PROBLEM_SETS if o != ps))
        others = {line for line in others if line not in own_text}  # not even part of a line of ps
        assert secret and others
        for html_file in (graded["root"] / "feedback").glob(f"*/{ps}/*.html"):
            text = _html_text(html_file)
            leaked = [line for line in secret | others if line in text]
            assert not leaked, f"{html_file}: {leaked[:3]}"
            scanned += 1
    assert scanned == sum(len(_submissions(ps)) for ps in PROBLEM_SETS) - 1, "one per graded submission"


def test_feedback_says_whether_hidden_checks_passed_and_the_full_version_is_for_instructors(graded):
    text = _html_text(graded["root"] / "feedback" / "partly-wrong" / "ps1" / "ps1.html")
    assert "Hidden checks: failed" in text and "Hidden checks: passed" in text
    done = run_nbgrader(
        "generate_feedback",
        "ps1",
        "--student=partly-wrong",
        "--HideHiddenTests.enabled=False",
        "--CourseDirectory.feedback_directory=feedback_full",
        course_root=graded["root"],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    full = _html_text(graded["root"] / "feedback_full" / "partly-wrong" / "ps1" / "ps1.html")
    assert any(line in full for line in _secret_lines("ps1")), "the scan above would see a leak"


# --- the same class under the unshare sandbox (what runs where bubblewrap is missing) --------------------

#: ps1 submissions graded again under ``unshare``: honest, a kernel that kills itself, and three that
#: attack the grader (read other assignments, rewrite course_lib, a daemon rewriting the gradebook).
UNSHARE_CLASS = ("full-marks", "kill-kernel", "exfiltration", "course-lib-tamper", "gradebook-daemon")


@pytest.mark.needs("unshare")
def test_the_unshare_sandbox_grades_like_bubblewrap_and_protects_the_same_files(tmp_path):
    root = _copy_course(tmp_path / "exercises")
    done = run_nbgrader("generate_assignment", "ps1", "--force", course_root=root)
    assert done.returncode == 0, done.stderr[-3000:]
    for student in UNSHARE_CLASS:
        shutil.copytree(FIXTURES / "submitted" / student / "ps1", root / "submitted" / student / "ps1")
    before = _protected(root)
    done = _grading_command("autograde", "ps1", "--sandbox", "unshare", "--course-root", str(root))
    assert done.returncode == 0 and "run in the `unshare` sandbox" in done.stderr, done.stderr[-3000:]
    assert _protected(root) == before, "student code changed source/, course_lib or site-packages"
    assert _processes_with(DAEMON_MARKER) == [], "the daemon outlived its kernel"
    expected = pd.read_csv(FIXTURES / "expected_question_scores.csv")
    expected = expected[(expected.assignment == "ps1") & expected.student_id.isin(UNSHARE_CLASS)]
    assert question_scores(root, "ps1").to_csv(index=False) == expected.to_csv(index=False)
    for student in ("course-lib-tamper", "gradebook-daemon"):
        assert _report(root, "ps1", student)["withheld_scores"]["ps1"] == FLAGGED[(student, "ps1")]
    stolen = _read(root / "autograded" / "exfiltration" / "ps1" / "ps1.ipynb")
    text = _cell_outputs_text(stolen, "q4_answer")
    assert "could not read ../../../source/ps3/ps3.ipynb FileNotFoundError" in text, text
    assert not [line for line in _assignment_lines("ps3") if line in text]
