"""nbgrader configuration for the workbook's graded exercises.

This folder is the nbgrader course root: run every ``nbgrader`` command from here (``cd exercises``).
The root is pinned to this file's folder, so a copy of the folder (as the CI round-trip makes) grades
into its own gradebook and never touches this one.

References
----------
nbgrader 0.9 configuration options: https://nbgrader.readthedocs.io/en/stable/configuration/config_options.html
Deleted grade cells: jupyter/nbgrader#1682, fixed by ``OverwriteCells.add_missing_cells`` (PR #1770).
"""

import os

c = get_config()  # noqa: F821  (nbgrader injects get_config when it loads this file)

COURSE_ROOT = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "inference-workbook"
c.CourseDirectory.root = COURSE_ROOT
# The gradebook is a SQLite file next to this config; it is instructor-local and git-ignored.
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(COURSE_ROOT, "gradebook.db")

# Every cell of a submission runs under a per-cell time limit. A cell that runs longer (an infinite loop)
# is interrupted, recorded as an error (so its question scores 0) and grading goes on with the next cell.
# The exercises' cells take well under a second, so 15 s leaves a wide margin on a busy 2-core machine.
c.Execute.timeout = 15
c.Execute.interrupt_on_timeout = True

# A student who deletes a locked test cell would otherwise leave that grade "needing manual grading"
# forever (nothing to grade). With this option autograde re-inserts the cell from the gradebook after the
# answer cell before it and grades it like any other.
c.OverwriteCells.add_missing_cells = True
