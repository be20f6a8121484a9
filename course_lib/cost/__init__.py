"""What serving costs: replicas from peak traffic, the monthly bill, cost per 1,000 or 1,000,000 predictions.

The model every function here implements:

* **Replicas** are sized for the *peak* (plus headroom), never the mean::

      replicas = max(min_replicas, ceil(peak_rps x (1 + headroom) / (rps_per_replica x target_utilization)))

* **The monthly bill** is what runs, busy or idle: ``hourly_price x replicas x hours_per_month``.
* **Cost per prediction** divides that bill by the predictions actually served, i.e. by the *mean*
  traffic: ``predictions_per_month = mean_rps x 3600 x hours_per_month``. Dividing by peak traffic
  understates it by the peak-to-mean ratio.
* **Cost at full use** (``hourly_price / (rps_per_replica x 3600)``) is the floor a replica reaches only
  when it is busy every second; it is what "the GPU is cheaper per request" compares.

Conventions
-----------
Traffic is in requests per second (``_rps``); one request is one prediction. Money: every price,
bill and cost is in the unit of the price you pass in, and no name carries a currency. The arithmetic
is linear in price and never converts, so Kirana Kart's rupee prices give rupee results;
:class:`ServingOption` records the unit in ``currency`` and the functions that compare two options
refuse to mix currencies. Prices are always arguments (with an as-of date on :class:`ServingOption`),
never constants in this module.

Arithmetic is exact on the decimals you type: each input is read as the decimal it prints as
(``str(float(x))``) and combined with :class:`fractions.Fraction`, so 100 req/s x 1.1 / 10 req/s is
exactly 11 replicas (binary floating point gives 11.000000000000002, which ``math.ceil`` turns into 12),
and 0.17 x 1.2 x 720 prints as 146.88. Results are returned as the nearest ``float``.

Where it lives
--------------
This module is the one import for lessons; the pieces are :mod:`course_lib.cost.inputs` (checked,
exact inputs), :mod:`course_lib.cost.fleet` (replicas, bills, cost per prediction, scheduled jobs),
:mod:`course_lib.cost.options` (options, plans, comparisons) and :mod:`course_lib.cost.break_even`
(the break-even search).

References
----------
Source lessons 000 ("Cost per prediction modeling"), 001 ("CPU or GPU") and 004 ("Capacity Planning and
Cost Analysis"); each piece cites the sections and figures it reproduces.
"""

from __future__ import annotations

from course_lib.cost.break_even import BreakEven, break_even_rps
from course_lib.cost.fleet import (
    YEAR_CONVENTIONS,
    ScheduledJobComparison,
    _replicas_exact,  # noqa: F401  (Lesson 5 shows its source as cost._replicas_exact)
    always_on_vs_scheduled,
    batch_job_cost,
    cost_per_million,
    cost_per_million_at_full_use,
    cost_per_thousand,
    cost_per_thousand_at_full_use,
    monthly_cost,
    predictions_per_month,
    replicas_needed,
)
from course_lib.cost.inputs import HOURS_PER_MONTH, SECONDS_PER_HOUR
from course_lib.cost.options import ServingOption, ServingPlan, compare_options, plan_serving

__all__ = [
    "HOURS_PER_MONTH",
    "SECONDS_PER_HOUR",
    "YEAR_CONVENTIONS",
    "BreakEven",
    "ScheduledJobComparison",
    "ServingOption",
    "ServingPlan",
    "always_on_vs_scheduled",
    "batch_job_cost",
    "break_even_rps",
    "compare_options",
    "cost_per_million",
    "cost_per_million_at_full_use",
    "cost_per_thousand",
    "cost_per_thousand_at_full_use",
    "monthly_cost",
    "plan_serving",
    "predictions_per_month",
    "replicas_needed",
]
