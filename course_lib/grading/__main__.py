"""``python -m course_lib.grading``: see :func:`course_lib.grading.cli.main`."""

from course_lib.grading.cli import main

main()
