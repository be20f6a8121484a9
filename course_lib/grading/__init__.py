"""Grading the nbgrader problem sets: intake, sandboxed kernels, the grader's checks, grades, feedback.

From a shell, ``python -m course_lib.grading`` runs intake and a sandboxed autograde, prints the
instructor report, writes feedback and prints score tables (:mod:`course_lib.grading.cli`). The parts:

* :mod:`~course_lib.grading.intake`: which files of a hand-in reach nbgrader;
* :mod:`~course_lib.grading.screen`: deleted cells restored, grade metadata normalised, a report;
* :mod:`~course_lib.grading.execute`: the notebook run within budgets, the grader's checks at each
  test cell, scores into the gradebook;
* :mod:`~course_lib.grading.checks`: the API of the grader's checks (``exercises/checks/<ps>.py``),
  which call students' functions through :mod:`~course_lib.grading.calls` and read the answers with
  :mod:`~course_lib.grading.wire` (in the kernel: :mod:`~course_lib.grading.kernel_side`);
* :mod:`~course_lib.grading.manager`, :mod:`~course_lib.grading.sandbox`,
  :mod:`~course_lib.grading.unshare`, :mod:`~course_lib.grading.view`,
  :mod:`~course_lib.grading.limits`: the sandboxed, bounded kernels;
* :mod:`~course_lib.grading.feedback`: sanitized feedback; :mod:`~course_lib.grading.report`: the
  instructor report; :mod:`~course_lib.grading.gradebook`: per-question scores, ``grades.csv``;
* :mod:`~course_lib.grading.validate`: students' Validate with the grader's rule.

The names below are imported on first use, so a grading kernel that imports
:mod:`course_lib.grading.kernel_side` does not load nbgrader.
"""

from __future__ import annotations

import importlib
from typing import Any

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

_HOMES = {name: "course_lib.grading.gradebook" for name in __all__ if name != "main"} | {
    "main": "course_lib.grading.cli"
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'course_lib.grading' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
