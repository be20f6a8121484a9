"""``python -m course_lib.offline``: the resumable batch scoring job (see :func:`course_lib.offline.job.main`).

The fork server is started before the job's own imports (pyarrow, the model's scikit-learn stack),
unless the job will run in one process, so that its imports overlap them.
"""

import os
import sys

from course_lib.offline.fork_server import warm_up_workers


def _one_process(argv: list[str]) -> bool:
    """True if the command asks for ``--workers 1`` or this process may use a single core."""
    for i, arg in enumerate(argv):
        if arg == "--workers" and i + 1 < len(argv):
            return argv[i + 1].strip() == "1"
        if arg.startswith("--workers="):
            return arg.partition("=")[2].strip() == "1"
    return len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) < 2


if __name__ == "__main__":
    if not _one_process(sys.argv[1:]):
        warm_up_workers()
    from course_lib.offline.job import main

    sys.exit(main())
