"""nbgrader configuration for the workbook's graded exercises.

This folder is the nbgrader course root: run every ``nbgrader`` command from here (``cd exercises``).
The root is pinned to this file's folder, so a copy of the folder (as the CI round-trip makes) grades
into its own gradebook and never touches this one.

Autograde with ``python -m course_lib.grading autograde <ps>`` (see ``--help`` and docs/instructors.md):
intake checks every hand-in first (only regular notebook files, size-limited, renamed copies matched,
nothing else copied); each kernel runs under bubblewrap (else util-linux unshare) with the course root
invisible, the environment read-only, no network, in-memory scratch folders and memory/process limits
for the whole sandbox; the notebook runs top to bottom within its budgets; at each test cell the
grader's checks (``checks/<ps>.py``, which no kernel and no student sees) call the student's functions
with hidden inputs and judge the answers in the grader's process; points go into the gradebook from
those verdicts only. Plain ``nbgrader autograde`` (and formgrader's Autograde button) refuses, because
it would read raw hand-ins. Without a working sandbox, autograding refuses to run unless
``c.SandboxedKernelManager.sandbox = "none"`` (what ``--unsafe`` sets).

References
----------
nbgrader 0.9 configuration options: https://nbgrader.readthedocs.io/en/stable/configuration/config_options.html
Duplicated grade cells: jupyter/nbgrader#1083 (open), handled by ``ScreenSubmission``.
"""

import os
import sys

c = get_config()  # noqa: F821  (nbgrader injects get_config when it loads this file)

COURSE_ROOT = os.path.dirname(os.path.abspath(__file__))
# course_lib lives next to this folder; `make`, `python -m course_lib.grading` and the tests also put
# the checkout first on PYTHONPATH.
sys.path.append(os.path.dirname(COURSE_ROOT))

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties,
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    GetGrades,
    IgnorePattern,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
)

from course_lib.grading.execute import GraderScores, GuardedExecute  # noqa: E402
from course_lib.grading.feedback import HeldForReviewNote, SafeHTML  # noqa: E402
from course_lib.grading.intake import IntakeOnlyExporter  # noqa: E402
from course_lib.grading.screen import ScreenSubmission  # noqa: E402

c.CourseDirectory.course_id = "inference-workbook"
c.CourseDirectory.root = COURSE_ROOT
# The gradebook is a SQLite file next to this config; it is instructor-local and git-ignored.
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(COURSE_ROOT, "gradebook.db")

# Autograde reads only what intake let through (intake/), never submitted/ directly.
c.Autograde.exporter_class = IntakeOnlyExporter

# Budgets, stated in every problem statement. A cell runs at most 15 s (then it is interrupted and
# recorded as an error); each call the grader makes into a student's function at most 15 s, all of one
# question's calls at most 60 s; the whole notebook (cells, checks, kernel restarts) at most 10 minutes,
# after which the rest is not run and its questions score 0. A cell or call that ignores the interrupt,
# or kills its kernel, costs only the questions that need it: the kernel is replaced and the earlier
# cells replayed.
c.Execute.timeout = 15
c.Execute.interrupt_on_timeout = True
c.GuardedExecute.call_timeout_s = 15
c.GuardedExecute.question_budget_s = 60
c.GuardedExecute.notebook_budget_s = 600
c.GuardedExecute.output_budget_bytes = 8 * 1024**2
c.GuardedExecute.checks_dir = os.path.join(COURSE_ROOT, "checks")
c.GuardedExecute.report_dir = os.path.join(COURSE_ROOT, "reports")

# The screen puts back deleted cells itself (from release/), so nbgrader's own re-insertion, which fails
# with a KeyError when an answer cell was deleted with its test cell, stays off.
c.OverwriteCells.add_missing_cells = False

c.Autograde.sanitize_preprocessors = [
    ClearOutput,
    ScreenSubmission,
    DeduplicateIds,
    OverwriteKernelspec,
    OverwriteCells,
    CheckCellMetadata,
]
c.Autograde.autograde_preprocessors = [
    GuardedExecute,
    IgnorePattern,
    LimitOutput,
    SafeHTML,
    GraderScores,
    AssignLatePenalties,
    CheckCellMetadata,
]
c.ScreenSubmission.report_dir = os.path.join(COURSE_ROOT, "reports")
c.ScreenSubmission.release_dir = os.path.join(COURSE_ROOT, "release")

# Kernel sandbox (auto: bubblewrap, else unshare) and its limits. The whole sandbox (every process and
# its in-memory files) gets 3 GiB and 64 processes (a cgroup where one can be made, else the grader's
# watchdog); each process 4 GiB of address space and 900 CPU seconds; files at most 256 MiB each, in
# in-memory folders of 256 MiB (the notebook's folder, /tmp) and 64 MiB (/dev/shm).
c.SandboxedKernelManager.sandbox = "auto"
c.SandboxedKernelManager.sandbox_memory_bytes = 3 * 1024**3
c.SandboxedKernelManager.max_processes = 64
c.SandboxedKernelManager.memory_limit_bytes = 4 * 1024**3
c.SandboxedKernelManager.cpu_limit_s = 900

# Feedback: student HTML sanitized, a line on submissions held for review.
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, SafeHTML, HeldForReviewNote]
