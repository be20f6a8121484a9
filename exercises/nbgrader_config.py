"""nbgrader configuration for the workbook's graded exercises.

This folder is the nbgrader course root: run every ``nbgrader`` command from here (``cd exercises``).
The root is pinned to this file's folder, so a copy of the folder (as the CI round-trip makes) grades
into its own gradebook and never touches this one.

Autograding runs student code in a sandbox and grades it safely (``course_lib.grading``, see
``python -m course_lib.grading autograde --help``): each kernel runs under bubblewrap (else util-linux unshare) with the course
root invisible, the environment read-only, no network and memory/CPU limits; a pre-grading screen
normalises duplicated or split grade cells and flags kernel-level code for review; test cells score
from errors only, after a guard clears hooks; a cell that kills or hangs its kernel costs only its own
questions; feedback shows hidden tests as pass/fail only. Without a working sandbox, autograding
refuses to run unless ``c.SandboxedKernelManager.sandbox = "none"`` (what ``--unsafe`` sets).

References
----------
nbgrader 0.9 configuration options: https://nbgrader.readthedocs.io/en/stable/configuration/config_options.html
Deleted grade cells: jupyter/nbgrader#1682, fixed by ``OverwriteCells.add_missing_cells`` (PR #1770).
Duplicated grade cells: jupyter/nbgrader#1083 (open), handled by ``ScreenSubmission``.
"""

import os
import sys

c = get_config()  # noqa: F821  (nbgrader injects get_config when it loads this file)

COURSE_ROOT = os.path.dirname(os.path.abspath(__file__))
# course_lib lives next to this folder; `make`, `python -m course_lib.grading` and the tests also put
# the checkout first on PYTHONPATH.
sys.path.append(os.path.dirname(COURSE_ROOT))

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor  # noqa: E402
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

from course_lib.grading.execute import ErrorOnlyGrades, GuardedExecute  # noqa: E402
from course_lib.grading.feedback import HideHiddenTests  # noqa: E402
from course_lib.grading.screen import ScreenSubmission  # noqa: E402

c.CourseDirectory.course_id = "inference-workbook"
c.CourseDirectory.root = COURSE_ROOT
# The gradebook is a SQLite file next to this config; it is instructor-local and git-ignored.
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(COURSE_ROOT, "gradebook.db")

# Every cell of a submission runs under a per-cell time limit. A cell that runs longer (an infinite loop)
# is interrupted, recorded as an error (so its question scores 0) and grading goes on with the next cell.
# A cell that ignores the interrupt, or kills its kernel, gets an error too; the kernel is replaced and
# the earlier cells replayed. The exercises' cells take well under a second, so 15 s leaves a wide margin
# on a busy 2-core machine. (A test cell runs as two parts, visible then hidden checks, 15 s each.)
c.Execute.timeout = 15
c.Execute.interrupt_on_timeout = True

# A student who deletes a locked test cell would otherwise leave that grade "needing manual grading"
# forever (nothing to grade). With this option autograde re-inserts the cell from the gradebook after the
# answer cell before it and grades it like any other.
c.OverwriteCells.add_missing_cells = True

# Pre-grading screen (before DeduplicateIds, which would silently empty all but one copy's metadata,
# and OverwriteCells) and safe execution/grading (replacing Execute and
# SaveAutoGrades). Instructor reports: reports/<assignment>/<student>.json.
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
    ClearMetadataPreprocessor,
    LimitOutput,
    ErrorOnlyGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]
c.ScreenSubmission.report_dir = os.path.join(COURSE_ROOT, "reports")
c.ErrorOnlyGrades.report_dir = os.path.join(COURSE_ROOT, "reports")
# Kernel sandbox (auto: bubblewrap, else unshare) and its limits: 4 GiB of address space, 600 CPU seconds per kernel.
c.SandboxedKernelManager.sandbox = "auto"
c.SandboxedKernelManager.memory_limit_bytes = 4 * 1024**3
c.SandboxedKernelManager.cpu_limit_s = 600

# Feedback shows hidden tests as pass/fail only (no source, no traceback).
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, HideHiddenTests]
