"""Submission intake: what of a student's hand-in reaches nbgrader, checked before anything parses it.

nbgrader's autograde copies every file of ``submitted/<student>/<ps>/`` into ``autograded/`` (and
feedback copies them on), following symbolic links with the grader's rights, and reads each notebook
whole, however large. :func:`intake` stands in front of it: for each student it writes a clean copy
``intake/<student>/<ps>/`` that holds only

* each of the assignment's notebooks, found as a **regular file** (not a link), no larger than
  ``max_notebook_bytes`` (checked before reading), decoded as UTF-8 with or without a byte-order mark,
  and parsed as a notebook. A notebook saved under another name that starts with the assignment
  notebook's name (``ps1 (1).ipynb``, ``PS1-Copy1.ipynb``) is taken as that notebook, with a report line;
* nbgrader's ``timestamp.txt`` (a small regular file).

Everything else (links, folders, ``.py`` files, data) is **refused**: reported, never copied. A
notebook that is too large or unreadable is not graded: the submission is recorded with no score
(0 in ``grades.csv``, needing manual grading) and reported. ``python -m course_lib.grading autograde``
runs intake, then nbgrader with ``--CourseDirectory.submitted_directory=intake``;
:class:`IntakeOnlyExporter` makes plain ``nbgrader autograde`` (and formgrader's Autograde button)
refuse to read ``submitted/`` directly.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbconvert.exporters import NotebookExporter

from course_lib.grading.report import update_report

__all__ = ["INTAKE_DIR", "IntakeOnlyExporter", "StudentIntake", "intake"]

#: Folder of the course root that holds what intake let through (git-ignored, rebuilt every run).
INTAKE_DIR = "intake"
_TIMESTAMP = "timestamp.txt"
_TIMESTAMP_MAX_BYTES = 1024
MIB = 1024**2


@dataclass
class StudentIntake:
    """What intake did with one student's hand-in of one assignment."""

    student: str
    accepted: dict[str, str] = field(default_factory=dict)  # notebook name -> file it came from
    unreadable: dict[str, str] = field(default_factory=dict)  # notebook name -> why
    refused: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a file"
    return "not a regular file"


def _matches(filename: str, notebook: str) -> bool:
    """``ps1 (1).ipynb`` and ``PS1-Copy1.ipynb`` match ``ps1``; ``ps10.ipynb`` and ``ps1.py`` do not."""
    stem = filename[: -len(".ipynb")] if filename.lower().endswith(".ipynb") else None
    if stem is None or not stem.lower().startswith(notebook.lower()):
        return False
    rest = stem[len(notebook) :]
    return rest == "" or not re.match(r"[A-Za-z0-9]", rest)


def _read_notebook(path: Path, max_bytes: int) -> tuple[str | None, str]:
    """(the notebook's text, "" or a note) or (None, why not), reading at most ``max_bytes`` + 1 bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        return None, f"could not be opened ({error.strerror})"
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None, "is not a regular file"
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        return None, f"is larger than the {max_bytes / MIB:g} MiB a notebook may be"
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        return None, f"is not UTF-8 text (byte {error.start})"
    try:
        nbformat.reads(text, as_version=4)
    except Exception as error:
        return None, f"is not a readable notebook ({type(error).__name__}: {str(error)[:120]})"
    return text, "starts with a UTF-8 byte-order mark: read without it" if raw.startswith(
        b"\xef\xbb\xbf"
    ) else ""


def _student(folder: Path, notebooks: list[str], dest: Path, max_bytes: int, name: str) -> StudentIntake:
    result = StudentIntake(name)
    entries = {entry.name: entry for entry in os.scandir(folder)}
    candidates: dict[str, list[str]] = {nb: [] for nb in notebooks}
    for filename, entry in sorted(entries.items()):
        mode = entry.stat(follow_symlinks=False).st_mode
        if filename == _TIMESTAMP and stat.S_ISREG(mode) and entry.stat().st_size <= _TIMESTAMP_MAX_BYTES:
            continue
        owner = next((nb for nb in notebooks if _matches(filename, nb)), None)
        if owner is not None and stat.S_ISREG(mode):
            candidates[owner].append(filename)
            continue
        why = (
            "only the notebook is graded"
            if stat.S_ISREG(mode)
            else "only the notebook, a regular file, is read"
        )
        result.refused.append(filename)
        result.lines.append(f"refused {filename!r}: {_kind(mode)}; {why} (not copied)")
    dest.mkdir(parents=True, exist_ok=True)
    for notebook, found in candidates.items():
        exact = f"{notebook}.ipynb"
        if not found:
            result.lines.append(f"no {exact} handed in")
            continue
        chosen = exact if exact in found else max(found, key=lambda f: (entries[f].stat().st_mtime, f))
        for other in found:
            if other != chosen:
                result.refused.append(other)
                result.lines.append(f"refused {other!r}: another copy of {exact}; {chosen!r} is graded")
        if chosen != exact:
            result.lines.append(f"{chosen!r} taken as {exact} (renamed)")
        text, why = _read_notebook(folder / chosen, max_bytes)
        if text is None:
            result.unreadable[notebook] = f"{chosen} {why}"
            result.lines.append(f"not graded: {chosen!r} {why}")
            continue
        if why:
            result.lines.append(f"{chosen!r} {why}")
        (dest / exact).write_text(text, encoding="utf-8")
        result.accepted[notebook] = chosen
    if _TIMESTAMP in entries and _TIMESTAMP not in result.refused:
        shutil.copyfile(folder / _TIMESTAMP, dest / _TIMESTAMP, follow_symlinks=False)
    return result


def _record_unreadable(db_url: str, assignment: str, student: str, notebooks: list[str]) -> None:
    """Give an unreadable notebook a submission with no score (so it shows in grades.csv and formgrader)."""
    from nbgrader.api import Gradebook  # noqa: PLC0415 (heavy optional dependency: nbgrader)

    with Gradebook(db_url) as gradebook:
        gradebook.update_or_create_student(student)
        submission = gradebook.update_or_create_submission(assignment, student)
        for notebook in submission.notebooks:
            if notebook.name in notebooks:
                for grade in notebook.grades:
                    grade.auto_score, grade.needs_manual_grade = None, True
        gradebook.db.commit()


def intake(
    course_root: str | os.PathLike,
    assignment: str,
    notebooks: list[str],
    *,
    max_notebook_bytes: int = 16 * MIB,
    report_dir: str | os.PathLike | None = None,
    db_url: str | None = None,
    student: str | None = None,
) -> list[StudentIntake]:
    """Check every hand-in of ``assignment`` and write the clean copies under ``intake/``.

    Parameters
    ----------
    course_root : path-like
        The nbgrader course root (holding ``submitted/``).
    assignment : str
        The problem set (``"ps1"``).
    notebooks : list of str
        The assignment's notebook names, without ``.ipynb``.
    max_notebook_bytes : int
        Largest notebook read, bytes (larger ones are refused before reading).
    report_dir : path-like, optional
        Where reports go (default ``<course_root>/reports``).
    db_url : str, optional
        The gradebook; given, an unreadable notebook gets a submission with no score.
    student : str, optional
        Only this student.

    Returns
    -------
    list of StudentIntake, one per student folder, sorted by student id.
    """
    root = Path(course_root)
    reports = Path(report_dir) if report_dir is not None else root / "reports"
    results = []
    submitted = root / "submitted"
    for entry in sorted(os.scandir(submitted), key=lambda e: e.name) if submitted.is_dir() else []:
        if student is not None and entry.name != student:
            continue
        dest = root / INTAKE_DIR / entry.name / assignment
        shutil.rmtree(dest, ignore_errors=True)
        folder = Path(entry.path) / assignment
        if not entry.is_dir(follow_symlinks=False):
            result = StudentIntake(entry.name, refused=[entry.name])
            result.lines.append(
                f"refused: submitted/{entry.name} is {_kind(entry.stat(follow_symlinks=False).st_mode)}"
            )
        elif not os.path.lexists(folder):
            continue
        elif not folder.is_dir() or folder.is_symlink():
            result = StudentIntake(entry.name, refused=[assignment])
            result.lines.append(f"refused: {assignment} is {_kind(os.lstat(folder).st_mode)}, not a folder")
        else:
            result = _student(folder, notebooks, dest, max_notebook_bytes, entry.name)
        if not result.accepted:
            shutil.rmtree(dest, ignore_errors=True)
            with contextlib.suppress(OSError):
                dest.parent.rmdir()
        if result.unreadable and db_url is not None:
            _record_unreadable(db_url, assignment, entry.name, list(result.unreadable))
        summary = {"lines": result.lines, "refused": result.refused, "unreadable": result.unreadable}
        update_report(reports, assignment, entry.name, "intake", summary)
        results.append(result)
    return results


class IntakeOnlyExporter(NotebookExporter):
    """nbgrader's notebook exporter that, in autograde's first (sanitize) step, reads only ``intake/``.

    Set as ``c.Autograde.exporter_class``: plain ``nbgrader autograde`` on ``submitted/`` then fails
    for each student with a message that says to run ``python -m course_lib.grading autograde``.
    """

    def from_filename(self, filename, resources=None, **kw):
        converter = self.parent
        if getattr(converter, "_sanitizing", False):
            folder = getattr(getattr(converter, "coursedir", None), "submitted_directory", INTAKE_DIR)
            if folder != INTAKE_DIR:
                raise RuntimeError(
                    f"refusing to read {filename} before intake: grade with `python -m course_lib.grading "
                    "autograde <ps>`, which checks each hand-in (links, size, encoding, extra files) first"
                )
        return super().from_filename(filename, resources, **kw)
