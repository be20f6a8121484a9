"""Pre-grading screen: normalise grade-cell metadata a student's editing broke, flag kernel-level code.

:class:`ScreenSubmission` runs in nbgrader's sanitize step, before ``DeduplicateIds`` (which empties
the metadata of all copies but the last without a word) and ``OverwriteCells`` (which fails
with ``KeyError: 'grade_id'`` on duplicated or stray grade metadata, jupyter/nbgrader#1083, and then
the student is not graded at all). For each submitted notebook it

* drops nbgrader metadata without a ``grade_id`` or whose ``grade_id`` is not in the assignment (a
  student's own "bonus" test cell); the cell stays and runs as an ordinary cell;
* keeps the metadata on one copy of a duplicated or split cell (the last copy of an answer cell, the
  first copy of anything else) and drops it from the others, which also still run;
* drops any ``course_grading`` result metadata a student may have planted;
* flags, for manual review, code that uses kernel or process internals the problem sets never need
  (:data:`FLAGGED_NAMES`, :data:`FLAGGED_ATTRIBUTES`, :data:`FLAGGED_MODULES`, writes to computed or
  out-of-folder paths).

Every event and flag is recorded in the notebook's metadata (for :class:`~course_lib.grading.execute.
ErrorOnlyGrades`) and in the instructor report ``<report_dir>/<assignment>/<student>.json``.
"""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import List, Unicode

from course_lib.grading.execute import RESULT_KEY, SCREEN_KEY

__all__ = ["FLAGGED_ATTRIBUTES", "FLAGGED_MODULES", "FLAGGED_NAMES", "ScreenSubmission", "scan_source"]

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
    "IPython": "reaches into IPython",
    "ipykernel": "reaches into the kernel",
    "gc": "walks the interpreter's objects (gc)",
}
_WRITE_MODE = re.compile(r"[wax+]")
_WRITE_METHODS = {"write_text", "write_bytes", "unlink", "rmdir", "rename", "replace", "touch", "symlink_to"}


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
    if isinstance(func, ast.Attribute) and func.attr in _WRITE_METHODS:
        target = func.value
        if isinstance(target, ast.Call) and target.args and _literal_inside_folder(target.args[0]):
            return None
        return f"writes or removes a file at a computed path (.{func.attr})"
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in ("os", "shutil")
    ) and func.attr in ("remove", "unlink", "rename", "replace", "rmdir", "removedirs", "rmtree", "move"):
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
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FLAGGED_NAMES:
            found.append(FLAGGED_NAMES[node.id])
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            why = FLAGGED_ATTRIBUTES.get((owner, node.attr)) or FLAGGED_ATTRIBUTES.get((None, node.attr))
            if why:
                found.append(why)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else None
            names = [alias.name for alias in node.names] if module is None else [module]
            for name in names:
                if name.split(".")[0] in modules:
                    found.append(modules[name.split(".")[0]])
            for alias in node.names if module is not None else []:
                why = FLAGGED_ATTRIBUTES.get((module, alias.name)) or FLAGGED_ATTRIBUTES.get(
                    (None, alias.name)
                )
                if why:
                    found.append(why)
        elif isinstance(node, ast.Call) and (why := _write_flag(node)):
            found.append(why)
    return list(dict.fromkeys(found))


class ScreenSubmission(NbGraderPreprocessor):
    """Sanitize-step preprocessor: normalise grade metadata and flag kernel-level code (see module)."""

    report_dir = Unicode("", help="folder for <assignment>/<student>.json reports (default ./reports)").tag(
        config=True
    )
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

    def preprocess(self, nb, resources):
        known = self._known_ids(resources)
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
        flags = []
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                reasons = scan_source(cell.source, tuple(self.allowed_modules))
                flags += [f"cell {index + 1}: {why}" for why in reasons]
        nb.metadata[SCREEN_KEY] = {"events": events, "flags": flags}
        info = resources["nbgrader"]
        path = Path(self.report_dir or "reports", info["assignment"], f"{info['student']}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        report = json.loads(path.read_text()) if path.is_file() else {}
        report.setdefault("notebooks", {})[info["notebook"]] = {"events": events, "flags": flags}
        report.get("withheld_scores", {}).pop(info["notebook"], None)
        path.write_text(json.dumps(report, indent=1, sort_keys=True))
        for line in events + flags:
            self.log.warning("screen %s/%s: %s", info["student"], info["notebook"], line)
        return nb, resources
