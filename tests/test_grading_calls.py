"""The grader's calls into a kernel: answers are data checked on arrival, whatever the kernel does to itself.

Pure tests of the wire format (what a lying kernel could send), then one real sandboxed kernel per
test module, driven as the grader drives a student's: a kernel that patches its own messaging,
shadows builtins or returns an object equal to everything can only change the values it sends.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

import course_lib.grading as grading
from course_lib.grading import gradebook, kernel_side
from course_lib.grading.wire import (
    Code,
    MalformedAnswerError,
    Opaque,
    Records,
    from_wire,
    parse_answer,
    to_wire,
)


def _quoted(document: object) -> str:
    return repr(base64.b64encode(json.dumps(document).encode()).decode())


def test_values_survive_the_round_trip_with_their_types():
    values = [
        {"p50_ms": np.float64(20.0), "slo_breached": False, 3: None},
        (2.8, [0, 1]),
        np.array([[1, 2], [3, 4]], dtype=np.int64),
        float("nan"),
        pd.DataFrame({"p99_ms": [1.5, 2.5], "step": ["a", "b"]}, index=["x", "y"]),
    ]
    for value in values:
        answer = parse_answer(_quoted({"ok": kernel_side.encode(value)}), max_bytes=1 << 20).value
        if isinstance(value, pd.DataFrame):
            assert answer["p99_ms"].dtype == np.float64 and answer["p99_ms"].tolist() == [1.5, 2.5]
            assert list(answer["step"]) == ["a", "b"] and list(answer.index) == ["x", "y"]
        elif isinstance(value, np.ndarray):
            assert answer.dtype == value.dtype and np.array_equal(answer, value)
        elif isinstance(value, float):
            assert np.isnan(answer)
        else:
            assert answer == value and type(answer) is type(value)
    scalar = parse_answer(_quoted({"ok": kernel_side.encode(np.float64(1.5))}), max_bytes=1 << 20).value
    assert type(scalar) is np.float64


def test_anything_that_is_not_plain_data_arrives_opaque_and_equals_nothing():
    class EqualsAnything(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    encoded = kernel_side.encode([EqualsAnything(5), object(), {"k": lambda: 1}])
    got = from_wire(encoded)
    assert all(isinstance(v, Opaque) for v in (got[0], got[1], got[2]["k"]))
    assert got[0] != 5 and got[0] != got[0] and "EqualsAnything" in got[0].type_name


@pytest.mark.parametrize(
    "text",
    [
        None,
        42,
        "'not base64!'",
        repr(base64.b64encode(b"not json").decode()),
        _quoted(["a list"]),
        _quoted({"ok": {"$array": {"dtype": "object", "shape": [1], "data": ["os.system"]}}}),
        _quoted({"ok": {"$array": {"dtype": "float64", "shape": [3], "data": [1.0]}}}),
        _quoted({"ok": {"$array": {"dtype": "float64", "shape": [1], "data": ["1.0"]}}}),
        _quoted({"ok": {"$float": "1e999"}}),
        _quoted({"ok": {"$pickle": "gASVAAAA"}}),
        _quoted(
            {"ok": {"$frame": {"columns": ["a"], "index": [0], "dtypes": ["float64"], "data": [[1, 2]]}}}
        ),
        _quoted({"ok": {"$dict": [[[1], 2]]}}),
        _quoted({"raised": {"types": "KeyError", "message": 1}}),
        _quoted({"ok": {"$dollar": 1, "x": 2}}),
        _quoted({"too_large": 10**9}),
        repr(base64.b64encode(("[" * 100_000 + "]" * 100_000).encode()).decode()),
    ],
)
def test_malformed_answers_are_refused_without_evaluating_anything(text):
    with pytest.raises(MalformedAnswerError):
        parse_answer(text, max_bytes=1 << 20)


def test_an_answer_over_the_size_limit_is_refused_before_decoding():
    huge = _quoted({"ok": "x" * 2_000_000})
    with pytest.raises(MalformedAnswerError, match="size limit"):
        parse_answer(huge, max_bytes=1 << 20)


def test_the_grader_sends_arrays_frames_records_and_code():
    frame = pd.DataFrame({"a_ms": [1.0, 2.0]})
    sent = kernel_side.decode(
        to_wire([np.arange(3.0), frame, Records([{"x": 1}, {"x": 2}]), Code("lambda b: 2 * b")])
    )
    array, back, records, double = sent
    assert (
        array.dtype == np.float64 and back.equals(frame) and list(records["x"]) == [1, 2] and double(4) == 8
    )
    with pytest.raises(TypeError, match="cannot send"):
        to_wire(object())


# --- a real sandboxed kernel ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A sandboxed kernel and its :class:`KernelCalls`, on one event loop kept for the module."""
    from course_lib.grading.calls import KernelCalls
    from course_lib.grading.manager import SandboxedKernelManager

    loop = asyncio.new_event_loop()
    km = SandboxedKernelManager(kernel_name="python3")
    folder = tmp_path_factory.mktemp("kernel")
    loop.run_until_complete(km.start_kernel(cwd=str(folder)))
    kc = km.client()
    kc.start_channels()
    loop.run_until_complete(kc.wait_for_ready(timeout=120))
    calls = KernelCalls(km, kc)

    def run(code: str) -> None:
        reply = loop.run_until_complete(kc.execute_interactive(code, timeout=60, output_hook=lambda m: None))
        assert reply["content"]["status"] == "ok", reply["content"]

    def request(op: str, **kw):
        return loop.run_until_complete(calls.request(op, timeout_s=kw.pop("timeout_s", 10), **kw))

    yield run, request, km
    kc.stop_channels()
    loop.run_until_complete(km.shutdown_kernel(now=True))
    loop.close()


def test_a_kernel_that_lies_to_the_grader_can_only_change_values(kernel):
    run, request, _ = kernel
    run(
        "import jupyter_client.session as s, builtins, json\n"
        "_send = s.Session.send\n"
        "def send(self, stream, kind, content=None, *a, **k):\n"
        "    name = kind if isinstance(kind, str) else kind.get('msg_type')\n"
        "    if name == 'error':\n"
        "        return None\n"
        "    if isinstance(content, dict) and content.get('status') == 'error':\n"
        "        content = {'status': 'ok', 'execution_count': 1, 'user_expressions': {}, 'payload': []}\n"
        "    return _send(self, stream, kind, content, *a, **k)\n"
        "s.Session.send = send\n"
        "class EqualsAnything(int):\n"
        "    def __eq__(self, other): return True\n"
        "    __hash__ = int.__hash__\n"
        "type = lambda value: int\n"
        "abs = lambda value: 0\n"
        "def answer(x): return EqualsAnything(x)\n"
        "def broken(x): raise KeyError(x)\n"
    )
    got = request("call", target="answer", args=(5,)).answer
    assert isinstance(got.value, Opaque) and got.value != 5
    raised = request("call", target="broken", args=("SC-1",)).answer.raised
    assert raised is not None and raised.is_a("KeyError") and raised.is_a("LookupError")


def test_a_call_is_timed_from_the_grader_and_interrupted_past_its_time(kernel):
    from course_lib.grading.calls import CallError

    run, request, _ = kernel
    run("import time\ndef slow(s):\n    time.sleep(s)\n    return s")
    outcome = request("call", target="slow", args=(0.2,))
    assert outcome.answer.value == 0.2 and outcome.elapsed_s >= 0.2
    started = time.perf_counter()
    with pytest.raises(CallError, match="took longer than 1 s"):
        request("call", target="slow", args=(30,), timeout_s=1)
    assert time.perf_counter() - started < 10
    assert request("call", target="slow", args=(0,)).answer.value == 0, (
        "the kernel is usable after the interrupt"
    )


def test_a_call_that_leaves_no_answer_or_prints_a_fake_one_fails(kernel):
    from course_lib.grading import kernel_side as side  # noqa: F401 (the kernel imports its own copy)
    from course_lib.grading.calls import CallError

    run, request, _ = kernel
    run(
        "import course_lib.grading.kernel_side as side\n"
        "side.take = lambda nonce: 'forged'\n"
        "def honest(): return 1\n"
    )
    with pytest.raises(CallError, match="not well-formed"):
        request("call", target="honest")
    run("import importlib; importlib.reload(side)")
    assert request("call", target="honest").answer.value == 1


def test_a_kernel_that_dies_during_a_call_is_reported_lost(tmp_path):
    from course_lib.grading.calls import KernelCalls, KernelLostError
    from course_lib.grading.manager import SandboxedKernelManager

    async def scenario():
        km = SandboxedKernelManager(kernel_name="python3")
        await km.start_kernel(cwd=str(tmp_path))
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=120)
            await kc.execute_interactive("import os\ndef die(): os._exit(1)", timeout=60)
            with pytest.raises(KernelLostError, match="ended the kernel"):
                await KernelCalls(km, kc).request("call", target="die", timeout_s=10)
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    asyncio.run(scenario())


# --- the checks' verdicts, from a fake kernel (no kernel needed) ------------------------------------------


class _FakeCalls:
    """Answers the grader's requests from a table: target -> Answer, or an exception to raise."""

    def __init__(self, answers):
        self.answers, self.timeouts = answers, []

    def request_sync(self, op, *, target=None, timeout_s, **request):
        from course_lib.grading.calls import Outcome

        self.timeouts.append(timeout_s)
        found = self.answers[target or op]
        if isinstance(found, Exception):
            raise found
        return Outcome(found, 0.001)


def _verdict(answers, check, **budgets):
    from course_lib.grading.checks import Checks

    checks = Checks("psx")
    checks.question("q1")(check)
    calls = _FakeCalls(answers)
    settings = {"budget_s": 60.0, "call_timeout_s": 15.0, "notebook_deadline": time.monotonic() + 600}
    return checks.run("q1", lambda: calls, **{**settings, **budgets}), calls


def test_a_question_passes_only_when_every_expectation_holds_and_says_what_failed():
    from course_lib.grading.wire import Answer, Raised

    def check(q):
        with q.step("f on other inputs"):
            q.expect(q.call("f", 1) == 2, "f(1) should be 2")

    passed, _ = _verdict({"f": Answer(value=2)}, check)
    assert passed.passed and passed.reason == "passed"
    wrong, _ = _verdict({"f": Answer(value=3)}, check)
    assert (wrong.passed, wrong.reason, wrong.detail) == (
        False,
        "f on other inputs: wrong answer",
        "f(1) should be 2",
    )
    raised, _ = _verdict({"f": Answer(raised=Raised(("KeyError", "Exception"), "SC-1"))}, check)
    assert raised.reason == "f on other inputs: f raised KeyError" and raised.detail == "SC-1"
    opaque, _ = _verdict({"f": Answer(value=Opaque("x.EqualsAnything"))}, check)
    assert opaque.reason == "f on other inputs: wrong answer", (
        "an object equal to everything equals nothing here"
    )


def test_a_timeout_or_a_lost_kernel_fails_the_question_and_asks_for_a_new_kernel():
    from course_lib.grading.calls import CallError, KernelLostError

    def check(q):
        with q.step("slow f"):
            q.call("f")

    timed_out, _ = _verdict({"f": CallError("took longer than 15 s", "interrupted")}, check)
    assert timed_out.reason == "slow f: f took longer than 15 s" and not timed_out.kernel_lost
    lost, _ = _verdict({"f": KernelLostError("ended the kernel (it died during the call)")}, check)
    assert lost.reason == "slow f: f ended the kernel (it died during the call)" and lost.kernel_lost


def test_calls_get_what_is_left_of_the_question_and_the_notebook_budget():
    from course_lib.grading.wire import Answer

    def check(q):
        for _ in range(3):
            q.call("f")

    result, calls = _verdict({"f": Answer(value=1)}, check, notebook_deadline=time.monotonic() + 4)
    assert result.passed and all(t <= 4 for t in calls.timeouts) and calls.timeouts[0] > 3
    spent, calls = _verdict({"f": Answer(value=1)}, check, notebook_deadline=time.monotonic() - 1)
    assert not spent.passed and "ran out" in spent.reason and calls.timeouts == []


def test_a_check_that_trips_over_an_odd_value_is_a_wrong_answer_not_a_crash():
    from course_lib.grading.wire import Answer

    def check(q):
        with q.step("f's table"):
            q.expect(q.call("f")["p99_ms"] > 1)  # the answer is not a dict

    result, _ = _verdict({"f": Answer(value=Opaque("x.Y"))}, check)
    assert not result.passed and result.reason == "f's table: wrong answer" and "TypeError" in result.detail


def test_both_sides_tag_non_finite_floats_alike():
    for value in (1.5, float("nan"), float("inf"), float("-inf")):
        assert to_wire(value) == kernel_side.encode(value) == kernel_side.float_tag(value)
    assert kernel_side.decode(to_wire((float("-inf"),))) == (float("-inf"),)


def test_the_package_names_what_gradebook_exports_and_a_kernel_loads_neither_pandas_nor_nbgrader():
    # the lazy facade must spell the names out (importing gradebook would load pandas into every kernel)
    assert set(grading.__all__) == {*gradebook.__all__, "main"}
    probe = (
        "import sys, course_lib.grading.kernel_side; print(sorted({'pandas', 'nbgrader'} & set(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
