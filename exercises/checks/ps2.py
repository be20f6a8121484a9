"""The grader's checks of ps2 (instructors only: the hidden inputs and the answers they must give).

Run in the grader's process by ``course_lib.grading.execute.GuardedExecute``; see
``course_lib.grading.checks`` for the API.
"""

import numpy as np

from course_lib.grading.checks import Checks, is_float_array
from course_lib.grading.wire import Code

CHECKS = Checks("ps2")

BURST_MS = np.round(np.arange(20) * 0.4, 1)
BURST_BATCHES = [(2.8, list(range(0, 8))), (6.0, list(range(8, 16))), (9.4, [16, 17, 18, 19])]
TRAFFIC_MS = np.cumsum(np.random.default_rng(2024).exponential(1000 / 400, size=2000))
HEAVY_MS = np.cumsum(np.random.default_rng(7).exponential(1.0, size=2000))  # 1,000 requests per second
CANDIDATES_MS = np.arange(0.0, 20.5, 0.5)
SERVICE_MS = Code("lambda batch_size: 5.0 + 0.2 * batch_size")  # the setup cell's service_time_ms


def normalise(batches):
    """Batches as ``[(dispatch_ms rounded to 1e-6, [int indices])]``; raises on anything else."""
    return [(round(float(dispatch_ms), 6), [int(i) for i in members]) for dispatch_ms, members in batches]


@CHECKS.question("q1")
def q1(q):
    with q.step("form_batches on the burst"):
        got = q.call("form_batches", BURST_MS, 8, 3.0)
        q.expect(isinstance(got, list) and normalise(got) == BURST_BATCHES, f"got {got!r}")
    with q.step("form_batches on other arrivals, batch sizes and delays"):
        cases = [
            (
                ([0.0, 1.0, 2.0, 10.0, 10.5, 11.0, 11.2, 30.0], 3, 2.0),
                [(2.0, [0, 1, 2]), (11.0, [3, 4, 5]), (13.2, [6]), (32.0, [7])],
            ),
            (
                ([0.0, 0.0, 0.0, 1.0, 1.0, 5.0], 2, 0.0),
                [(0.0, [0, 1]), (0.0, [2]), (1.0, [3, 4]), (5.0, [5])],
            ),
            (([3.0, 4.0, 4.0], 1, 5.0), [(3.0, [0]), (4.0, [1]), (4.0, [2])]),
            (([0.0, 2.0, 5.0], 4, 2.0), [(2.0, [0, 1]), (7.0, [2])]),  # arriving at the deadline joins
            (([], 8, 3.0), []),
        ]
        for args, expected in cases:
            got = q.call("form_batches", *args)
            q.expect(isinstance(got, list) and normalise(got) == expected, f"{args}: got {got!r}")


@CHECKS.question("q2")
def q2(q):
    with q.step("queue_waits_ms of the burst's batches"):
        got = q.call("queue_waits_ms", BURST_MS, BURST_BATCHES)
        expected = [2.8, 2.4, 2.0, 1.6, 1.2, 0.8, 0.4, 0.0] * 2 + [3.0, 2.6, 2.2, 1.8]
        q.expect(is_float_array(got, (20,)) and np.allclose(got, expected), f"got {got!r}")
    with q.step("queue_waits_ms of other batches, in any order"):
        arrivals = [0.0, 1.0, 2.0, 10.0, 10.5, 11.0, 11.2, 30.0]
        shuffled = [(13.2, [6]), (2.0, [0, 1, 2]), (32.0, [7]), (11.0, [3, 4, 5])]
        got = q.call("queue_waits_ms", arrivals, shuffled)
        q.expect(is_float_array(got, (8,)) and np.allclose(got, [2.0, 1.0, 0.0, 1.0, 0.5, 0.0, 2.0, 2.0]))
        got = q.call("queue_waits_ms", np.array([5.0]), [(5.0, [0])])
        q.expect(is_float_array(got, (1,)) and np.allclose(got, [0.0]), f"got {got!r}")


@CHECKS.question("q3")
def q3(q):
    with q.step("batch_summary of the burst's batches"):
        got = q.call("batch_summary", BURST_BATCHES)
        q.expect(type(got) is dict and got.get("n_batches") == 3, f"got {got!r}")
        q.expect(type(got.get("mean_batch_size")) is float and abs(got["mean_batch_size"] - 20 / 3) < 1e-12)
    with q.step("batch_summary of other batches"):
        got = q.call("batch_summary", [(2.0, [0, 1, 2]), (11.0, [3, 4, 5]), (13.2, [6]), (32.0, [7])])
        q.expect(type(got) is dict and type(got.get("n_batches")) is int, f"got {got!r}")
        q.expect(
            type(got.get("mean_batch_size")) is float and got == {"n_batches": 4, "mean_batch_size": 2.0}
        )
        got = q.call("batch_summary", [(3.0, [0]), (4.0, [1]), (4.0, [2])])
        q.expect(
            type(got) is dict and got.get("n_batches") == 3 and abs(got.get("mean_batch_size") - 1.0) < 1e-12
        )


@CHECKS.question("q4")
def q4(q):
    def largest(arrivals, batch, budget, service=SERVICE_MS, candidates=CANDIDATES_MS):
        return q.call("largest_delay_within_budget", arrivals, batch, candidates, budget, service)

    with q.step("largest_delay_within_budget at 400 requests per second"):
        got = largest(TRAFFIC_MS, 8, 20.0)
        q.expect(type(got) is float and got == 13.5, f"got {got!r}")
    with q.step("largest_delay_within_budget for other budgets, batch sizes and traffic"):
        got = largest([0.0, 1.0, 2.0, 3.0], 2, 1.5, Code("lambda size: 1.0"), [0.0, 1.0, 2.0])
        q.expect(got == 0.0, f"got {got!r}")
        got = largest(TRAFFIC_MS, 8, 15.0)
        q.expect(type(got) is float and got == 8.5, f"got {got!r}")
        got = largest(TRAFFIC_MS, 8, 5.0)
        q.expect(got is None, f"got {got!r}")
        q.expect(largest(TRAFFIC_MS, 4, 20.0) == 14.0)
        q.expect(largest(HEAVY_MS, 8, 18.0) == 12.5)
        q.expect(largest(HEAVY_MS, 8, 18.5) == 20.0)
