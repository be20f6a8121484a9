"""``python -m course_lib.grading``: sandboxed autograde, screen report, feedback and score tables.

Sub-commands (run from anywhere; ``--course-root`` defaults to the workbook's ``exercises/``):

``autograde PS [--student ID] [--force] [--sandbox auto|bwrap|unshare] [--unsafe]``
    Checks that a kernel sandbox works (``auto``: bubblewrap, else util-linux ``unshare``), refuses
    with the reason if none does (unless ``--unsafe``), runs ``nbgrader autograde PS`` with it, then
    prints the screen report and the scores.
``report PS``
    The pre-grading screen report: per student, every normalisation, flag and withheld score.
``feedback PS [--full]``
    ``nbgrader generate_feedback PS``: hidden tests as pass/fail only; ``--full`` writes the
    instructor's version with hidden tests into ``feedback_full/`` instead.
``validate NOTEBOOK [...]`` (for students)
    Runs each notebook and checks it as the autograder will: a check fails only if it raises
    (warnings and log messages do not count); exits 1 if any fails.
``scores [PS ...]`` (also the default: ``python -m course_lib.grading ps1``)
    Per-question score tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd

from course_lib.grading.gradebook import _course_root, question_scores, run_nbgrader, score_table
from course_lib.grading.sandbox import MECHANISMS, find_sandbox

__all__ = ["main", "screen_report"]

COMMANDS = ("autograde", "report", "feedback", "validate", "scores")
#: Exit status when autograde refuses to run without a sandbox.
EXIT_NO_SANDBOX = 3


def screen_report(course_root: str | os.PathLike | None, assignment: str) -> str:
    """The screen report of ``assignment`` as text: one block per student with anything to report.

    Reads ``<course_root>/reports/<assignment>/<student>.json`` (written while autograding).
    Students with nothing to report are listed on one line at the end.
    """
    folder = _course_root(course_root) / "reports" / assignment
    blocks, clean = [], []
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        lines = []
        for notebook, found in sorted(report.get("notebooks", {}).items()):
            lines += [f"  {notebook}: normalised: {event}" for event in found.get("events", [])]
            lines += [f"  {notebook}: FLAGGED: {flag}" for flag in found.get("flags", [])]
        for notebook, scores in sorted(report.get("withheld_scores", {}).items()):
            earned = ", ".join(f"{q} {s:g}" for q, s in scores.items())
            lines.append(f"  {notebook}: held at 0 pending review; the autograder's scores were: {earned}")
        if lines:
            blocks.append(f"{path.stem}\n" + "\n".join(lines))
        else:
            clean.append(path.stem)
    if not blocks and not clean:
        return f"no screen reports for {assignment} in {folder}"
    summary = f"nothing to report: {', '.join(clean)}" if clean else ""
    return "\n".join([f"Screen report for {assignment}", *blocks, summary]).strip()


def _autograde(args) -> int:
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
    nbgrader_args = ["autograde", args.assignment]
    if args.student:
        nbgrader_args.append(f"--student={args.student}")
    if args.force:
        nbgrader_args.append("--force")
    # The mechanism that passed the check (nbgrader's kernels would otherwise search again).
    nbgrader_args.append(f"--SandboxedKernelManager.sandbox={check.mechanism or 'none'}")
    done = run_nbgrader(*nbgrader_args, course_root=args.course_root, timeout_s=args.timeout_s)
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line or "There was an error" in line]
    print("\n".join(errors[-20:]) or "nbgrader autograde: no errors")
    print(screen_report(args.course_root, args.assignment))
    _print_scores(args.course_root, [args.assignment])
    return done.returncode


def _feedback(args) -> int:
    extra = ["--HideHiddenTests.enabled=False", "--CourseDirectory.feedback_directory=feedback_full"]
    done = run_nbgrader(
        "generate_feedback", args.assignment, *(extra if args.full else []), course_root=args.course_root
    )
    folder = "feedback_full" if args.full else "feedback"
    print(f"feedback in {Path(_course_root(args.course_root)) / folder} (exit {done.returncode})")
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    return done.returncode


def _validate(args) -> int:
    from course_lib.grading.validate import validate_notebook

    missing = [nb for nb in args.notebooks if not Path(nb).is_file()]
    if missing:
        print(f"validate: no such notebook: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    failed = 0
    for notebook in args.notebooks:
        print(f"== {notebook}", flush=True)
        failed += bool(validate_notebook(notebook, print_results=True))
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
    grade = commands.add_parser("autograde", help="sandboxed nbgrader autograde + screen report + scores")
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
    grade.add_argument("--timeout-s", type=float, default=3600.0, help="limit for the whole command, seconds")
    report = commands.add_parser("report", help="pre-grading screen report")
    report.add_argument("assignment")
    feedback = commands.add_parser("feedback", help="feedback without hidden tests (--full: with them)")
    feedback.add_argument("assignment")
    feedback.add_argument("--full", action="store_true", help="instructor version into feedback_full/")
    check = commands.add_parser("validate", help="(students) check notebooks as the autograder will")
    check.add_argument("notebooks", nargs="+", help="the .ipynb files to check")
    scores = commands.add_parser("scores", help="per-question score tables")
    scores.add_argument("assignments", nargs="*", help="default: every assignment with submissions")
    for sub in (grade, report, feedback, scores):
        sub.add_argument("--course-root", default=None, help="nbgrader course root (default: exercises/)")
    args = parser.parse_args(argv)
    if args.command == "autograde":
        status = _autograde(args)
    elif args.command == "report":
        print(screen_report(args.course_root, args.assignment))
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
