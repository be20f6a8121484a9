"""One rung of the ladder: the row a run gives, and the rule that says whether it met the SLO.

:func:`step_row` turns one open-loop run at one offered rate into the row a load-test report needs
(offered and achieved rate, p50/p95/p99/p99.9, error, shed and timeout rates, goodput, whether the
generator kept up); :class:`SloRule` is the per-rung rule the climb (``course_lib.measure.ladder.climb``)
applies: that row, the SLO verdict (``met_slo``) and whether a miss may be tried again.

References
----------
Google SRE book, ch. 4 "Service Level Objectives" (percentile SLOs). Gil Tene, "How NOT to measure latency".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from course_lib.core.checks import integer, number, positive_number
from course_lib.core.percentiles import percentiles
from course_lib.measure.loadgen import SEND_LAG_BOUND_MS, LoadResult

#: Default error budget of the SLO: fewer than 0.1% of requests may fail (shed and timeouts included).
MAX_ERROR_RATE = 0.001


def step_row(
    result: LoadResult,
    *,
    p99_limit_ms: float,
    max_error_rate: float = MAX_ERROR_RATE,
    lag_bound_ms: float = SEND_LAG_BOUND_MS,
) -> dict[str, Any]:
    """One rung's row from one run at one offered rate.

    Parameters
    ----------
    result : the open-loop run (``course_lib.measure.loadgen.LoadResult``).
    p99_limit_ms : float > 0
    max_error_rate : float >= 0
        The error budget: the SLO needs ``error_rate < max_error_rate``; 0 means no request may fail.
    lag_bound_ms : float
        The generator's send-lag bound (``generator_ok``).

    Returns
    -------
    dict with ``rate_rps`` (asked), ``offered_rps``/``achieved_rps`` (measured, see
    ``LoadResult.summary``), ``sent``, ``ok``, ``errors``, ``shed``, ``timeouts``, ``other_errors``,
    ``p50_ms``/``p95_ms``/``p99_ms``/``p99.9_ms`` (nearest rank, successful requests, from the intended
    send time), ``error_rate`` and ``shed_rate`` (fractions of sent), ``goodput_rps`` (answers within
    the p99 limit per second: ``achieved_rps`` x the fraction of answers within it, so never above
    ``achieved_rps``), ``lag_p99_ms``, ``generator_ok`` and ``met_slo``
    (p99 <= limit and the error rate within the budget), and ``mean_batch_size`` where the target
    reported batch sizes.
    """
    limit = positive_number("p99_limit_ms", p99_limit_ms)
    budget = positive_number("max_error_rate", max_error_rate, allow_zero=True)
    s = result.summary(lag_bound_ms=lag_bound_ms)
    req = result.requests
    ok = req[req["ok"]]
    lat = percentiles(ok["latency_ms"].to_numpy(), (50, 95, 99, 99.9)) if len(ok) else {}
    error_rate = s["errors"] / s["sent"]
    keep = ("rate_rps", "offered_rps", "achieved_rps", "sent", "ok", "errors", "shed", "timeouts")
    row: dict[str, Any] = {k: s[k] for k in keep}
    row["other_errors"] = s["other_errors"]
    for q in ("p50", "p95", "p99", "p99.9"):
        row[f"{q}_ms"] = lat.get(q, math.nan)
    within_budget = error_rate < budget if budget > 0 else s["errors"] == 0
    row.update(
        error_rate=error_rate,
        shed_rate=s["shed"] / s["sent"],
        goodput_rps=s["achieved_rps"] * float((ok["latency_ms"] <= limit).mean()) if len(ok) else 0.0,
        lag_p99_ms=s["lag_p99_ms"],
        generator_ok=s["generator_ok"],
        met_slo=bool(len(ok) > 0 and row["p99_ms"] <= limit and within_budget),
    )
    if "mean_batch_size" in s:  # the target reported how each request was batched
        row["mean_batch_size"] = s["mean_batch_size"]
    return row


def step_table(results: Sequence[LoadResult], *, p99_limit_ms: float, **kwargs: float) -> pd.DataFrame:
    """``step_row`` of each run, one row per run, in the order given (e.g. a climb's runs re-judged)."""
    return pd.DataFrame([step_row(r, p99_limit_ms=p99_limit_ms, **kwargs) for r in results])


def _done_in_time(result: LoadResult, limit_ms: float) -> float:
    """Share of requests answered by the end of the schedule plus the limit (a run that kept up)."""
    req = result.requests
    in_time = req["ok"] & (req["scheduled_ms"] + req["latency_ms"] <= req["scheduled_ms"].max() + limit_ms)
    return float(in_time.mean())


@dataclass(frozen=True)
class SloRule:
    """The per-rung rule: one run's row, whether it met the SLO, and whether a miss may be tried again.

    A run meets the SLO when its p99 (from the intended send times) is within ``p99_limit_ms``, its
    error rate within ``max_error_rate`` (``step_row``) and it sent at least ``min_requests`` requests.
    A missed try is tried again (as often as the climb's ``retries`` allow) unless
    ``retry_min_done_fraction`` is set: then only a *hiccup* is, a miss without errors whose
    ``done_in_time`` (share answered by the end of the schedule plus the limit) is at least that
    fraction; a run that fell behind is overloaded, and trying again would only repeat it.

    Attributes
    ----------
    p99_limit_ms : float > 0
    max_error_rate : float >= 0
        Default ``MAX_ERROR_RATE`` (0.1 %); 0: no request may fail.
    min_requests : int >= 1
        Requests a run needs for the p99 it judges (``MIN_REQUESTS_P99`` = 1,000 for ten above it).
    retry_min_done_fraction : float in (0, 1], optional

    Raises
    ------
    ValueError
        For a limit that is not > 0, a negative budget, ``min_requests`` < 1 or a fraction outside (0, 1].
    """

    p99_limit_ms: float
    max_error_rate: float = MAX_ERROR_RATE
    min_requests: int = 1
    retry_min_done_fraction: float | None = None

    def __post_init__(self) -> None:
        positive_number("p99_limit_ms", self.p99_limit_ms)
        positive_number("max_error_rate", self.max_error_rate, allow_zero=True)
        integer("min_requests", self.min_requests, min=1)
        if self.retry_min_done_fraction is not None:
            number("retry_min_done_fraction", self.retry_min_done_fraction, min=0, max=1, min_open=True)

    @classmethod
    def without_errors(cls, p99_limit_ms: float, *, retry_min_done_fraction: float = 0.95) -> SloRule:
        """No request may fail, and only a hiccup is retried (Lesson 3's and ``benchmarks/batching.py``'s rule).

        >>> SloRule.without_errors(100.0)
        SloRule(p99_limit_ms=100.0, max_error_rate=0.0, min_requests=1, retry_min_done_fraction=0.95)
        """
        return cls(p99_limit_ms, max_error_rate=0.0, retry_min_done_fraction=retry_min_done_fraction)

    def __call__(self, result: LoadResult) -> dict[str, Any]:
        """The rung's row: ``step_row`` plus ``done_in_time``, ``enough_requests``, ``met_slo`` and ``retry``."""
        row = step_row(result, p99_limit_ms=self.p99_limit_ms, max_error_rate=self.max_error_rate)
        done = _done_in_time(result, self.p99_limit_ms)
        enough = row["sent"] >= self.min_requests
        met = bool(row["met_slo"] and enough)
        hiccup = self.retry_min_done_fraction is None or (
            row["errors"] == 0 and done >= self.retry_min_done_fraction
        )
        return {**row, "done_in_time": done, "enough_requests": enough, "met_slo": met, "retry": hiccup}
