"""nbgrader preprocessors that execute a submission safely and grade its test cells from errors only.

:class:`GuardedExecute` replaces nbgrader's ``Execute`` in ``Autograde.autograde_preprocessors``:

* kernels start in the sandbox of :class:`~course_lib.grading.sandbox.SandboxedKernelManager`;
* before each test cell the kernel-side guard (:mod:`course_lib.grading.guard`) clears hooks that
  student code installed, and each test cell runs in two parts, the visible checks then the hidden
  ones, so the result of each part is known and the feedback can show the first without the second;
* a cell that outlives the per-cell timeout and ignores the interrupt, or kills its kernel, gets an
  error output; the kernel is replaced, the earlier non-test cells are replayed silently, and
  grading goes on: the bad cell costs its own questions only.

The result of each test cell is written to its metadata under ``course_grading``
(``{"visible": "passed"|"failed", "hidden": "passed"|"failed"|"not run", "passed": bool}``).
:class:`ErrorOnlyGrades` replaces ``SaveAutoGrades``: a test cell scores its points when both parts
ran without error and 0 otherwise. nbgrader's own rule also reads a test cell's first
``execute_result`` as partial credit (any non-number meaning full marks) and any stderr as failure;
neither applies here, so a stray displayed value grants nothing and a warning costs nothing. A
submission the screen flagged is recorded as 0 needing manual grading, with the score it would have
had in the instructor report.

References
----------
nbgrader 0.9 ``nbgrader.preprocessors.Execute``/``SaveAutoGrades`` and ``utils.determine_grade``;
nbclient ``NotebookClient.async_execute_cell`` (timeouts, ``DeadKernelError``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from queue import Empty

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import Execute, SaveAutoGrades
from traitlets import Integer, Unicode

from course_lib.grading import guard
from course_lib.grading.sandbox import SandboxedKernelManager

__all__ = ["RESULT_KEY", "ErrorOnlyGrades", "GuardedExecute", "split_hidden_tests"]

#: Cell metadata key holding a test cell's result (the screen strips it from submissions).
RESULT_KEY = "course_grading"
#: Notebook metadata key holding the screen's findings (set by :mod:`course_lib.grading.screen`).
SCREEN_KEY = "course_grading_screen"
HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"


def split_hidden_tests(source: str) -> tuple[str, str]:
    """Split a test cell into (visible checks, hidden checks); lines after the hidden block go last."""
    visible, hidden, after, where = [], [], [], "visible"
    for line in source.split("\n"):
        if HIDDEN_BEGIN in line:
            where = "hidden"
        elif HIDDEN_END in line:
            where = "after"
        else:
            {"visible": visible, "hidden": hidden, "after": after}[where].append(line)
    return "\n".join(visible).strip("\n"), "\n".join(hidden + after).strip("\n")


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _is_test_cell(cell) -> bool:
    return cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell)


class GuardedExecute(Execute):
    """nbgrader's ``Execute`` with a sandboxed kernel, guarded test cells and kernel replacement."""

    max_kernel_restarts = Integer(5, help="kernel replacements per notebook before the rest fails").tag(
        config=True
    )
    guard_timeout_s = Integer(30, help="seconds the guard may take (it imports numpy at kernel start)").tag(
        config=True
    )

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources=None, km=None):
        self._replay: list[int] = []
        self._restarts = 0
        self._last_reply = None
        return super().preprocess(nb, resources, km)

    # --- kernel life -----------------------------------------------------------------------------

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        reply = await self._async_silent(guard.install_code(), self.guard_timeout_s)
        if reply is None or reply["content"]["status"] != "ok":
            raise RuntimeError(f"the grading guard could not be installed: {reply and reply['content']}")
        return kc

    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    async def _async_silent(self, code: str, timeout_s: float) -> dict | None:
        """Run ``code`` silently; its execute reply, or None if none came within ``timeout_s``."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (remaining := deadline - loop.time()) > 0:
            try:
                msg = await self.kc.shell_channel.get_msg(timeout=remaining)
            except Empty:
                break
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg
        return None

    _silent = run_sync(_async_silent)

    def _replace_kernel(self, why: str) -> None:
        """Kill the kernel, start a fresh one, replay the non-test cells that ran well so far."""
        self._restarts += 1
        self.log.warning("Replacing the kernel (%s); replacement %d", why, self._restarts)
        shutdown, self.shutdown_kernel = self.shutdown_kernel, "immediate"
        try:
            self._cleanup_kernel()
        finally:
            self.shutdown_kernel = shutdown
        self.km = self.create_kernel_manager()
        self.start_new_kernel()
        self.start_new_kernel_client()
        for index in list(self._replay):
            reply = self._silent(self.nb.cells[index].source, self._get_timeout(None) or 60)
            if reply is None:  # the replayed cell hangs now: drop it and start again without it
                self._replay.remove(index)
                self._replace_kernel(f"cell {index} hung when replayed")
                return

    # --- cells -----------------------------------------------------------------------------------

    def on_cell_executed(self, **kwargs):
        self._last_reply = kwargs["execute_reply"]
        super().on_cell_executed(**kwargs)

    def _run(self, cell, index: int) -> tuple[bool, bool]:
        """Execute one cell (outputs into ``cell``): (ran without error, kernel had to be replaced)."""
        self._last_reply = None
        try:
            self.execute_cell(cell, index, store_history=True)
        except (CellTimeoutError, DeadKernelError) as error:
            if isinstance(error, DeadKernelError):
                note = "the kernel died while running this cell (killed, out of memory or os._exit)"
            else:
                note = f"no answer {self.iopub_timeout} s after the interrupt: the cell ignored it"
            cell.setdefault("outputs", []).append(_error_output(type(error).__name__, note))
            self.nb.cells[index] = cell
            if self._restarts >= self.max_kernel_restarts:
                raise RuntimeError(f"more than {self.max_kernel_restarts} kernel replacements") from error
            self._replace_kernel(note)
            return False, True
        ok = self._last_reply is not None and self._last_reply["content"]["status"] == "ok"
        return ok and not any(out.output_type == "error" for out in cell.get("outputs", [])), False

    def _run_part(self, cell, index: int, source: str) -> tuple[bool, list]:
        """Run ``source`` as if it were ``cell`` after the guard; (ran without error, outputs)."""
        reply = self._silent(guard.restore_code(), self.guard_timeout_s)
        if reply is None:  # a hook that hangs the kernel before any code runs
            self._replace_kernel("the guard got no answer")
        if reply is None or reply["content"]["status"] != "ok":
            return False, [_error_output("GradingGuardError", "the kernel's state was tampered with")]
        part = NotebookNode({**cell, "source": source, "outputs": [], "metadata": cell.metadata})
        ok, _ = self._run(part, index)
        self.nb.cells[index] = cell
        return ok, list(part.get("outputs", []))

    def preprocess_cell(self, cell, resources, index):
        self._check_assign_resources(resources)
        if cell.cell_type != "code" or not cell.source.strip():
            return cell, self.resources
        if not _is_test_cell(cell):
            _, replaced = self._run(cell, index)
            timed_out = any(out.get("ename") == "CellTimeoutError" for out in cell.get("outputs", []))
            if not (replaced or timed_out):  # replayed after a kernel replacement, errors and all
                self._replay.append(index)
            return cell, self.resources
        visible, hidden = split_hidden_tests(cell.source)
        result = {"visible": "not run", "hidden": "not run", "passed": False, "n_visible_outputs": 0}
        outputs: list = []
        if visible.strip():
            ok, outputs = self._run_part(cell, index, visible)
            result["visible"] = "passed" if ok else "failed"
        else:
            ok = True
        result["n_visible_outputs"] = len(outputs)
        if ok and hidden.strip():
            ok, hidden_outputs = self._run_part(cell, index, hidden)
            outputs += hidden_outputs
            result["hidden"] = "passed" if ok else "failed"
        result["passed"] = ok
        cell.outputs = outputs
        cell.metadata[RESULT_KEY] = result
        self.nb.cells[index] = cell
        return cell, self.resources


class ErrorOnlyGrades(SaveAutoGrades):
    """``SaveAutoGrades`` that scores test cells from :class:`GuardedExecute`'s results only.

    A flagged submission (the screen's ``flags``) is recorded as 0 and needing manual grading; the
    score it would have had goes into the instructor report, ``<report_dir>/<ps>/<student>.json``.
    """

    report_dir = Unicode("", help="folder of the screen reports (default: ./reports)").tag(config=True)

    def preprocess(self, nb, resources):
        screen = nb.metadata.get(SCREEN_KEY, {})
        self._flags = list(screen.get("flags", []))
        self._withheld: dict[str, float] = {}
        nb, resources = super().preprocess(nb, resources)
        if self._flags:
            path = Path(self.report_dir or "reports", self.assignment_id, f"{self.student_id}.json")
            report = json.loads(path.read_text()) if path.is_file() else {}
            report.setdefault("withheld_scores", {})[self.notebook_id] = self._withheld
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1, sort_keys=True))
        return nb, resources

    def _add_score(self, cell, resources):
        if not _is_test_cell(cell):
            return super()._add_score(cell, resources)
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
        passed = cell.metadata.get(RESULT_KEY, {}).get("passed") is True
        earned = float(cell.metadata["nbgrader"]["points"]) if passed else 0.0
        if self._flags:
            self._withheld[grade_id] = earned
            grade.auto_score, grade.needs_manual_grade = 0.0, True
        else:
            grade.auto_score = earned
            grade.needs_manual_grade = grade.manual_score is not None
        self.gradebook.db.commit()
