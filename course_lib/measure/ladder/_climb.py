"""The climb: targets taking turns at every rung of a ladder of offered rates, each until it misses.

:func:`climb` (and :func:`climb_async`, for an async ``run``) lay the climb out as one plan of tries
(:func:`_plan`) and run it; the rule (``SloRule``) judges each try. :func:`geometric_ladder` builds a
ladder, :func:`start_rungs` the rungs to start at from expected knees, :func:`open_loop_runs` the
``run`` for in-process targets.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import pandas as pd

from course_lib.core.checks import (
    InvalidArgumentError,
    distinct,
    instance_of,
    integer,
    non_empty,
    number,
    positive_number,
)
from course_lib.measure.loadgen import LoadResult, Send, run_open_loop

#: Rungs of the ladder are this far apart (2 ** (1/4): four rungs per doubling).
LADDER_RATIO = 2**0.25


def geometric_ladder(low_rps: float, high_rps: float, *, ratio: float = LADDER_RATIO) -> list[float]:
    """Rates from ``low_rps`` up to at least ``high_rps``, each ``ratio`` times the last, rounded to 3 digits.

    Raises
    ------
    ValueError
        For a rate that is not > 0 or a ratio that is not > 1.

    >>> geometric_ladder(100, 200)
    [100.0, 119.0, 141.0, 168.0, 200.0]
    """
    low, high = positive_number("low_rps", low_rps), positive_number("high_rps", high_rps)
    ratio = number("ratio", ratio, min=1, min_open=True)
    n = math.ceil(math.log(high / low) / math.log(ratio) - 1e-9) + 1
    return [float(f"{low * ratio**k:.3g}") for k in range(n)]


def start_rungs(
    knees_rps: Mapping[str, float], ladder_rps: Sequence[float], *, back: int = 3
) -> dict[str, float]:
    """Per target, the rung ``back`` rungs below the highest rung at or under its expected knee (or the first).

    >>> start_rungs({"a": 100.0, "b": 0.0}, [50, 70, 100, 140], back=1)
    {'a': 70.0, 'b': 50.0}
    """
    ladder = sorted(float(r) for r in ladder_rps)
    n_back = integer("back", back, min=0)
    out = {}
    for target, knee in knees_rps.items():
        at_or_below = bisect.bisect_right(ladder, max(float(knee), ladder[0]))
        out[target] = ladder[max(0, at_or_below - 1 - n_back)]
    return out


# -- the climb --------------------------------------------------------------------------------------
#: A try the climb asks for: (target, rate_rps, attempt); it is answered with the try's row.
_Try = tuple[str, float, int]


def _rung(target: str, rate: float, n_tries: int) -> Generator[_Try, dict[str, Any], bool]:
    """Up to ``n_tries`` tries of one rung; whether one met the SLO (a miss the rule won't retry ends it)."""
    for attempt in range(1, n_tries + 1):
        row = yield (target, rate, attempt)
        if row["met_slo"]:
            return True
        if not row.get("retry", True):
            return False
    return False


def _plan(
    order: list[str], ladder: list[float], starts: dict[str, float], *, tries: int, step_down: bool
) -> Generator[_Try, dict[str, Any], None]:
    """The climb as a sequence of tries: targets take turns at every rung, each stops after a rung missed.

    With ``step_down`` a target whose first rung run misses every try walks down the rungs below it, once
    each, until one is met (its climb ends there).
    """
    alive, ran = list(order), set()
    for rate in ladder:
        for target in [t for t in alive if starts[t] <= rate]:
            first = target not in ran  # the first rung this target runs: its start, or the rung above it
            ran.add(target)
            if (yield from _rung(target, rate, tries)):
                continue
            alive.remove(target)
            if step_down and first:
                below = [r for r in ladder if r < rate]
                while below and not (yield from _rung(target, below.pop(), 1)):  # going down, one try a rung
                    pass
        if not alive:
            break


@dataclass(frozen=True)
class _Setup:
    plan: Generator[_Try, dict[str, Any], None]
    repeat: int


def _setup(
    targets: Sequence[str],
    ladder_rps: Sequence[float],
    start_rps: Mapping[str, float] | None,
    retries: int,
    repeat: int,
    step_down: bool,
) -> _Setup:
    """Check the climb's inputs (before anything runs) and lay out its plan."""
    tries = integer("retries", retries, min=0) + 1
    repeat = integer("repeat", repeat, min=0)
    instance_of("step_down", step_down, bool)
    order = _target_names(targets)
    shift = repeat % len(order)
    order = order[shift:] + order[:shift]
    ladder = _ladder(ladder_rps)
    starts = _starts(start_rps, order, ladder)
    return _Setup(_plan(order, ladder, starts, tries=tries, step_down=step_down), repeat)


def _record(
    rows: list[dict[str, Any]],
    repeat: int,
    at: _Try,
    judged: dict[str, Any],
    on_row: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    target, rate, attempt = at
    row = {"repeat": repeat, "target": target, "attempt": attempt, "rate_rps": rate, **judged}
    rows.append(row)
    if on_row is not None:
        on_row(row)
    return row


def climb(
    run: Callable[[str, float], Any],
    targets: Sequence[str],
    ladder_rps: Sequence[float],
    *,
    rule: Callable[[Any], dict[str, Any]],
    start_rps: Mapping[str, float] | None = None,
    retries: int = 1,
    repeat: int = 0,
    step_down: bool = False,
    settle: Callable[[str], object] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    results: list[Any] | None = None,
) -> pd.DataFrame:
    """Climb ``ladder_rps`` with ``targets`` taking turns at every rung; one row per run.

    Parameters
    ----------
    run : callable (target, rate_rps) -> result
        One run of a target at a rate, e.g. an open-loop ``LoadResult`` (the caller sizes it with
        ``course_lib.measure.loadgen.rung_duration_s``).
    targets : list or tuple of distinct names, in the order they take turns at ``repeat`` 0; repeat r
        starts r places later.
    ladder_rps : distinct offered rates (requests/s), each finite and > 0; climbed in ascending order.
    rule : callable result -> row
        The per-rung rule (:class:`SloRule`): the row to record, with ``met_slo`` (bool) and optionally
        ``retry`` (False: a miss is not tried again).
    start_rps : target -> the rung it starts at (default the first); rungs below are taken as met.
    retries : int >= 0
        Extra tries of a missed rung; a target stops after a rung that missed every try.
    repeat : int >= 0
        Recorded in every row, and rotates the order.
    step_down : bool
        If the first rung a target runs (its start, or the rung above it) misses every try, try the rungs
        below it, one at a time and once each, until one is met or the ladder's first rung missed too: a
        start taken from another machine's record may lie above what this one sustains. The climb of that
        target ends there, and those rungs are run one target after the other, not in turns. Without it,
        such a target's knee is 0.
    settle : callable target -> anything, optional
        Run before every run (e.g. wait until that server has no backlog).
    on_row : callable row -> None, optional
        Progress.
    results : list, optional
        Each run's raw result is appended to it, in the order run (e.g. to re-judge them with ``step_table``).

    Returns
    -------
    DataFrame with ``repeat``, ``target``, ``attempt``, ``rate_rps`` and the rule's columns, in the order run.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For target names not in a list or tuple, or repeated, a ladder that is empty or holds a rate that
        is not finite and > 0 or holds one twice, a ``start_rps`` key that is not a target or a start
        outside the ladder, and a ``repeat`` below 0. ``ValueError`` (its base class) for the other counts.
    """
    setup = _setup(targets, ladder_rps, start_rps, retries, repeat, step_down)
    rows: list[dict[str, Any]] = []
    try:
        at = next(setup.plan)
        while True:
            if settle is not None:
                settle(at[0])
            result = run(at[0], at[1])
            if results is not None:
                results.append(result)
            at = setup.plan.send(_record(rows, setup.repeat, at, rule(result), on_row))
    except StopIteration:
        pass
    return pd.DataFrame(rows)


async def climb_async(
    run: Callable[[str, float], Awaitable[Any]],
    targets: Sequence[str],
    ladder_rps: Sequence[float],
    *,
    rule: Callable[[Any], dict[str, Any]],
    start_rps: Mapping[str, float] | None = None,
    retries: int = 1,
    repeat: int = 0,
    step_down: bool = False,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> pd.DataFrame:
    """:func:`climb` with an async ``run`` (awaited one at a time): the same plan, rows and errors."""
    setup = _setup(targets, ladder_rps, start_rps, retries, repeat, step_down)
    rows: list[dict[str, Any]] = []
    try:
        at = next(setup.plan)
        while True:
            result = await run(at[0], at[1])
            at = setup.plan.send(_record(rows, setup.repeat, at, rule(result), on_row))
    except StopIteration:
        pass
    return pd.DataFrame(rows)


def open_loop_runs(
    targets: Mapping[str, Callable[[], AbstractAsyncContextManager[Send]]],
    *,
    duration_s: float,
    request_timeout_s: float = 0.5,
    max_requests: int = 100_000,
    seed: int = 0,
    warmup_requests: int = 20,
) -> Callable[[str, float], Awaitable[LoadResult]]:
    """The ``run`` of :func:`climb_async` for in-process targets: a fresh context and an open-loop run.

    Parameters
    ----------
    targets : mapping name -> zero-argument factory of an async context manager yielding ``send``
        Each run enters a fresh context (e.g. a new ``DynamicBatcher`` or a new HTTP client) so runs
        do not share a backlog.
    duration_s : float > 0
        Length of each run (``max_duration_s`` of ``run_open_loop``).
    request_timeout_s : float > 0
        Give up on a request after this long (a failure already, so an overloaded run ends soon after
        ``duration_s``); 5 x the p99 limit, at least 0.5 s, is a good choice.
    max_requests : int
        Upper bound on requests per run.
    seed : int
        Arrival schedule seed: the same schedule for every target at a rung; each further try of a
        target at that rung draws the next seed.
    warmup_requests : int >= 0
        Requests sent one at a time before each run and not recorded (thread pools, caches, sockets).

    Raises
    ------
    ValueError
        For a duration or timeout that is not > 0 or a negative ``warmup_requests``.
    """
    positive_number("duration_s", duration_s)
    positive_number("request_timeout_s", request_timeout_s)
    n_warm = integer("warmup_requests", warmup_requests, min=0)
    tries: dict[tuple[str, float], int] = {}

    async def run(target: str, rate_rps: float) -> LoadResult:
        attempt = tries[(target, rate_rps)] = tries.get((target, rate_rps), 0) + 1
        async with targets[target]() as send:
            for i in range(n_warm):
                await send(i)
            return await run_open_loop(
                send,
                rate_rps=rate_rps,
                n_requests=max_requests,
                max_duration_s=duration_s,
                seed=seed + attempt - 1,
                request_timeout_s=request_timeout_s,
            )

    return run


def _target_names(targets: Sequence[str]) -> list[str]:
    order: list[str] = distinct("targets", instance_of("targets", targets, (list, tuple)))
    if not order:
        raise ValueError("targets must name at least one target")
    return order


def _ladder(ladder_rps: Sequence[float]) -> list[float]:
    rates = [positive_number("ladder_rps", r, unit="requests/s") for r in non_empty("ladder_rps", ladder_rps)]
    return sorted(distinct("ladder_rps", rates))


def _starts(start_rps: Mapping[str, float] | None, order: list[str], ladder: list[float]) -> dict[str, float]:
    given = dict(start_rps or {})
    unknown = sorted(set(given) - set(order), key=str)
    if unknown:
        raise InvalidArgumentError(
            f"start_rps names targets that are not climbed: {unknown!r} (targets: {order!r})"
        )
    return {
        target: number(
            f"start_rps[{target!r}]",
            given.get(target, ladder[0]),
            min=ladder[0],
            max=ladder[-1],
            unit="requests/s",
        )
        for target in order
    }
