"""The grader's checks of ps1 (instructors only: the hidden inputs and the answers they must give).

Run in the grader's process by ``course_lib.grading.execute.GuardedExecute``: every call goes into the
student's kernel with inputs chosen here and comes back as data, judged here. See
``course_lib.grading.checks`` for the API.
"""

import numpy as np
import pandas as pd

from course_lib.core.percentiles import fanout_tail_probability, percentile
from course_lib.grading.checks import Checks, is_float, is_float_array, is_int

CHECKS = Checks("ps1")

STAGE_RANGES_MS = {
    "network_ms": (5.0, 15.0),
    "parse_ms": (1.0, 3.0),
    "feature_store_ms": (1.0, 3.0),
    "model_ms": (10.0, 30.0),
    "format_ms": (2.0, 5.0),
}


def stage_table(seed: int = 19, n: int = 500) -> pd.DataFrame:
    """The setup cell's per-stage times, rebuilt here (the kernel's copy is not trusted)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({stage: rng.uniform(low, high, n) for stage, (low, high) in STAGE_RANGES_MS.items()})


@CHECKS.question("q1")
def q1(q):
    stages = stage_table()
    hit_ms = stages.sum(axis=1).to_numpy()
    with q.step("simulate_request_latencies_ms on the 500 StayWell requests (seed 20)"):
        got = q.call("simulate_request_latencies_ms", stages, 0.05, 40.0, seed=20)
        q.expect(is_float_array(got, (500,)), f"type {type(got).__name__}")
        extra = got - hit_ms
        q.expect(np.all(np.isclose(extra, 0.0) | np.isclose(extra, 40.0)), "each request adds 0 or 40 ms")
        q.expect(int(np.isclose(extra, 40.0).sum()) == 20, "20 misses with seed 20")
    tiny = pd.DataFrame({"a_ms": [1.0, 2.0, 3.0, 4.0], "b_ms": [10.0, 10.0, 10.0, 10.0]})
    with q.step("simulate_request_latencies_ms on other stages, miss rates and seeds"):
        got, (frame_after, *_) = q.call_keeping_args(
            "simulate_request_latencies_ms", tiny, 0.6, 100.0, seed=5
        )
        q.expect(is_float_array(got, (4,)), f"type {type(got).__name__}")
        q.expect(np.allclose(got, [11.0, 12.0, 113.0, 114.0]), f"got {got}")
        q.expect(
            isinstance(frame_after, pd.DataFrame) and np.array_equal(frame_after.to_numpy(), tiny.to_numpy())
        )
        got = q.call("simulate_request_latencies_ms", tiny, 0.0, 100.0, seed=5)
        q.expect(is_float_array(got, (4,)) and np.allclose(got, [11.0, 12.0, 13.0, 14.0]), f"got {got}")
        got = q.call("simulate_request_latencies_ms", tiny, 1.0, 7.5, seed=9)
        q.expect(is_float_array(got, (4,)) and np.allclose(got, [18.5, 19.5, 20.5, 21.5]), f"got {got}")
        got = q.call("simulate_request_latencies_ms", stages, 0.3, 25.0, seed=123)
        misses = np.random.default_rng(123).random(500) < 0.3
        q.expect(is_float_array(got, (500,)) and np.allclose(got, hit_ms + 25.0 * misses))


@CHECKS.question("q2")
def q2(q):
    hit_ms = stage_table().sum(axis=1).to_numpy()
    reference_ms = hit_ms + np.where(np.random.default_rng(20).random(500) < 0.05, 40.0, 0.0)

    def summary(samples, slo_ms):
        got = q.call("latency_summary", samples, slo_ms)
        q.expect(type(got) is dict and set(got) == {"p50_ms", "p99_ms", "slo_breached"}, f"got {got!r}")
        q.expect(is_float(got["p50_ms"]) and is_float(got["p99_ms"]), "p50_ms and p99_ms are floats")
        q.expect(type(got["slo_breached"]) is bool, "slo_breached is a bool")
        return got

    with q.step("latency_summary of the simulated requests"):
        got = summary(reference_ms, 60.0)
        q.expect(abs(got["p50_ms"] - percentile(reference_ms, 50)) <= 1e-9, f"p50 {got['p50_ms']}")
        q.expect(abs(got["p99_ms"] - percentile(reference_ms, 99)) <= 1e-9, f"p99 {got['p99_ms']}")
        q.expect(got["slo_breached"] is True)
        q.expect(summary(hit_ms, 60.0)["slo_breached"] is False)
    with q.step("latency_summary of other samples and objectives"):
        four = summary(np.array([40.0, 10.0, 30.0, 20.0]), 40.0)
        q.expect(four == {"p50_ms": 20.0, "p99_ms": 40.0, "slo_breached": False}, f"got {four}")
        q.expect(summary(np.array([40.0, 10.0, 30.0, 20.0]), 39.9)["slo_breached"] is True)
        hundred = summary(np.arange(1.0, 101.0), 99.0)
        q.expect(hundred["p99_ms"] == 99.0 and hundred["slo_breached"] is False, f"got {hundred}")


@CHECKS.question("q3")
def q3(q):
    with q.step("page_slow_probability of the 4-call dashboard"):
        one, four = q.call("page_slow_probability", 1), q.call("page_slow_probability", 4)
        q.expect(is_float(one) and abs(one - 0.01) <= 1e-12, f"got {one!r}")
        q.expect(is_float(four) and abs(four - 0.03940399) <= 1e-9, f"got {four!r}")
    with q.step("page_slow_probability for other call counts and percentiles"):
        for calls, pct in ((2, 95.0), (5, 99.0), (10, 99.9), (100, 99.0), (3, 90.0)):
            got = q.call("page_slow_probability", calls, pct)
            q.expect(is_float(got), f"{calls}, {pct}: type {type(got).__name__}")
            q.expect(abs(got - fanout_tail_probability(calls, pct)) <= 1e-12, f"{calls}, {pct}: got {got}")
        got = q.call("page_slow_probability", 100)
        q.expect(is_float(got) and abs(got - 0.6339676587267709) <= 1e-12, f"default q: got {got!r}")


@CHECKS.question("q4")
def q4(q):
    with q.step("max_parallel_calls for a 5% target"):
        got = q.call("max_parallel_calls", 0.05)
        q.expect(is_int(got) and got == 5, f"got {got!r}")
    with q.step("max_parallel_calls for other targets and percentiles"):
        # 1 - 0.99**68 = 0.495 and 1 - 0.99**69 = 0.5002; 4 calls give 0.03940399, just above 0.0394;
        # even one p99 call is slow 1% of the time; 1 - 0.999**10 = 0.00995
        for target, pct, expected in ((0.5, 99.0, 68), (0.0394, 99.0, 3), (0.005, 99.0, 0), (0.01, 99.9, 10)):
            got = q.call("max_parallel_calls", target, q=pct)
            q.expect(is_int(got) and got == expected, f"{target}, {pct}: got {got!r}")
