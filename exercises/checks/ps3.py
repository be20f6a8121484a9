"""The grader's checks of ps3 (instructors only: the hidden inputs and the answers they must give).

Run in the grader's process by ``course_lib.grading.execute.GuardedExecute``; see
``course_lib.grading.checks`` for the API.
"""

import math

from course_lib.grading.checks import Checks, is_int

CHECKS = Checks("ps3")

CPU = {"rps_per_replica": 50, "price_per_hour": 40.0}
GPU = {"rps_per_replica": 600, "price_per_hour": 250.0}


def number(value) -> bool:
    """A finite int or float (not a bool, not a subclass that claims equality)."""
    return type(value) in (int, float) and math.isfinite(value)


@CHECKS.question("q1")
def q1(q):
    with q.step("annual_cost of the always-on instance and the spot job"):
        always_on = q.call("annual_cost", 0.17, 24, 365)
        spot = q.call("annual_cost", 0.04, 0.5, 52)
        q.expect(number(always_on) and abs(always_on - 1489.20) <= 1e-6, f"got {always_on!r}")
        q.expect(number(spot) and abs(spot - 1.04) <= 1e-9, f"got {spot!r}")
    with q.step("annual_cost with other prices and schedules"):
        got = q.call("annual_cost", 1.01, 24, 365)
        q.expect(number(got) and abs(got - 8847.6) <= 1e-6, f"got {got!r}")
        got = q.call("annual_cost", 0.102, 0.2, 12)
        q.expect(number(got) and abs(got - 0.2448) <= 1e-9, f"got {got!r}")
        got = q.call("annual_cost", 3.0, 2, 0)
        q.expect(number(got) and got == 0, f"got {got!r}")


@CHECKS.question("q2")
def q2(q):
    with q.step("cost_per_million of the source lesson's architecture"):
        got = q.call("cost_per_million", 727.20, 1_000_000)
        q.expect(number(got) and abs(got - 727.20) <= 1e-9, f"got {got!r}")
        got = q.call("cost_per_million", 1.2 * 0.17 * 720, 1_500_000)
        q.expect(number(got) and abs(got - 97.92) <= 1e-6, f"got {got!r}")
    with q.step("cost_per_million of other bills and volumes"):
        got = q.call("cost_per_million", 0.0204, 1_000_000)
        q.expect(number(got) and abs(got - 0.0204) <= 1e-12, f"got {got!r}")
        got = q.call("cost_per_million", 500.0, 250_000)
        q.expect(number(got) and abs(got - 2000.0) <= 1e-9, f"got {got!r}")
    with q.step("cost_per_million without predictions"):
        for bad in (0, -5):
            q.raises("ValueError", "cost_per_million", 100.0, bad)
    with q.step("cost_per_million_at_full_use"):
        for price, rps, expected, tol in (
            (40.0, 50, 222.2222, 1e-3),
            (250.0, 600, 115.7407, 1e-3),
            (1.01, 400, 0.70138888, 1e-6),
            (3.6, 1, 1000.0, 1e-9),
        ):
            got = q.call("cost_per_million_at_full_use", price, rps)
            q.expect(number(got) and abs(got - expected) <= tol, f"{price}, {rps}: got {got!r}")


@CHECKS.question("q3")
def q3(q):
    with q.step("replicas_needed and monthly_cost of the Kirana Kart options"):
        cpu, gpu = q.call("replicas_needed", 278, 50, 0.30, 2), q.call("replicas_needed", 278, 600, 0.30, 2)
        q.expect(is_int(cpu) and cpu == 8 and is_int(gpu) and gpu == 2, f"got {cpu!r}, {gpu!r}")
        cost = q.call("monthly_cost", 40.0, 8), q.call("monthly_cost", 250.0, 2)
        q.expect(all(number(c) for c in cost) and cost == (230_400, 360_000), f"got {cost!r}")
    with q.step("replicas_needed with other traffic, headroom and floors"):
        for args, expected in (
            ((100, 30, 0.5, 1), 5),
            ((100, 10, 0.1, 1), 11),
            ((10, 50, 0.3, 2), 2),
            ((1000, 64, 0.25, 3), 20),
            ((0, 50, 0.3, 3), 3),
        ):
            got = q.call("replicas_needed", *args)
            q.expect(is_int(got) and got == expected, f"{args}: got {got!r}")
    with q.step("monthly_cost with other prices and months"):
        got = q.call("monthly_cost", 250.0, 3)
        q.expect(number(got) and got == 540_000, f"got {got!r}")
        got = q.call("monthly_cost", 40.0, 8, hours_per_month=744)
        q.expect(number(got) and got == 238_080, f"got {got!r}")


@CHECKS.question("q4")
def q4(q):
    with q.step("break_even_rps of the Kirana Kart options"):
        got = q.call("break_even_rps", CPU, GPU, 0.30, 2)
        q.expect(is_int(got) and got == 462, f"got {got!r}")
    with q.step("break_even_rps with other options, headroom and floors"):
        for args, expected in (
            ((CPU, GPU, 0.3, 1), 231),
            ((CPU, GPU, 0.0, 2), 601),
            ((CPU, GPU, 0.3, 4), 962),
            (
                (
                    {"rps_per_replica": 20, "price_per_hour": 0.17},
                    {"rps_per_replica": 400, "price_per_hour": 1.01},
                    0.3,
                    2,
                ),
                170,
            ),
        ):
            got = q.call("break_even_rps", *args)
            q.expect(is_int(got) and got == expected, f"{args}: got {got!r}")
        got = q.call(
            "break_even_rps", CPU, {"rps_per_replica": 600, "price_per_hour": 1000.0}, 0.3, 2, max_rps=3000
        )
        q.expect(got is None, f"got {got!r}")
