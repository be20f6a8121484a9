"""Alert rules on a replayed incident: simulated scrapes, the rules evaluated in Python, and promtool.

An incident is replayed as the counters a Prometheus server would have scraped from the churn
service every 15 s: ``churn_requests_total{version, status}`` and the latency histogram
``churn_request_latency_seconds_bucket{version, le}`` (buckets ``SLO_BUCKETS_S``). The counters start
at the values of hours of healthy traffic, as a long-running process's would.

``evaluate_rules`` evaluates the rules of ``prometheus/alerts.yml`` and ``prometheus/source004_alerts.yml``
on those series with the Prometheus arithmetic of ``course_lib.operate.prom_quantile`` (``rate`` with its
extrapolation, ``histogram_quantile``) and the ``for`` state machine of an alerting rule (pending
from the first evaluation where the expression has a result, firing once it has been pending for the
``for`` duration, gone as soon as the expression has no result). ``course_lib.operate.promtool`` writes that
timeline as ``promtool test rules`` unit-test files, so Prometheus's own engine checks it.

References
----------
Prometheus documentation, "Alerting rules" (``for``), "Unit testing for rules" (``promtool test
rules``, ``input_series`` notation, ``alert_rule_test``, ``promql_expr_test``) and "Query functions".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from course_lib.core.checks import InvalidArgumentError, number, positive_number
from course_lib.core.files import package_file
from course_lib.operate.prom_quantile import SLO_BUCKETS_S, SLO_P95_S, extrapolated_rate, histogram_quantile

__all__ = [
    "PROMETHEUS_DIR",
    "RULES",
    "SCRAPE_INTERVAL_S",
    "AlertRule",
    "IncidentSeries",
    "IncidentSpec",
    "evaluate_rules",
    "incident_signals",
    "simulate_incident",
]

#: The rules and their promtool tests, shipped inside the package (``prometheus/`` in a checkout links here).
PROMETHEUS_DIR = package_file("course_lib.operate", "prometheus_rules")
SCRAPE_INTERVAL_S = 15
RATE_RANGE_S = 300.0
REQUESTS = "churn_requests_total"
LATENCY = "churn_request_latency_seconds_bucket"
Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
SeriesKey = tuple[str, Labels]


def _key(name: str, **labels: str) -> SeriesKey:
    return name, tuple(sorted(labels.items()))


@dataclass(frozen=True)
class IncidentSpec:
    """A canary incident: v2 takes ``canary_share`` of traffic, goes bad, then is rolled back.

    Latencies are log-normal (median ``*_median_ms``, shape ``*_sigma``); error ratios are the share
    of requests answered 500. Times are minutes from the start of the replay.
    """

    duration_min: int = 60
    total_rps: float = 40.0
    canary_share: float = 0.25
    incident_start_min: float = 20.0
    rollback_min: float = 40.0
    healthy_median_ms: float = 6.0
    healthy_sigma: float = 0.45
    bad_median_ms: float = 30.0
    bad_sigma: float = 0.5
    healthy_error_ratio: float = 0.002
    bad_error_ratio: float = 0.05
    warm_hours: float = 6.0

    def __post_init__(self) -> None:
        number("canary_share", self.canary_share, min=0, max=1, min_open=True, max_open=True)
        if not 0 <= self.incident_start_min <= self.rollback_min <= self.duration_min:
            raise InvalidArgumentError(
                "need 0 <= incident_start_min <= rollback_min <= duration_min, got "
                f"{self.incident_start_min}, {self.rollback_min}, {self.duration_min}"
            )
        positive_number("total_rps", self.total_rps)


@dataclass
class IncidentSeries:
    """Scrape times (s from the start) and the cumulative value of every series at each scrape."""

    spec: IncidentSpec
    times_s: np.ndarray
    series: dict[SeriesKey, np.ndarray] = field(default_factory=dict)

    def select(self, name: str, **matchers: str) -> dict[SeriesKey, np.ndarray]:
        """Series of ``name`` whose labels equal ``matchers`` (a value ending in ``..`` matches a prefix)."""

        def ok(labels: dict[str, str]) -> bool:
            for k, v in matchers.items():
                got = labels.get(k, "")
                if not (got.startswith(v[:-2]) if v.endswith("..") else got == v):
                    return False
            return True

        return {k: v for k, v in self.series.items() if k[0] == name and ok(dict(k[1]))}


def _shares(spec: IncidentSpec, t_s: np.ndarray, version: str) -> tuple[np.ndarray, np.ndarray]:
    """Per scrape interval ending at t: requests of ``version`` and whether v2 is in its bad phase."""
    minute = t_s / 60.0
    share = np.full(len(t_s), 1 - spec.canary_share)
    if version == "v2":
        share = np.where(minute <= spec.rollback_min, spec.canary_share, 0.0)
    else:
        share = np.where(minute <= spec.rollback_min, share, 1.0)
    bad = (version == "v2") & (minute > spec.incident_start_min) & (minute <= spec.rollback_min)
    return spec.total_rps * share * SCRAPE_INTERVAL_S, bad


def simulate_incident(spec: IncidentSpec | None = None) -> IncidentSeries:
    """The counters scraped every 15 s during ``spec``'s incident (deterministic, integer counts).

    Each interval adds the expected number of requests and of observations per bucket (from the
    log-normal CDF); cumulative values are rounded to whole requests, so counters never decrease.

    Returns
    -------
    IncidentSeries with ``churn_requests_total{version, status="200"|"500"}`` and
    ``churn_request_latency_seconds_bucket{version, le}`` for v1 and v2.
    """
    spec = spec or IncidentSpec()
    times = np.arange(0, spec.duration_min * 60 + 1, SCRAPE_INTERVAL_S, dtype=float)
    out = IncidentSeries(spec, times)
    warm_s = spec.warm_hours * 3600
    for version in ("v1", "v2"):
        n, bad = _shares(spec, times, version)
        n[0] = 0.0
        base_share = spec.canary_share if version == "v2" else 1 - spec.canary_share
        warm_n = spec.total_rps * base_share * warm_s
        err_ratio = np.where(bad, spec.bad_error_ratio, spec.healthy_error_ratio)
        errors = np.cumsum(n * err_ratio) + warm_n * spec.healthy_error_ratio
        total = np.cumsum(n) + warm_n
        out.series[_key(REQUESTS, version=version, status="500")] = np.floor(errors + 0.5)
        out.series[_key(REQUESTS, version=version, status="200")] = np.floor(total + 0.5) - np.floor(
            errors + 0.5
        )
        for le in (*SLO_BUCKETS_S, math.inf):
            healthy = _lognormal_cdf(le * 1e3, spec.healthy_median_ms, spec.healthy_sigma)
            slow = _lognormal_cdf(le * 1e3, spec.bad_median_ms, spec.bad_sigma)
            frac = np.where(bad, slow, healthy)
            cum = np.cumsum(n * frac) + warm_n * healthy
            out.series[_key(LATENCY, version=version, le=_le_text(le))] = np.floor(cum + 0.5)
    return out


def _lognormal_cdf(x: float, median: float, sigma: float) -> float:
    """P(X <= x) for a log-normal latency with the given median and shape."""
    if math.isinf(x):
        return 1.0
    return 0.5 * (1.0 + math.erf((math.log(x) - math.log(median)) / (sigma * math.sqrt(2.0))))


def _le_text(le: float) -> str:
    return "+Inf" if math.isinf(le) else repr(float(le))


# -- the rules, evaluated the way Prometheus evaluates them ------------------------------------------
def _rates(inc: IncidentSeries, sel: Mapping[SeriesKey, np.ndarray], at: float, left_open: bool) -> dict:
    out = {}
    for key, values in sel.items():
        r = extrapolated_rate(inc.times_s, values, at, RATE_RANGE_S, left_open=left_open)
        if not math.isnan(r):
            out[key] = r
    return out


def _latency_quantile_by_version(values: Mapping[SeriesKey, float]) -> dict[str, float]:
    per_version: dict[str, list[tuple[float, float]]] = {}
    for (_, labels), v in values.items():
        lab = dict(labels)
        per_version.setdefault(lab["version"], []).append((float(lab["le"]), v))
    return {ver: histogram_quantile(0.95, b) for ver, b in per_version.items()}


def _by_version(values: Mapping[str, float]) -> dict[Labels, float]:
    return {(("version", ver),): v for ver, v in values.items()}


def _corrected_latency(inc: IncidentSeries, at: float, left_open: bool) -> dict[Labels, float]:
    q = _latency_quantile_by_version(_rates(inc, inc.select(LATENCY), at, left_open))
    return _by_version({ver: v for ver, v in q.items() if v > SLO_P95_S})


def _corrected_errors(inc: IncidentSeries, at: float, left_open: bool) -> dict[Labels, float]:
    out = {}
    for ver in ("v1", "v2"):
        errs = _rates(inc, inc.select(REQUESTS, version=ver, status="5.."), at, left_open)
        alls = _rates(inc, inc.select(REQUESTS, version=ver), at, left_open)
        if errs and alls and sum(alls.values()) > 0:
            ratio = sum(errs.values()) / sum(alls.values())
            if ratio > 0.01:
                out[ver] = ratio
    return _by_version(out)


def _source004_latency_no_series(inc: IncidentSeries, at: float, left_open: bool) -> dict[Labels, float]:
    return {}  # ``churn_request_latency_seconds`` names no series: only _bucket, _sum, _count exist


def _source004_latency_cumulative(inc: IncidentSeries, at: float, left_open: bool) -> dict[Labels, float]:
    i = int(np.searchsorted(inc.times_s, at, side="right")) - 1
    now = {k: float(v[i]) for k, v in inc.select(LATENCY).items()}
    return _by_version({ver: v for ver, v in _latency_quantile_by_version(now).items() if v > 0.1})


def _source004_errors(inc: IncidentSeries, at: float, left_open: bool) -> dict[Labels, float]:
    rates = _rates(inc, inc.select(REQUESTS, status="5.."), at, left_open)
    return {labels: v for (_, labels), v in rates.items() if v > 0.01}  # no aggregation: all labels stay


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule: its PromQL (as in the YAML file), ``for`` and a Python evaluator.

    ``evaluate(incident, t_s, left_open)`` returns {labels: value} for the label sets where the
    expression has a result at ``t_s`` (labels: sorted (name, value) pairs of the result series).
    """

    name: str
    file: str
    expr: str
    for_s: float
    labels: Mapping[str, str]
    summary: str
    evaluate: Callable[[IncidentSeries, float, bool], dict[Labels, float]]


RULES: tuple[AlertRule, ...] = (
    AlertRule(
        "ChurnLatencyP95AboveSLO",
        "alerts.yml",
        "histogram_quantile(0.95, sum by (le, version) (rate(churn_request_latency_seconds_bucket[5m]))) > 0.02",
        120,
        {"severity": "page"},
        "p95 latency of model {version} above the 20 ms SLO for 2 minutes",
        _corrected_latency,
    ),
    AlertRule(
        "ChurnErrorRatioHigh",
        "alerts.yml",
        'sum by (version) (rate(churn_requests_total{status=~"5.."}[5m])) / sum by (version) '
        "(rate(churn_requests_total[5m])) > 0.01",
        60,
        {"severity": "page"},
        "more than 1 % of model {version} requests failed over 5 minutes",
        _corrected_errors,
    ),
    AlertRule(
        "Source004HighInferenceLatency",
        "source004_alerts.yml",
        "histogram_quantile(0.95, churn_request_latency_seconds) > 0.1",
        300,
        {},
        "p95 inference latency exceeds 100 ms",
        _source004_latency_no_series,
    ),
    AlertRule(
        "Source004HighInferenceLatencyBuckets",
        "source004_alerts.yml",
        "histogram_quantile(0.95, churn_request_latency_seconds_bucket) > 0.1",
        300,
        {},
        "p95 inference latency exceeds 100 ms",
        _source004_latency_cumulative,
    ),
    AlertRule(
        "Source004HighErrorRate",
        "source004_alerts.yml",
        'rate(churn_requests_total{status=~"5.."}[5m]) > 0.01',
        60,
        {},
        "Model error rate exceeds 1%",
        _source004_errors,
    ),
)


def evaluate_rules(
    incident: IncidentSeries,
    rules: Sequence[AlertRule] = RULES,
    *,
    interval_s: float = SCRAPE_INTERVAL_S,
    left_open: bool = False,
) -> pd.DataFrame:
    """The state of every alert at every rule evaluation (every ``interval_s`` from 0).

    Returns
    -------
    DataFrame with columns ``t_s``, ``alert``, ``labels`` (the result's labels, sorted pairs),
    ``version`` (its version label or ""), ``state`` ("pending" or "firing") and ``value`` (the
    expression's value), one row per active alert per evaluation.
    """
    rows = []
    active: dict[tuple[str, Labels], float] = {}
    for t in np.arange(0, incident.times_s[-1] + 1e-9, interval_s):
        for rule in rules:
            result = rule.evaluate(incident, float(t), left_open)
            for labels in [lab for (r, lab) in active if r == rule.name and lab not in result]:
                del active[(rule.name, labels)]
            for labels, value in result.items():
                since = active.setdefault((rule.name, labels), float(t))
                rows.append(
                    {
                        "t_s": float(t),
                        "alert": rule.name,
                        "labels": labels,
                        "version": dict(labels).get("version", ""),
                        "state": "firing" if t - since >= rule.for_s else "pending",
                        "value": value,
                    }
                )
    return pd.DataFrame(rows, columns=["t_s", "alert", "labels", "version", "state", "value"])


def incident_signals(incident: IncidentSeries, *, left_open: bool = False) -> pd.DataFrame:
    """What the corrected rules look at, at every scrape: per version, the request rate, the p95
    (``histogram_quantile`` of the 5 m rates, s) and the 5xx ratio over 5 m.

    Returns
    -------
    DataFrame with ``t_s``, ``version``, ``rps``, ``p95_s`` and ``error_ratio`` (NaN without traffic).
    """
    rows = []
    for t in incident.times_s[1:]:
        buckets = _rates(incident, incident.select(LATENCY), float(t), left_open)
        p95 = _latency_quantile_by_version(buckets)
        for ver in ("v1", "v2"):
            alls = sum(_rates(incident, incident.select(REQUESTS, version=ver), float(t), left_open).values())
            errs = sum(
                _rates(
                    incident, incident.select(REQUESTS, version=ver, status="5.."), float(t), left_open
                ).values()
            )
            rows.append(
                {
                    "t_s": float(t),
                    "version": ver,
                    "rps": alls,
                    "p95_s": p95.get(ver, math.nan),
                    "error_ratio": errs / alls if alls > 0 else math.nan,
                }
            )
    return pd.DataFrame(rows)
