"""``python -m course_lib.offline``: the resumable batch scoring job (see :func:`course_lib.offline.job.main`).

The fork server is started before the job's own imports (pyarrow, the model's scikit-learn stack),
unless the job will run in one process, so that its imports overlap them.
"""

import os
import sys

from course_lib.offline.fork_server import warm_up_workers


def _one_process(argv: list[str]) -> bool:
    """True unless the command may need worker processes: ``--workers 1`` (or an abbreviation argparse
    accepts, such as ``--work=1``), a ``--workers`` value that is not a number (argparse will refuse it),
    ``--help``, or a single usable core."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if (len(name) > 3 and "--help".startswith(name)) or arg == "-h":
            return True
        if len(name) > 3 and "--workers".startswith(name):
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                return int(value) <= 1
            except ValueError:
                return True
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores < 2


if __name__ == "__main__":
    if not _one_process(sys.argv[1:]):
        warm_up_workers()
    from course_lib.offline.job import main

    sys.exit(main())
