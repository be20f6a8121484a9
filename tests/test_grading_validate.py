"""Students' Validate agrees with the course's autograder: only errors fail a check.

Real nbgrader validations of a one-question notebook (a kernel each, a few seconds). nbgrader's own rule
fails a test cell that wrote to stderr or displayed a number below its points; the autograder
(the grader's checks, see the round trip's warning and logging students) gives such an answer its
points, and so must Validate with the students' configuration, loaded the way nbgrader's Validate
button loads it, and ``python -m course_lib.grading validate``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_lib.grading import main
from course_lib.grading.cli import VISIBLE_ONLY

REPO = Path(__file__).resolve().parents[1]
STUDENT_CONFIG = REPO / "config" / "student-jupyter"
RIGHT = "def square(x):\n    {noise}\n    return x * x"
CHECK = "assert square(3) == 9 and square(-2) == 4"


def _notebook(folder: Path, answer: str, test: str) -> Path:
    """A student's notebook: one answer cell and its locked test cell worth 2 points (nbgrader schema 3)."""
    meta = {"schema_version": 3, "task": False}
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell(
            answer,
            metadata={
                "nbgrader": {**meta, "grade": False, "solution": True, "locked": False, "grade_id": "a"}
            },
        ),
        nbformat.v4.new_code_cell(
            test,
            metadata={
                "nbgrader": {
                    **meta,
                    "grade": True,
                    "solution": False,
                    "locked": True,
                    "grade_id": "q",
                    "points": 2,
                }
            },
        ),
    ]
    path = folder / "ps.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture
def button_config(monkeypatch, tmp_path):
    """The configuration nbgrader's Validate button loads in a JupyterLab run with the students' config."""
    from nbgrader.server_extensions.validate_assignment.handlers import ValidateAssignmentHandler

    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(STUDENT_CONFIG))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.chdir(tmp_path)
    return ValidateAssignmentHandler.load_config(None)  # it reads no handler state


@pytest.mark.parametrize(
    ("noise", "test"),
    [
        ("__import__('warnings').warn('slow on big inputs', UserWarning)", CHECK),
        ("__import__('logging').warning('squaring %s', x)", CHECK),
        ("print('working...', file=__import__('sys').stderr)", CHECK),
        ("pass", CHECK + "\n1  # a displayed number is not partial credit"),
    ],
    ids=["warning", "logging", "stderr", "displayed-value"],
)
def test_a_correct_answer_that_writes_to_stderr_validates_as_passing(button_config, tmp_path, noise, test):
    from nbgrader.validator import Validator

    path = _notebook(tmp_path, RIGHT.format(noise=noise), test)
    assert len(Validator().validate(str(path)).get("failed", [])) == 1, "nbgrader's own rule fails it"
    assert Validator(config=button_config).validate(str(path)) == {}


def test_a_wrong_answer_still_fails_and_shows_its_error(button_config, tmp_path):
    from nbgrader.validator import Validator

    path = _notebook(tmp_path, "def square(x):\n    return x + x", CHECK)
    [failed] = Validator(config=button_config).validate(str(path))["failed"]
    assert "AssertionError" in failed["raw_error"]


def test_the_validate_command_exits_1_on_a_failing_check_and_0_when_all_pass(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    (tmp_path / "wrong").mkdir()
    (tmp_path / "warns").mkdir()
    wrong = _notebook(tmp_path / "wrong", "def square(x):\n    return x + x", CHECK)
    warns = _notebook(tmp_path / "warns", RIGHT.format(noise="__import__('warnings').warn('slow')"), CHECK)
    with pytest.raises(SystemExit) as stopped:
        main(["validate", str(wrong)])
    failing = capsys.readouterr().out
    assert stopped.value.code == 1 and "VALIDATION FAILED ON 1 CELL(S)" in failing
    assert VISIBLE_ONLY not in failing
    main(["validate", str(warns)])
    passing = capsys.readouterr().out
    assert "Success! Your notebook passes all the tests." in passing
    assert VISIBLE_ONLY in passing, "says that the visible checks decide no points"


def test_validate_names_a_missing_notebook_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["validate", str(tmp_path / "ps9.ipynb")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == f"validate: no such notebook: {tmp_path / 'ps9.ipynb'}"
