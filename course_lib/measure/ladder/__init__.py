"""The rate ladder: climb offered rates with a per-rung SLO rule, and read each target's knee off the climb.

One climber for every lesson and benchmark. A *ladder* is a list of offered rates (``geometric_ladder``:
four rungs per doubling by default). :func:`climb` runs each target (a server configuration, an endpoint,
an in-process batcher) at each rung; a :class:`SloRule` turns each run into a row and decides whether the
rung met the SLO (p99 within a limit, errors under a budget, enough requests for the p99 it judges) and
whether a missed try may be tried again. Several targets take turns at every rung (their order rotates
with ``repeat``, so drift of a shared machine and order effects hit them alike); a target leaves the climb
after a rung that missed every try, since higher rates would only pile up a longer queue. A target may
start higher up (``start_rps``, e.g. from a record: ``start_rungs``) and, with ``step_down``, walk down
when its first rung misses. :func:`climb_async` climbs the same way with an async ``run`` (in-process
targets on the notebook's event loop; :func:`open_loop_runs` builds that ``run`` from factories of
``send`` functions).

:func:`knees` is the one knee reader: per repeat and target, the highest rung met with every rung above
its start met too, the first rung that missed every try, and what the run at the knee measured.
:func:`sustainable_rate` reads the same knee off a table that no climb made (a simulator's sweep).

Columns of a climb (one row per run, in the order run): ``repeat``, ``target``, ``attempt``, ``rate_rps``,
the :func:`step_row` columns, ``done_in_time``, ``enough_requests`` and ``met_slo`` (the rule's verdict).

References
----------
Google SRE book, ch. 4 "Service Level Objectives" (percentile SLOs). Gil Tene, "How NOT to measure
latency" (intended send times, send lag). The 10 / (1 - q) rule for the requests a p99 needs:
``course_lib.measure.loadgen.MIN_REQUESTS_P99``.
"""

from __future__ import annotations

from course_lib.measure.ladder._climb import (
    LADDER_RATIO,
    climb,
    climb_async,
    geometric_ladder,
    open_loop_runs,
    start_rungs,
)
from course_lib.measure.ladder._knee import knees, sustainable_rate
from course_lib.measure.ladder._rung import MAX_ERROR_RATE, SloRule, step_row, step_table

__all__ = [
    "LADDER_RATIO",
    "MAX_ERROR_RATE",
    "SloRule",
    "climb",
    "climb_async",
    "geometric_ladder",
    "knees",
    "open_loop_runs",
    "start_rungs",
    "step_row",
    "step_table",
    "sustainable_rate",
]
