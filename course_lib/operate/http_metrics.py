"""What the clients of a server saw, as Prometheus metrics: the server door's counters exported.

One concept: :class:`DoorCollector`, a ``prometheus_client`` custom collector over a
``course_lib.serving.server.DoorCounters``. It exports ``churn_http_requests_total{outcome}`` (every
request once, by what its client saw: ``ok``, ``shed`` (503), ``expired`` (504), ``client_errors``,
``server_errors``, ``abandoned``: the client had gone before its answer was written) and the histogram
``churn_http_request_duration_seconds`` of the ``ok`` answers, timed from the door to the last byte
written. Unlike timings taken inside a handler, these include the wait behind other requests in
the server, so under overload they agree with what a load generator measures (up to the time a
request spends in the kernel before the server reads it).

References
----------
prometheus_client documentation, "Custom Collectors" (``CounterMetricFamily``,
``HistogramMetricFamily``); Prometheus documentation, "Histograms and summaries".
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from course_lib.core.vocabulary import LATENCY_BUCKETS_S, SERVER_OUTCOMES
from course_lib.serving.server import DoorCounters

__all__ = ["DoorCollector"]


class DoorCollector:
    """Exports the server door's counters: what the clients saw (see the module docstring)."""

    def __init__(self, counters: DoorCounters):
        self.counters = counters

    def collect(self) -> Any:
        c = self.counters
        family = CounterMetricFamily(
            "churn_http_requests",
            "Requests by what their client saw, counted at the server's door",
            labels=["outcome"],
        )
        for outcome in SERVER_OUTCOMES:
            family.add_metric([outcome], float(getattr(c, outcome)))
        yield family
        cumulative, buckets = 0, []
        for bound, count in zip([*LATENCY_BUCKETS_S, float("inf")], c.ok_latency_buckets, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
        yield HistogramMetricFamily(
            "churn_http_request_duration_seconds",
            "Answered (ok) requests, from the server's door to the last byte written",
            buckets=buckets,
            sum_value=c.ok_latency_sum_s,
        )
