"""The service waterfall: from the prototype to the production service one lever at a time, read off knees.

Each :class:`WaterfallStep` is one server configuration and endpoint, and names the step it changes one
lever from (its ``base``). :func:`interleaved_climb` climbs one ladder of offered rates with the steps
taking turns at every rung (in an order that rotates from repeat to repeat, so drift of a shared
machine and order effects hit them alike); each rung holds at least ``min_requests`` requests, enough
for the p99 it judges (10 / (1 - 0.99) = 1,000), and a missed rung is tried once more. Latency is
timed from each request's intended send time, so a generator that falls behind only makes a rung
harder to meet: a rung met is met, and a rung missed while the generator's send-lag p99 was over
its bound is flagged ``generator_bound`` (the generator, not the server, may have failed it). Every
scheduled request is sent (late if need be): none is dropped. :func:`knees` reads each step's knee per repeat (the highest rung met with every rung
above its start met too) and the first rung that failed; :func:`lever_table` turns them into ratios
to the base with the interval the ladder and the repeats allow:

    per repeat: knee / first_fail_base  <=  gain  <=  first_fail / knee_base

and over the repeats the lowest low and the highest high. A lever is a *gain* only when the whole
interval lies above 1, a *loss* only when it lies below 1; otherwise the run did not resolve it.

:func:`floor_model` says how close a service comes to its floor (the same stack doing no work) and what
its own measured work predicts.

References
----------
Google SRE book, ch. 4 (percentile SLOs). Gil Tene, "How NOT to measure latency" (send lag).
The 10 / (1 - q) rule: a p99 judged on n requests rests on its n / 100 slowest; with 1,000 that is ten.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
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
from course_lib.measure.knee import MAX_ERROR_RATE, step_row
from course_lib.measure.loadgen import MIN_REQUESTS_P99, LoadResult

#: Rungs of the ladder are this far apart (2 ** (1/4): four rungs per doubling).
LADDER_RATIO = 2**0.25


@dataclass(frozen=True)
class WaterfallStep:
    """One bar of the waterfall: ``server`` (a key of the benchmark's servers) and ``path`` under load,
    ``base`` the step it changes one ``lever`` from (None for the prototype)."""

    name: str
    server: str
    path: str
    base: str | None
    lever: str


def geometric_ladder(low_rps: float, high_rps: float, *, ratio: float = LADDER_RATIO) -> list[float]:
    """Rates from ``low_rps`` up to at least ``high_rps``, each ``ratio`` times the last, rounded to 3 digits.

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
    """Per step, the rung ``back`` rungs below the highest rung at or under its expected knee (or the first).

    >>> start_rungs({"a": 100.0, "b": 0.0}, [50, 70, 100, 140], back=1)
    {'a': 70.0, 'b': 50.0}
    """
    ladder = sorted(float(r) for r in ladder_rps)
    n_back = integer("back", back, min=0)
    out = {}
    for step, knee in knees_rps.items():
        at_or_below = bisect.bisect_right(ladder, max(float(knee), ladder[0]))
        out[step] = ladder[max(0, at_or_below - 1 - n_back)]
    return out


def interleaved_climb(
    run_step: Callable[[str, float], LoadResult],
    steps: Sequence[str],
    ladder_rps: Sequence[float],
    *,
    start_rps: Mapping[str, float] | None = None,
    p99_limit_ms: float,
    min_requests: int = MIN_REQUESTS_P99,
    retries: int = 1,
    repeat: int = 0,
    settle: Callable[[str], object] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    step_down: bool = False,
) -> pd.DataFrame:
    """Climb ``ladder_rps`` with ``steps`` taking turns at every rung; one row per run.

    Parameters
    ----------
    run_step : callable (step, rate_rps) -> LoadResult
        One open-loop run of a step at a rate (the caller sizes it with ``course_lib.measure.loadgen.rung_duration_s``).
    steps : names, in the order they take turns at ``repeat`` 0; repeat r starts r places later.
    ladder_rps : increasing offered rates (requests/s).
    start_rps : step -> the rung it starts at (default the first); rungs below are taken as met.
    p99_limit_ms : float > 0
        A run meets the SLO with p99 <= the limit (from the intended send times), errors < 0.1 % and
        at least ``min_requests`` requests sent.
    retries : int >= 0
        Extra tries of a missed rung; a step stops after a rung that missed every try.
    settle : callable step -> anything, optional
        Run before every run (e.g. wait until that server has no backlog).
    on_row : callable row -> None, optional
        Progress.
    step_down : bool
        If the first rung a step runs (its start, or the rung above it) misses every try, try the rungs
        below it, one at a time and once each, until one is met or the ladder's first rung missed too:
        a start taken from another machine's record may lie above what this one sustains. The climb of that step ends there
        (the rung above the one met missed). The rungs below are run then, one step after the other, not
        in turns. Without it, such a step's knee is 0.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For step names not in a list or tuple, or repeated, a ladder that is empty or holds a rate that is
        not finite and > 0 or holds one twice, a ``start_rps`` key that is not a step or a start outside
        the ladder, and a ``repeat`` below 0. ``ValueError`` (its base class) for the other counts.

    Returns
    -------
    DataFrame with ``repeat``, ``step``, ``attempt``, ``rate_rps``, the ``course_lib.measure.knee.step_row``
    columns, ``enough_requests`` and ``met`` (the rule above), in the order run.
    """
    limit = positive_number("p99_limit_ms", p99_limit_ms)
    n_min = integer("min_requests", min_requests, min=1)
    tries = integer("retries", retries, min=0) + 1
    repeat = integer("repeat", repeat, min=0)
    instance_of("step_down", step_down, bool)
    order = _step_names(steps)
    shift = repeat % len(order)
    order = order[shift:] + order[:shift]
    ladder = _ladder(ladder_rps)
    starts = _starts(start_rps, order, ladder)
    alive: list[str] = list(order)
    ran: set[str] = set()
    rows: list[dict[str, Any]] = []

    def rung(step: str, rate: float, n_tries: int = tries) -> bool:
        """Run ``step`` at ``rate`` up to ``n_tries`` times; whether a try met the SLO."""
        for attempt in range(1, n_tries + 1):
            if settle is not None:
                settle(step)
            row = step_row(run_step(step, rate), p99_limit_ms=limit, max_error_rate=MAX_ERROR_RATE)
            enough = row["sent"] >= n_min
            met = bool(row["met_slo"] and enough)
            rows.append({"repeat": repeat, "step": step, "attempt": attempt, **row,
                         "enough_requests": enough, "met": met})  # fmt: skip
            if on_row is not None:
                on_row(rows[-1])
            if met:
                return True
        return False

    for rate in ladder:
        for step in [s for s in alive if starts[s] <= rate]:
            first = step not in ran  # the first rung this step runs: its start, or the rung above it
            ran.add(step)
            if rung(step, rate):
                continue
            alive.remove(step)
            if step_down and first:
                below = [r for r in ladder if r < rate]
                while below and not rung(step, below.pop(), 1):  # going down, one try a rung
                    pass
        if not alive:
            break
    return pd.DataFrame(rows)


def _step_names(steps: Sequence[str]) -> list[str]:
    order: list[str] = distinct("steps", instance_of("steps", steps, (list, tuple)))
    if not order:
        raise ValueError("steps must name at least one step")
    return order


def _ladder(ladder_rps: Sequence[float]) -> list[float]:
    rates = [positive_number("ladder_rps", r, unit="requests/s") for r in non_empty("ladder_rps", ladder_rps)]
    return sorted(distinct("ladder_rps", rates))


def _starts(start_rps: Mapping[str, float] | None, order: list[str], ladder: list[float]) -> dict[str, float]:
    given = dict(start_rps or {})
    unknown = sorted(set(given) - set(order), key=str)
    if unknown:
        raise InvalidArgumentError(
            f"start_rps names steps that are not climbed: {unknown!r} (steps: {order!r})"
        )
    return {
        step: number(f"start_rps[{step!r}]", given.get(step, ladder[0]), min=ladder[0], max=ladder[-1],
                     unit="requests/s")
        for step in order
    }  # fmt: skip


def knees(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (repeat, step): ``knee_rps`` (highest rung met, every rung met up to it; 0 if the first missed),
    ``first_fail_rps`` (the rung that missed every try; NaN if none did: the ladder ended first) and
    ``generator_bound`` (that rung missed because the generator fell behind, not the server)."""
    out = []
    for key, runs_ in runs.groupby(["repeat", "step"], sort=False):
        repeat, step = cast(tuple[int, str], key)  # the two group columns
        by_rate = runs_.groupby("rate_rps", sort=True)
        met = by_rate["met"].any()
        failed = met.index[~met.to_numpy()]
        first_fail = float(failed[0]) if len(failed) else math.nan
        passed = met.index[met.to_numpy() & (met.index < (first_fail if len(failed) else math.inf))]
        last = runs_[runs_["rate_rps"] == first_fail] if len(failed) else runs_.iloc[0:0]
        out.append(
            {
                "repeat": int(repeat),
                "step": step,
                "knee_rps": float(passed.max()) if len(passed) else 0.0,
                "first_fail_rps": first_fail,
                "generator_bound": bool(len(last) and not last["generator_ok"].any()),
            }
        )
    return pd.DataFrame(out)


def lever_verdict(low: float, high: float) -> str:
    """``"gain"`` if the interval [low, high] lies above 1, ``"loss"`` if below, else ``"not resolved"``.

    >>> lever_verdict(1.2, 3.0), lever_verdict(0.4, 0.9), lever_verdict(0.8, 1.5)
    ('gain', 'loss', 'not resolved')
    """
    if low > 1:
        return "gain"
    if high < 1:
        return "loss"
    return "not resolved"


def _ratio_bounds(k: pd.Series, ff: pd.Series, kb: pd.Series, ffb: pd.Series) -> tuple[float, float]:
    lows = [a / b if b > 0 and math.isfinite(b) else 0.0 for a, b in zip(k, ffb, strict=True)]
    highs = [a / b if b > 0 and math.isfinite(a) else math.inf for a, b in zip(ff, kb, strict=True)]
    return float(min(lows)), float(max(highs))


def lever_table(steps: Sequence[WaterfallStep], knee_table: pd.DataFrame) -> pd.DataFrame:
    """One row per step: knees over the repeats, the ratio to its base and the verdict on the lever.

    Returns
    -------
    DataFrame indexed by step name with ``lever``, ``base``, ``knee_rps`` (list, one per repeat),
    ``median_knee_rps``, ``median_first_fail_rps`` (NaN where no rung failed), ``min_knee_rps``,
    ``max_knee_rps``, ``ratio_to_base`` (median over median),
    ``ratio_low``/``ratio_high`` (the interval in the module docstring; NaN without a base) and
    ``verdict`` (:func:`lever_verdict`; ``""`` without a base).
    """
    rows = {}
    by_step = {name: part.sort_values("repeat") for name, part in knee_table.groupby("step")}
    for step in steps:
        part = by_step.get(step.name)
        if part is None:
            continue
        row: dict[str, Any] = {
            "lever": step.lever,
            "base": step.base or "",
            "knee_rps": [float(x) for x in part["knee_rps"]],
            "first_fail_rps": [float(x) for x in part["first_fail_rps"]],
            "median_knee_rps": float(np.median(part["knee_rps"])),
            "median_first_fail_rps": float(part["first_fail_rps"].median()),
            "min_knee_rps": float(part["knee_rps"].min()),
            "max_knee_rps": float(part["knee_rps"].max()),
            "generator_bound": bool(part["generator_bound"].any()),
        }
        base = by_step.get(step.base) if step.base else None
        if base is not None and len(base) == len(part):
            low, high = _ratio_bounds(
                part["knee_rps"], part["first_fail_rps"], base["knee_rps"], base["first_fail_rps"]
            )
            base_median = float(np.median(base["knee_rps"]))
            row.update(
                ratio_to_base=row["median_knee_rps"] / base_median if base_median > 0 else math.nan,
                ratio_low=low,
                ratio_high=high,
                verdict=lever_verdict(low, high),
            )
        else:
            row.update(ratio_to_base=math.nan, ratio_low=math.nan, ratio_high=math.nan, verdict="")
        rows[step.name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def floor_model(table: pd.DataFrame, *, service: str, floor: str, workers: int) -> dict[str, float]:
    """How close a service comes to its floor, and what its own measured work predicts.

    Each request costs the stack ``s`` ms of CPU, read off the floor (the same stack and ``workers``
    answering a constant): ``s = 1000 x workers / floor knee``; the service adds its measured work ``w``
    (``handle_ms``, from ``Server-Timing``). Then floor ~ workers / s, service ~ workers / (s + w), and
    the service reaches ``s / (s + w)`` of its floor.

    Parameters
    ----------
    table : a waterfall table (``median_knee_rps`` and ``handle_ms`` by step name).
    service, floor : step names.
    workers : int >= 1

    Returns
    -------
    dict with ``floor_rps``, ``service_rps``, ``measured_fraction`` (service / floor), ``stack_ms`` (s),
    ``work_ms`` (w) and ``predicted_fraction`` (s / (s + w)).

    >>> t = pd.DataFrame({"median_knee_rps": [1000.0, 2000.0], "handle_ms": [1.0, 0.0]}, index=["svc", "null"])
    >>> floor_model(t, service="svc", floor="null", workers=2)["predicted_fraction"]
    0.5
    """
    n = integer("workers", workers, min=1)
    floor_rps, service_rps = (
        float(table["median_knee_rps"].loc[floor]),
        float(table["median_knee_rps"].loc[service]),
    )
    stack_ms = 1000.0 * n / floor_rps if floor_rps > 0 else math.nan
    work_ms = float(table["handle_ms"].loc[service])
    return {
        "floor_rps": floor_rps,
        "service_rps": service_rps,
        "measured_fraction": service_rps / floor_rps if floor_rps > 0 else math.nan,
        "stack_ms": stack_ms,
        "work_ms": work_ms,
        "predicted_fraction": stack_ms / (stack_ms + work_ms),
    }
