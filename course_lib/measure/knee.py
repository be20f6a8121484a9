"""The knee rule, small (``knee_core``); reading a knee against the generator's limit, and surviving a spike: how long the tail takes to recover.

The *knee* is the highest offered rate at which the service still meets its SLO (p99 within a stated
limit and fewer than 0.1% errors): below it latency barely moves with load, above it queues grow and
the tail explodes. The climb that finds it and the knee reader are ``course_lib.measure.ladder``
(``climb``, ``knees``); here ``knees_beside_generator`` says in words where knees sit against the
generator's own limit, and ``rolling_p99`` / ``recovery_time_s`` say how long after a spike
(``course_lib.simulate.traffic.spike_schedule``: "steady, spike, steady") the tail came back within the SLO.

References
----------
Google SRE book, ch. 4 "Service Level Objectives" (percentile SLOs) and ch. 21 "Handling Overload"
(shedding with 503, Retry-After). Gil Tene, "How NOT to measure latency".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from course_lib.core.checks import InvalidArgumentError, instance_of, positive_number
from course_lib.core.percentiles import percentile

__all__ = ["knee_core", "knees_beside_generator", "recovery_time_s", "rolling_p99"]


def knee_core(rates_rps: Sequence[float], p99_ms: Sequence[float], *, p99_limit_ms: float) -> float:
    """The knee rule, small: climbing the rates in order, the last rate whose p99 met the limit.

    The climb stops at the first rate that misses: past it each rate only builds a longer queue.
    ``course_lib.measure.ladder.knees`` applies this rule to a climb's rows, with error budgets, retries, repeats and the
    generator's own check.

    Parameters
    ----------
    rates_rps : 1-D sequence of float, shape (n,)
        Offered rates tried (requests/s), any order.
    p99_ms : 1-D sequence of float, shape (n,)
        The p99 latency measured at each rate (ms).
    p99_limit_ms : float > 0
        The SLO's p99 limit (ms).

    Returns
    -------
    float
        The knee (requests/s); 0.0 if the lowest rate already missed.
    """
    limit = positive_number("p99_limit_ms", p99_limit_ms)
    if len(rates_rps) != len(p99_ms):
        raise InvalidArgumentError(
            f"rates_rps and p99_ms must have the same length, got {len(rates_rps)} and {len(p99_ms)}"
        )
    knee = 0.0
    for rate, p99 in sorted(zip(rates_rps, p99_ms, strict=True)):
        if not p99 <= limit:  # a NaN p99 (no answers) misses too
            break
        knee = float(rate)
    return knee


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
