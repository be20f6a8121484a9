"""``python -m course_lib.offline``: the resumable batch scoring job (see :func:`course_lib.offline.job.main`)."""

from course_lib.offline.job import main

if __name__ == "__main__":
    main()
