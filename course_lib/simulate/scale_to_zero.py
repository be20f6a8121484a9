"""Scale to zero for a rarely used model: what it saves, and what the first request after a quiet spell pays.

A replica stops after ``idle_timeout_s`` without requests; the next request starts one and waits the
whole cold start (model load + warm-up) before it is served. Requests that arrive while the replica is
starting wait too. Request by request, deterministic for given arrival times.

Kubernetes' HPA cannot scale a Deployment to zero (``minReplicas >= 1`` unless the alpha feature gate
``HPAScaleToZero`` is on, and even then only on Object or External metrics); Knative Serving and KEDA do
it with a request buffer (the activator) in front of the model.

References
----------
Kubernetes documentation, "Horizontal Pod Autoscaling" (minReplicas, HPAScaleToZero); Knative Serving
documentation, "Configuring scale to zero"; source lesson 001, "Autoscaling" ("scale to zero suits rarely
used models, accepting a slow first request").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from course_lib.core.checks import number, positive_number
from course_lib.core.percentiles import percentile

__all__ = ["ScaleToZeroResult", "scale_to_zero"]


@dataclass(frozen=True)
class ScaleToZeroResult:
    """Outcome of a day: request counts, latency percentiles (ms) and billed replica-hours."""

    requests: int
    cold_starts: int
    requests_that_waited: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    replica_hours: float


def scale_to_zero(
    arrival_times_s: np.ndarray,
    *,
    idle_timeout_s: float,
    cold_start_s: float,
    service_s: float,
    horizon_s: float | None = None,
) -> ScaleToZeroResult:
    """Serve requests one at a time on a replica that stops after ``idle_timeout_s`` of idleness.

    Parameters
    ----------
    arrival_times_s : array of float, shape (n,)
        Non-decreasing request times, seconds.
    idle_timeout_s : float >= 0 or ``math.inf``
        Idle time before the replica stops; ``math.inf`` is an always-on replica (never cold after
        the first start, which happens before the first request).
    cold_start_s : float >= 0
        Seconds from "start a replica" to "ready to serve".
    service_s : float > 0
        Time to score one request, seconds.
    horizon_s : float, optional
        Length of the period billed (default: last arrival + idle timeout, or the last arrival for
        an always-on replica).

    Returns
    -------
    ScaleToZeroResult

    Raises
    ------
    ValueError
        For decreasing arrival times or parameters out of range.
    """
    t_arr = np.asarray(arrival_times_s, dtype=float)
    if t_arr.ndim != 1 or not np.isfinite(t_arr).all() or (np.diff(t_arr) < 0).any() or (t_arr < 0).any():
        raise ValueError("arrival_times_s must be a 1-D array of finite, non-decreasing times >= 0 seconds")
    idle_timeout_s = number("idle_timeout_s", idle_timeout_s, min=0, finite=False)
    cold_start_s = positive_number("cold_start_s", cold_start_s, allow_zero=True)
    service_s = positive_number("service_s", service_s)
    if horizon_s is not None and not (
        math.isfinite(horizon_s) and horizon_s >= (t_arr[-1] if len(t_arr) else 0)
    ):
        raise ValueError(f"horizon_s must be finite and not before the last arrival, got {horizon_s!r}")
    always_on = math.isinf(idle_timeout_s)
    latencies, cold, waited = [], 0, 0
    up_since = 0.0 if always_on else None  # start of the current "replica running" interval
    free_at = 0.0  # when the replica finishes its current work
    billed = 0.0
    for t in t_arr:
        if up_since is not None and not always_on and t > free_at + idle_timeout_s:
            billed += free_at + idle_timeout_s - up_since  # it stopped after the idle timeout
            up_since = None
        if up_since is None:
            cold += 1
            up_since = t
            free_at = t + cold_start_s
        start = max(t, free_at)
        waited += start > t
        free_at = start + service_s
        latencies.append(free_at - t)
    end = (
        horizon_s
        if horizon_s is not None
        else ((t_arr[-1] if len(t_arr) else 0.0) if always_on else free_at + idle_timeout_s)
    )
    if up_since is not None:
        billed += (end if always_on else min(end, free_at + idle_timeout_s)) - up_since
    lat_ms = np.asarray(latencies) * 1000.0
    pct = (lambda q: percentile(lat_ms, q)) if len(lat_ms) else (lambda q: math.nan)
    return ScaleToZeroResult(
        requests=len(t_arr),
        cold_starts=cold,
        requests_that_waited=int(waited),
        p50_ms=pct(50),
        p99_ms=pct(99),
        max_ms=float(lat_ms.max()) if len(lat_ms) else math.nan,
        replica_hours=billed / 3600.0,
    )
