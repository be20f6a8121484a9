"""Ladders of offered rates: several targets climbed side by side, and the highest rate each sustained.

Built on the open-loop generator (``course_lib.measure.loadgen.run_open_loop``): ``sweep_rates`` climbs a
ladder with the targets taking turns at every rung, ``capacity_table`` reads off each target's highest
rung within the SLO and its gain over a baseline, and ``sustainable_rate`` does the same for any table
with offered, achieved and p99 columns (the simulator's too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager

import pandas as pd

from course_lib.core.checks import integer, non_empty, number, one_of, positive_number
from course_lib.measure.loadgen import Send, run_open_loop

__all__ = ["capacity_table", "sustainable_rate", "sweep_rates"]


def sustainable_rate(
    table: pd.DataFrame,
    *,
    p99_limit_ms: float,
    min_achieved_fraction: float = 0.95,
    achieved_column: str = "achieved_rps",
) -> float:
    """Highest offered rate in a sweep that met the p99 limit, kept up, and had no errors.

    A row qualifies when its ``errors`` are 0 (a table without that column, like the simulator's,
    has none), ``p99_ms <= p99_limit_ms`` and ``achieved_column`` is at least
    ``min_achieved_fraction`` of ``offered_rps``. Returns 0.0 if no row does. The answer is only as
    fine as the sweep: the true limit lies between this rate and the next one measured.

    Parameters
    ----------
    table : DataFrame with ``offered_rps``, ``p99_ms`` and ``achieved_column`` (one row per rate),
        e.g. ``LoadResult.summary()`` rows or ``course_lib.simulate.batching.sweep_offered_load`` output
        (the default ``achieved_column`` names it).
    p99_limit_ms : float > 0
    min_achieved_fraction : float in (0, 1]
    achieved_column : str

    Raises
    ------
    ValueError
        For a limit that is not > 0, a fraction outside (0, 1], or a missing column.
    """
    positive_number("p99_limit_ms", p99_limit_ms)
    number("min_achieved_fraction", min_achieved_fraction, min=0, max=1, min_open=True)
    missing = [c for c in ("offered_rps", "p99_ms", achieved_column) if c not in table.columns]
    if missing:
        raise ValueError(f"table is missing columns {missing}")
    errors = table["errors"] if "errors" in table.columns else 0
    good = table[
        (errors == 0)
        & (table["p99_ms"] <= p99_limit_ms)
        & (table[achieved_column] >= min_achieved_fraction * table["offered_rps"])
    ]
    return float(good["offered_rps"].max()) if len(good) else 0.0


async def sweep_rates(
    targets: Mapping[str, Callable[[], AbstractAsyncContextManager[Send]]],
    rates_rps: Iterable[float],
    *,
    p99_limit_ms: float,
    duration_s: float,
    max_requests: int = 100_000,
    seed: int = 0,
    request_timeout_s: float | None = None,
    warmup_requests: int = 20,
    min_done_fraction: float = 0.95,
    retries: int = 1,
) -> pd.DataFrame:
    """Climb a ladder of offered rates for several targets side by side, until each one fails.

    At every rate the targets take turns (A, B, A, B, ...), so slow drift of a shared machine hits
    them alike. A run meets the SLO when no request failed and its p99 is within the limit (so 99% of
    requests were answered within the limit of their scheduled time: the target kept up). A run
    that missed although at least ``min_done_fraction`` of its requests were answered by the end of
    the schedule plus the limit was a hiccup of a shared machine, not an overload: the rate is tried
    again (``retries`` times, with the next seed). A target that misses every try, or is plainly
    overloaded, drops out: higher rates would only pile up a longer queue.

    Parameters
    ----------
    targets : mapping name -> zero-argument factory of an async context manager yielding ``send``
        Each run enters a fresh context (e.g. a new ``DynamicBatcher`` or a new HTTP client) so runs
        do not share a backlog.
    rates_rps : iterable of float > 0, climbed in ascending order
    p99_limit_ms : float > 0
        The latency SLO a rate must meet.
    duration_s : float > 0
        Length of each run (``max_duration_s`` of ``run_open_loop``).
    max_requests : int
        Upper bound on requests per run.
    seed : int
        Arrival schedule seed (the same schedule for every target at a given rate).
    request_timeout_s : float, optional
        Give up on a request after this long; default 5 x the p99 limit (at least 0.5 s), which is
        already a failure, so an overloaded run ends soon after ``duration_s``.
    warmup_requests : int >= 0
        Requests sent one at a time before each run and not recorded (thread pools, caches, sockets).
    min_done_fraction : float in (0, 1]
        Share of requests answered by the end of the schedule plus the limit, above which a miss
        counts as a hiccup and is retried.
    retries : int >= 0
        Extra tries at a rate after a hiccup.

    Returns
    -------
    DataFrame with ``target``, ``attempt`` (1 for the first try at a rate), the
    ``LoadResult.summary()`` columns, ``done_in_time`` (share answered by the end of the schedule
    plus the limit) and ``met_slo`` (bool), one row per run, in the order they ran.

    Raises
    ------
    ValueError
        For a p99 limit that is not > 0 or a negative ``retries``.
    """
    limit = positive_number("p99_limit_ms", p99_limit_ms)
    retries = integer("retries", retries, min=0)
    number("min_done_fraction", min_done_fraction, min=0, max=1, min_open=True)
    timeout = request_timeout_s if request_timeout_s is not None else max(0.5, 5 * limit / 1000.0)
    alive = list(targets)
    rows: list[dict[str, object]] = []
    for rate in sorted(float(r) for r in rates_rps):
        for name in list(alive):
            for attempt in range(1, retries + 2):
                async with targets[name]() as send:
                    for i in range(warmup_requests):
                        await send(i)
                    result = await run_open_loop(
                        send,
                        rate_rps=rate,
                        n_requests=max_requests,
                        max_duration_s=duration_s,
                        seed=seed + attempt - 1,
                        request_timeout_s=timeout,
                    )
                summary = result.summary()
                req = result.requests
                in_time = req["ok"] & (
                    req["scheduled_ms"] + req["latency_ms"] <= req["scheduled_ms"].max() + limit
                )
                done_in_time = float(in_time.mean())
                met_slo = bool(summary["errors"] == 0 and summary["p99_ms"] <= limit)
                rows.append(
                    {
                        "target": name,
                        "attempt": attempt,
                        **summary,
                        "done_in_time": done_in_time,
                        "met_slo": met_slo,
                    }
                )
                hiccup = summary["errors"] == 0 and done_in_time >= min_done_fraction
                if met_slo or not hiccup:  # overloaded: trying again would only repeat it
                    break
            if not met_slo:
                alive.remove(name)
        if not alive:
            break
    return pd.DataFrame(rows)


def capacity_table(sweep: pd.DataFrame, *, baseline: str | Sequence[str]) -> pd.DataFrame:
    """Per target of a ``sweep_rates`` table: the highest rate that met the SLO and the gain over a baseline.

    Parameters
    ----------
    sweep : output of ``sweep_rates`` (its ``met_slo`` column carries the SLO that was applied).
    baseline : str or sequence of str
        Target the ``gain`` column divides by (e.g. the one-call-per-request configuration). With several
        names the one that sustained the highest rate is used, the rule of
        ``course_lib.measure.batching_gain.gain_verdict``; its name is in ``table.attrs["baseline"]``.

    Returns
    -------
    DataFrame indexed by target with ``sustained_rps`` (the highest rung of the ladder, ``rate_rps``,
    that met the SLO; a lower bound, since the true limit lies below the next rung), the realised
    ``offered_rps`` and the ``achieved_rps`` of that run, its ``p99_ms`` and
    ``mean_batch_size`` at that rate, ``first_failed_rps`` (lowest rung where every try missed, NaN
    if none did) and
    ``gain`` (sustained_rps / baseline's; NaN if the baseline met the SLO at no rate, in which case
    start the ladder lower).

    Raises
    ------
    ValueError
        If a ``baseline`` is not a target of the sweep, or none is named.
    """
    baselines = [baseline] if isinstance(baseline, str) else list(baseline)
    non_empty("baseline", baselines)
    for name in baselines:
        one_of("baseline", name, sorted(set(sweep["target"])))
    rows: dict[Hashable, dict[str, float]] = {}
    for target, runs in sweep.groupby("target", sort=False):
        good = runs[runs["met_slo"]]
        bad = runs[~runs["met_slo"] & ~runs["rate_rps"].isin(good["rate_rps"])]  # no try at that rate met
        best_run = good.iloc[good["rate_rps"].argmax()] if len(good) else None
        rows[target] = {
            "sustained_rps": float(best_run["rate_rps"]) if best_run is not None else 0.0,
            "offered_rps": float(best_run["offered_rps"]) if best_run is not None else math.nan,
            "achieved_rps": float(best_run["achieved_rps"]) if best_run is not None else math.nan,
            "p99_ms": float(best_run["p99_ms"]) if best_run is not None else math.nan,
            "mean_batch_size": float(best_run.get("mean_batch_size", math.nan))
            if best_run is not None
            else math.nan,
            "first_failed_rps": float(bad["rate_rps"].min()) if len(bad) else math.nan,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "target"
    sustained = table["sustained_rps"]
    best = max(baselines, key=lambda name: sustained.loc[name])
    base = sustained.loc[best]
    table["gain"] = table["sustained_rps"] / base if base > 0 else math.nan
    table.attrs["baseline"] = best
    return table
