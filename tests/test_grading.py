"""course_lib.grading on a small gradebook built with nbgrader's own API (no kernels: seconds, not minutes)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

from course_lib.grading import (
    QUESTION_COLUMNS,
    gradebook_url,
    main,
    question_scores,
    run_nbgrader,
    score_table,
)

# nbgrader's add_submission trips SQLAlchemy autoflush warnings inside nbgrader itself; they are harmless.
pytestmark = pytest.mark.filterwarnings("ignore:Object of type:sqlalchemy.exc.SAWarning")


@pytest.fixture(scope="module")
def gradebook_file(tmp_path_factory) -> Path:
    """ps1: q1, q2, q10 (3, 2, 1 points), amy fully autograded, bo's q10 never scored; ps2: no submissions;
    ps3: two notebooks with a q1 each, amy scores 1 on both."""
    from nbgrader.api import Gradebook

    path = tmp_path_factory.mktemp("gradebook") / "gradebook.db"
    with pytest.MonkeyPatch.context() as mp:
        # nbgrader runs the `alembic` script by name when it creates a gradebook.
        mp.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        with Gradebook(f"sqlite:///{path}", course_id="inference-workbook") as gb:
            gb.add_assignment("ps1")
            gb.add_notebook("ps1", "ps1")
            for name, points in (("q1", 3), ("q2", 2), ("q10", 1)):
                gb.add_grade_cell(name, "ps1", "ps1", max_score=points, cell_type="code")
            gb.add_assignment("ps2")
            gb.add_assignment("ps3")  # two notebooks that both have a "q1"
            for notebook, points in (("part_a", 1), ("part_b", 2)):
                gb.add_notebook(notebook, "ps3")
                gb.add_grade_cell("q1", notebook, "ps3", max_score=points, cell_type="code")
            for student, scores in (("amy", {"q1": 3, "q2": 0, "q10": 1}), ("bo", {"q1": 1.5, "q2": 2})):
                gb.add_student(student)
                gb.add_submission("ps1", student)
                for name, score in scores.items():
                    grade = gb.find_grade(name, "ps1", "ps1", student)
                    grade.auto_score = score
                    grade.needs_manual_grade = False
            gb.add_submission("ps3", "amy")
            for notebook in ("part_a", "part_b"):
                grade = gb.find_grade("q1", notebook, "ps3", "amy")
                grade.auto_score, grade.needs_manual_grade = 1.0, False
            gb.db.commit()
    return path


@pytest.fixture
def course_root(tmp_path, gradebook_file) -> Path:
    """A course folder holding a fresh copy of the small gradebook."""
    shutil.copy(gradebook_file, tmp_path / "gradebook.db")
    return tmp_path


def test_question_scores_has_one_row_per_student_and_grade_cell_in_natural_order(course_root):
    table = question_scores(course_root, "ps1")
    assert list(table.columns) == list(QUESTION_COLUMNS)
    assert list(zip(table.student_id, table.question, strict=True)) == [
        ("amy", "q1"),
        ("amy", "q2"),
        ("amy", "q10"),
        ("bo", "q1"),
        ("bo", "q2"),
        ("bo", "q10"),
    ]
    assert table.score.tolist() == [3.0, 0.0, 1.0, 1.5, 2.0, 0.0]
    assert table.max_score.tolist() == [3.0, 2.0, 1.0, 3.0, 2.0, 1.0]


def test_a_cell_nobody_scored_is_flagged_not_autograded_and_needing_a_grader(course_root):
    table = question_scores(course_root).set_index(["student_id", "question"])
    assert table.loc[("bo", "q10"), ["score", "autograded", "needs_manual_grade"]].tolist() == [
        0.0,
        False,
        True,
    ]
    assert table.loc[("amy", "q10"), ["autograded", "needs_manual_grade"]].tolist() == [True, False]


def test_a_manual_score_takes_precedence_over_the_autograder(course_root):
    from nbgrader.api import Gradebook

    with Gradebook(gradebook_url(course_root), course_id="inference-workbook") as gb:
        gb.find_grade("q2", "ps1", "ps1", "amy").manual_score = 1.5
        gb.db.commit()
    table = question_scores(course_root, "ps1").set_index(["student_id", "question"])
    assert table.loc[("amy", "q2"), "score"] == 1.5


def test_an_assignment_without_submissions_has_no_rows(course_root):
    assert question_scores(course_root, "ps2").empty


def test_score_table_has_a_column_per_question_with_its_points_and_a_total(course_root):
    table = score_table(course_root, "ps1")
    assert list(table.columns) == ["q1 (3)", "q2 (2)", "q10 (1)", "total (6)"]
    assert table.loc["amy"].tolist() == [3.0, 0.0, 1.0, 4.0]
    assert table.loc["bo", ["q1 (3)", "q2 (2)"]].tolist() == [1.5, 2.0]
    assert table.loc["bo", ["q10 (1)", "total (6)"]].isna().all(), "an unscored question is not a 0"


def test_score_table_prefixes_questions_with_their_notebook_when_there_are_several(course_root):
    table = score_table(course_root, "ps3")
    assert list(table.columns) == ["part_a/q1 (1)", "part_b/q1 (2)", "total (3)"]
    assert table.loc["amy"].tolist() == [1.0, 1.0, 2.0]


def test_reading_scores_leaves_the_gradebook_file_unchanged(course_root):
    before = hashlib.sha256((course_root / "gradebook.db").read_bytes()).hexdigest()
    question_scores(course_root)
    score_table(course_root, "ps1")
    assert hashlib.sha256((course_root / "gradebook.db").read_bytes()).hexdigest() == before


def test_unknown_assignment_is_a_value_error_naming_it_and_the_known_ones(course_root):
    with pytest.raises(ValueError, match=r"'ps9' is not in the gradebook.*'ps1', 'ps2', 'ps3'"):
        question_scores(course_root, "ps9")


def test_score_table_needs_an_assignment_with_submissions(course_root):
    with pytest.raises(ValueError, match="assignment is required"):
        score_table(course_root)
    with pytest.raises(ValueError, match="'ps2' has no submissions"):
        score_table(course_root, "ps2")


def test_a_course_without_gradebook_says_to_generate_the_assignment_first(tmp_path):
    with pytest.raises(FileNotFoundError, match="nbgrader generate_assignment"):
        question_scores(tmp_path)
    assert not (tmp_path / "gradebook.db").exists(), "reading must not create an empty gradebook"


def test_a_course_root_that_is_not_a_folder_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="course_root must be an existing nbgrader course folder"):
        gradebook_url(tmp_path / "missing")


def test_run_nbgrader_needs_a_subcommand():
    with pytest.raises(ValueError, match="sub-command"):
        run_nbgrader()


def test_command_line_prints_a_score_table_per_assignment_with_submissions(course_root, capsys):
    main(["--course-root", str(course_root)])
    out = capsys.readouterr().out
    assert out.startswith("ps1\n") and "ps2" not in out, "ps2 has no submissions"
    assert "q10 (1)" in out and "total (6)" in out
    amy = next(line for line in out.splitlines() if line.startswith("amy"))
    assert amy.split() == ["amy", "3.0", "0.0", "1.0", "4.0"]
