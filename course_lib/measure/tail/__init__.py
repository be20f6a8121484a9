"""Lesson 7's live tail experiments: hedge settings in rounds, the fan-out check, cold starts.

* ``_hedging_rounds``: ``run_hedging_rounds`` (settings taking turns in rotated, paired rounds),
  ``HedgingRounds`` (per-round percentile ratios with their interval), ``busy_fractions``;
* ``_fanout``: ``stalled_calls``, ``binomial_interval``, ``fanout_check`` / ``FanoutCheck`` (the pages
  measured against ``1 - (1 - p)^k``);
* ``_cold_start``: ``cold_start_table`` / ``ColdStartVariant``, ``first_requests_ms`` (fresh replica
  processes, with and without a warm-up).
"""

from __future__ import annotations

from course_lib.measure.tail._cold_start import (
    ColdStartVariant,
    cold_start_table,
    first_requests_ms,
)
from course_lib.measure.tail._fanout import (
    FanoutCheck,
    binomial_interval,
    fanout_check,
    stalled_calls,
)
from course_lib.measure.tail._hedging_rounds import (
    HedgingRounds,
    busy_fractions,
    run_hedging_rounds,
)

__all__ = [
    "ColdStartVariant",
    "FanoutCheck",
    "HedgingRounds",
    "binomial_interval",
    "busy_fractions",
    "cold_start_table",
    "fanout_check",
    "first_requests_ms",
    "run_hedging_rounds",
    "stalled_calls",
]
