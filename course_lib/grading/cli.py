"""``python -m course_lib.grading``: intake, sandboxed autograde, report, feedback and score tables.

Sub-commands (run from anywhere; ``--course-root`` defaults to the workbook's ``exercises/``):

``autograde PS [--student ID] [--force] [--sandbox auto|bwrap|unshare] [--unsafe] [-- NBGRADER_ARGS]``
    Checks that a kernel sandbox works (``auto``: bubblewrap, else util-linux ``unshare``), refuses
    with the reason if none does (unless ``--unsafe``), runs intake (:mod:`course_lib.grading.intake`),
    runs ``nbgrader autograde PS`` on what intake let through (the grader's checks of
    ``checks/PS.py`` decide the points), then prints the report and the scores. Arguments after
    ``--`` go to nbgrader (``--GuardedExecute.notebook_budget_s=120``). Exits 1 if a submission
    could not be graded.
``intake PS``
    Intake alone: what would be graded, renamed or refused.
``report PS``
    The instructor report: per student, what intake refused, what the screen normalised and
    flagged, which of the grader's checks failed and why (with the details students do not see),
    which limits a submission hit, and whether it is held for review.
``feedback PS``
    ``nbgrader generate_feedback PS``: sanitized pages with the grader's verdict per question.
``validate NOTEBOOK [...]`` (for students)
    Runs each notebook and checks it as the autograder will: a check fails only if it raises
    (warnings and log messages do not count); exits 1 if any fails.
``scores [PS ...]`` (also the default: ``python -m course_lib.grading ps1``)
    Per-question score tables.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import pandas as pd

from course_lib.grading.gradebook import (
    _course_root,
    gradebook_url,
    question_scores,
    run_nbgrader,
    score_table,
)
from course_lib.grading.intake import INTAKE_DIR, intake
from course_lib.grading.report import report_text
from course_lib.grading.sandbox import MECHANISMS, find_sandbox

__all__ = ["error_lines", "main", "run_intake"]

#: Printed under nbgrader's "Success!" for a notebook that passes: what passing means, and what it does not.
VISIBLE_ONLY = (
    "These were the notebook's visible checks. The grader calls your functions with other inputs and "
    "decides the points from what they return."
)
COMMANDS = ("autograde", "intake", "report", "feedback", "validate", "scores")
#: Exit status when autograde refuses to run without a sandbox.
EXIT_NO_SANDBOX = 3
#: Exit status when the course's nbgrader_config.py does not load (nbgrader would grade without it).
EXIT_BAD_CONFIG = 4


def config_error(course_root) -> str | None:
    """Why ``<course_root>/nbgrader_config.py`` does not load, or None if it does.

    nbgrader logs a configuration file that raises and carries on with its defaults, which would
    grade with plain ``Execute``: unsandboxed, by nbgrader's own rule.
    """
    from traitlets.config.loader import PyFileConfigLoader  # noqa: PLC0415 (heavy optional dependency: nbgrader)

    path = _course_root(course_root) / "nbgrader_config.py"
    if not path.is_file():
        return f"{path} does not exist"
    try:
        PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    except Exception as error:
        return f"{path} raises {type(error).__name__}: {error}"
    return None


def _notebooks(course_root, assignment: str) -> list[str]:
    from nbgrader.api import Gradebook, MissingEntry  # noqa: PLC0415 (heavy optional dependency: nbgrader)

    with Gradebook(gradebook_url(course_root), course_id="") as gradebook:
        try:
            return [nb.name for nb in gradebook.find_assignment(assignment).notebooks]
        except MissingEntry:
            raise ValueError(
                f"assignment {assignment!r} is not in the gradebook: "
                f"run `nbgrader generate_assignment {assignment}`"
            ) from None


def run_intake(course_root, assignment: str, *, student: str | None = None) -> list:
    """Intake of ``assignment`` in ``course_root``, printing one line per thing to report.

    Returns the :class:`~course_lib.grading.intake.StudentIntake` list.
    """
    root = _course_root(course_root)
    results = intake(
        root, assignment, _notebooks(root, assignment), db_url=gradebook_url(root), student=student
    )
    for result in results:
        for line in result.lines:
            print(f"intake {result.student}: {line}")
    graded = sum(bool(r.accepted) for r in results)
    print(f"intake: {graded} of {len(results)} submissions of {assignment} go to nbgrader ({INTAKE_DIR}/)")
    return results


def error_lines(log: str) -> list[str]:
    """nbgrader's ``ERROR`` lines with the traceback lines that follow each (nbgrader does not prefix them).

    Examples
    --------
    >>> log = "[A | INFO] ok\\n[A | ERROR] Traceback (most recent call last):\\n"
    >>> log += "  File x\\nKeyError: 1\\n[A | INFO] next"
    >>> error_lines(log)
    ['[A | ERROR] Traceback (most recent call last):', '  File x', 'KeyError: 1']
    """
    kept: list[str] = []
    in_error = False
    for line in log.splitlines():
        if line.startswith("["):
            in_error = "ERROR" in line or "There was an error" in line
        elif re.match(r"\S.*Warning: ", line):  # a Python warning (SQLAlchemy's SAWarning...) ends a block
            in_error = False
        if in_error and line.strip():
            kept.append(line)
    return kept


def root_note() -> str | None:
    """A warning when this process grades as root (docs/instructors.md, *Grading safely*), else None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    return (
        "NOTE: grading as root. Student kernels keep your user id inside the sandbox, and root's id owns "
        "the host's files: grade as an ordinary user (docs/instructors.md, Grading safely)."
    )


def _autograde(args) -> int:
    broken = config_error(args.course_root)
    if broken is not None:
        print(f"Refusing to autograde {args.assignment}: {broken}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    check = find_sandbox("none" if args.unsafe else args.sandbox)
    if check.mechanism is None and not args.unsafe:
        print(
            f"Refusing to autograde {args.assignment}: {check.reason}.\n"
            "Student code would run with your rights (it could rewrite the gradebook, other students' "
            "results or course_lib). Fix the sandbox, or pass --unsafe to grade anyway.",
            file=sys.stderr,
        )
        return EXIT_NO_SANDBOX
    if check.mechanism is not None:
        print(f"Student kernels run in the `{check.mechanism}` sandbox.", file=sys.stderr)
    else:
        print("WARNING: --unsafe: student code runs without a sandbox, with your rights.", file=sys.stderr)
    if (note := root_note()) is not None:
        print(note, file=sys.stderr)
    results = run_intake(args.course_root, args.assignment, student=args.student)
    nbgrader_args = ["autograde", args.assignment, f"--CourseDirectory.submitted_directory={INTAKE_DIR}"]
    if args.student:
        nbgrader_args.append(f"--student={args.student}")
    if args.force:
        nbgrader_args.append("--force")
    # The mechanism that passed the check (nbgrader's kernels would otherwise search again).
    nbgrader_args.append(f"--SandboxedKernelManager.sandbox={check.mechanism or 'none'}")
    nbgrader_args += args.nbgrader_args
    status = 0
    if any(r.accepted for r in results):
        done = run_nbgrader(*nbgrader_args, course_root=args.course_root, timeout_s=args.timeout_s)
        log = _course_root(args.course_root) / "reports" / args.assignment / "nbgrader-autograde.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(done.stderr, encoding="utf-8")
        errors = error_lines(done.stderr)
        print("\n".join(errors[-40:]) or "nbgrader autograde: no errors")
        if errors:
            print(f"(nbgrader's whole log: {log})")
        status = done.returncode
        if "Exception while loading config file" in done.stderr:
            print(
                "nbgrader could not load the course's configuration: these grades are not valid",
                file=sys.stderr,
            )
            status = EXIT_BAD_CONFIG
    print(report_text(_course_root(args.course_root) / "reports", args.assignment))
    _print_scores(args.course_root, [args.assignment])
    return status or int(any(r.unreadable for r in results))


def _feedback(args) -> int:
    done = run_nbgrader("generate_feedback", args.assignment, course_root=args.course_root)
    print(f"feedback in {Path(_course_root(args.course_root)) / 'feedback'} (exit {done.returncode})")
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    return done.returncode


def _validate(args) -> int:
    from course_lib.grading.validate import validate_notebook  # noqa: PLC0415 (heavy optional dependency: nbgrader)

    missing = [nb for nb in args.notebooks if not Path(nb).is_file()]
    if missing:
        print(f"validate: no such notebook: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    failed = 0
    for notebook in args.notebooks:
        print(f"== {notebook}", flush=True)
        bad = bool(validate_notebook(notebook, print_results=True))
        failed += bad
        if not bad:
            print(VISIBLE_ONLY, flush=True)
    return 1 if failed else 0


def _print_scores(course_root, assignments: list[str]) -> None:
    names = assignments or sorted(set(question_scores(course_root)["assignment"]))
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        for name in names:
            print(f"{name}\n{score_table(course_root, name)}\n")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point (see the module docstring); exits with the command's status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help"):
        argv = ["scores", *argv]
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    grade = commands.add_parser("autograde", help="intake + sandboxed nbgrader autograde + report + scores")
    grade.add_argument("assignment")
    grade.add_argument("--student", default=None, help="grade only this student")
    grade.add_argument("--force", action="store_true", help="grade again submissions already graded")
    grade.add_argument(
        "--sandbox",
        choices=("auto", *MECHANISMS),
        default="auto",
        help="sandbox mechanism (auto: bubblewrap, else unshare)",
    )
    grade.add_argument(
        "--unsafe", action="store_true", help="grade without a sandbox (student code gets your rights)"
    )
    grade.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="limit for the whole command, seconds (default: none; each notebook has its own budget)",
    )
    intake_ = commands.add_parser("intake", help="intake alone: what would be graded, renamed, refused")
    intake_.add_argument("assignment")
    report = commands.add_parser("report", help="the instructor report")
    report.add_argument("assignment")
    feedback = commands.add_parser("feedback", help="sanitized feedback with the grader's verdicts")
    feedback.add_argument("assignment")
    check = commands.add_parser("validate", help="(students) check notebooks as the autograder will")
    check.add_argument("notebooks", nargs="+", help="the .ipynb files to check")
    scores = commands.add_parser("scores", help="per-question score tables")
    scores.add_argument("assignments", nargs="*", help="default: every assignment with submissions")
    for sub in (grade, intake_, report, feedback, scores):
        sub.add_argument("--course-root", default=None, help="nbgrader course root (default: exercises/)")
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.nbgrader_args = extra
    if args.command == "autograde":
        status = _autograde(args)
    elif args.command == "intake":
        run_intake(args.course_root, args.assignment)
        status = 0
    elif args.command == "report":
        print(report_text(_course_root(args.course_root) / "reports", args.assignment))
        status = 0
    elif args.command == "feedback":
        status = _feedback(args)
    elif args.command == "validate":
        status = _validate(args)
    else:
        _print_scores(args.course_root, args.assignments)
        status = 0
    if status:
        raise SystemExit(status)
