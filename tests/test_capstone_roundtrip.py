"""The capstone problem sets (ps4, ps5) through nbgrader: generate, autograde the fixture class, compare scores.

A fresh copy of ``exercises/`` (no gradebook) generates the student versions of ps4 and ps5, collects
the fixture class of ``tests/fixtures/capstone`` and autogrades it once per module; each test then checks
one promise. The per-question scores must equal ``expected_question_scores.csv`` exactly, including
ps4's speed verdict (question 6), which the hidden test measures itself, interleaving the baseline and
the submission's ``fast_scorer`` in one run; the reference solution is far above the 3x threshold and
the too-slow fixture far below it, so a busy machine does not flip either.

Runtime: each ps4 submission runs the slow baseline a few dozen times (about 1 to 2 minutes for the
class on a quiet 2-core machine, several times that on a loaded one).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import nbformat
import pytest

from course_lib.grading import question_scores, run_nbgrader

REPO = Path(__file__).resolve().parents[1]
EXERCISES = REPO / "exercises"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "capstone"
PROBLEM_SETS = ("ps4", "ps5")
HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
SOLUTION = ("### BEGIN SOLUTION", "### END SOLUTION")


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _log_excerpt(stderr: str) -> str:
    """nbgrader's log from the first traceback on (where a submission failed), else its tail."""
    start = stderr.find("Traceback")
    return stderr[start : start + 6000] if start >= 0 else stderr[-3000:]


def _cell(nb, grade_id: str):
    [cell] = [c for c in nb.cells if _nbgrader(c).get("grade_id") == grade_id]
    return cell


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """Generate ps4/ps5 in a copy of the course root, collect the fixture class and autograde it."""
    from course_lib.slow_baseline import SlowChurnScorer

    # The graded notebooks open the baseline in a cell limited to 15 s: build its feature store first,
    # as the instructor guide says to do before autograding.
    SlowChurnScorer.open().close()
    root = tmp_path_factory.mktemp("capstone") / "exercises"
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
    generate = {
        ps: run_nbgrader("generate_assignment", ps, "--force", course_root=root) for ps in PROBLEM_SETS
    }
    for ps, done in generate.items():
        assert done.returncode == 0, f"generate_assignment {ps} failed:\n{done.stderr[-3000:]}"
    shutil.copytree(FIXTURES / "submitted", root / "submitted")
    autograde = {ps: run_nbgrader("autograde", ps, course_root=root, timeout_s=2400.0) for ps in PROBLEM_SETS}
    return {"root": root, "autograde": autograde}


# --- the exercises as committed -------------------------------------------------------------------------


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_every_grade_cell_is_locked_has_points_and_hidden_tests(ps):
    nb = _read(EXERCISES / "source" / ps / f"{ps}.ipynb")
    assert nb.metadata.kernelspec["name"] == "python3"
    graded_code = [c for c in nb.cells if _nbgrader(c).get("grade") and c.cell_type == "code"]
    assert len(graded_code) >= 3
    for cell in graded_code:
        meta = _nbgrader(cell)
        assert meta["locked"] and meta["points"] > 0 and meta["schema_version"] == 3, meta
        assert HIDDEN[0] in cell.source and HIDDEN[1] in cell.source, f"{meta['grade_id']} lacks hidden tests"
    for cell in nb.cells:
        assert "NBVAL" not in cell.source, _nbgrader(cell).get("grade_id")


def test_ps4_has_a_manually_graded_written_answer():
    cell = _cell(_read(EXERCISES / "source" / "ps4" / "ps4.ipynb"), "q7")
    meta = _nbgrader(cell)
    assert cell.cell_type == "markdown" and meta["grade"] and meta["solution"] and meta["points"] > 0


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_release_holds_no_solution_no_hidden_test_and_no_nbval_marker(ps):
    release = EXERCISES / "release" / ps / f"{ps}.ipynb"
    text = release.read_text(encoding="utf-8")
    for marker in (*HIDDEN, *SOLUTION, "NBVAL"):
        assert marker not in text, f"{marker!r} leaked into the student version of {ps}"
    release_lines = {line.strip() for cell in _read(release).cells for line in cell.source.split("\n")}
    for begin, end in (HIDDEN, SOLUTION):
        inside, outside = set(), set()
        for cell in _read(EXERCISES / "source" / ps / f"{ps}.ipynb").cells:
            within = False
            for line in cell.source.split("\n"):
                if begin in line:
                    within = True
                elif end in line:
                    within = False
                elif line.strip():
                    (inside if within else outside).add(line.strip())
        secret = inside - outside  # a line that also appears outside the markers is no secret
        assert secret, f"{ps} should have {begin!r} regions"
        assert not secret & release_lines, (
            f"{ps}: lines from {begin!r} leaked: {sorted(secret & release_lines)}"
        )


def test_committed_fixture_class_is_exactly_what_make_fixtures_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("capstone_fixtures", FIXTURES / "make_fixtures.py")
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
    assert not stale, f"run `python tests/fixtures/capstone/make_fixtures.py` and commit: {stale}"


# --- grading the fixture class --------------------------------------------------------------------------


@pytest.mark.parametrize("ps", PROBLEM_SETS)
def test_committed_release_is_what_generate_assignment_produces(graded, ps):
    committed = _read(EXERCISES / "release" / ps / f"{ps}.ipynb")
    regenerated = _read(graded["root"] / "release" / ps / f"{ps}.ipynb")
    assert [(c.id, c.cell_type, c.source, c.metadata) for c in regenerated.cells] == [
        (c.id, c.cell_type, c.source, c.metadata) for c in committed.cells
    ], f"exercises/release/{ps} is stale: run `make exercises` and commit the result"


def test_every_submission_was_graded(graded):
    for ps in PROBLEM_SETS:
        assert graded["autograde"][ps].returncode == 0, _log_excerpt(graded["autograde"][ps].stderr)
        for student in (FIXTURES / "submitted").iterdir():
            if (student / ps).exists():
                assert (graded["root"] / "autograded" / student.name / ps / f"{ps}.ipynb").exists()


def test_per_question_scores_match_the_expected_table_exactly(graded):
    table = question_scores(graded["root"])
    expected = (FIXTURES / "expected_question_scores.csv").read_text(encoding="utf-8")
    assert table.to_csv(index=False, lineterminator="\n") == expected


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


@pytest.mark.parametrize(("ps", "answer"), [("ps4", "q5_answer"), ("ps5", "q2_answer")])
def test_an_infinite_loop_is_interrupted_by_the_cell_timeout(graded, ps, answer):
    nb = _read(graded["root"] / "autograded" / "infinite-loop" / ps / f"{ps}.ipynb")
    errors = {out.ename for out in _cell(nb, answer).outputs if out.output_type == "error"}
    assert "CellTimeoutError" in errors, errors


def test_the_written_answer_waits_for_a_person(graded):
    rows = question_scores(graded["root"], "ps4").set_index(["student_id", "question"])
    assert bool(rows.loc[("full-marks", "q7"), "needs_manual_grade"])
