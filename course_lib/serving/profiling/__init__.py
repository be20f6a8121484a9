"""Per-request stage timing: a stage timer, request profiles, the latency budget, the ``Server-Timing`` header.

* ``_stages``: ``StageTimer``, ``RequestProfile``, ``LatencyBudget`` (p50/p95/p99 per stage, SLO flags),
  ``profile_requests``;
* ``_server_timing``: ``format_server_timing`` / ``parse_server_timing`` (W3C Server Timing).
"""

from __future__ import annotations

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
    "StageTimer",
    "check_metric_name",
    "format_server_timing",
    "parse_server_timing",
    "profile_requests",
]
