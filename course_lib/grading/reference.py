"""The reference kernel and speed tests: trusted answers and timings for the grader's checks.

A reference kernel (:class:`ReferenceKernel`) is a sandboxed kernel like a student's, started by the
grader, that runs only the grader's ``reference_setup`` code (the capstone's model, baseline and
feature store) and never student code: its answers are the grader's own. :func:`speedup` times a
student's function in the student's kernel against a baseline in the reference kernel, both from the
grader's side and interleaved, with :mod:`course_lib.core.bench`.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import itertools
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from course_lib.core.bench import interleaved_rounds_ns, p99_median_of_rounds_us
from course_lib.grading.calls import CallError, KernelCalls
from course_lib.grading.wire import to_wire

__all__ = ["GraderError", "ReferenceKernel", "Speedup", "speedup"]


class GraderError(RuntimeError):
    """The grader itself failed (its reference kernel, its checks file): not the student's fault."""


class ReferenceKernel:
    """A sandboxed kernel that runs only the grader's ``setup`` code: trusted answers, same round trip.

    Started on first use and kept for the grading process (one per setup source), so each problem set
    pays its start once. Calls that fail raise :class:`GraderError`.
    """

    _running: ClassVar[dict[str, ReferenceKernel]] = {}

    def __init__(
        self, setup: str, *, manager_factory: Callable[[], Any], setup_timeout_s: float = 300.0
    ) -> None:
        self.setup, self._factory, self.setup_timeout_s = setup, manager_factory, setup_timeout_s
        self._km: Any = None
        self._kc: Any = None
        self._calls: KernelCalls | None = None
        self._folder: tempfile.TemporaryDirectory | None = None
        self._answers: dict[str, Any] = {}

    @classmethod
    def shared(cls, setup: str, manager_factory: Callable[[], Any]) -> ReferenceKernel:
        """The running reference kernel for ``setup``, creating it if needed."""
        if setup not in cls._running:
            cls._running[setup] = cls(setup, manager_factory=manager_factory)
        return cls._running[setup]

    def calls(self) -> KernelCalls:
        """Requests into the reference kernel (started, and ``setup`` run, on first use)."""
        if self._calls is None:
            from jupyter_core.utils import run_sync  # noqa: PLC0415 (heavy optional dependency: jupyter)

            run_sync(self._start)()
        assert self._calls is not None  # _start sets it or raises
        return self._calls

    async def _start(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="grading-reference-")
        km = self._factory()
        await km.start_kernel(cwd=self._folder.name)
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=120)
        self._km, self._kc = km, kc
        calls = KernelCalls(km, kc)
        source = f"def check(ns):\n    exec({self.setup!r}, ns)\n    return True"
        try:
            outcome = await calls.request("run", source=source, timeout_s=self.setup_timeout_s)
        except CallError as error:
            raise GraderError(
                f"the reference kernel's setup failed: {error.reason} {error.detail}"
            ) from error
        if outcome.answer.raised is not None:  # the setup itself raised: say what, not a later NameError
            raised = outcome.answer.raised
            raise GraderError(f"the reference kernel's setup raised {raised.name}: {raised.message}")
        self._calls = calls

    def request(self, op: str, **request: Any) -> Any:
        """One request; its value (raises :class:`GraderError` if it failed or raised)."""
        try:
            answer = (
                self.calls().request_sync(op, timeout_s=request.pop("timeout_s", 120.0), **request).answer
            )
        except CallError as error:
            raise GraderError(f"the reference kernel failed: {error.reason} {error.detail}") from error
        if answer.raised is not None:
            raise GraderError(f"the reference kernel raised {answer.raised.name}: {answer.raised.message}")
        return answer.value

    def call(self, target: str, *args: Any, **kwargs: Any) -> Any:
        """Call the reference kernel's ``target``; the same call again returns the kept answer.

        The reference kernel runs only the grader's code, so the same call gives the same answer for
        every student of the class: it is made once per grading process.
        """
        key = json.dumps([target, to_wire(list(args)), to_wire(kwargs)], sort_keys=True)
        if key not in self._answers:
            self._answers[key] = self.request("call", target=target, args=args, kwargs=kwargs)
        return copy.deepcopy(self._answers[key])

    def close(self) -> None:
        """Shut the kernel down (at exit the event loop may be gone: then kill it and clean up directly)."""
        if self._km is not None:
            from jupyter_core.utils import run_sync  # noqa: PLC0415 (heavy optional dependency: jupyter)

            with contextlib.suppress(Exception):
                self._kc.stop_channels()
            try:
                run_sync(self._km.shutdown_kernel)(now=True)
            except Exception:
                self._km.kill_sandbox()
            self._km = self._kc = self._calls = None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    @classmethod
    def close_all(cls) -> None:
        """Shut down every running reference kernel (at exit)."""
        for kernel in list(cls._running.values()):
            with contextlib.suppress(Exception):
                kernel.close()
        cls._running.clear()


atexit.register(ReferenceKernel.close_all)


@dataclass(frozen=True)
class Speedup:
    """A speed test's result: p99 per round (µs) of each side, the ratio of their medians, its range."""

    p99_us: dict[str, list[float]]
    ratio: float
    low: float
    high: float


def speedup(
    question: Any,
    *,
    student: str,
    baseline: str,
    inputs: list,
    rounds: int = 3,
    calls_per_round: int = 10,
    warmup_calls: int = 2,
) -> tuple[Speedup, list[tuple[Any, Any]]]:
    """Time ``baseline`` in the reference kernel and ``student`` in the student's kernel, interleaved.

    ``student`` is a function of the notebook, or grader-written source of a ``check(ns, input)`` that
    calls it (several calls per request: a call much quicker than the round trip between grader and
    kernel would be timed as the round trip); ``baseline`` a function of the reference kernel. Every
    request takes its own input from ``inputs`` (warm-up first, then the rounds; both sides get the
    same inputs in the same order) and is timed from the grader's side, request to answer, so both
    include the same round trip. While the baseline is timed, every process of the student's
    sandbox is stopped (``SIGSTOP``), so nothing the submission started competes with it for the CPU.
    Stopping it is timed with the baseline: a walk over the sandbox's processes in ``/proc``, small
    next to a baseline request (it grows with the processes, at most ``max_processes``); timed with
    the student's calls instead it would weigh on a fast solution's much shorter requests. The ratio is
    ``p99_median_of_rounds_us(baseline) / p99_median_of_rounds_us(student)`` (:mod:`course_lib.core.bench`)
    over the requests' times; ``low`` and ``high`` are the smallest and largest ratio of one round's p99s.

    Returns
    -------
    (Speedup, list of (student answer, baseline answer) pairs of every timed and warm-up request)

    ``question`` is the :class:`~course_lib.grading.checks.Question` of the check (its calls count
    against the question's budget).

    Raises
    ------
    course_lib.grading.checks.CheckError
        When a student call fails (raises, times out, sends no data).
    """
    needed = warmup_calls + rounds * calls_per_round
    if len(inputs) < needed:
        raise GraderError(f"speedup needs {needed} inputs, got {len(inputs)}")
    answers: dict[str, list] = {"student": [], "baseline": []}
    sources = {"student": itertools.cycle(inputs[:needed]), "baseline": itertools.cycle(inputs[:needed])}
    reference = question.reference.calls()

    def student_call() -> None:
        given = next(sources["student"])
        run = student.startswith("def check")
        answers["student"].append(question.run(student, given) if run else question.call(student, given))

    def baseline_call() -> None:
        # the student's kernel and all it started stay stopped meanwhile: nothing of the submission
        # (a CPU burner waiting for its own calls to end) can slow the baseline down
        with question.calls().paused():
            outcome = reference.request_sync(
                "call", target=baseline, args=(next(sources["baseline"]),), timeout_s=120
            )
        if outcome.answer.raised is not None:
            raise GraderError(f"the baseline raised {outcome.answer.raised.name}")
        answers["baseline"].append(outcome.answer.value)

    samples = interleaved_rounds_ns(
        {"baseline": baseline_call, "student": student_call},
        n_calls=calls_per_round,
        rounds=rounds,
        warmup_calls=warmup_calls,
    )
    p99 = {name: [p99_median_of_rounds_us([row]) for row in rows] for name, rows in samples.items()}
    ratio = p99_median_of_rounds_us(samples["baseline"]) / p99_median_of_rounds_us(samples["student"])
    per_round = [b / s for b, s in zip(p99["baseline"], p99["student"], strict=True)]
    return Speedup(p99, ratio, min(per_round), max(per_round)), list(
        zip(answers["student"], answers["baseline"], strict=True)
    )
