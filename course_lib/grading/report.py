"""The instructor report: one JSON file per student and problem set, written by every grading step.

``<report_dir>/<assignment>/<student>.json`` holds what intake refused or renamed
(:mod:`course_lib.grading.intake`), what the screen normalised and flagged
(:mod:`course_lib.grading.screen`), and per notebook the grader's verdict on each question with the
details students do not see, plus the budgets and limits a submission hit
(:mod:`course_lib.grading.execute`). :func:`report_text` prints it for a whole class.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_report", "report_text", "update_report"]


def _path(report_dir: str | os.PathLike, assignment: str, student: str) -> Path:
    return Path(report_dir, assignment, f"{student}.json")


def read_report(report_dir: str | os.PathLike, assignment: str, student: str) -> dict:
    """The report of ``student`` for ``assignment`` (empty if none was written)."""
    path = _path(report_dir, assignment, student)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def update_report(
    report_dir: str | os.PathLike,
    assignment: str,
    student: str,
    key: str,
    value: Any,
    *,
    notebook: str | None = None,
) -> dict:
    """Set ``key`` (under ``notebooks/<notebook>`` if given) in the report; returns the whole report."""
    report = read_report(report_dir, assignment, student)
    target = report.setdefault("notebooks", {}).setdefault(notebook, {}) if notebook else report
    target[key] = value
    path = _path(report_dir, assignment, student)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, sort_keys=True), encoding="utf-8")
    return report


def _student_lines(report: dict) -> list[str]:
    lines = []
    intake = report.get("intake", {})
    lines += [f"  intake: {line}" for line in intake.get("lines", [])]
    for notebook, found in sorted(report.get("notebooks", {}).items()):
        lines += [f"  {notebook}: normalised: {event}" for event in found.get("events", [])]
        lines += [f"  {notebook}: flagged: {flag}" for flag in found.get("flags", [])]
        lines += [f"  {notebook}: limit: {event}" for event in found.get("limits", [])]
        lines += [f"  {notebook}: kernel replaced: {why}" for why in found.get("replaced", [])]
        if found.get("limits") and found.get("peak_memory_mib"):
            lines.append(f"  {notebook}: the sandbox's memory peaked at {found['peak_memory_mib']:g} MiB")
        for grade_id, verdict in found.get("grader", {}).items():
            lines += [f"  {notebook}: {grade_id}: {note}" for note in verdict.get("notes", [])]
            if not verdict.get("passed"):
                detail = f" [{verdict['detail'].strip()[:300]}]" if verdict.get("detail") else ""
                lines.append(f"  {notebook}: {grade_id} failed: {verdict.get('reason')}{detail}")
    if report.get("held_for_review"):
        lines.append(
            "  HELD FOR REVIEW (scores kept; formgrader lists it as needing grading): "
            + "; ".join(report["held_for_review"])
        )
    return lines


def report_text(report_dir: str | os.PathLike, assignment: str) -> str:
    """The report of ``assignment`` as text: a block per student with anything to report.

    Students with nothing to report are listed on one line at the end.
    """
    folder = Path(report_dir, assignment)
    blocks, clean = [], []
    for path in sorted(folder.glob("*.json")):
        lines = _student_lines(read_report(report_dir, assignment, path.stem))
        if lines:
            blocks.append(f"{path.stem}\n" + "\n".join(lines))
        else:
            clean.append(path.stem)
    if not blocks and not clean:
        return f"no reports for {assignment} in {folder}"
    summary = f"nothing to report: {', '.join(clean)}" if clean else ""
    return "\n".join([f"Grading report for {assignment}", *blocks, summary]).strip()
