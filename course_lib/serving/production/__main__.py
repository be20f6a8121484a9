"""``python -m course_lib.serving.production --port N [--workers K] [levers]``: the production churn service."""

import sys

from course_lib.serving.production._workers import main

if __name__ == "__main__":
    sys.exit(main())
