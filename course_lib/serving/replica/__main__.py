"""``python -m course_lib.serving.replica``: serve one churn replica (see ``_replica.main``)."""

from course_lib.serving.replica._replica import main

if __name__ == "__main__":
    main()
