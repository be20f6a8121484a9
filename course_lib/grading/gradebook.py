"""The gradebook side of grading: run nbgrader, read per-question scores, export grades.

nbgrader keeps one *grade* per (submitted notebook, grade cell) in its gradebook. ``nbgrader export``
writes one total per student and assignment; :func:`question_scores` adds the per-question view an
instructor needs to see which question a class found hard, read with nbgrader's Gradebook API.

:func:`run_nbgrader` runs an ``nbgrader`` command in a course root with the environment it needs when
the virtual environment is not activated (nbgrader calls the ``alembic`` script by name when it creates
a gradebook) and with this checkout's ``course_lib`` importable by the grading kernels.

References
----------
nbgrader 0.9 documentation, "Gradebook API" (``nbgrader.api.Gradebook``; ``Grade.score`` is the manual
score if set, else the autograder's, else 0) and "Exporting grades" (``nbgrader export``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

from course_lib.core.checks import non_empty
from course_lib.core.files import IMPORT_ROOT, course_workspace

__all__ = [
    "COURSE_ROOT",
    "GRADEBOOK_FILE",
    "QUESTION_COLUMNS",
    "export_grades_csv",
    "gradebook_url",
    "question_scores",
    "run_nbgrader",
    "score_table",
]

#: The workbook's nbgrader course root, the default of every ``course_root``: ``exercises/`` of the course
#: checkout at or above the current working directory when this module is imported
#: (``course_lib.core.files.course_workspace``); grading only makes sense in a checkout.
COURSE_ROOT = course_workspace() / "exercises"
#: File name of the SQLite gradebook inside a course root (set in ``exercises/nbgrader_config.py``).
GRADEBOOK_FILE = "gradebook.db"
#: Columns of :func:`question_scores`, in order.
QUESTION_COLUMNS = (
    "assignment",
    "student_id",
    "notebook",
    "question",
    "score",
    "max_score",
    "autograded",
    "needs_manual_grade",
)


def _course_root(course_root: str | os.PathLike | None) -> Path:
    root = Path(COURSE_ROOT if course_root is None else course_root)
    if not root.is_dir():
        raise ValueError(f"course_root must be an existing nbgrader course folder, got {str(root)!r}")
    return root.resolve()


def gradebook_url(course_root: str | os.PathLike | None = None) -> str:
    """SQLAlchemy URL of the gradebook of ``course_root`` (default: the workbook's ``exercises/``).

    Raises
    ------
    ValueError
        If ``course_root`` is not a folder.
    FileNotFoundError
        If the folder has no gradebook yet (``nbgrader generate_assignment`` creates it).
    """
    path = _course_root(course_root) / GRADEBOOK_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no gradebook at {path}: run `nbgrader generate_assignment <ps>` (and autograde) in "
            f"{path.parent} first"
        )
    return f"sqlite:///{path}"


def _natural_key(text: str) -> tuple:
    """Sort ``q2`` before ``q10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def question_scores(
    course_root: str | os.PathLike | None = None, assignment: str | None = None
) -> pd.DataFrame:
    """One row per submitted notebook and grade cell: the per-question scores of a class.

    Parameters
    ----------
    course_root : path-like, optional
        nbgrader course root holding ``gradebook.db``; default: the workbook's ``exercises/``.
    assignment : str, optional
        Only this assignment (e.g. ``"ps1"``); default: every assignment in the gradebook.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`QUESTION_COLUMNS`, sorted by assignment, student, notebook and question
        (``q2`` before ``q10``). ``question`` is the grade cell's ``grade_id``; ``score`` and
        ``max_score`` are points (``score`` is nbgrader's: the manual score if a grader set one, else
        the autograder's, else 0). ``autograded`` is False when neither the autograder nor a person
        scored the cell, for instance because the notebook could not be read; such rows also have
        ``needs_manual_grade`` True. Only submissions appear: a student who submitted nothing has no row.

    Raises
    ------
    ValueError
        If ``course_root`` is not a folder or ``assignment`` is not in the gradebook.
    FileNotFoundError
        If the course has no gradebook yet.
    """
    from nbgrader.api import Gradebook  # noqa: PLC0415 (heavy optional dependency: nbgrader)

    url = gradebook_url(course_root)
    rows = []
    # course_id="" reads the gradebook without registering a course in it (Gradebook.check_course).
    with Gradebook(url, course_id="") as gradebook:
        known = [a.name for a in gradebook.assignments]
        if assignment is not None and assignment not in known:
            raise ValueError(f"assignment {assignment!r} is not in the gradebook at {url}; it has {known}")
        for assignment_row in gradebook.assignments:
            if assignment is not None and assignment_row.name != assignment:
                continue
            for submission in assignment_row.submissions:
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        rows.append(
                            (
                                assignment_row.name,
                                submission.student.id,
                                notebook.name,
                                grade.name,
                                float(grade.score),
                                float(grade.max_score),
                                grade.auto_score is not None or grade.manual_score is not None,
                                bool(grade.needs_manual_grade),
                            )
                        )
    rows.sort(key=lambda r: (r[0], r[1], r[2], _natural_key(r[3])))
    return pd.DataFrame(rows, columns=list(QUESTION_COLUMNS))


def score_table(course_root: str | os.PathLike | None = None, assignment: str | None = None) -> pd.DataFrame:
    """The per-question scores of one assignment as a table: one row per student, one column per question.

    Parameters
    ----------
    course_root : path-like, optional
        As in :func:`question_scores`.
    assignment : str
        The assignment, e.g. ``"ps1"`` (required: question names repeat across assignments).

    Returns
    -------
    pandas.DataFrame
        Index ``student_id``; one column per question in notebook order (``q1``, ``q2``...; prefixed
        ``<notebook>/`` when the assignment has several notebooks), then ``total``. The labels carry the
        points available, e.g. ``"q1 (3)"`` and ``"total (10)"``. A question nobody scored (the
        notebook could not be read, say) shows NaN rather than nbgrader's 0, and so does the total.

    Raises
    ------
    ValueError
        If ``assignment`` is missing or unknown, or nobody submitted it yet.
    """
    if assignment is None:
        raise ValueError("assignment is required (e.g. 'ps1'): question names repeat across assignments")
    long = question_scores(course_root, assignment)
    if long.empty:
        raise ValueError(f"assignment {assignment!r} has no submissions in the gradebook yet")
    if long["notebook"].nunique() > 1:
        long["question"] = long["notebook"] + "/" + long["question"]
    long["score"] = long["score"].where(long["autograded"])
    questions = sorted(long["question"].unique(), key=_natural_key)
    points = long.groupby("question")["max_score"].first()
    table = long.pivot(index="student_id", columns="question", values="score")[questions]
    table["total"] = table.sum(axis=1, skipna=False)
    labels = {q: f"{q} ({points[q]:g})" for q in questions}
    labels["total"] = f"total ({points.sum():g})"
    table.columns.name = None
    return table.rename(columns=labels)


def run_nbgrader(
    *args: str, course_root: str | os.PathLike | None = None, timeout_s: float = 900.0
) -> subprocess.CompletedProcess:
    """Run ``nbgrader <args>`` in ``course_root`` and return the finished process (output captured).

    The command runs with this interpreter (``python -m nbgrader``), its ``bin/`` folder first on
    ``PATH`` and the repository root first on ``PYTHONPATH``, so it works without an activated virtual
    environment and the grading kernels import this checkout's ``course_lib``.

    Parameters
    ----------
    *args : str
        nbgrader sub-command and options, e.g. ``"autograde", "ps1"``.
    course_root : path-like, optional
        Folder holding ``nbgrader_config.py``; default: the workbook's ``exercises/``.
    timeout_s : float
        Wall-clock limit in seconds for the whole command.

    Returns
    -------
    subprocess.CompletedProcess
        With ``returncode``, ``stdout`` and ``stderr`` (nbgrader logs to stderr). A non-zero return code
        is not raised: ``nbgrader autograde`` exits 1 when any submission failed even though it graded
        the others, and callers decide what that means.

    Raises
    ------
    ValueError
        If no sub-command is given or ``course_root`` is not a folder.
    subprocess.TimeoutExpired
        If the command runs longer than ``timeout_s``.
    """
    non_empty("args", args)  # the nbgrader sub-command and its arguments, e.g. ('autograde', 'ps1')
    root = _course_root(course_root)
    env = os.environ.copy()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    import_root = str(IMPORT_ROOT)  # nbgrader's kernels import this same course_lib
    env["PYTHONPATH"] = os.pathsep.join(p for p in [import_root, env.get("PYTHONPATH", "")] if p)
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def export_grades_csv(dest: str | os.PathLike, course_root: str | os.PathLike | None = None) -> pd.DataFrame:
    """Write ``nbgrader export``'s grades CSV to ``dest`` and return it as a DataFrame.

    One row per student and assignment (a student who submitted nothing scores 0), with nbgrader's
    columns: assignment, duedate, timestamp, student_id, last_name, first_name, email, raw_score,
    late_submission_penalty, score, max_score.

    Raises
    ------
    FileNotFoundError
        If the course has no gradebook yet.
    RuntimeError
        If ``nbgrader export`` fails; the message carries its log.
    """
    gradebook_url(course_root)  # a clear error before nbgrader would create an empty gradebook
    dest_path = Path(dest).resolve()
    done = run_nbgrader("export", f"--to={dest_path}", course_root=course_root)
    if done.returncode != 0 or not dest_path.is_file():
        raise RuntimeError(f"nbgrader export failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return pd.read_csv(dest_path, dtype={"student_id": str}, keep_default_na=False)
