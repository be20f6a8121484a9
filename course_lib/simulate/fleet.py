"""A deterministic day of an autoscaled fleet: replicas, queues, p99 latency, shed requests and cost.

The model, second by second (every assumption is a parameter of :class:`FleetConfig`):

* **Replicas** serve ``capacity_rps`` requests a second each once *ready*; a replica the autoscaler adds
  becomes ready ``startup_s`` seconds later (model load and warm-up) but is paid for from the start.
* **Queue**: requests that cannot be served this second wait in a bounded queue of ``queue_limit_s``
  seconds of work per ready replica; arrivals beyond it are shed (HTTP 503), counted, never lost:
  ``offered = served + shed + still queued at the end`` holds exactly (integer counts).
* **Latency** of a request arriving in a second = time to drain the backlog ahead of it + an M/M/1
  sojourn time at that second's utilization ``rho`` (exponential with rate ``capacity_rps x (1 - rho)``).
  The p99 of a minute is the 99th percentile of the mixture over its seconds, weighted by accepted
  requests. This is a queueing *model*, not a measurement: it shows how latency explodes near and past
  capacity, which is what the autoscaler must prevent.
* **Autoscaler**: every ``sync_period_s`` the :class:`course_lib.simulate.hpa.HPA` control rule reads one
  signal averaged over a window and sets the replica count. Signals (value per replica, as the HPA
  averages them; starting replicas count as idle, as Kubernetes treats not-yet-ready pods when scaling up):

  ``"cpu"``   busy fraction in %, over ``cpu_window_s`` (saturates at 100 % however deep the overload);
  ``"rps"``   offered requests per second per replica, over ``metric_window_s``;
  ``"queue"`` queued requests per replica (backlog + the M/M/1 mean queue), mean over ``metric_window_s``;
  ``"p99"``   the p99 latency in ms over ``metric_window_s`` (an Object metric: one value for the fleet).

References
----------
Kubernetes documentation, "Horizontal Pod Autoscaling" (algorithm, sync period 15 s, not-ready pods).
L. Kleinrock, *Queueing Systems*, vol. 1 (1975): the M/M/1 sojourn time is exponential with rate mu - lambda.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TypedDict, Unpack

import numpy as np
import pandas as pd

from course_lib.core.checks import InvalidArgumentError, integer, non_empty, number, one_of, positive_number
from course_lib.simulate.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    DEFAULT_SYNC_PERIOD_S,
    HPA,
    ScalingRules,
    check_replica_bounds,
)

__all__ = [
    "SIGNALS",
    "DayResult",
    "FleetConfig",
    "mixture_quantile_s",
    "simulate_day",
    "targets_for_utilization",
    "with_changes",
]

SIGNALS = ("cpu", "rps", "queue", "p99")
_RHO_CAP = 0.99  # keeps the M/M/1 rate positive at saturation; the backlog term carries the overload


@dataclass(frozen=True)
class FleetConfig:
    """One autoscaling policy and the fleet it drives (see the module docstring for the model).

    ``target`` is in the signal's unit: % busy (cpu), requests/s per replica (rps), queued requests per
    replica (queue) or milliseconds (p99). ``price_per_replica_hour`` is in ``currency``.
    """

    signal: str = "rps"
    target: float = 30.0
    min_replicas: int = 4
    max_replicas: int = 12
    capacity_rps: float = 50.0
    startup_s: int = 30
    sync_period_s: int = DEFAULT_SYNC_PERIOD_S
    metric_window_s: int = 30
    cpu_window_s: int = 60
    queue_limit_s: float = 2.0
    slo_p99_ms: float = 300.0
    max_shed_fraction: float = 0.001
    price_per_replica_hour: float = 40.0
    currency: str = "INR"
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN

    def __post_init__(self) -> None:
        one_of("signal", self.signal, SIGNALS)
        for name in ("target", "capacity_rps", "queue_limit_s", "slo_p99_ms", "price_per_replica_hour"):
            positive_number(name, getattr(self, name))
        if self.signal == "cpu" and not self.target <= 100:
            raise InvalidArgumentError(f"a cpu target is a percentage in (0, 100], got {self.target!r}")
        integer("startup_s", self.startup_s, min=0)
        for name in ("sync_period_s", "metric_window_s", "cpu_window_s"):
            integer(name, getattr(self, name), min=1)
        check_replica_bounds(self.min_replicas, self.max_replicas)


@dataclass
class DayResult:
    """What a simulated day produced: ``per_minute`` table, ``per_second`` arrays and totals."""

    config: FleetConfig
    per_minute: pd.DataFrame
    per_second: dict[str, np.ndarray] = field(repr=False)

    @property
    def totals(self) -> dict[str, float]:
        """SLO-violation minutes, replica-hours, cost, request counts and how often the count changed."""
        m = self.per_minute
        s = self.per_second
        replica_hours = float(s["replicas"].sum()) / 3600.0
        return {
            "offered": int(s["arrivals"].sum()),
            "served": int(s["served"].sum()),
            "shed": int(s["shed"].sum()),
            "queued_at_end": int(s["backlog"][-1]),
            "slo_violation_minutes": int((~m["slo_met"]).sum()),
            "max_p99_ms": float(m["p99_ms"].max()),
            "peak_replicas": int(s["replicas"].max()),
            "replica_changes": int((np.diff(s["replicas"]) != 0).sum()),
            "replica_hours": replica_hours,
            "cost": replica_hours * self.config.price_per_replica_hour,
        }


def mixture_quantile_s(
    delay_s: np.ndarray, rate_per_s: np.ndarray, weight: np.ndarray, q: float = 0.99
) -> np.ndarray:
    """Quantile of mixtures of shifted exponentials, one mixture per row.

    Row ``i`` mixes, with weights ``weight[i, j]``, distributions ``delay_s[i, j] + Exp(rate_per_s[i, j])``.
    Solved by bisection to 1e-6 s. Arrays have shape ``(groups, members)``; returns shape ``(groups,)``
    in seconds, NaN where a row's weights sum to 0. Raises ``ValueError`` for q outside (0, 1) or
    mismatched shapes.
    """
    q = number("q", q, min=0, max=1, min_open=True, max_open=True)
    delay_s, rate_per_s, weight = (
        np.atleast_2d(np.asarray(a, dtype=float)) for a in (delay_s, rate_per_s, weight)
    )
    if not delay_s.shape == rate_per_s.shape == weight.shape:
        raise ValueError(f"shapes differ: {delay_s.shape}, {rate_per_s.shape}, {weight.shape}")
    total = weight.sum(axis=1)
    w = np.divide(weight, total[:, None], out=np.zeros_like(weight), where=total[:, None] > 0)
    # A mixture's quantile lies between its components' quantiles: bracket there, then bisect.
    own = delay_s + math.log(1 / (1 - q)) / rate_per_s
    lo = np.where(w > 0, own, np.inf).min(axis=1)
    hi = np.where(w > 0, own, -np.inf).max(axis=1)
    lo, hi = np.where(total > 0, lo, 0.0), np.where(total > 0, hi, 0.0) + 1e-9
    while np.max(hi - lo) > 1e-7:
        mid = (lo + hi) / 2
        tail = np.where(mid[:, None] < delay_s, 1.0, np.exp(-rate_per_s * (mid[:, None] - delay_s)))
        above = (w * tail).sum(axis=1) > 1 - q
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return np.where(total > 0, hi, np.nan)


def targets_for_utilization(utilization: float, capacity_rps: float) -> dict[str, float]:
    """Each signal's target that, in steady state, holds every replica at ``utilization``.

    cpu: ``100 x utilization`` %; rps: ``utilization x capacity_rps``; queue: the M/M/1 mean number
    waiting ``rho^2 / (1 - rho)``; p99: the M/M/1 p99 sojourn time ``ln(100) / (capacity x (1 - rho))``
    in ms. Comparing signals at these targets isolates their *dynamics* (lag, saturation) from their
    set points. Raises ``ValueError`` unless ``0 < utilization < 1`` and ``capacity_rps > 0``.

    >>> targets_for_utilization(0.6, 50.0)["rps"]
    30.0
    """
    utilization = number("utilization", utilization, min=0, max=1, min_open=True, max_open=True)
    capacity_rps = positive_number("capacity_rps", capacity_rps)
    rho = utilization
    return {
        "cpu": round(100 * rho, 6),
        "rps": round(rho * capacity_rps, 6),
        "queue": round(rho * rho / (1 - rho), 6),
        "p99": round(1000 * math.log(100) / (capacity_rps * (1 - rho)), 6),
    }


def _window_p99_s(delay_s: list[float], rate_per_s: list[float], weight: list[int], q: float = 0.99) -> float:
    """:func:`mixture_quantile_s` for one short window, in pure Python (faster for ~30 values)."""
    total = sum(weight)
    if total == 0:
        return 0.0
    log_q = math.log(1 / (1 - q))
    own = [d + log_q / r for d, r, w in zip(delay_s, rate_per_s, weight, strict=True) if w]
    lo, hi = min(own), max(own) + 1e-9
    while hi - lo > 1e-7:
        mid = (lo + hi) / 2
        tail = sum(
            w * (1.0 if mid < d else math.exp(-r * (mid - d)))
            for d, r, w in zip(delay_s, rate_per_s, weight, strict=True)
        )
        if tail > (1 - q) * total:
            lo = mid
        else:
            hi = mid
    return hi


def _signal_value(cfg: FleetConfig, s: dict[str, list], t: int, replicas: int) -> float:
    w = cfg.cpu_window_s if cfg.signal == "cpu" else cfg.metric_window_s
    lo = max(0, t - w)
    if cfg.signal == "cpu":
        paid = sum(s["replicas"][lo:t]) * cfg.capacity_rps
        return 100.0 * sum(s["served"][lo:t]) / paid if paid else 0.0
    if cfg.signal == "rps":
        return sum(s["arrivals"][lo:t]) / (t - lo) / replicas
    if cfg.signal == "queue":
        return (sum(s["backlog"][lo:t]) + sum(s["queue_mm1"][lo:t])) / (t - lo) / replicas
    return 1000.0 * _window_p99_s(s["delay_s"][lo:t], s["rate_per_s"][lo:t], s["accepted"][lo:t])


def simulate_day(cfg: FleetConfig, arrivals: np.ndarray) -> DayResult:
    """Run the fleet through ``arrivals`` (requests in each second, int, shape ``(n_seconds,)``).

    Starts with ``min_replicas`` ready replicas and an empty queue. Deterministic: the same config and
    arrivals give the same result. Raises ``ValueError`` for negative or non-integer arrivals or a day
    shorter than one minute.
    """
    arrivals = non_empty("arrivals", np.asarray(arrivals), min_items=60)  # a minute at least
    if arrivals.ndim != 1 or not np.issubdtype(arrivals.dtype, np.integer):
        raise ValueError("arrivals must be a 1-D integer array of at least 60 seconds")
    if (arrivals < 0).any():
        raise ValueError("arrivals must be >= 0 requests in every second")
    keys = (
        "served",
        "shed",
        "backlog",
        "replicas",
        "ready",
        "accepted",
        "delay_s",
        "rate_per_s",
        "queue_mm1",
    )
    s: dict[str, list] = {k: [] for k in keys}  # the signals read these as the day unfolds
    s["arrivals"] = arrivals.astype(np.int64).tolist()
    appends = [s[k].append for k in keys]
    hpa = HPA(cfg.min_replicas, cfg.max_replicas, [cfg.target], cfg.scale_up, cfg.scale_down)
    ready = cfg.min_replicas  # ready replicas
    pending: list[int] = []  # seconds at which the starting ones become ready
    backlog, cap = 0, cfg.capacity_rps
    queue_limit = cfg.queue_limit_s * cap
    for t, a in enumerate(s["arrivals"]):
        if t and t % cfg.sync_period_s == 0:
            current = ready + len(pending)
            new = hpa.step(float(t), current, [_signal_value(cfg, s, t, current)])
            if new > current:
                pending += [t + cfg.startup_s] * (new - current)
            elif new < current:  # drop the replicas that are still starting first, newest first
                drop = current - new
                keep = max(0, len(pending) - drop)
                ready -= drop - (len(pending) - keep)
                pending = pending[:keep]
        while pending and pending[0] <= t:
            pending.pop(0)
            ready += 1
        capacity = int(ready * cap)
        if capacity:
            rho = min(a / capacity, _RHO_CAP)
            delay = (backlog + max(0, a - capacity) / 2) / capacity
            rate, mm1 = cap * (1 - rho), ready * rho * rho / (1 - rho)
        else:  # every replica still starting: wait for the first one
            delay, rate, mm1 = pending[0] - t + backlog / cap, cap, 0.0
        served = min(backlog + a, capacity)
        backlog += a - served
        shed = max(0, backlog - int(queue_limit * max(ready, 1)))
        backlog -= shed
        row = (served, shed, backlog, ready + len(pending), ready, max(a - shed, 0), delay, rate, mm1)
        for append, value in zip(appends, row, strict=True):
            append(value)
    arrays = {k: np.asarray(v) for k, v in s.items()}
    return DayResult(cfg, _per_minute(cfg, arrays), arrays)


def _per_minute(cfg: FleetConfig, s: dict[str, np.ndarray]) -> pd.DataFrame:
    m = len(s["arrivals"]) // 60
    shaped = {k: v[: m * 60].reshape(m, 60) for k, v in s.items()}
    p99_ms = 1000.0 * mixture_quantile_s(shaped["delay_s"], shaped["rate_per_s"], shaped["accepted"])
    offered = shaped["arrivals"].sum(axis=1)
    shed = shaped["shed"].sum(axis=1)
    capacity = shaped["ready"].sum(axis=1) * cfg.capacity_rps
    shed_ok = shed <= cfg.max_shed_fraction * np.maximum(offered, 1)
    return pd.DataFrame(
        {
            "minute": np.arange(m),
            "offered_rps": offered / 60.0,
            "replicas": shaped["replicas"].mean(axis=1),
            "ready": shaped["ready"].mean(axis=1),
            "utilization": np.divide(
                shaped["served"].sum(axis=1), capacity, out=np.zeros(m), where=capacity > 0
            ),
            "p99_ms": p99_ms,
            "shed": shed,
            "slo_met": shed_ok & ~(np.nan_to_num(p99_ms, nan=0.0) > cfg.slo_p99_ms),
        }
    )


class _FleetChanges(TypedDict, total=False):
    """The fields of ``FleetConfig``, any of which ``with_changes`` may change."""

    signal: str
    target: float
    min_replicas: int
    max_replicas: int
    capacity_rps: float
    startup_s: int
    sync_period_s: int
    metric_window_s: int
    cpu_window_s: int
    queue_limit_s: float
    slo_p99_ms: float
    max_shed_fraction: float
    price_per_replica_hour: float
    currency: str
    scale_up: ScalingRules
    scale_down: ScalingRules


def with_changes(cfg: FleetConfig, **changes: Unpack[_FleetChanges]) -> FleetConfig:
    """A copy of ``cfg`` with some fields changed (validated again)."""
    return replace(cfg, **changes)
