"""Finding the knee and surviving a spike: step the offered load up, then push past it and watch recovery.

The *knee* is the highest offered rate at which the service still meets its SLO (here: p99 within a
stated limit and fewer than 0.1% errors): below it latency barely moves with load, above it queues
grow and the tail explodes. ``step_table`` turns one open-loop run per rate into the row a load-test
report needs (offered and achieved rate, p50/p95/p99/p99.9, error, shed and timeout rates, goodput and
whether the generator kept up); ``find_knee`` reads the knee off it. ``spike_schedule`` builds the
arrival times of "steady, spike, steady" and ``rolling_p99`` / ``recovery_time_s`` say how long after
the spike the tail came back within the SLO.

References
----------
Google SRE book, ch. 4 "Service Level Objectives" (percentile SLOs) and ch. 21 "Handling Overload"
(shedding with 503, Retry-After). Gil Tene, "How NOT to measure latency".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from course_lib.core.checks import InvalidArgumentError, instance_of, positive_number
from course_lib.core.percentiles import percentile, percentiles
from course_lib.measure.loadgen import SEND_LAG_BOUND_MS, LoadResult

__all__ = [
    "MAX_ERROR_RATE",
    "climb",
    "find_knee",
    "knees_beside_generator",
    "recovery_time_s",
    "rolling_p99",
    "step_row",
    "step_table",
]

#: Default error budget of the SLO: fewer than 0.1% of requests may fail (shed and timeouts included).
MAX_ERROR_RATE = 0.001


def step_row(
    result: LoadResult,
    *,
    p99_limit_ms: float,
    max_error_rate: float = MAX_ERROR_RATE,
    lag_bound_ms: float = SEND_LAG_BOUND_MS,
) -> dict[str, float]:
    """One row of a knee table from one run at one offered rate.

    Returns
    -------
    dict with ``rate_rps`` (asked), ``offered_rps``/``achieved_rps`` (measured, see
    ``LoadResult.summary``), ``sent``, ``ok``, ``shed``, ``timeouts``, ``other_errors``,
    ``p50_ms``/``p95_ms``/``p99_ms``/``p99.9_ms`` (nearest rank, successful requests, from the intended
    send time), ``error_rate`` and ``shed_rate`` (fractions of sent), ``goodput_rps`` (answers within
    the p99 limit per second: ``achieved_rps`` x the fraction of answers within it, so never above
    ``achieved_rps``), ``lag_p99_ms``, ``generator_ok`` and ``met_slo``
    (p99 <= limit and error rate < ``max_error_rate``), and ``mean_batch_size`` where the target
    reported batch sizes.
    """
    limit = positive_number("p99_limit_ms", p99_limit_ms)
    s = result.summary(lag_bound_ms=lag_bound_ms)
    req = result.requests
    ok = req[req["ok"]]
    lat = percentiles(ok["latency_ms"].to_numpy(), (50, 95, 99, 99.9)) if len(ok) else {}
    error_rate = s["errors"] / s["sent"]
    row = {k: s[k] for k in ("rate_rps", "offered_rps", "achieved_rps", "sent", "ok", "shed", "timeouts")}
    row["other_errors"] = s["other_errors"]
    for q in ("p50", "p95", "p99", "p99.9"):
        row[f"{q}_ms"] = lat.get(q, math.nan)
    row.update(
        error_rate=error_rate,
        shed_rate=s["shed"] / s["sent"],
        goodput_rps=s["achieved_rps"] * float((ok["latency_ms"] <= limit).mean()) if len(ok) else 0.0,
        lag_p99_ms=s["lag_p99_ms"],
        generator_ok=s["generator_ok"],
        met_slo=bool(len(ok) > 0 and row["p99_ms"] <= limit and error_rate < max_error_rate),
    )
    if "mean_batch_size" in s:  # the target reported how each request was batched
        row["mean_batch_size"] = s["mean_batch_size"]
    return row


def step_table(results: Sequence[LoadResult], *, p99_limit_ms: float, **kwargs: float) -> pd.DataFrame:
    """``step_row`` of each run, one row per offered rate, in the order given."""
    return pd.DataFrame([step_row(r, p99_limit_ms=p99_limit_ms, **kwargs) for r in results])


def climb(
    run_step: Callable[[float], LoadResult],
    rates_rps: Iterable[float],
    *,
    p99_limit_ms: float,
    misses_allowed: int = 1,
    settle: Callable[[], object] | None = None,
    lower_rates_rps: Iterable[float] = (),
    **row_kwargs: float,
) -> tuple[list[LoadResult], pd.DataFrame]:
    """Run ``run_step(rate)`` for each rate in ascending order until ``misses_allowed`` rates missed the SLO.

    Past the knee every further step only builds a longer backlog, so the climb stops. ``settle()``
    (e.g. ``course_lib.measure.server_probes.wait_idle``) runs before every step so a step does not inherit the
    previous one's backlog. A climb that starts from an expected knee (a record from another run) can
    start above this run's knee: when its first rate misses, the ``lower_rates_rps`` below it are tried
    from the highest down until one meets the SLO, so :func:`find_knee` finds a knee instead of 0.

    Returns
    -------
    (results, table)
        The runs and their ``step_table``.
    """
    results: list[LoadResult] = []
    misses = 0
    for rate in sorted(float(r) for r in rates_rps):
        if settle is not None:
            settle()
        results.append(run_step(rate))
        if not step_row(results[-1], p99_limit_ms=p99_limit_ms, **row_kwargs)["met_slo"]:
            misses += 1
            if misses >= misses_allowed:
                break
    if results and not step_row(results[0], p99_limit_ms=p99_limit_ms, **row_kwargs)["met_slo"]:
        first = float(results[0].rate_rps)
        for rate in sorted((float(r) for r in lower_rates_rps if float(r) < first), reverse=True):
            if settle is not None:
                settle()
            results.append(run_step(rate))
            if step_row(results[-1], p99_limit_ms=p99_limit_ms, **row_kwargs)["met_slo"]:
                break
    return results, step_table(results, p99_limit_ms=p99_limit_ms, **row_kwargs)


def find_knee(table: pd.DataFrame) -> dict[str, float]:
    """The knee of a ``step_table``: the highest rate that met the SLO with every lower rate meeting it too.

    Returns
    -------
    dict with ``knee_rps`` (the ``rate_rps`` asked, 0.0 if the first step missed), ``knee_offered_rps``
    (measured), ``first_miss_rps`` (the next rate, where it failed; NaN if none did) and
    ``generator_ok`` (whether the generator kept within its lag bound up to and including the knee; if
    not, the knee may be the generator's, not the service's).
    """
    missing = {"rate_rps", "offered_rps", "met_slo", "generator_ok"} - set(table.columns)
    if missing:
        raise ValueError(f"table is missing columns {sorted(missing)}")
    ordered = table.sort_values("rate_rps").reset_index(drop=True)
    failed = ordered.index[~ordered["met_slo"].astype(bool)]
    upto = ordered if not len(failed) else ordered.iloc[: failed[0]]
    return {
        "knee_rps": float(upto["rate_rps"].max()) if len(upto) else 0.0,
        "knee_offered_rps": float(upto["offered_rps"].iloc[-1]) if len(upto) else math.nan,
        "first_miss_rps": float(ordered.loc[failed[0], "rate_rps"]) if len(failed) else math.nan,
        "generator_ok": bool(upto["generator_ok"].all()) if len(upto) else False,
    }


def _rps(value: float) -> str:
    return f"{value:,.0f} req/s" if value >= 10 else f"{value:.2g} req/s"


def _knees(knees_rps: Mapping[str, float]) -> str:
    """``the knee of a (1 req/s)`` or ``the knees of a (1 req/s) and b (2 req/s)``; names kept as given."""
    parts = [f"{n} ({_rps(k)})" for n, k in knees_rps.items()]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return ("the knee of " if len(parts) == 1 else "the knees of ") + listed


def knees_beside_generator(knees_rps: Mapping[str, float], limit_rps: float, lowest_rps: float) -> str:
    """Where each knee sits against the generator's limit on the null server, and what follows, in words.

    Parameters
    ----------
    knees_rps : mapping name -> knee (requests/s; 0 = no rung met, left out). Names are printed as given.
    limit_rps : float, 0 or >= ``lowest_rps``
        ``course_lib.measure.generators.generator_limit``'s answer (0.0 when no rate it tried met its
        send-lag bound without errors).
    lowest_rps : float > 0
        The lowest rate that limit's climb tried.

    Above the limit the generator was not shown to keep its schedule (the next rate it tried, on a null
    server with the machine to itself, went over its send-lag bound or had errors). Where it falls
    behind, its lateness counts in the latency, against the SLO, and its CPU comes out of the cores the
    server runs on: such a knee is the service's *with this generator beside it on this machine*, not the
    service's alone. Whether it kept up at each step is that step's ``generator_ok``. Knees and the limit
    are compared as printed (whole requests/s).

    Raises
    ------
    InvalidArgumentError
        For knees that are not a mapping, a knee that is negative or not a number, a negative limit or
        one between 0 and ``lowest_rps``, or a lowest rate that is not > 0.

    Examples
    --------
    >>> knees_beside_generator({"production": 1520.0, "prototype": 40.0}, 1000.0, 100.0).split(", so")[0]
    "The knee of production (1,520 req/s) is above the generator's limit on a null server (1,000 req/s)"
    """
    instance_of("knees_rps", knees_rps, Mapping)
    limit = positive_number("limit_rps", limit_rps, allow_zero=True)
    lowest = positive_number("lowest_rps", lowest_rps)
    if 0 < limit < lowest:
        raise InvalidArgumentError(
            f"limit_rps must be 0 or at least lowest_rps ({lowest:g}): generator_limit answers a rate it tried, "
            f"got {limit_rps!r}"
        )
    met = {n: positive_number(f"knees_rps[{n!r}]", k, allow_zero=True) for n, k in knees_rps.items()}
    met = {n: k for n, k in met.items() if k > 0}
    if not met:
        return "No knee to compare with the generator's limit: no rung met the SLO."
    if limit == 0:
        return (
            f"The generator met its send-lag bound without errors at none of the rates tried on the null server "
            f"(from {_rps(lowest)}), so it was not shown to keep its schedule at {_knees(met)}; each step's "
            "generator_ok says whether it did beside this server."
        )
    above = {n: k for n, k in met.items() if round(k) > round(limit)}
    below = {n: k for n, k in met.items() if n not in above}
    if not above:
        lead = _knees(below)
        return (
            f"{lead[0].upper()}{lead[1:]} {'is' if len(below) == 1 else 'are'} at or below the generator's limit on "
            f"a null server ({_rps(limit)}): the generator can offer {'this rate' if len(below) == 1 else 'these rates'} "
            "on time with the machine to itself; each step's generator_ok says whether it did beside this server."
        )
    one, lead = len(above) == 1, _knees(above)
    text = (
        f"{lead[0].upper()}{lead[1:]} {'is' if one else 'are'} above the generator's limit on a null server "
        f"({_rps(limit)}), so the generator was not shown to keep its schedule there (each step's generator_ok says "
        "whether it did). Where it falls behind, its lateness counts in the latency, against the SLO, and its CPU "
        "comes out of the cores the server runs on: "
        + (
            "such a knee is the service's with this generator beside it on this machine, not the service's alone."
            if one
            else "such knees are the services' with this generator beside them on this machine, not theirs alone."
        )
    )
    if not below:
        return text
    rest = _knees(below)
    return text + f" {rest[0].upper()}{rest[1:]} {'is' if len(below) == 1 else 'are'} at or below the limit."


def rolling_p99(requests: pd.DataFrame, *, window_ms: float = 500.0, step_ms: float = 100.0) -> pd.DataFrame:
    """p99 latency over a sliding window of intended send times; a failed request counts as infinitely slow.

    Parameters
    ----------
    requests : ``LoadResult.requests`` (``scheduled_ms``, ``latency_ms``, ``ok``)
    window_ms, step_ms : float > 0

    Returns
    -------
    DataFrame with ``t_ms`` (window end), ``requests``, ``failed`` and ``p99_ms`` (nearest rank over
    all requests in the window, +inf when more than 1% of them failed).
    """
    window = positive_number("window_ms", window_ms)
    step = positive_number("step_ms", step_ms)
    t = requests["scheduled_ms"].to_numpy()
    lat = np.where(requests["ok"].to_numpy(), requests["latency_ms"].to_numpy(), np.inf)
    rows = []
    for end in np.arange(window, t.max() + step, step):
        sel = lat[(t >= end - window) & (t < end)]
        if sel.size:
            failed = int(np.isinf(sel).sum())
            rows.append(
                {
                    "t_ms": float(end),
                    "requests": int(sel.size),
                    "failed": failed,
                    "p99_ms": percentile(sel, 99),
                }
            )
    return pd.DataFrame(rows)


def recovery_time_s(rolling: pd.DataFrame, *, spike_end_ms: float, p99_limit_ms: float) -> float:
    """Seconds from the end of the spike until the rolling p99 is within the limit for good.

    Returns the first window end after ``spike_end_ms`` from which every later window meets
    ``p99_limit_ms``, minus ``spike_end_ms``, in seconds (0.0 if it never left the SLO after the spike
    ended; NaN if it had not recovered by the end of the run).
    """
    after = rolling[rolling["t_ms"] >= spike_end_ms].reset_index(drop=True)
    if not len(after):
        raise ValueError("the run ended before the spike did: no window after spike_end_ms")
    bad = after.index[after["p99_ms"] > p99_limit_ms]
    if not len(bad):
        return 0.0
    if bad[-1] == len(after) - 1:
        return math.nan
    return (float(after.loc[bad[-1] + 1, "t_ms"]) - spike_end_ms) / 1000.0
