"""k6 beside the course generator on one service: the two open-loop tools taking turns, and whether they agree.

:func:`tool_comparison` climbs a ladder of offered rates on one URL with the two tools taking turns at
every rate, as ``course_lib.measure.ladder.climb`` climbs the waterfall's steps: which
tool goes first alternates from repeat to repeat (so drift of a shared machine and order hit both alike),
a missed rate is tried once more (one descheduling should not end a climb), a tool leaves the climb after
a rate it missed on every try, and the climb is repeated ``repeats`` times. :func:`tool_agreement` reads
each tool's knee per repeat (the highest rate met with every lower rate met too), their medians and
ranges, and the two tools' p50s at the rates both met.

Each tool keeps its own definition of latency (see ``course_lib.measure.load_tools.k6``); the like-for-like
figure is the time on the wire, from a request's write to its answer's last byte (k6's
``http_req_duration``, the wire client's ``wire_ms``). Both open keep-alive connections before the measured
run (the generator 8 per process, ``warm_connections``, and more during the run when more requests are in
flight; k6 one per pre-allocated virtual user, in its warm-up scenario).

References
----------
k6 documentation: "Constant arrival rate", "Dropped iterations", "Built-in metrics". Gil Tene, "How NOT to
measure latency" (send lag). The 10 / (1 - q) rule for the requests a rung needs: ``MIN_REQUESTS_P99``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from course_lib.core import checks
from course_lib.core.checks import integer, positive_number
from course_lib.core.percentiles import percentile
from course_lib.measure.generators import GeneratorPool
from course_lib.measure.ladder import climb, knees, step_row
from course_lib.measure.load_tools.k6 import run_k6
from course_lib.measure.loadgen import MIN_REQUESTS_P99, SPIN_WINDOW_S, LoadResult, rung_duration_s
from course_lib.measure.targets import WIRE_FIELD

#: The two tools, in the order they take turns at repeat 0.
TOOLS = ("course generator", "k6")
#: How far apart k6 and the course generator may be and still agree (issue 24: "within 20 %").
AGREEMENT_TOLERANCE = 0.2


def tool_comparison(
    pool: GeneratorPool,
    url: str,
    ids: Sequence[str],
    ladder_rps: Sequence[float],
    *,
    p99_limit_ms: float,
    min_requests: int = MIN_REQUESTS_P99,
    repeats: int = 3,
    retries: int = 1,
    settle: Callable[[], object] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    max_vus: int = 400,
    pre_allocated_vus: int = 200,
    spin_s: float = SPIN_WINDOW_S,
    order_shift: int = 0,
) -> pd.DataFrame:
    """The course generator and k6 taking turns at each rate on ``url``, ``repeats`` times.

    Parameters
    ----------
    pool : the course generator's processes.
    url : the endpoint both tools POST ``{"customer_id": ...}`` to, ids drawn from ``ids`` in turn.
    ladder_rps : offered rates (requests/s), climbed from the lowest.
    p99_limit_ms : float > 0
        A run meets the SLO with its p99 within the limit (each tool on its own definition), errors below
        0.1 %, at least ``min_requests`` requests sent, and for k6 no iteration dropped.
    min_requests : int >= 1
        Requests a run needs (each lasts :func:`rung_duration_s`; 1,000 judge a p99).
    repeats : int >= 1
        Climbs; in repeat r the tool ``TOOLS[(r + order_shift) % 2]`` goes first at every rate.
    retries : int >= 0
        Extra tries of a missed rate; a tool leaves the climb after a rate that missed every try.
    settle : callable, optional
        Run before every run (e.g. wait until the server has no backlog).
    on_row : callable row -> None, optional
        Progress: each run's row of the climb (``course_lib.measure.ladder.climb``: ``target`` is the tool,
        ``met_slo`` the verdict).
    max_vus, pre_allocated_vus : k6's virtual users (``run_k6``).
    spin_s : float in [0, 1)
        The course generator's spin window before each send (``GeneratorPool.run``; 0: none, it sleeps on its
        loop's timer and yields to the loop only for what remains if the timer wakes it early).
    order_shift : int >= 0
        Shifts which tool goes first (a caller that runs one repeat at a time passes its repeat number).

    Returns
    -------
    DataFrame, one row per run, in the order run: ``tool``, ``repeat``, ``attempt``, ``rate_rps``, ``sent``,
    ``achieved_rps``, ``p50_ms``, ``p99_ms`` (each tool on its own definition: the course generator from
    the intended send time, k6 from the actual send), ``p50_from_send_ms`` (both from the actual send:
    the course generator's latency minus its send lag, request by request; it still holds the client's
    work before the write and after the read), ``p50_wire_ms`` (both from the request's write to its
    answer's read; the like-for-like one), ``errors`` (share), ``dropped`` (k6's ``dropped_iterations``;
    the course generator sends every request, late if need be, so 0), ``lag_p99_ms`` (course generator),
    ``enough_requests`` and ``met``.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For ``repeats`` < 1, ``retries`` < 0, ``min_requests`` < 1, a limit that is not > 0, an empty
        ladder or ``ids``, ``pre_allocated_vus`` above ``max_vus``, a ``spin_s`` outside [0, 1) or a negative
        ``order_shift`` (all before anything runs). RuntimeError if k6 fails (``run_k6``).
    """
    limit = positive_number("p99_limit_ms", p99_limit_ms)
    n_min = integer("min_requests", min_requests, min=1)
    n_repeats = integer("repeats", repeats, min=1)
    shift = integer("order_shift", order_shift, min=0) % len(TOOLS)
    run = _tool_runs(
        pool, url, ids, n_min=n_min, limit_ms=limit, vus=(pre_allocated_vus, max_vus), spin_s=spin_s
    )
    order = list(TOOLS[shift:] + TOOLS[:shift])  # repeat r starts r places later (climb rotates it)
    climbs = [
        climb(run, order, ladder_rps, rule=partial(_enough, n_min=n_min), retries=retries, repeat=repeat,
              settle=None if settle is None else (lambda _: settle()), on_row=on_row)
        for repeat in range(n_repeats)
    ]  # fmt: skip
    # the tools table keeps its own names: the recorded waterfall's meta.tools and spin_table read them
    return pd.concat(climbs, ignore_index=True).rename(columns={"target": "tool", "met_slo": "met"})


def _enough(row: dict[str, Any], *, n_min: int) -> dict[str, Any]:
    """The per-rung rule of :func:`tool_comparison`: the tool's own verdict, and at least ``n_min`` sent."""
    enough = row["sent"] >= n_min
    return {**row, "enough_requests": enough, "met_slo": bool(row["met_slo"] and enough)}


def _tool_runs(
    pool: GeneratorPool,
    url: str,
    ids: Sequence[str],
    *,
    n_min: int,
    limit_ms: float,
    vus: tuple[int, int],
    spin_s: float,
) -> Callable[[str, float], dict[str, Any]]:
    """``run(tool, rate)`` for :func:`tool_comparison`: one run of k6 or of the course generator, as a row.

    Checks ``ids`` (non-empty), ``vus`` (pre-allocated >= 1, at most the maximum) and ``spin_s`` (in [0, 1)).
    """
    checks.non_empty("ids", ids)
    integer("max_vus", vus[1], min=integer("pre_allocated_vus", vus[0], min=1))
    spin_s = checks.number("spin_s", spin_s, min=0, max=1, max_open=True, unit="s")
    payloads = [{"customer_id": c} for c in ids]

    def run(tool: str, rate: float) -> dict[str, Any]:
        duration = rung_duration_s(rate, min_requests=n_min)
        if tool == "k6":
            r = run_k6(
                url, rate_rps=rate, duration_s=duration, ids=ids, pre_allocated_vus=vus[0], max_vus=vus[1]
            )
            return _k6_row(r, limit_ms)
        result = pool.run(url, payloads, rate_rps=rate, duration_s=duration, seed=int(rate), fields=(WIRE_FIELD,),
                          spin_s=spin_s)  # fmt: skip
        return _generator_row(result, limit_ms)

    return run


def _k6_row(r: Any, limit_ms: float) -> dict[str, Any]:
    """One k6 run as a row of :func:`tool_comparison` (its own definitions: from the actual send)."""
    return {"sent": r.requests, "achieved_rps": r.achieved_rps, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
            "p50_from_send_ms": r.p50_ms, "p50_wire_ms": r.p50_ms, "errors": r.failed_rate,
            "dropped": r.dropped_iterations, "lag_p99_ms": math.nan, "met_slo": r.met_slo(limit_ms)}  # fmt: skip


def _generator_row(result: LoadResult, limit_ms: float) -> dict[str, Any]:
    """One course-generator run as a row of :func:`tool_comparison` (p99 from the intended send time)."""
    s = step_row(result, p99_limit_ms=limit_ms)
    ok = result.requests[result.requests["ok"]]
    from_send = (ok["latency_ms"] - ok["lag_ms"]).to_numpy()
    return {"sent": s["sent"], "achieved_rps": s["achieved_rps"], "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"],
            "p50_from_send_ms": percentile(from_send, 50) if len(from_send) else math.nan,
            "p50_wire_ms": percentile(ok[WIRE_FIELD].to_numpy(), 50) if len(ok) else math.nan,
            "errors": s["error_rate"], "dropped": 0, "lag_p99_ms": s["lag_p99_ms"],
            "met_slo": bool(s["met_slo"])}  # fmt: skip


def _rungs(tools: pd.DataFrame, p50_column: str) -> pd.DataFrame:
    """One row per tool, repeat and rate: ``met`` (a try met) and the p50 of the try that met (NaN if none).

    Raises ValueError if a column is missing, a tool has no row, or a repeat has rows of one tool only.
    """
    missing = {"tool", "rate_rps", "met", p50_column} - set(tools.columns)
    if missing:
        raise ValueError(f"tools is missing columns {sorted(missing)}")
    for tool in TOOLS:
        if not (tools["tool"] == tool).any():
            raise ValueError(f"tools has no row for {tool!r}")
    t = tools.copy()
    if "repeat" not in t.columns:  # a record made before the repeats
        t["repeat"] = 0
    t["met"] = t["met"].astype(bool)
    t["p50"] = t[p50_column].where(t["met"])
    rungs = t.groupby(["tool", "repeat", "rate_rps"], as_index=False).agg(
        met=("met", "any"), p50=("p50", "first")
    )
    tools_by_repeat = rungs.groupby("repeat")["tool"].nunique()
    if (tools_by_repeat < len(TOOLS)).any():
        lone = [int(r) for r in tools_by_repeat.index[tools_by_repeat < len(TOOLS)]]
        raise ValueError(
            f"tools has repeats {lone} with rows of one tool only; each repeat needs both {TOOLS}"
        )
    return rungs


def tool_agreement(
    tools: pd.DataFrame, *, tolerance: float = AGREEMENT_TOLERANCE, p50_column: str = "p50_wire_ms"
) -> dict[str, Any]:
    """Whether k6 and the course generator agree on one service: its knee, and its p50 at the same rates.

    Parameters
    ----------
    tools : DataFrame
        :func:`tool_comparison`'s table (``tool``, ``rate_rps``, ``met``, ``p50_column`` and, where the
        climb was repeated, ``repeat``; a rate counts as met if any of its tries met).
    tolerance : float in (0, 1)
        Largest relative difference that still agrees: ``|ratio - 1| <= tolerance``.
    p50_column : str
        The p50s compared: ``"p50_wire_ms"`` (default: both tools time the request from its write to its
        answer's read) or ``"p50_from_send_ms"`` (the course generator's span then also holds its client
        work before the write and after the read; records made before ``p50_wire_ms`` existed).

    Returns
    -------
    dict
        ``knees_by_repeat`` (tool -> list of knees, one per repeat: the highest rate met with every lower
        rate met too, 0.0 if its first missed), ``knee_rps`` (tool -> their median; with an even number of
        repeats the midpoint of the middle two, which need not be a rate tried), ``knee_range_rps``
        (tool -> (lowest, highest)), ``repeats``, ``knee_ratio`` (course generator / k6, of the medians),
        ``p50_ratios`` (rate -> the median over the repeats in which both tools met that rate of the
        course generator's p50 / k6's, ``p50_column``), ``worst_p50_ratio`` (the one furthest from 1), and
        ``knee_agrees``, ``p50_agrees`` (within ``tolerance``).

    Raises
    ------
    InvalidArgumentError
        For a tolerance outside (0, 1). ValueError if a column is missing, a tool has no row, or a repeat
        has rows of one tool only (the knees would be read over different climbs).

    Examples
    --------
    >>> t = pd.DataFrame({"tool": ["course generator", "k6"] * 2, "rate_rps": [100.0, 100.0, 200.0, 200.0],
    ...                   "met": [True, True, False, True], "p50_wire_ms": [1.1, 1.0, 9.0, 2.0]})
    >>> a = tool_agreement(t)
    >>> a["knee_rps"], a["knee_ratio"], a["p50_agrees"]
    ({'course generator': 100.0, 'k6': 200.0}, 0.5, True)
    """
    tol = positive_number("tolerance", tolerance)
    if tol >= 1:
        raise checks.InvalidArgumentError(f"tolerance must be below 1, got {tolerance!r}")
    rungs = _rungs(tools, p50_column)
    found = knees(rungs.rename(columns={"tool": "target", "met": "met_slo"}))  # by tool, then repeat
    by_repeat = {tool: [float(k) for k in found.loc[found["target"] == tool, "knee_rps"]] for tool in TOOLS}
    knee = {tool: float(np.median(k)) for tool, k in by_repeat.items()}
    both = rungs.pivot_table(index=["repeat", "rate_rps"], columns="tool", values="p50", aggfunc="first")
    both = both.dropna() if set(TOOLS) <= set(both.columns) else both.iloc[0:0]
    per_rate = (
        (both["course generator"] / both["k6"]).groupby(level="rate_rps").median()
        if len(both)
        else pd.Series(dtype=float)
    )
    ratios = dict(zip(per_rate.index.astype(float).tolist(), per_rate.astype(float).tolist(), strict=True))
    worst = max(ratios.values(), key=lambda r: abs(r - 1), default=math.nan)
    knee_ratio = knee["course generator"] / knee["k6"] if knee["k6"] > 0 else math.nan
    return {
        "knees_by_repeat": by_repeat,
        "knee_rps": knee,
        "knee_range_rps": {tool: (min(k), max(k)) for tool, k in by_repeat.items()},
        "repeats": int(rungs["repeat"].nunique()),
        "knee_ratio": knee_ratio,
        "p50_ratios": ratios,
        "worst_p50_ratio": worst,
        "knee_agrees": bool(abs(knee_ratio - 1) <= tol),
        "p50_agrees": bool(ratios) and abs(worst - 1) <= tol,
    }
