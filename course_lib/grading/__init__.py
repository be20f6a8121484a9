"""Grading the nbgrader problem sets: sandboxed kernels, grades, feedback, the students' Validate.

From a shell, ``python -m course_lib.grading`` autogrades in a sandbox, prints the pre-grading screen
report, writes feedback and prints score tables (:mod:`course_lib.grading.cli`). The parts:

* :mod:`~course_lib.grading.gradebook`: run nbgrader, per-question scores, ``grades.csv``;
* :mod:`~course_lib.grading.sandbox`: sandboxed kernels (bubblewrap, else
  :mod:`~course_lib.grading.unshare`, both building :mod:`~course_lib.grading.view`);
* :mod:`~course_lib.grading.screen`: the pre-grading screen;
* :mod:`~course_lib.grading.execute`: guarded execution, grades from errors only;
* :mod:`~course_lib.grading.feedback`: feedback with the hidden tests hidden;
* :mod:`~course_lib.grading.validate`: students' Validate with the grader's rule.
"""

from __future__ import annotations

from course_lib.grading.cli import main
from course_lib.grading.gradebook import (
    COURSE_ROOT,
    GRADEBOOK_FILE,
    QUESTION_COLUMNS,
    export_grades_csv,
    gradebook_url,
    question_scores,
    run_nbgrader,
    score_table,
)

__all__ = [
    "COURSE_ROOT",
    "GRADEBOOK_FILE",
    "QUESTION_COLUMNS",
    "export_grades_csv",
    "gradebook_url",
    "main",
    "question_scores",
    "run_nbgrader",
    "score_table",
]
