"""``make course``: execute every lesson headless, save executed notebooks and HTML, print a table.

Usage: ``python -m course_lib.course_runner notebooks --out build/course --budget-s 90``; name lesson
files instead of (or beside) a folder to run only those
(``python -m course_lib.course_runner notebooks/06_load_testing.ipynb``, which ``make course
LESSONS=notebooks/06_load_testing.ipynb`` runs).

``python -m course_lib.course_runner --prepare`` builds what the lessons would otherwise build on their
first run (:func:`prepare_first_run`: the course model in ``build/models`` and Lesson 2's 1,000,000-customer
SQLite feature store in ``build/feature_store``), timed, so that no lesson's 90 s budget pays for them;
``make lab``, ``make course`` and the test targets call it first. It returns at once when both exist.

Each lesson runs in a fresh kernel from its own folder (as JupyterLab would). The table reports the
wall time of each lesson against the budget; going over budget is reported, not a failure. The exit
status is non-zero if any lesson raised an error or timed out.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from course_lib.core.files import atomic_write_text, course_workspace

__all__ = ["LessonResult", "lesson_paths", "main", "prepare_first_run", "run_lessons"]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes in a kernel's traceback
#: The checkout's nbconvert templates: ``config/nbconvert_templates`` of the course checkout at or above the
#: current working directory (``course_lib.core.files.course_workspace``).
_TEMPLATES = course_workspace() / "config" / "nbconvert_templates"
#: The HTML pages' template, as ``make html``'s: JupyterLab's ``lab`` plus each figure's alt text (the cell
#: metadata ``alt``, which ``lab`` drops); nbconvert's stock ``lab`` outside a checkout.
HTML_TEMPLATE: dict[str, object] = (
    {"template_name": "lab_alt", "extra_template_basedirs": [str(_TEMPLATES)]}
    if (_TEMPLATES / "lab_alt").is_dir()
    else {}
)


def _near(path: Path) -> str:
    """``"; did you mean 'notebooks/05_cpu_gpu_cost.ipynb'?"`` for the closest lesson beside ``path``, or ``""``."""
    folder = path.parent if path.parent.is_dir() else Path("notebooks")
    names = [str(p) for p in sorted(folder.glob("*.ipynb"))] if folder.is_dir() else []
    close = difflib.get_close_matches(str(path), names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class LessonResult:
    """Outcome of one lesson: name, seconds, status ("ok", "over budget", "error: ...")."""

    def __init__(self, name: str, seconds: float, status: str):
        self.name, self.seconds, self.status = name, seconds, status

    @property
    def failed(self) -> bool:
        return self.status.startswith("error")


def lesson_paths(paths: Path | Sequence[Path]) -> list[Path]:
    """The lesson notebooks named by ``paths``: a folder gives its ``*.ipynb`` (sorted), a file itself.

    Order is kept (a folder's lessons in name order at its place); a lesson named twice runs once.

    Raises
    ------
    FileNotFoundError
        For a path that does not exist.
    ValueError
        For a file that is not a ``.ipynb`` notebook.
    """
    found: list[Path] = []
    for path in [paths] if isinstance(paths, Path) else list(paths):
        if path.is_dir():
            found.extend(sorted(path.glob("*.ipynb")))
        elif not path.exists():
            raise FileNotFoundError(
                f"lesson path {str(path)!r} does not exist (name a folder or a .ipynb file){_near(path)}"
            )
        elif path.suffix != ".ipynb":
            raise ValueError(f"lesson path {str(path)!r} is not a notebook: name a folder or a .ipynb file")
        else:
            found.append(path)
    return list(dict.fromkeys(found))


def run_lessons(
    folder: Path | Sequence[Path],
    out: Path,
    *,
    budget_s: float = 90.0,
    cell_timeout_s: int = 300,
    kernel_name: str | None = None,
) -> list[LessonResult]:
    """Execute the lessons ``lesson_paths(folder)`` names, writing ``out/<name>.ipynb`` and ``.html``.

    ``folder`` is a folder of lessons, or a list of folders and ``.ipynb`` files. Raises as
    ``lesson_paths`` does.
    """
    # Jupyter's execution stack loads only to run lessons (``--prepare`` alone never needs it)
    import nbformat  # noqa: PLC0415 (heavy optional dependency)
    from nbclient import NotebookClient  # noqa: PLC0415 (heavy optional dependency)
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError  # noqa: PLC0415 (heavy optional dependency)
    from nbconvert import HTMLExporter  # noqa: PLC0415 (heavy optional dependency)

    lessons = lesson_paths(folder)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for path in lessons:
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(
            nb,
            timeout=cell_timeout_s,
            kernel_name=kernel_name or nb.metadata.get("kernelspec", {}).get("name", "python3"),
            resources={"metadata": {"path": str(path.parent.resolve())}},
        )
        start = time.perf_counter()
        try:
            client.execute()
            seconds = time.perf_counter() - start
            status = "ok" if seconds <= budget_s else f"over budget ({budget_s:g} s)"
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
            seconds = time.perf_counter() - start
            first = _ANSI.sub("", str(exc)).strip().splitlines()
            status = "error: " + (first[-1] if first else type(exc).__name__)[:120]
        nbformat.write(nb, out / path.name)
        body, _ = HTMLExporter(**HTML_TEMPLATE).from_notebook_node(nb)
        atomic_write_text(out / path.with_suffix(".html").name, body)
        results.append(LessonResult(path.stem, seconds, status))
        print(f"  ran {path.name}: {seconds:.1f} s, {status}", flush=True)
    return results


class FirstRunRow(TypedDict):
    """One artefact ``prepare_first_run`` checked or built."""

    what: str
    path: Path
    built: bool
    seconds: float
    bytes: int


def prepare_first_run() -> list[FirstRunRow]:
    """Build the course model and Lesson 2's feature store if they are missing; one row per artefact.

    Returns
    -------
    list of dict with ``what``, ``path`` (relative to the repository), ``built`` (False: it was there),
    ``seconds`` (wall time of this step) and ``bytes`` (its size on disk).
    """
    # the model and feature-store stack (pandas, scikit-learn, XGBoost) loads only to build them
    from course_lib.churn.data import DATA_DIR  # noqa: PLC0415 (heavy optional dependency)
    from course_lib.churn.model import load_or_train_churn_model, model_cache_key  # noqa: PLC0415 (heavy optional dependency)
    from course_lib.serving.feature_store import build_feature_store  # noqa: PLC0415 (heavy optional dependency)

    root = DATA_DIR.parent
    model_path = root / "build" / "models" / f"churn_model_{model_cache_key()}.pkl"
    existed = model_path.is_file()
    start = time.perf_counter()
    load_or_train_churn_model()
    rows: list[FirstRunRow] = [
        {
            "what": "course model (Lesson 1's XGBoost pipeline)",
            "path": model_path.relative_to(root),
            "built": not existed,
            "seconds": time.perf_counter() - start,
            "bytes": model_path.stat().st_size,
        }
    ]
    build = build_feature_store()
    rows.append(
        {
            "what": "feature store (1,000,000 customers, Lessons 2, 3, 6, 8 and 12)",
            "path": build.path.relative_to(root),
            "built": build.built,
            "seconds": build.seconds,
            "bytes": build.size_bytes,
        }
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "paths", type=Path, nargs="*", help="folders of lesson notebooks, or lesson .ipynb files"
    )
    parser.add_argument(
        "--prepare", action="store_true", help="first build the course model and the feature store if missing"
    )
    parser.add_argument("--out", type=Path, default=Path("build/course"))
    parser.add_argument("--budget-s", type=float, default=90.0, help="per-lesson budget in seconds")
    parser.add_argument("--cell-timeout-s", type=int, default=300)
    parser.add_argument("--kernel", default=None, help="kernel name (default: the notebook's own)")
    args = parser.parse_args(argv)
    if args.prepare:
        for row in prepare_first_run():
            done = f"built in {row['seconds']:.1f} s" if row["built"] else "already built"
            print(
                f"first run: {row['what']}: {done} ({row['path']}, {row['bytes'] / 1e6:.0f} MB)", flush=True
            )
        if not args.paths:
            return 0
    if not args.paths:
        parser.error("name a folder of lessons or lesson .ipynb files (or pass --prepare alone)")
    try:
        lessons = lesson_paths(args.paths)
    except (FileNotFoundError, ValueError) as exc:  # a make user never typed this command: no usage block
        parser.exit(2, f"course_runner: error: {exc}\n")
    results = run_lessons(
        lessons,
        args.out,
        budget_s=args.budget_s,
        cell_timeout_s=args.cell_timeout_s,
        kernel_name=args.kernel,
    )
    if not results:
        print(f"no lessons (*.ipynb) found in {' '.join(map(str, args.paths))}", file=sys.stderr)
        return 1
    width = max(len(r.name) for r in results)
    print(f"\n{'lesson':<{width}} | {'seconds':>7} | status")
    print(f"{'-' * width}-+-{'-' * 7}-+-{'-' * 20}")
    for r in results:
        print(f"{r.name:<{width}} | {r.seconds:7.1f} | {r.status}")
    total = sum(r.seconds for r in results)
    noun = "lesson" if len(results) == 1 else "lessons"
    print(f"\n{len(results)} {noun}, {total:.1f} s in all; executed copies and HTML in {args.out}/")
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
