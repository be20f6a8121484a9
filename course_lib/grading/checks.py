"""The grader's checks: hidden inputs sent to a student's functions, answers judged in the grader.

Each problem set's checks live with the instructor, outside anything a kernel or a student sees:
``exercises/checks/<ps>.py`` defines ``CHECKS = Checks("<ps>")`` and one function per autograded
question, registered with :meth:`Checks.question`. A check function gets a :class:`Question` and
drives the student's kernel through it: :meth:`Question.call` calls a function of the notebook with
arguments the grader chose and returns the answer as data (:mod:`course_lib.grading.wire`),
:meth:`Question.expect` judges it in the grader's process. The question earns its points when the
check function returns; the first failed expectation, error or timeout costs them, with a reason
that names what was checked (:meth:`Question.step`) and never the hidden inputs or answers.

A kernel that patched IPython, ``math`` or ``jupyter_client`` in itself, shadowed builtins or read
its history can only change the values it sends; the grader compares those with answers it computed
itself. Expected answers that need the course's heavy machinery (the capstone's model and baseline)
come from a *reference kernel*: a second sandboxed kernel that runs only the grader's
``reference_setup`` code, never student code, started once per grading process
(:class:`ReferenceKernel`). Speed checks time calls into both kernels from the grader's side
(:func:`speedup`), interleaved, with :mod:`course_lib.core.bench`.

Budgets: each call runs at most ``call_timeout_s`` (as long as a cell may), all of a question's calls
at most ``question_budget_s``, and nothing past the notebook's own deadline.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from course_lib.grading.calls import CallError, KernelCalls, KernelLostError
from course_lib.grading.reference import GraderError, ReferenceKernel, Speedup, speedup
from course_lib.grading.wire import Answer, Raised

__all__ = [
    "CheckError",
    "Checks",
    "GraderError",
    "Question",
    "ReferenceKernel",
    "Result",
    "Speedup",
    "is_float",
    "is_float_array",
    "is_int",
    "load_checks",
    "speedup",
]


class CheckError(Exception):
    """A failed expectation: ``reason`` may be shown to the student, ``detail`` is for instructors."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Result:
    """The grader's verdict on one question."""

    grade_id: str
    passed: bool
    reason: str
    detail: str
    elapsed_s: float
    kernel_lost: bool = False
    notes: tuple[str, ...] = ()


def is_float(value: Any) -> bool:
    """A finite Python float or numpy float64 scalar."""
    return type(value) in (float, np.float64) and bool(np.isfinite(value))


def is_int(value: Any) -> bool:
    """A Python int (not a bool, not an int subclass)."""
    return type(value) is int


def is_float_array(value: Any, shape: tuple[int, ...] | None = None) -> bool:
    """A numpy float64 array (of ``shape``, if given)."""
    return type(value) is np.ndarray and value.dtype == np.float64 and (shape is None or value.shape == shape)


class Question:
    """What a check function gets: calls into the student's kernel, within the question's budget.

    Parameters
    ----------
    grade_id : str
        The question's grade cell.
    calls : callable
        Returns the current :class:`~course_lib.grading.calls.KernelCalls` of the student's kernel.
    deadline : float
        ``time.monotonic()`` after which no call starts.
    call_timeout_s : float
        Longest one call may run.
    reference : ReferenceKernel, optional
        The problem set's reference kernel, if it has one.
    """

    def __init__(
        self,
        grade_id: str,
        calls: Callable[[], KernelCalls],
        *,
        deadline: float,
        call_timeout_s: float,
        budget_s: float,
        reference: ReferenceKernel | None = None,
    ) -> None:
        self.grade_id = grade_id
        self._calls, self._deadline = calls, deadline
        self.call_timeout_s, self.budget_s = call_timeout_s, budget_s
        self._reference = reference
        self._label = "the grader's checks"
        self.notes: list[str] = []
        #: Wall time of the last request that answered, seconds, timed by the grader (request sent to
        #: reply received): an upper bound on any time the kernel reports about what ran in it.
        self.last_elapsed_s = 0.0

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """Name what the checks inside are about (the reason a failure gives, e.g. "with other seeds").

        A check inside that trips over an odd value (indexes an answer that is not a dict, say) fails
        as a wrong answer of this step.
        """
        outer, self._label = self._label, label
        try:
            yield
        except (CheckError, GraderError):
            raise
        except Exception as error:
            detail = "".join(traceback.format_exception(error)[-3:])
            raise CheckError(f"{label}: wrong answer", detail) from None
        finally:
            self._label = outer

    def note(self, text: str) -> None:
        """Record ``text`` for the instructor report (a measured speed-up, say), passed or not."""
        self.notes.append(text)

    def expect(self, condition: Any, detail: str = "") -> None:
        """Fail the question (wrong answer) unless ``condition`` is true; ``detail`` is for instructors."""
        try:
            ok = bool(condition)
        except Exception as error:
            raise CheckError(f"{self._label}: wrong answer", f"{detail} ({error!r})") from None
        if not ok:
            raise CheckError(f"{self._label}: wrong answer", detail)

    def _timeout(self) -> float:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise CheckError(
                f"{self._label}: the time for this question's checks ({self.budget_s:g} s) ran out"
            )
        return min(self.call_timeout_s, remaining)

    def _answer(self, op: str, *, target: str = "", **request) -> Answer:
        what = target or "the grader's request"
        try:
            outcome = self._calls().request_sync(
                op, target=target or None, timeout_s=self._timeout(), **request
            )
        except KernelLostError as error:
            raise CheckError(f"{self._label}: {what} {error.reason}", error.detail) from error
        except CallError as error:
            raise CheckError(f"{self._label}: {what} {error.reason}", error.detail) from None
        self.last_elapsed_s = outcome.elapsed_s
        return outcome.answer

    def _value(self, answer: Answer, what: str) -> Any:
        if answer.raised is not None:
            raised = answer.raised
            raise CheckError(f"{self._label}: {what} raised {raised.name}", raised.message)
        return answer.value

    def call(self, target: str, *args: Any, asynchronous: bool = False, **kwargs: Any) -> Any:
        """Call the notebook's ``target`` (a name or dotted path) and return its answer as data.

        Fails the question if the call raises, times out or sends something that is not data.
        ``asynchronous``: ``target`` is an ``async def`` function (awaited in the kernel).
        """
        answer = self._answer("call", target=target, args=args, kwargs=kwargs, asynchronous=asynchronous)
        return self._value(answer, target)

    def call_keeping_args(self, target: str, *args: Any, **kwargs: Any) -> tuple[Any, list]:
        """:meth:`call`, with the arguments as the kernel holds them after the call (were they changed?)."""
        value = self._value(
            self._answer("call", target=target, args=args, kwargs=kwargs, return_args=True), target
        )
        if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], list)):
            raise CheckError(f"{self._label}: {target} sent a malformed answer")
        return value

    def outcome(self, target: str, *args: Any, **kwargs: Any) -> Answer:
        """Call ``target`` and return its :class:`~course_lib.grading.wire.Answer`.

        The answer holds what ``target`` returned or the error it raised.
        """
        return self._answer("call", target=target, args=args, kwargs=kwargs)

    def raises(self, exception: str, target: str, *args: Any, **kwargs: Any) -> None:
        """Fail unless calling ``target`` raises ``exception``, a built-in class name (``"ValueError"``)."""
        answer = self.outcome(target, *args, **kwargs)
        if not (isinstance(answer.raised, Raised) and answer.raised.is_a(exception)):
            got = f"raised {answer.raised.name}" if answer.raised else "returned"
            raise CheckError(f"{self._label}: {target} should raise {exception}", got)

    def value(self, expression: str) -> Any:
        """Evaluate a grader-written expression in the notebook (``"float(MAX_ABS_PROBABILITY_DIFF)"``)."""
        return self._value(self._answer("eval", source=expression), "the notebook")

    def run(self, source: str, *args: Any, asynchronous: bool = False) -> Any:
        """Run grader-written ``source`` defining ``check(ns, *args)`` (``async def`` if ``asynchronous``)."""
        answer = self._answer("run", source=source, args=args, asynchronous=asynchronous)
        return self._value(answer, "the code under test")

    @property
    def reference(self) -> ReferenceKernel:
        """The problem set's reference kernel (only the grader's code runs there)."""
        if self._reference is None:
            raise GraderError(
                f"the checks of {self.grade_id} use a reference kernel but define no reference_setup"
            )
        return self._reference

    def calls(self) -> KernelCalls:
        """The student's kernel, for timing (:func:`speedup`)."""
        return self._calls()

    def remaining_s(self) -> float:
        """Seconds left of this question's budget (what one call may take, at most ``call_timeout_s``)."""
        return self._timeout()


class Checks:
    """The grader's checks of one problem set: one function per autograded question.

    Parameters
    ----------
    assignment : str
        The problem set (``"ps1"``).
    reference_setup : str, optional
        Python source the reference kernel runs once (imports, the model, the baseline, helpers the
        checks call with :meth:`ReferenceKernel.call`).
    """

    def __init__(self, assignment: str, *, reference_setup: str | None = None) -> None:
        self.assignment = assignment
        self.reference_setup = reference_setup
        self.questions: dict[str, Callable[[Question], None]] = {}

    def question(self, grade_id: str) -> Callable:
        """Decorator registering the check function of the grade cell ``grade_id``."""

        def register(function: Callable[[Question], None]) -> Callable[[Question], None]:
            if grade_id in self.questions:
                raise ValueError(f"{self.assignment}: {grade_id!r} has two check functions")
            self.questions[grade_id] = function
            return function

        return register

    def run(
        self,
        grade_id: str,
        calls: Callable[[], KernelCalls],
        *,
        budget_s: float,
        call_timeout_s: float,
        notebook_deadline: float,
        manager_factory: Callable[[], Any] | None = None,
    ) -> Result:
        """Run the checks of ``grade_id``; the verdict (never raises for what the student did).

        Raises
        ------
        GraderError
            The grader's own machinery failed (the reference kernel); the submission cannot be graded.
        KeyError
            ``grade_id`` has no check function.
        """
        function = self.questions[grade_id]
        start = time.monotonic()
        reference = (
            ReferenceKernel.shared(self.reference_setup, manager_factory)
            if self.reference_setup and manager_factory is not None
            else None
        )
        question = Question(
            grade_id,
            calls,
            deadline=min(start + budget_s, notebook_deadline),
            call_timeout_s=call_timeout_s,
            budget_s=budget_s,
            reference=reference,
        )
        try:
            function(question)
        except GraderError:
            raise
        except CheckError as failure:
            lost = isinstance(failure.__cause__, KernelLostError)
            elapsed = time.monotonic() - start
            return Result(
                grade_id, False, failure.reason, failure.detail, elapsed, lost, tuple(question.notes)
            )
        except Exception as error:
            detail = "".join(traceback.format_exception(error)[-3:])
            elapsed = time.monotonic() - start
            return Result(
                grade_id,
                False,
                f"{question._label}: wrong answer",
                detail,
                elapsed,
                notes=tuple(question.notes),
            )
        return Result(grade_id, True, "passed", "", time.monotonic() - start, notes=tuple(question.notes))


def load_checks(folder: str | Path, assignment: str) -> Checks:
    """The ``CHECKS`` of ``<folder>/<assignment>.py`` (the instructor's file, run in the grader).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    GraderError
        If it defines no ``CHECKS`` for ``assignment``.
    """
    path = Path(folder) / f"{assignment}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no grader checks for {assignment}: {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"_grader_checks_{assignment}", path)
    assert spec is not None and spec.loader is not None  # a .py file always gets a source file loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    checks = getattr(module, "CHECKS", None)
    if not isinstance(checks, Checks) or checks.assignment != assignment:
        raise GraderError(f"{path} must define CHECKS = Checks({assignment!r})")
    return checks
