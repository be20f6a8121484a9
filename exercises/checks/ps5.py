"""The grader's checks of ps5 (instructors only: the scenarios and what each must show).

Each scenario is grader-written code the student's kernel runs with the grader's own fake replica
(``REPLICA``, not the notebook's copy) and the student's ``hedged`` or ``latencies_ms``; it sends back
what happened (who answered, what was called and cancelled) as data, judged here.
"""

import numpy as np

from course_lib.grading.checks import Checks, is_float, is_float_array

CHECKS = Checks("ps5")

REPLICA = """
import asyncio
import random
import time


class Replica:
    def __init__(self, name, *, fast_ms=1.0, slow_ms=50.0, slow_probability=0.0, seed=0):
        self.name, self.fast_ms, self.slow_ms = name, fast_ms, slow_ms
        self.slow_probability = slow_probability
        self._rng = random.Random(seed)
        self.calls = self.completed = self.cancelled = self.slow_draws = 0

    async def score(self, customer_id):
        self.calls += 1
        slow = self._rng.random() < self.slow_probability
        self.slow_draws += slow
        try:
            await asyncio.sleep((self.slow_ms if slow else self.fast_ms) / 1000)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.completed += 1
        return f"{self.name}:{customer_id}"


def counts(*replicas):
    return [[r.calls, r.cancelled] for r in replicas]


async def outcome(awaitable, timeout=10):
    try:
        return {"answer": await asyncio.wait_for(awaitable, timeout)}
    except asyncio.TimeoutError:
        return {"error": "timed out"}
    except Exception as error:
        return {"error": type(error).__name__}


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)
"""


def scenario(body: str) -> str:
    """``async def check(ns)`` running ``body`` (indented 4) after the replica's definitions."""
    lines = "\n".join("    " + line if line else line for line in body.strip("\n").split("\n"))
    return REPLICA + "\n\nasync def check(ns):\n    hedged = ns['hedged']\n" + lines + "\n"


SCENARIOS = {
    "an answer in time sends no hedge": (
        """
fast, spare = Replica("a", fast_ms=0.0), Replica("b", fast_ms=0.0)
got = await outcome(hedged(lambda r: r.score("c1"), [fast, spare], hedge_after_ms=1000))
return [got, counts(fast, spare)]
""",
        [{"answer": "a:c1"}, [[1, 0], [0, 0]]],
    ),
    "a stuck primary is hedged and cancelled": (
        """
stuck, spare = Replica("a", fast_ms=60_000.0), Replica("b", fast_ms=0.0)
got = await outcome(hedged(lambda r: r.score("c2"), [stuck, spare], hedge_after_ms=5))
await settle()
return [got, counts(stuck, spare)]
""",
        [{"answer": "b:c2"}, [[1, 1], [1, 0]]],
    ),
    "at most one hedge, whatever the number of replicas": (
        """
stuck, spare, third = Replica("a", fast_ms=60_000.0), Replica("b", fast_ms=0.0), Replica("c", fast_ms=0.0)
got = await outcome(hedged(lambda r: r.score("c3"), [stuck, spare, third], hedge_after_ms=1))
await settle()
return [got, counts(stuck, spare, third)]
""",
        [{"answer": "b:c3"}, [[1, 1], [1, 0], [0, 0]]],
    ),
    "a primary that answers after the hedge was sent wins": (
        """
primary_gate, hedge_sent = asyncio.Event(), asyncio.Event()
hedge_cancelled = []


async def gated_call(replica):
    if replica == "primary":
        await primary_gate.wait()
        return "primary"
    hedge_sent.set()
    primary_gate.set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        hedge_cancelled.append(True)
        raise
    return "hedge"


got = await outcome(hedged(gated_call, ["primary", "hedge"], 1))
await settle()
return [got, hedge_sent.is_set(), hedge_cancelled]
""",
        [{"answer": "primary"}, True, [True]],
    ),
    "a single replica: no hedge, its answer": (
        """
lone = Replica("a", fast_ms=5.0)
got = await outcome(hedged(lambda r: r.score("c4"), [lone], hedge_after_ms=0))
return [got, counts(lone)]
""",
        [{"answer": "a:c4"}, [[1, 0]]],
    ),
    "a zero delay hedges at once": (
        """
stuck, spare = Replica("a", fast_ms=60_000.0), Replica("b", fast_ms=0.0)
got = await outcome(hedged(lambda r: r.score("c5"), [stuck, spare], 0))
await settle()
return [got, counts(stuck, spare)]
""",
        [{"answer": "b:c5"}, [[1, 1], [1, 0]]],
    ),
    "the first request to finish raises: its error, the other cancelled": (
        """
class ReplicaDownError(Exception):
    pass


cancelled = []


async def failing_call(replica):
    if replica == "slow":
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(replica)
            raise
        return "slow"
    raise ReplicaDownError("replica down")


got = await outcome(hedged(failing_call, ["slow", "broken"], 1))
await settle()
return [got, cancelled]
""",
        [{"error": "ReplicaDownError"}, ["slow"]],
    ),
    "cancelling hedged cancels every request it started": (
        """
stuck_a, stuck_b = Replica("a", fast_ms=60_000.0), Replica("b", fast_ms=60_000.0)
outer = asyncio.ensure_future(hedged(lambda r: r.score("c6"), [stuck_a, stuck_b], 1))
for _ in range(2000):
    if stuck_b.calls:
        break
    await asyncio.sleep(0.001)
outer.cancel()
try:
    await asyncio.wait_for(outer, 5)
except BaseException as error:
    ended = type(error).__name__
else:
    ended = "returned"
await settle()
return [ended, counts(stuck_a, stuck_b)]
""",
        ["CancelledError", [[1, 1], [1, 1]]],
    ),
    "bad arguments raise ValueError": (
        """
spare = Replica("b", fast_ms=0.0)
return [await outcome(hedged(lambda r: r.score("c7"), [], 10)), await outcome(hedged(lambda r: r.score("c7"), [spare], -1))]
""",
        [{"error": "ValueError"}, {"error": "ValueError"}],
    ),
}


@CHECKS.question("q1")
def q1(q):
    for label, (body, expected) in SCENARIOS.items():
        with q.step(f"hedged: {label}"):
            got = q.run(scenario(body), asynchronous=True)
            q.expect(got == expected, f"got {got!r}, expected {expected!r}")


RUNS = (
    REPLICA
    + """

async def check(ns, n_requests, hedge_after_ms):
    hedged, latencies_ms = ns["hedged"], ns["latencies_ms"]
    ids = [f"SC-{i:07d}" for i in range(1, n_requests + 1)]

    def fresh():
        return (
            Replica("A", fast_ms=1.0, slow_ms=200.0, slow_probability=0.02, seed=1),
            Replica("B", fast_ms=1.0, slow_ms=200.0, slow_probability=0.02, seed=2),
        )

    plain_a, plain_b = fresh()
    plain = await asyncio.wait_for(latencies_ms(plain_a.score, ids), 12)
    hedged_a, hedged_b = fresh()
    run = await asyncio.wait_for(
        latencies_ms(lambda cid: hedged(lambda r: r.score(cid), [hedged_a, hedged_b], hedge_after_ms), ids), 12
    )
    return {
        "plain_ms": plain, "hedged_ms": run,
        "plain": [plain_a.calls, plain_b.calls, plain_a.slow_draws],
        "hedged": [hedged_a.calls, hedged_b.calls, hedged_a.slow_draws, hedged_a.cancelled],
    }
"""
)

PROBE = """
import asyncio
import time


async def check(ns, sleeps_ms):
    sent = []

    async def counted(customer_id):
        start = time.perf_counter()
        await asyncio.sleep(sleeps_ms[int(customer_id)] / 1000)
        sent.append((time.perf_counter() - start) * 1000)
        return customer_id

    ids = [str(i) for i in range(len(sleeps_ms))]
    return [await asyncio.wait_for(ns["latencies_ms"](counted, ids), 10), sent]
"""
#: How long each of the probe's requests takes, ms: one long request among short ones, so that times
#: that are not each request's own (a constant, the time since the first request) add up to more than
#: the whole call took.
PROBE_SLEEPS_MS = [1.0] * 7 + [25.0] + [1.0] * 8


@CHECKS.question("q2")
def q2(q):
    n = 300
    with q.step("latencies_ms with and without hedging against the grader's replicas"):
        got = q.run(RUNS, n, 10.0, asynchronous=True)
        run_ms = q.last_elapsed_s * 1000  # the grader's clock: the kernel's cannot be trusted
        q.expect(
            isinstance(got, dict) and set(got) == {"plain_ms", "hedged_ms", "plain", "hedged"}, f"{got!r}"
        )
        plain_ms, hedged_ms = got["plain_ms"], got["hedged_ms"]
        q.expect(is_float_array(plain_ms, (n,)) and is_float_array(hedged_ms, (n,)), "two float arrays")
        q.expect((plain_ms > 0).all() and (hedged_ms > 0).all(), "positive wall times")
        (plain_a, plain_b, slow_plain), (calls_a, calls_b, slow_a, cancelled_a) = got["plain"], got["hedged"]
        q.expect(plain_a == n and plain_b == 0, f"plain run {got['plain']}")
        # every slow primary (200 ms against a 10 ms hedge delay) was hedged; a busy machine only adds hedges
        q.expect(calls_b >= slow_a == slow_plain > 0 and cancelled_a >= 1, f"hedged run {got['hedged']}")
        q.expect(0 < (calls_a + calls_b) / n - 1 < 0.5, "extra load between 0 and 50 %")
        q.expect((plain_ms >= 200.0).sum() >= slow_plain, "each slow plain request took its 200 ms")
        # one request after another: their wall times add up to at most the whole request's
        total_ms = float(plain_ms.sum() + hedged_ms.sum())
        q.expect(total_ms <= run_ms + 1.0, f"wall times add up to {total_ms:.0f} ms in {run_ms:.0f} ms")
    with q.step("latencies_ms times each request"):
        got = q.run(PROBE, PROBE_SLEEPS_MS, asynchronous=True)
        probe_ms = q.last_elapsed_s * 1000
        q.expect(isinstance(got, list) and len(got) == 2, f"{got!r}")
        probe, sent = got
        q.expect(is_float_array(probe, (len(PROBE_SLEEPS_MS),)), f"got {probe!r}")
        q.expect(
            all(p >= s - 0.05 for p, s in zip(probe, PROBE_SLEEPS_MS, strict=True))
            and all(p >= s - 0.5 for p, s in zip(probe, sent, strict=True)),
            f"each wall time covers its request: {probe}",
        )
        q.expect(
            probe.sum() <= probe_ms + 1.0, f"wall times add up to {probe.sum():.1f} ms in {probe_ms:.1f} ms"
        )
    with q.step("extra_load of your own run"):
        got = q.value("[float(extra_load), hedged_a.calls, hedged_b.calls, N_REQUESTS]")
        q.expect(isinstance(got, list) and len(got) == 4, f"{got!r}")
        extra, calls_a, calls_b, requests = got
        q.expect(is_float(extra) and abs(extra - ((calls_a + calls_b) / requests - 1)) < 1e-12, f"{got}")


@CHECKS.question("q3")
def q3(q):
    sample = np.arange(1, 101, dtype=float)
    with q.step("hedge_after_for of a 1-100 ms sample"):
        for load, expected in ((0.05, 95.0), (0.5, 50.0)):
            got = q.call("hedge_after_for", sample, load)
            q.expect(is_float(got) and got == expected, f"{load}: got {got!r}")
    with q.step("hedge_after_for of other samples and loads"):
        for data, load, expected in (
            ([7.0, 1.0, 3.0], 0.01, 7.0),
            (np.arange(1, 1001, dtype=float), 0.001, 999.0),
            ([4.0] * 10, 0.2, 4.0),
        ):
            got = q.call("hedge_after_for", data, load)
            q.expect(is_float(got) and got == expected, f"{load}: got {got!r}")
    with q.step("hedge_after_for of a load outside (0, 1)"):
        for bad in (0, 1, -0.1, 1.5):
            q.raises("ValueError", "hedge_after_for", sample, bad)
