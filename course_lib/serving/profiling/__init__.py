"""Per-request stage timing: stage timer, request profiles, the latency budget, the ``Server-Timing`` header.

* ``core``: ``time_stages``, the stage timer's core (each stage timed with ``perf_counter_ns``);
* ``_stages``: ``StageTimer``, ``RequestProfile``, ``LatencyBudget`` (p50/p95/p99 per stage, SLO flags),
  ``profile_requests``;
* ``_rounds``: ``profile_in_rounds`` (several configurations side by side in interleaved, rotated
  rounds) and its ``RoundsProfile`` (per-round budgets, ratios with intervals);
* ``_server_timing``: ``format_server_timing`` / ``parse_server_timing`` (W3C Server Timing).
"""

from __future__ import annotations

from course_lib.serving.profiling._rounds import RoundsProfile, profile_in_rounds
from course_lib.serving.profiling._server_timing import (
    check_metric_name,
    format_server_timing,
    parse_server_timing,
)
from course_lib.serving.profiling._stages import (
    END_TO_END,
    SUMMARY_COLUMNS,
    LatencyBudget,
    RequestProfile,
    StageTimer,
    profile_requests,
)

__all__ = [
    "END_TO_END",
    "SUMMARY_COLUMNS",
    "LatencyBudget",
    "RequestProfile",
    "RoundsProfile",
    "StageTimer",
    "check_metric_name",
    "format_server_timing",
    "parse_server_timing",
    "profile_in_rounds",
    "profile_requests",
]
