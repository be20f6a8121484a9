"""nbgrader preprocessors that run a submission within its budgets and grade it from the grader's checks.

:class:`GuardedExecute` replaces nbgrader's ``Execute`` in ``Autograde.autograde_preprocessors``:

* kernels start in the sandbox of :class:`~course_lib.grading.manager.SandboxedKernelManager`;
* the notebook runs top to bottom (Restart & Run All), each cell within ``Execute.timeout`` seconds,
  the whole notebook within ``notebook_budget_s``: past it, the rest is not run and its questions
  score 0. Outputs past ``output_budget_bytes`` are dropped;
* a test cell runs as the student saw it (its visible checks, for the feedback: they decide nothing);
  once the last cell has run, the grader's checks of each question that ran
  (:mod:`course_lib.grading.checks`, from ``<checks_dir>/<assignment>.py``) call the student's
  functions with hidden inputs and judge the answers in this process, each within
  ``question_budget_s``. No cell runs after them, so no cell can print the hidden inputs into the
  feedback. A note with the verdict is appended to the test cell's outputs;
* a cell or a call that outlives its time and ignores the interrupt, or kills its kernel, gets an
  error; the kernel is replaced, the earlier non-test cells are replayed silently, and grading goes
  on: the bad cell costs its own questions only.

The verdicts travel to :class:`GraderScores` in ``resources`` (never through anything the kernel can
write); it records each test cell's points in the gradebook (nbgrader's ``SaveAutoGrades`` with
``auto_score`` from the verdict). A submission held for review (:mod:`course_lib.grading.screen`)
keeps its scores and is marked as needing manual grading.

References
----------
nbgrader 0.9 ``nbgrader.preprocessors.Execute``/``SaveAutoGrades``; nbclient ``NotebookClient``
(``async_execute_cell``, ``output``, ``_get_timeout``, ``DeadKernelError``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from queue import Empty
from typing import Literal

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import Execute, SaveAutoGrades
from traitlets import Float, Integer, Unicode

from course_lib.grading.calls import KernelCalls
from course_lib.grading.checks import GraderError, Result, load_checks
from course_lib.grading.manager import SandboxedKernelManager
from course_lib.grading.report import update_report

__all__ = ["NOTE_PREFIX", "RESULT_KEY", "SCREEN_KEY", "GraderScores", "GuardedExecute", "is_test_cell"]

#: ``resources`` key (and cell metadata key, public part only) of the grader's verdicts.
RESULT_KEY = "course_grading"
#: Notebook metadata key holding the screen's findings (set by :mod:`course_lib.grading.screen`).
SCREEN_KEY = "course_grading_screen"
#: First words of the note appended to each test cell's outputs.
NOTE_PREFIX = "Grader's checks"


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _note(text: str) -> NotebookNode:
    return NotebookNode(output_type="stream", name="stdout", text=text)


def is_test_cell(cell) -> bool:
    """A graded code cell that is not an answer cell (nbgrader's autograded test cell)."""
    return cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell)


def _output_bytes(msg: dict) -> int:
    content = msg.get("content") or {}
    size = len(str(content.get("text", "")))
    size += sum(len(str(value)) for value in (content.get("data") or {}).values())
    size += sum(len(str(line)) for line in content.get("traceback") or [])
    return size


class GuardedExecute(Execute):
    """nbgrader's ``Execute`` with budgets, the grader's checks and kernel replacement (see the module)."""

    shutdown_kernel: Literal["graceful", "immediate"]  # nbclient's Enum trait (nbgrader has no stubs)

    checks_dir = Unicode("", help="folder of the grader's checks, <checks_dir>/<assignment>.py").tag(
        config=True
    )
    report_dir = Unicode("", help="folder of the instructor reports (default ./reports)").tag(config=True)
    notebook_budget_s = Float(600.0, help="seconds for a whole notebook: cells, checks, restarts").tag(
        config=True
    )
    question_budget_s = Float(60.0, help="seconds for all the grader's calls of one question").tag(
        config=True
    )
    call_timeout_s = Float(15.0, help="seconds for one call of the grader's").tag(config=True)
    output_budget_bytes = Integer(8 * 1024**2, help="outputs kept per notebook, bytes").tag(config=True)
    max_kernel_restarts = Integer(5, help="kernel replacements per notebook before the rest fails").tag(
        config=True
    )

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources=None, km=None):
        info = resources["nbgrader"]
        self._checks = load_checks(self.checks_dir or "checks", info["assignment"])
        missing = [
            cell.metadata.nbgrader["grade_id"]
            for cell in nb.cells
            if is_test_cell(cell) and cell.metadata.nbgrader["grade_id"] not in self._checks.questions
        ]
        if missing:
            raise GraderError(f"the grader's checks of {info['assignment']} have no function for {missing}")
        self._deadline = time.monotonic() + self.notebook_budget_s
        self._replay: list[int] = []
        self._restarts = 0
        self._last_reply = None
        self._kept_bytes = 0
        self._dropped = False
        self._limits: list[str] = []
        self._replaced: list[str] = []
        self._peak_bytes = 0
        self._containment = "none"
        self._results: dict[str, Result] = {}
        self._deferred: list[int] = []
        self._calls_of: tuple | None = None
        try:
            nb, resources = super().preprocess(nb, resources, km)
        finally:
            self._record(resources)
        resources[RESULT_KEY] = {grade_id: r.passed for grade_id, r in self._results.items()}
        return nb, resources

    def _record(self, resources) -> None:
        info = resources["nbgrader"]
        verdicts = {gid: dataclasses.asdict(r) for gid, r in self._results.items()}
        folder = self.report_dir or "reports"
        update_report(
            folder, info["assignment"], info["student"], "grader", verdicts, notebook=info["notebook"]
        )
        update_report(
            folder, info["assignment"], info["student"], "limits", self._limits, notebook=info["notebook"]
        )
        update_report(
            folder,
            info["assignment"],
            info["student"],
            "containment",
            self._containment,
            notebook=info["notebook"],
        )
        update_report(
            folder, info["assignment"], info["student"], "replaced", self._replaced, notebook=info["notebook"]
        )
        peak_mib = round(self._peak_bytes / 1024**2, 1)
        update_report(
            folder,
            info["assignment"],
            info["student"],
            "peak_memory_mib",
            peak_mib,
            notebook=info["notebook"],
        )

    # --- budgets ---------------------------------------------------------------------------------

    def _remaining_s(self) -> float:
        return self._deadline - time.monotonic()

    def _get_timeout(self, cell):
        timeout = super()._get_timeout(cell) or self.call_timeout_s
        return max(1, min(int(timeout), int(self._remaining_s())))

    def _limit(self, event: str) -> None:
        if event not in self._limits:
            self._limits.append(event)
            self.log.warning("limit: %s", event)

    def output(self, outs, msg, display_id, cell_index):
        size = _output_bytes(msg)
        if self._kept_bytes + size > self.output_budget_bytes:
            if not self._dropped:
                self._dropped = True
                mib = self.output_budget_bytes / 1024**2
                self._limit(f"outputs past {mib:g} MiB were dropped")
                outs.append(_note(f"[output dropped: the notebook's outputs passed {mib:g} MiB]\n"))
            return None
        self._kept_bytes += size
        return super().output(outs, msg, display_id, cell_index)

    # --- kernel life -----------------------------------------------------------------------------

    def _calls(self) -> KernelCalls:
        if self._calls_of is None or self._calls_of[0] is not self.kc:
            self._calls_of = (self.kc, KernelCalls(self.km, self.kc))
        return self._calls_of[1]

    def _kernel_events(self) -> None:
        for event in getattr(self.km, "events", list)():
            self._limit(event)
        self._peak_bytes = max(self._peak_bytes, getattr(self.km, "peak_memory_bytes", int)())
        self._containment = getattr(self.km, "containment_kind", "none")

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
        self._replaced.append(why)
        self._kernel_events()
        self.log.warning("Replacing the kernel (%s); replacement %d", why, self._restarts)
        if self._restarts > self.max_kernel_restarts:
            raise RuntimeError(f"more than {self.max_kernel_restarts} kernel replacements")
        shutdown = self.shutdown_kernel
        self.shutdown_kernel = "immediate"
        try:
            self._cleanup_kernel()
        finally:
            self.shutdown_kernel = shutdown
        self.km = self.create_kernel_manager()
        self.start_new_kernel()
        self.start_new_kernel_client()
        for index in list(self._replay):
            timeout = min(self._get_timeout(None), max(self._remaining_s(), 0.0))
            reply = self._silent(self.nb.cells[index].source, timeout) if timeout > 0 else None
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
                note = (
                    "the kernel died while running this cell (killed, out of memory or os._exit), or "
                    "sent a message over the grader's limit"
                )
            else:
                note = f"no answer {self.iopub_timeout} s after the interrupt: the cell ignored it"
            cell.setdefault("outputs", []).append(_error_output(type(error).__name__, note))
            self.nb.cells[index] = cell
            self._replace_kernel(note)
            return False, True
        ok = self._last_reply is not None and self._last_reply["content"]["status"] == "ok"
        return ok and not any(out.output_type == "error" for out in cell.get("outputs", [])), False

    def _skip(self, cell, *, ran: bool = False) -> None:
        budget = f"{self.notebook_budget_s:g} s"
        self._limit(f"the notebook's {budget} ran out: later cells were not run")
        if not ran:
            cell.outputs = [_error_output("NotRun", f"not run: the notebook's {budget} for grading ran out")]
        if is_test_cell(cell):
            grade_id = cell.metadata.nbgrader["grade_id"]
            reason = f"not run: the notebook's {budget} for grading ran out"
            self._results[grade_id] = Result(grade_id, False, reason, "", 0.0)
            cell.outputs.append(_note(f"{NOTE_PREFIX}: {reason}. 0 points.\n"))

    def _grade(self, cell) -> None:
        grade_id = cell.metadata.nbgrader["grade_id"]
        points = float(cell.metadata.nbgrader.get("points", 0))
        result = self._checks.run(
            grade_id,
            self._calls,
            budget_s=self.question_budget_s,
            call_timeout_s=self.call_timeout_s,
            notebook_deadline=self._deadline,
            manager_factory=lambda: self.kernel_manager_class(kernel_name="python3", config=self.config),
        )
        self._results[grade_id] = result
        if result.kernel_lost:
            self._replace_kernel(result.reason)
        verdict = (
            f"passed, {points:g} of {points:g} points" if result.passed else f"{result.reason}. 0 points"
        )
        cell.outputs.append(_note(f"{NOTE_PREFIX}: {verdict}.\n"))
        cell.metadata[RESULT_KEY] = {"passed": result.passed, "reason": result.reason}

    def preprocess_cell(self, cell, resources, index):
        cell, resources = self._cell(cell, resources, index)
        if index == len(self.nb.cells) - 1:
            self._grade_deferred()
        return cell, resources

    def _grade_deferred(self) -> None:
        """The grader's checks of every test cell that ran, once the notebook's last cell has run.

        Each question gets its own ``question_budget_s`` from here (the cells' budget may be spent), so
        a cell that ran the notebook's budget out costs the questions after it, not the ones before.
        """
        pending, self._deferred = self._deferred, []
        self._deadline = max(self._deadline, time.monotonic() + len(pending) * self.question_budget_s)
        for index in pending:
            cell = self.nb.cells[index]
            self._grade(cell)
            self._kernel_events()
            self.nb.cells[index] = cell

    def _cell(self, cell, resources, index):
        self._check_assign_resources(resources)
        if cell.cell_type != "code" or not cell.source.strip():
            return cell, self.resources
        if self._remaining_s() < 1:
            self._skip(cell)
            return cell, self.resources
        _, replaced = self._run(cell, index)
        timed_out = any(out.get("ename") == "CellTimeoutError" for out in cell.get("outputs", []))
        if not is_test_cell(cell):
            if not (replaced or timed_out):  # replayed after a kernel replacement, errors and all
                self._replay.append(index)
        elif self._remaining_s() < 1:
            self._skip(cell, ran=True)
        else:
            self._deferred.append(index)  # graded after the last cell: no later cell sees the inputs
        self._kernel_events()
        self.nb.cells[index] = cell
        return cell, self.resources


class GraderScores(SaveAutoGrades):
    """``SaveAutoGrades`` that scores test cells from the grader's verdicts only.

    A test cell earns its points when the grader's checks of its question passed, else 0; nbgrader's
    own rule (a displayed value as partial credit, any stderr as failure) does not apply. A submission
    held for review (``held_for_review`` in the screen's findings) keeps these scores, and every grade
    of it is marked as needing manual grading so formgrader lists it.
    """

    def preprocess(self, nb, resources):
        self._passed = dict(resources.get(RESULT_KEY, {}))
        self._held = bool(nb.metadata.get(SCREEN_KEY, {}).get("held_for_review"))
        return super().preprocess(nb, resources)

    def _add_score(self, cell, resources):
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        if not is_test_cell(cell):  # a written answer: nbgrader's rule (it waits for a person)
            super()._add_score(cell, resources)
            if self._held:
                grade = self.gradebook.find_grade(
                    grade_id, self.notebook_id, self.assignment_id, self.student_id
                )
                grade.needs_manual_grade = True
                self.gradebook.db.commit()
            return
        grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
        passed = self._passed.get(grade_id) is True
        grade.auto_score = float(cell.metadata["nbgrader"]["points"]) if passed else 0.0
        grade.needs_manual_grade = self._held or grade.manual_score is not None
        self.gradebook.db.commit()


def checks_folder(course_root: str | Path) -> Path:
    """Where the grader's checks of a course root live: ``<course_root>/checks``."""
    return Path(course_root) / "checks"
