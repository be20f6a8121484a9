"""Pre-grading screen: restore deleted locked cells, normalise grade metadata, report kernel-level code.

:class:`ScreenSubmission` runs in nbgrader's sanitize step, before ``DeduplicateIds`` (which empties
the metadata of all copies but the last without a word) and ``OverwriteCells`` (which fails
with ``KeyError: 'grade_id'`` on duplicated or stray grade metadata, jupyter/nbgrader#1083, and with
``KeyError`` on an answer cell deleted with its test cell). For each submitted notebook it

* drops nbgrader metadata without a ``grade_id`` or whose ``grade_id`` is not in the assignment (a
  student's own "bonus" test cell); the cell stays and runs as an ordinary cell;
* keeps the metadata on one copy of a duplicated or split cell (the last copy of an answer cell, the
  first copy of anything else) and drops it from the others, which also still run;
* puts back every cell of the student version (``<release_dir>/<assignment>/<notebook>.ipynb``) whose
  ``grade_id`` is missing: locked cells as released (the setup, the instructions, the visible
  checks), a deleted answer cell as its empty stub, which costs that question only. Each goes after
  the nearest earlier cell that is still there;
* drops any ``course_grading`` metadata a student may have planted;
* reports code that uses kernel or process internals the problem sets never need
  (:data:`FLAGGED_NAMES`, :data:`FLAGGED_ATTRIBUTES`, :data:`FLAGGED_MODULES`, writes to computed or
  out-of-folder paths). Grades no longer depend on it (the grader's checks run outside the kernel):
  a flagged submission keeps its scores and is **held for review** (marked as needing manual
  grading, with a line on its feedback), as is one from which intake refused files.

Every event and flag is recorded in the notebook's metadata (for
:class:`~course_lib.grading.execute.GraderScores` and the feedback) and in the instructor report
(:mod:`course_lib.grading.report`).
"""

from __future__ import annotations

import ast
import copy
import re
from collections import defaultdict
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import List, Unicode

from course_lib.grading.execute import RESULT_KEY, SCREEN_KEY
from course_lib.grading.report import read_report, update_report

__all__ = [
    "FLAGGED_ATTRIBUTES",
    "FLAGGED_MODULES",
    "FLAGGED_NAMES",
    "ScreenSubmission",
    "restore_missing_cells",
    "scan_source",
]

#: Names whose use holds a submission for review.
FLAGGED_NAMES = {
    "get_ipython": "reaches into the IPython kernel (get_ipython)",
    "__import__": "imports a module by computed name (__import__)",
    "__builtins__": "modifies builtins (__builtins__)",
}
#: (object, attribute) pairs; object None means any object.
FLAGGED_ATTRIBUTES = {
    (None, "events"): "registers IPython event hooks (events)",
    (None, "ast_transformers"): "installs an IPython AST transformer",
    (None, "input_transformers_post"): "installs an IPython input transformer",
    (None, "input_transformers_cleanup"): "installs an IPython input transformer",
    (None, "displayhook"): "replaces or calls the display hook",
    (None, "excepthook"): "replaces the exception hook",
    (None, "showtraceback"): "replaces IPython's traceback display",
    (None, "settrace"): "installs a trace function (settrace)",
    (None, "setprofile"): "installs a profile function (setprofile)",
    (None, "_getframe"): "inspects the caller's frame (sys._getframe)",
    (None, "currentframe"): "inspects the caller's frame (inspect.currentframe)",
    (None, "f_back"): "inspects the caller's frame (f_back)",
    ("inspect", "stack"): "inspects the call stack (inspect.stack)",
    ("inspect", "getouterframes"): "inspects the call stack (inspect.getouterframes)",
    ("os", "_exit"): "exits the interpreter (os._exit)",
    ("os", "system"): "runs a shell command (os.system)",
    ("os", "popen"): "runs a shell command (os.popen)",
    ("os", "fork"): "forks a process (os.fork)",
    ("os", "setsid"): "detaches a process (os.setsid)",
    ("sys", "modules"): "reaches into loaded modules (sys.modules)",
    (None, "get_ipython"): "reaches into the IPython kernel (get_ipython)",
}
#: Modules whose import holds a submission for review.
FLAGGED_MODULES = {
    "subprocess": "starts processes (subprocess)",
    "multiprocessing": "starts processes (multiprocessing)",
    "sqlite3": "opens databases (sqlite3)",
    "site": "reads or changes site-packages (site)",
    "ctypes": "calls C code directly (ctypes)",
    "socket": "opens network connections (socket)",
    "importlib": "imports modules by computed name (importlib)",
    "builtins": "modifies builtins (builtins)",
    "ipykernel": "reaches into the kernel",
    "jupyter_client": "reaches into the kernel's messaging (jupyter_client)",
    "gc": "walks the interpreter's objects (gc)",
}
#: The grader's package: no question needs it (a notebook that imports it can patch what answers the grader).
GRADER_PACKAGE = "course_lib.grading"
#: IPython modules a notebook may import (displaying results is ordinary); the rest of IPython is flagged.
ALLOWED_IPYTHON = ("IPython.display", "IPython.core.display")
_WRITE_MODE = re.compile(r"[wax+]")
#: Methods only path objects have: a write, move or removal wherever they are called.
_PATH_METHODS = {"write_text", "write_bytes", "unlink", "rmdir", "touch", "symlink_to", "hardlink_to"}
#: Methods that also exist on strings and DataFrames: flagged only on ``os``/``shutil`` or a ``Path(...)``.
_MOVE_METHODS = {"rename", "replace"}


def _literal_inside_folder(node) -> bool:
    """A string literal naming a relative path that stays in the notebook's folder."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    return not node.value.startswith(("/", "~")) and ".." not in Path(node.value).parts


def _write_flag(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name) and func.id == "open" and node.args:
        mode = (
            node.args[1]
            if len(node.args) > 1
            else next((k.value for k in node.keywords if k.arg == "mode"), None)
        )
        writes = mode is not None and not (
            isinstance(mode, ast.Constant)
            and isinstance(mode.value, str)
            and not _WRITE_MODE.search(mode.value)
        )
        if writes and not _literal_inside_folder(node.args[0]):
            return "writes a file outside its folder or at a computed path (open)"
    if isinstance(func, ast.Attribute) and (func.attr in _PATH_METHODS or func.attr in _MOVE_METHODS):
        target = func.value
        names = ("os", "shutil") if func.attr in _MOVE_METHODS else ()
        if isinstance(target, ast.Name) and target.id in names:
            return f"removes or moves files ({target.id}.{func.attr})"
        is_path = isinstance(target, ast.Call) and (
            (isinstance(target.func, ast.Name) and target.func.id in ("Path", "PurePath"))
            or (isinstance(target.func, ast.Attribute) and target.func.attr in ("Path", "PurePath"))
        )
        if func.attr in _MOVE_METHODS and not is_path:
            return None  # str.replace, DataFrame.rename(columns=...)
        if (
            is_path
            and isinstance(target, ast.Call)
            and target.args
            and _literal_inside_folder(target.args[0])
        ):
            return None
        return f"writes or removes a file at a computed path (.{func.attr})"
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in ("os", "shutil")
    ) and func.attr in ("remove", "unlink", "rmdir", "removedirs", "rmtree", "move"):
        return f"removes or moves files ({func.value.id}.{func.attr})"
    return None


def scan_source(source: str, allowed_modules: tuple[str, ...] = ()) -> list[str]:
    """Reasons to review one cell's code, in order of appearance, without repeats.

    Cells that are not valid Python (IPython magics aside) are scanned as text for the same names.
    ``allowed_modules`` are top-level module names an assignment needs (e.g. ``"socket"``): not flagged.
    """
    modules = {name: why for name, why in FLAGGED_MODULES.items() if name not in allowed_modules}
    lines = [line if not line.lstrip().startswith(("%", "!")) else "" for line in source.split("\n")]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", source))
        found = [why for name, why in FLAGGED_NAMES.items() if name in words]
        found += [why for (_, attr), why in FLAGGED_ATTRIBUTES.items() if attr in words]
        found += [why for module, why in modules.items() if module in words]
        return list(dict.fromkeys(found)) or ["is not valid Python: could not be screened"]
    found = []
    aliases = {  # import os as _os: _os.fork is os.fork
        alias.asname: alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.asname
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FLAGGED_NAMES:
            found.append(FLAGGED_NAMES[node.id])
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            owner = aliases.get(owner, owner) if owner is not None else None
            why = FLAGGED_ATTRIBUTES.get((owner, node.attr)) or FLAGGED_ATTRIBUTES.get((None, node.attr))
            if why:
                found.append(why)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else None
            names = [alias.name for alias in node.names] if module is None else [module]
            for name in names:
                if name == GRADER_PACKAGE or name.startswith(GRADER_PACKAGE + "."):
                    found.append("imports the grader's own code (course_lib.grading)")
                elif name.split(".")[0] in modules:
                    found.append(modules[name.split(".")[0]])
                elif name.split(".")[0] == "IPython" and not name.startswith(ALLOWED_IPYTHON):
                    found.append("reaches into IPython")
            for alias in node.names if module is not None else []:
                why = FLAGGED_ATTRIBUTES.get((module, alias.name)) or FLAGGED_ATTRIBUTES.get(
                    (None, alias.name)
                )
                if why:
                    found.append(why)
        elif isinstance(node, ast.Call) and (why := _write_flag(node)):
            found.append(why)
    return list(dict.fromkeys(found))


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def restore_missing_cells(nb, release) -> list[str]:
    """Put back into ``nb`` every cell of ``release`` whose ``grade_id`` is missing; what was put back.

    Each restored cell goes after the nearest earlier release cell that ``nb`` still has (first if
    none): locked cells as released, answer cells as their stubs.
    """
    present = {_grade_id(cell): index for index, cell in enumerate(nb.cells) if _grade_id(cell)}
    restored, after = [], -1
    for cell in release.cells:
        grade_id = _grade_id(cell)
        if grade_id is None:
            continue
        if grade_id in present:
            after = nb.cells.index(next(c for c in nb.cells if _grade_id(c) == grade_id))
            continue
        nb.cells.insert(after + 1, copy.deepcopy(cell))
        after += 1
        kind = "answer stub" if cell.metadata["nbgrader"].get("solution") else "locked cell"
        restored.append(f"{grade_id!r} was missing: the released {kind} was put back (cell {after + 1})")
    return restored


class ScreenSubmission(NbGraderPreprocessor):
    """Sanitize-step preprocessor: restore, normalise and report (see the module)."""

    report_dir = Unicode("", help="folder for <assignment>/<student>.json reports (default ./reports)").tag(
        config=True
    )
    release_dir = Unicode("", help="folder of the student versions (default ./release)").tag(config=True)
    allowed_modules = List(
        Unicode(), default_value=[], help="modules an assignment needs, not flagged (e.g. ['socket'])"
    ).tag(config=True)

    def _known_ids(self, resources) -> set[str]:
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gradebook:
            try:
                notebook = gradebook.find_notebook(info["notebook"], info["assignment"])
            except MissingEntry:
                return set()
            return {cell.name for cell in notebook.source_cells}

    def _normalise(self, nb, known: set[str]) -> list[str]:
        events: list[str] = []
        copies: dict[str, list[int]] = defaultdict(list)
        for index, cell in enumerate(nb.cells):
            cell.metadata.pop(RESULT_KEY, None)
            meta = cell.metadata.get("nbgrader")
            if meta is None:
                continue
            grade_id = meta.get("grade_id")
            if grade_id is None or grade_id not in known:
                del cell.metadata["nbgrader"]
                what = (
                    "has no grade_id"
                    if grade_id is None
                    else f"{grade_id!r} is not a cell of this assignment"
                )
                events.append(
                    f"cell {index + 1}: grade metadata {what}; dropped (the cell still runs, ungraded)"
                )
            else:
                copies[grade_id].append(index)
        for grade_id, indices in copies.items():
            if len(indices) == 1:
                continue
            answer = nb.cells[indices[0]].metadata["nbgrader"].get("solution", False)
            keep = indices[-1] if answer else indices[0]
            for index in indices:
                if index != keep:
                    del nb.cells[index].metadata["nbgrader"]
            events.append(
                f"{grade_id!r} appears in {len(indices)} cells ({', '.join(str(i + 1) for i in indices)}: "
                f"duplicated or split); cell {keep + 1} keeps the grade metadata, all still run"
            )
        return events

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        events = self._normalise(nb, self._known_ids(resources))
        release = Path(self.release_dir or "release", info["assignment"], f"{info['notebook']}.ipynb")
        if release.is_file():
            events += restore_missing_cells(nb, nbformat.read(release, as_version=4))
        flags = []
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                reasons = scan_source(cell.source, tuple(self.allowed_modules))
                flags += [f"cell {index + 1}: {why}" for why in reasons]
        folder = self.report_dir or "reports"
        refused = (
            read_report(folder, info["assignment"], info["student"]).get("intake", {}).get("refused", [])
        )
        held = (["the screen flagged its code"] if flags else []) + (
            [f"intake refused {len(refused)} file(s) handed in with it"] if refused else []
        )
        nb.metadata[SCREEN_KEY] = {"events": events, "flags": flags, "held_for_review": held}
        update_report(
            folder, info["assignment"], info["student"], "events", events, notebook=info["notebook"]
        )
        update_report(folder, info["assignment"], info["student"], "flags", flags, notebook=info["notebook"])
        update_report(folder, info["assignment"], info["student"], "held_for_review", held)
        for line in events + flags:
            self.log.warning("screen %s/%s: %s", info["student"], info["notebook"], line)
        return nb, resources
