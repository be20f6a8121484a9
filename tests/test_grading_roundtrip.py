"""The nbgrader round trip CI relies on before a class depends on the exercises (every problem set, ps1-ps5).

A fresh copy of ``exercises/`` (no gradebook) goes through what an instructor does: generate the student
versions, collect the fixture class (``tests/fixtures/grading``), autograde with
``python -m course_lib.grading autograde`` (intake, sandboxed kernels, the grader's checks), write
feedback, export grades. Slow steps run once per module; each test then checks one promise. The class
includes honest mistakes, honest work that used to be flagged or lost, cheats that lie from inside the
kernel and leaks (``make_fixtures.py`` lists them); the expected per-question scores of every student
are the table ``expected_question_scores.csv``. Before and after grading the test hashes ``source/``,
``course_lib`` and the virtual environment's site-packages. A second batch, with small budgets set
here, holds the submissions that used to take the whole batch down (a sleeper, a 300 MB notebook, a
forking and a disk-filling one) next to an honest one; the test measures the memory of the whole
grading process tree and what lands on the host's disk while it runs.

The capstone's speed verdicts (ps4 q2 and q6) are measured by the grader from its own side, against
the baseline in a reference kernel; the reference solution is far above the thresholds and the too-slow
fixture far below, so a busy machine does not flip either.
"""

from __future__ import annotations

import contextlib
import glob
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
import tempfile
import threading
import time
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
SOLUTION = ("### BEGIN SOLUTION", "### END SOLUTION")
UNREADABLE = "corrupt-json"
pytestmark = pytest.mark.timeout(3600)
COMMAND_TIMEOUT_S = 2400.0
DAEMON_MARKER = b"GRADEBOOK-DAEMON-FIXTURE"
MIB = 1024**2
#: Submissions held for review: flagged by the screen, or with files intake refused. Scores are kept.
HELD = {
    ("ast-transformer", "ps1"),
    ("course-lib-tamper", "ps1"),
    ("cpu-burner", "ps4"),
    ("displayhook-hook", "ps1"),
    ("displayhook-hook", "ps2"),
    ("gradebook-daemon", "ps1"),
    ("guard-bypass", "ps1"),
    ("helpers-module", "ps1"),
    ("inspect-oracle", "ps1"),
    ("module-proxy", "ps1"),
    ("request-logger", "ps1"),
    ("session-patch", "ps1"),
    ("session-patch", "ps3"),
    ("session-patch", "ps5"),
    ("sitecustomize", "ps2"),
    ("symlinks", "ps1"),
}
#: Honest work the screen used to flag (IPython.display, DataFrame.rename, str.replace): no flag now.
NOT_FLAGGED = ("false-flags", "ps1")
#: Submissions whose structure the screen repairs: a phrase its report must contain.
NORMALISED = {
    ("dup-answer", "ps1"): "duplicated or split",
    ("split-cell", "ps2"): "duplicated or split",
    ("bonus-metadata", "ps3"): "is not a cell of this assignment",
    ("deleted-test", "ps2"): "'q3' was missing: the released locked cell was put back",
    ("deleted-answer", "ps1"): "'q2_answer' was missing: the released answer stub was put back",
    ("deleted-setup", "ps1"): "'setup' was missing: the released locked cell was put back",
}


def _cell(nb, grade_id: str):
    [cell] = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id]
    return cell


def _nbgrader_cells(nb, **flags) -> list:
    return [
        cell
        for cell in nb.cells
        if all(cell.get("metadata", {}).get("nbgrader", {}).get(k) == v for k, v in flags.items())
    ]


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


def _grading(*args: str) -> subprocess.CompletedProcess:
    """``python -m course_lib.grading ARGS`` as an instructor runs it, with this checkout's course_lib."""
    return subprocess.run(
        [sys.executable, "-m", "course_lib.grading", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=COMMAND_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def baseline_store() -> None:
    """Build ps4's slow baseline (its feature store) before any ps4 notebook runs (the guide says so)."""
    from course_lib.serving.slow_baseline import SlowChurnScorer

    SlowChurnScorer.open().close()


def _copy_course(root: Path) -> Path:
    """Copy the course root to ``root``: committed source, release and checks, no grading output."""
    shutil.copytree(
        EXERCISES,
        root,
        ignore=shutil.ignore_patterns(
            "gradebook.db", "submitted", "autograded", "feedback", "reports", "intake", "*.csv", "__pycache__"
        ),
    )
    return root


def _generate(root: Path, problem_sets=PROBLEM_SETS) -> Path:
    for ps in problem_sets:
        done = run_nbgrader("generate_assignment", ps, "--force", course_root=root)
        assert done.returncode == 0, f"generate_assignment {ps} failed:\n{done.stderr[-3000:]}"
    return root


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """A copy of the course with every problem set generated (this creates the gradebook)."""
    return _generate(_copy_course(tmp_path_factory.mktemp("course") / "exercises"))


def _digest_files(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def _digest_stats(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def _protected(root: Path) -> dict:
    return {
        "source": _digest_files(root / "source"),
        "checks": _digest_files(root / "checks"),
        "course_lib": _digest_files(REPO / "course_lib"),
        "site-packages": _digest_stats(Path(sysconfig.get_paths()["purelib"])),
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


@pytest.fixture(scope="module")
def graded(generated, baseline_store) -> dict:
    """Collect the fixture class, autograde each problem set once, write feedback and grades.csv."""
    require_component("grading sandbox")
    shutil.copytree(FIXTURES / "submitted", generated / "submitted", symlinks=True)
    before = _protected(generated)
    autograde = {ps: _grading("autograde", ps, "--course-root", str(generated)) for ps in PROBLEM_SETS}
    gradebook_after_autograde = hashlib.sha256((generated / "gradebook.db").read_bytes()).hexdigest()
    survivors = _processes_with(DAEMON_MARKER)
    feedback = {ps: _grading("feedback", ps, "--course-root", str(generated)) for ps in PROBLEM_SETS}
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
    return sorted(
        p.name
        for p in (FIXTURES / "submitted").iterdir()
        if (p / ps).is_dir() and any((p / ps).glob("*.ipynb"))
    )


def _report(root: Path, ps: str, student: str) -> dict:
    path = root / "reports" / ps / f"{student}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


# --- the exercises as committed -------------------------------------------------------------------------


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_source_notebook_passes_its_visible_checks_and_has_grader_checks_for_every_question(
    baseline_store, ps
):
    from course_lib.grading.checks import load_checks

    source = EXERCISES / "source" / ps / f"{ps}.ipynb"
    grade_cells = [cell for cell in _nbgrader_cells(_read(source), grade=True) if cell.cell_type == "code"]
    assert len(grade_cells) >= 3, "each problem set has several graded questions"
    checks = load_checks(EXERCISES / "checks", ps)
    for cell in grade_cells:
        meta = cell.metadata.nbgrader
        assert meta["locked"] and meta["points"] > 0 and meta["schema_version"] == 3, cell.metadata
        assert meta["grade_id"] in checks.questions, f"{ps}: no grader checks for {meta['grade_id']}"
        assert "HIDDEN TESTS" not in cell.source, "hidden tests live in exercises/checks, not in the notebook"
    assert set(checks.questions) == {cell.metadata.nbgrader["grade_id"] for cell in grade_cells}
    assert _validate(source) == {}, "the instructor's solution must pass every visible check"


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


def _checks_secrets(ps: str) -> set[str]:
    """Distinctive lines of the grader's checks of ``ps`` that no notebook of ``ps`` holds (>= 16 chars)."""
    notebook_text = "\n".join(
        cell.source
        for kind in ("source", "release")
        for cell in _read(EXERCISES / kind / ps / f"{ps}.ipynb").cells
    )
    lines = {line.strip() for line in (EXERCISES / "checks" / f"{ps}.py").read_text().split("\n")}
    return {
        line
        for line in lines
        if len(line) >= 16
        and line not in notebook_text
        and not line.startswith(("#", "from ", "import ", '"""'))
    }


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_release_holds_no_solution_no_grader_check_and_no_nbval_marker(ps):
    release_text = (EXERCISES / "release" / ps / f"{ps}.ipynb").read_text(encoding="utf-8")
    for marker in (*SOLUTION, "HIDDEN TESTS", "NBVAL"):
        assert marker not in release_text, f"{marker!r} leaked into the student version"
    release_lines = {
        line.strip()
        for cell in _read(EXERCISES / "release" / ps / f"{ps}.ipynb").cells
        for line in cell.source.split("\n")
    }
    inside, outside, within = set(), set(), False
    for cell in _read(EXERCISES / "source" / ps / f"{ps}.ipynb").cells:
        for line in cell.source.split("\n"):
            if SOLUTION[0] in line:
                within = True
            elif SOLUTION[1] in line:
                within = False
            elif line.strip():
                (inside if within else outside).add(line.strip())
    assert inside - outside and not (inside - outside) & release_lines, "solution lines leaked"
    secrets = _checks_secrets(ps)
    assert secrets and not secrets & release_lines, sorted(secrets & release_lines)[:3]


def test_the_grader_checks_sit_outside_everything_nbgrader_copies_and_kernels_see():
    assert sorted(p.name for p in (EXERCISES / "checks").glob("*.py")) == [f"{ps}.py" for ps in PROBLEM_SETS]
    for kind in ("source", "release"):
        files = sorted(p.name for p in (EXERCISES / kind).rglob("*") if p.is_file())
        assert files == sorted(f"{ps}.ipynb" for ps in PROBLEM_SETS), f"{kind}/ holds more than the notebooks"
    assert not list((REPO / "course_lib").rglob("ps[0-9].py")), (
        "course_lib (seen by kernels and students) has none"
    )


def test_exercises_hold_no_nbval_marker_and_use_the_python3_kernel():
    notebooks = sorted(EXERCISES.glob("*/*/*.ipynb"))
    assert len(notebooks) == 2 * len(PROBLEM_SETS)
    for path in [*notebooks, EXERCISES / "nbgrader_config.py"]:
        assert "NBVAL" not in path.read_text(encoding="utf-8"), path
    for path in notebooks:
        assert _read(path).metadata.kernelspec["name"] == "python3", path


def _tree(root: Path) -> dict:
    """Every file (its bytes) and link (its target) under ``root``."""
    found = {}
    for path in sorted(root.rglob("*")):
        key = path.relative_to(root)
        if path.is_symlink():
            found[key] = ("link", os.readlink(path))
        elif path.is_file():
            found[key] = path.read_bytes()
    return found


def test_committed_fixture_class_is_exactly_what_make_fixtures_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(tmp_path)
    for folder in ("submitted", "batch"):
        made, committed = _tree(tmp_path / folder), _tree(FIXTURES / folder)
        assert sorted(made) == sorted(committed)
        stale = [str(path) for path in made if made[path] != committed[path]]
        assert not stale, f"run `python tests/fixtures/grading/make_fixtures.py` and commit: {stale}"


# --- grading the fixture class --------------------------------------------------------------------------


def test_autograde_grades_everyone_and_reports_the_unreadable_notebook(graded):
    ps1 = graded["autograde"]["ps1"]
    assert ps1.returncode == 1, "autograde exits 1 when a submission could not be graded"
    assert f"intake {UNREADABLE}: not graded: 'ps1.ipynb' is not a readable notebook" in ps1.stdout
    for ps in PROBLEM_SETS[1:]:
        assert graded["autograde"][ps].returncode == 0, graded["autograde"][ps].stderr[-3000:]
    for ps in PROBLEM_SETS:
        assert "Student kernels run in the `" in graded["autograde"][ps].stderr
        for student in _submissions(ps):
            autograded = graded["root"] / "autograded" / student / ps / f"{ps}.ipynb"
            assert autograded.exists() == (student != UNREADABLE), autograded


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


def _scores(root: Path, ps: str, student: str) -> list[float]:
    return question_scores(root, ps).set_index("student_id").loc[student, "score"].tolist()


def _outputs_text(nb, grade_id: str) -> str:
    return "\n".join(
        f"{out.get('ename', '')}: {out.get('evalue', '')}{out.get('text', '')}"
        for out in _cell(nb, grade_id).outputs
    )


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
    assert errors & {"CellTimeoutError", "KeyboardInterrupt"}, errors
    assert _scores(graded["root"], ps, "infinite-loop") == expected


def test_an_edited_test_cell_is_restored_and_only_the_grader_decides(graded):
    submitted = _cell(_read(FIXTURES / "submitted" / "edited-test" / "ps1" / "ps1.ipynb"), "q2")
    assert submitted.source.endswith("assert True") and submitted.metadata.nbgrader["points"] == 10
    restored = _cell(_read(graded["root"] / "autograded" / "edited-test" / "ps1" / "ps1.ipynb"), "q2")
    assert restored.source == _cell(_read(EXERCISES / "release" / "ps1" / "ps1.ipynb"), "q2").source
    assert restored.metadata.nbgrader["points"] == 3
    assert (
        "Grader's checks: latency_summary of the simulated requests: wrong answer. 0 points."
        in _outputs_text(_read(graded["root"] / "autograded" / "edited-test" / "ps1" / "ps1.ipynb"), "q2")
    )


def test_deleted_cells_are_put_back_and_cost_only_their_question(graded):
    nb = _read(graded["root"] / "autograded" / "deleted-test" / "ps2" / "ps2.ipynb")
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    assert ids.index("q3") == ids.index("q3_answer") + 1
    assert _cell(nb, "q3").source == _cell(_read(EXERCISES / "release" / "ps2" / "ps2.ipynb"), "q3").source
    assert _scores(graded["root"], "ps2", "deleted-test") == [3.0, 2.0, 2.0, 3.0]
    assert _scores(graded["root"], "ps1", "deleted-answer") == [3.0, 0.0, 2.0, 2.0]
    assert _scores(graded["root"], "ps1", "deleted-setup") == [3.0, 3.0, 2.0, 2.0]


def test_feedback_is_written_for_every_graded_submission_with_its_score(graded):
    totals = (
        question_scores(graded["root"]).groupby(["assignment", "student_id"])[["score", "max_score"]].sum()
    )
    for ps in PROBLEM_SETS:
        assert graded["feedback"][ps].returncode == 0, graded["feedback"][ps].stderr[-3000:]
        for student in _submissions(ps):
            page = graded["root"] / "feedback" / student / ps / f"{ps}.html"
            assert page.exists() == (student != UNREADABLE), page
            if student != UNREADABLE:
                found = re.search(rf"{ps} \(Score: ([\d.]+) / ([\d.]+)\)", page.read_text(encoding="utf-8"))
                assert found, f"no score line in {page}"
                expected = totals.loc[(ps, student)]
                assert (float(found[1]), float(found[2])) == (expected["score"], expected["max_score"]), page


HARD_CODED = {"ps1": ("q3", "q4"), "ps2": ("q1", "q2", "q3", "q4"), "ps3": ("q1", "q2", "q3", "q4")}


@pytest.mark.parametrize("ps", HARD_CODED)
def test_hard_coded_answers_pass_the_visible_checks_but_not_the_graders(graded, ps):
    assert _validate(FIXTURES / "submitted" / "hard-coded" / ps / f"{ps}.ipynb") == {}, "visible checks pass"
    scores = question_scores(graded["root"], ps).set_index(["student_id", "question"])["score"]
    assert all(scores["hard-coded", q] == 0.0 for q in HARD_CODED[ps])


def test_cheats_that_lie_from_inside_the_kernel_score_what_their_answers_deserve(graded):
    root = graded["root"]
    for ps in ("ps1", "ps3", "ps5"):  # the kernel's messages patched, every function returns 42
        assert sum(_scores(root, ps, "session-patch")) == 0.0, ps
    for student in ("helpers-module", "guard-bypass", "ast-transformer"):
        assert sum(_scores(root, "ps1", student)) == 0.0, student
    for student in ("history-oracle", "module-proxy", "isclose-patch", "inspect-oracle"):  # right q1, q2 only
        assert _scores(root, "ps1", student) == [3.0, 3.0, 0.0, 0.0], student
    rebound = _scores(root, "ps4", "rebound-bench")
    assert rebound[5] == 0.0 and sum(rebound[:5]) == 11.0, "the baseline is not 3x faster than itself"


def test_the_speed_tests_are_timed_by_the_grader_and_separate_fast_from_too_slow(graded):
    scores = question_scores(graded["root"], "ps4").set_index(["student_id", "question"])["score"]
    assert scores["full-marks", "q6"] == 3.0 and scores["too-slow", "q6"] == 0.0
    assert scores["too-slow", "q4"] == 3.0, "the too-slow scorer's answers are right; only its speed fails"
    notes = _report(graded["root"], "ps4", "full-marks")["notebooks"]["ps4"]["grader"]
    ratio = float(re.search(r"p99 speed-up ([\d.]+)x", notes["q6"]["notes"][0])[1])
    assert ratio >= 3.0 and "lookup speed-up" in notes["q2"]["notes"][0]
    nb = _read(graded["root"] / "autograded" / "too-slow" / "ps4" / "ps4.ipynb")
    assert "p99 at least 3x below the baseline's, timed by the grader: wrong answer" in _outputs_text(
        nb, "q6"
    )


def test_the_slice_over_budget_costs_the_accuracy_question_only(graded):
    assert _scores(graded["root"], "ps4", "slice-breaker")[:6] == [2.0, 2.0, 0.0, 3.0, 1.0, 3.0]


def test_the_written_answer_waits_for_a_person(graded):
    rows = question_scores(graded["root"], "ps4").set_index(["student_id", "question"])
    assert bool(rows.loc[("full-marks", "q7"), "needs_manual_grade"])


# --- grading a real class safely -------------------------------------------------------------------------


def test_student_code_changed_no_protected_file(graded):
    for name in ("source", "checks", "course_lib", "site-packages"):
        changed = {
            path
            for path in graded["before"][name].keys() | graded["after"][name].keys()
            if graded["before"][name].get(path) != graded["after"][name].get(path)
        }
        assert not changed, f"{name} changed while grading: {sorted(changed)[:10]}"
    assert not (Path(sysconfig.get_paths()["purelib"]) / "sitecustomize.py").exists()


def test_no_student_process_outlives_its_kernel_and_the_gradebook_is_left_alone(graded):
    assert graded["survivors"] == [], "a detached process started by a submission is still running"
    assert graded["gradebook_at_end"] == graded["gradebook_after_autograde"], (
        "the gradebook changed after autograde"
    )
    table = question_scores(graded["root"])
    assert (table["score"] <= table["max_score"]).all(), "no grade above a question's points"


def test_held_submissions_keep_their_scores_and_wait_for_review_and_nothing_else_is_held(graded):
    table = question_scores(graded["root"]).set_index(["student_id", "assignment"])
    for ps in PROBLEM_SETS:
        for student in _submissions(ps):
            if student == UNREADABLE:
                continue
            held = _report(graded["root"], ps, student).get("held_for_review", [])
            rows = table.loc[(student, ps)]
            autograded = rows["question"] != "q7"
            if (student, ps) in HELD:
                assert held and rows["needs_manual_grade"].all(), (student, ps)
                page = (graded["root"] / "feedback" / student / ps / f"{ps}.html").read_text(encoding="utf-8")
                assert "Held for review." in page, (student, ps)
            else:
                assert held == [], f"{student}/{ps} held by mistake: {held}"
                assert not rows.loc[autograded, "needs_manual_grade"].any(), (student, ps)
    assert _report(graded["root"], "ps1", NOT_FLAGGED[0])["notebooks"]["ps1"]["flags"] == []
    assert sum(_scores(graded["root"], "ps1", "gradebook-daemon")) == 10.0, "held, not zeroed"


def test_intake_refuses_links_and_extra_files_and_never_copies_them(graded):
    root = graded["root"]
    for student, refused in (
        ("symlinks", ["db.bin", "notes.txt", "shadow"]),
        ("helpers-module", ["helpers.py"]),
    ):
        assert sorted(_report(root, "ps1", student)["intake"]["refused"]) == refused
        for folder in ("intake", "autograded", "feedback"):
            assert sorted(p.name for p in (root / folder / student / "ps1").iterdir()) in (
                ["ps1.ipynb"],
                ["ps1.html"],
            )
    assert "'ps1 (1).ipynb' taken as ps1.ipynb (renamed)" in graded["autograde"]["ps1"].stdout
    assert sum(_scores(root, "ps1", "renamed")) == 10.0 and sum(_scores(root, "ps2", "bom")) == 10.0
    assert sum(_scores(root, "ps1", "slow-correct")) == 10.0, "4 calls of 3.5 s fit the question's 60 s"


def test_plain_nbgrader_autograde_refuses_to_read_submissions_before_intake(graded):
    done = run_nbgrader("autograde", "ps1", "--student=full-marks", "--force", course_root=graded["root"])
    assert done.returncode != 0 and "refusing to read" in done.stderr and "before intake" in done.stderr


def test_normalised_and_restored_cells_are_reported_and_graded(graded):
    for (student, ps), phrase in NORMALISED.items():
        events = _report(graded["root"], ps, student)["notebooks"][ps]["events"]
        assert any(phrase in event for event in events), events
    for student, ps in (("dup-answer", "ps1"), ("split-cell", "ps2"), ("bonus-metadata", "ps3")):
        rows = question_scores(graded["root"], ps).set_index("student_id").loc[student]
        assert rows["score"].sum() == rows["max_score"].sum(), (student, ps)
    assert "bonus" not in set(question_scores(graded["root"], "ps3")["question"])


def test_the_autograde_command_prints_the_report_and_the_scores(graded):
    out = graded["autograde"]["ps3"].stdout
    assert "Grading report for ps3" in out and "'bonus' is not a cell" in out
    assert re.search(r"^full-marks\s+2\.0\s+3\.0\s+3\.0\s+3\.0\s+11\.0$", out, re.M), out


def test_the_report_command_names_what_failed_and_why_for_instructors(graded):
    done = _grading("report", "ps1", "--course-root", str(graded["root"]))
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-2000:]}\n{done.stdout[-4000:]}"
    assert "gradebook-daemon" in done.stdout and "flagged: cell" in done.stdout
    assert "starts processes (subprocess)" in done.stdout and "HELD FOR REVIEW" in done.stdout
    assert (
        "q4 failed: max_parallel_calls for a 5% target: wrong answer [got 6]" in done.stdout
    )  # partly-wrong
    assert "normalised: 'q2_answer' appears in 2 cells" in done.stdout


def test_a_cell_that_ignores_the_interrupt_or_a_call_that_kills_the_kernel_costs_only_its_questions(graded):
    hung = _read(graded["root"] / "autograded" / "ignore-interrupt" / "ps3" / "ps3.ipynb")
    assert "ignored it" in _outputs_text(hung, "q4_answer")
    killed = _read(graded["root"] / "autograded" / "kill-kernel" / "ps1" / "ps1.ipynb")
    assert "latency_summary ended the kernel (it died during the call). 0 points." in _outputs_text(
        killed, "q2"
    )
    assert _scores(graded["root"], "ps3", "ignore-interrupt") == [2.0, 3.0, 3.0, 0.0]
    assert _scores(graded["root"], "ps1", "kill-kernel") == [3.0, 0.0, 2.0, 2.0]
    replaced = _report(graded["root"], "ps1", "kill-kernel")["notebooks"]["ps1"]["replaced"]
    assert any("ended the kernel" in why for why in replaced), replaced


def test_warnings_and_log_messages_do_not_cost_points(graded):
    for student, ps, grade_id in (("warning", "ps3", "q4_answer"), ("logging", "ps2", "q1_answer")):
        nb = _read(graded["root"] / "autograded" / student / ps / f"{ps}.ipynb")
        streams = [out for out in _cell(nb, grade_id).outputs if out.output_type == "stream"]
        assert any(out.name == "stderr" for out in streams), "the submission really wrote to stderr"
        table = question_scores(graded["root"], ps).set_index("student_id").loc[student]
        assert table["score"].sum() == table["max_score"].sum(), (student, ps)


def _assignment_lines(ps: str) -> set[str]:
    return {
        line.strip()
        for cell in _read(EXERCISES / "source" / ps / f"{ps}.ipynb").cells
        for line in cell.source.split("\n")
        if len(line.strip()) >= 30
    }


def _html_text(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def test_no_feedback_holds_a_grader_check_line_another_file_or_a_student_script(graded):
    scanned = 0
    for ps in PROBLEM_SETS:
        own = "\n".join(
            cell.source
            for kind in ("source", "release")
            for cell in _read(EXERCISES / kind / ps / f"{ps}.ipynb").cells
        )
        secret = _checks_secrets(ps)
        others = {line for o in PROBLEM_SETS if o != ps for line in _assignment_lines(o) if line not in own}
        assert secret and others
        for page in (graded["root"] / "feedback").glob(f"*/{ps}/*.html"):
            raw = page.read_text(encoding="utf-8")
            text = _html_text(page)
            leaked = [line for line in secret | others if line in text]
            assert not leaked, f"{page}: {leaked[:3]}"
            assert "SQLite format" not in raw, f"{page}: the gradebook"
            assert "XSS-FIXTURE</script>" not in raw, f"{page}: a student's script element"
            assert not re.search(r"<[^>]+\son[a-z]+\s*=", raw), f"{page}: an event-handler attribute"
            scanned += 1
    assert scanned == sum(len(_submissions(ps)) for ps in PROBLEM_SETS) - 1, "one page per graded submission"
    autograded = (graded["root"] / "autograded" / "script-html" / "ps1" / "ps1.ipynb").read_text(
        encoding="utf-8"
    )
    outputs = json.dumps([c.get("outputs", []) for c in json.loads(autograded)["cells"]])
    assert "<script>" not in outputs and "<img" not in outputs, "formgrader shows the autograded notebook"
    history = _html_text(graded["root"] / "feedback" / "print-history" / "ps1" / "ps1.html")
    assert "def max_parallel_calls" in history, "print(In) printed the history: only the student's own cells"
    spy = _html_text(graded["root"] / "feedback" / "request-logger" / "ps1" / "ps1.html")
    assert "REQUESTS KEPT 0" in spy, "the checks ran before a later cell could print their requests"
    assert "Grader's checks: passed, 3 of 3 points." in spy, "and they were graded all the same"


def test_feedback_gives_each_questions_verdict_without_hidden_inputs(graded):
    text = _html_text(graded["root"] / "feedback" / "partly-wrong" / "ps1" / "ps1.html")
    assert "Grader's checks: passed, 3 of 3 points." in text
    assert "Grader's checks: max_parallel_calls for a 5% target: wrong answer. 0 points." in text
    detail = _report(graded["root"], "ps1", "partly-wrong")["notebooks"]["ps1"]["grader"]["q2"]["detail"]
    assert "'slo_breached': True" in detail and detail not in text, (
        "the instructor's details stay in the report"
    )


# --- the same class under the unshare sandbox (what runs where bubblewrap is missing) --------------------

#: ps1 submissions graded again under ``unshare``: honest, a kernel that kills itself, a session patch, and
#: three that attack the grader (read other assignments, rewrite course_lib, a daemon rewriting the gradebook).
UNSHARE_CLASS = (
    "full-marks",
    "kill-kernel",
    "session-patch",
    "exfiltration",
    "course-lib-tamper",
    "gradebook-daemon",
)


@pytest.mark.needs("unshare")
def test_the_unshare_sandbox_grades_like_bubblewrap_and_protects_the_same_files(tmp_path):
    root = _generate(_copy_course(tmp_path / "exercises"), ("ps1",))
    for student in UNSHARE_CLASS:
        shutil.copytree(FIXTURES / "submitted" / student / "ps1", root / "submitted" / student / "ps1")
    before = _protected(root)
    done = _grading("autograde", "ps1", "--sandbox", "unshare", "--course-root", str(root))
    # stdout holds nbgrader's error lines and the scores: what a failure needs to be read
    assert done.returncode == 0 and "run in the `unshare` sandbox" in done.stderr, (
        f"exit {done.returncode}\n{done.stderr[-2000:]}\n{done.stdout[-4000:]}"
    )
    assert _protected(root) == before, "student code changed source/, checks/, course_lib or site-packages"
    assert _processes_with(DAEMON_MARKER) == [], "the daemon outlived its kernel"
    expected = pd.read_csv(FIXTURES / "expected_question_scores.csv")
    expected = expected[(expected.assignment == "ps1") & expected.student_id.isin(UNSHARE_CLASS)]
    assert question_scores(root, "ps1").to_csv(index=False) == expected.to_csv(index=False)
    stolen = _read(root / "autograded" / "exfiltration" / "ps1" / "ps1.ipynb")
    text = _outputs_text(stolen, "q4_answer")
    assert "could not read ../../../source/ps3/ps3.ipynb FileNotFoundError" in text, text
    assert not [line for line in _assignment_lines("ps3") if line in text]


# --- one batch with the submissions that used to take the whole batch down -----------------------------

#: Small budgets for the batch (the real ones are in exercises/nbgrader_config.py and the statements).
BATCH_BUDGET_S = 20
BATCH_MEMORY_BYTES = 1024 * MIB
#: What the grader's own processes (the command, nbgrader) may hold besides the sandbox, bytes.
GRADER_MEMORY_BYTES = 700 * MIB


def _du(paths: list) -> int:
    total = 0
    for root in paths:
        for folder, _, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def _huge_notebook(path: Path, size_bytes: int) -> None:
    """A notebook of ``size_bytes`` (one markdown cell of x's), written in 1 MiB pieces."""
    path.parent.mkdir(parents=True)
    with path.open("w") as fh:
        fh.write('{"cells": [{"cell_type": "markdown", "metadata": {}, "source": "')
        for _ in range(size_bytes // MIB):
            fh.write("x" * MIB)
        fh.write('"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict:
    """Grade the batch killers next to an honest student, measuring memory and disk while it runs."""
    import psutil

    root = _generate(_copy_course(tmp_path_factory.mktemp("batch") / "exercises"), ("ps1",))
    shutil.copytree(FIXTURES / "batch", root / "submitted", symlinks=True)
    _huge_notebook(root / "submitted" / "huge" / "ps1" / "ps1.ipynb", 300 * 10**6)
    scratch = os.path.join(tempfile.gettempdir(), "grading-*")
    earlier = set(glob.glob(scratch))  # other graders' scratch folders (or leftovers) are not this batch's
    base = {"disk": _du([root]), "shm": shutil.disk_usage("/dev/shm").used}
    peak = {"tree": 0, "disk": 0, "shm": 0}
    stop = threading.Event()

    def watch(pid: int) -> None:
        while not stop.is_set():
            try:
                processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            except psutil.Error:
                return
            used = 0
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    used += process.memory_full_info().uss
            peak["tree"] = max(peak["tree"], used)
            peak["disk"] = max(peak["disk"], _du([root, *set(glob.glob(scratch)) - earlier]) - base["disk"])
            peak["shm"] = max(peak["shm"], shutil.disk_usage("/dev/shm").used - base["shm"])
            time.sleep(0.05)

    options = [f"--GuardedExecute.notebook_budget_s={BATCH_BUDGET_S}"]
    options.append(f"--SandboxedKernelManager.sandbox_memory_bytes={BATCH_MEMORY_BYTES}")
    started = time.monotonic()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "course_lib.grading",
            "autograde",
            "ps1",
            "--course-root",
            str(root),
            "--",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    watcher = threading.Thread(target=watch, args=(process.pid,), daemon=True)
    watcher.start()
    out, err = process.communicate(timeout=COMMAND_TIMEOUT_S)
    stop.set()
    watcher.join()
    return {
        "root": root,
        "returncode": process.returncode,
        "out": out,
        "err": err,
        "peak": peak,
        "elapsed_s": time.monotonic() - started,
    }


def test_a_batch_with_a_sleeper_a_300mb_notebook_a_fork_and_a_disk_filler_completes_for_everyone(batch):
    assert batch["returncode"] == 1, "exit 1: the 300 MB notebook could not be graded"
    assert _scores(batch["root"], "ps1", "full-marks") == [3.0, 3.0, 2.0, 2.0]
    assert _scores(batch["root"], "ps1", "sleeper") == [3.0, 0.0, 0.0, 0.0], (
        "q1 ran before the budget was spent"
    )
    assert _scores(batch["root"], "ps1", "fork-memory") == [3.0, 3.0, 2.0, 0.0], (
        "only the forking cell's question"
    )
    assert _scores(batch["root"], "ps1", "disk-filler") == [3.0, 3.0, 2.0, 2.0], (
        "its disk was in memory, and full"
    )
    assert "'ps1.ipynb' is larger than the 16 MiB a notebook may be" in batch["out"]
    sleeper = _report(batch["root"], "ps1", "sleeper")["notebooks"]["ps1"]["limits"]
    assert sleeper == [f"the notebook's {BATCH_BUDGET_S} s ran out: later cells were not run"]
    forked = _report(batch["root"], "ps1", "fork-memory")["notebooks"]["ps1"]["limits"]
    assert any("limit reached" in line for line in forked), forked
    # The budget bounds the batch: four notebooks, each at most its 20 s plus its kernel's start and end
    # (without it the sleeper alone would run 250 x 14 s, about an hour).
    assert batch["elapsed_s"] < 4 * (BATCH_BUDGET_S + 120), batch["elapsed_s"]


def test_the_batch_stayed_within_its_memory_and_wrote_nothing_to_the_hosts_disk(batch):
    peak = batch["peak"]
    kind = _report(batch["root"], "ps1", "fork-memory")["notebooks"]["ps1"]["containment"]
    assert kind in ("cgroup2", "cgroup1", "watchdog"), kind
    # A cgroup holds the limit exactly; the watchdog looks every 0.05 s, and three children writing
    # 2 GiB each can take a few hundred MiB more in that time before it kills them (the guide says so).
    slack = 64 * MIB if kind != "watchdog" else 1024 * MIB
    limit = BATCH_MEMORY_BYTES + GRADER_MEMORY_BYTES + slack
    assert peak["tree"] <= limit, f"{kind}: {peak['tree'] / MIB:.0f} MiB > {limit / MIB:.0f} MiB"
    assert peak["disk"] <= 16 * MIB, f"{peak['disk'] / MIB:.0f} MiB landed on the host's disk"
    assert peak["shm"] <= 16 * MIB, f"{peak['shm'] / MIB:.0f} MiB landed in the host's /dev/shm"
