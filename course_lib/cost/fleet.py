"""The fleet cost model: replicas from peak traffic, the monthly bill, cost per 1,000 or 1M predictions.

* **Replicas** are sized for the *peak* (plus headroom), never the mean::

      replicas = max(min_replicas, ceil(peak_rps x (1 + headroom) / (rps_per_replica x target_utilization)))

* **The monthly bill** is what runs, busy or idle: ``hourly_price x replicas x hours_per_month``.
* **Cost per prediction** divides that bill by the predictions actually served, i.e. by the *mean*
  traffic: ``predictions_per_month = mean_rps x 3600 x hours_per_month``. Dividing by peak traffic
  understates it by the peak-to-mean ratio.
* **Cost at full use** (``hourly_price / (rps_per_replica x 3600)``) is the floor a replica reaches only
  when it is busy every second; it is what "the GPU is cheaper per request" compares.

Money is in the unit of the price passed in (any currency; nothing converts), so the names carry no
currency: :class:`course_lib.cost.options.ServingOption` records the unit in ``currency``. Inputs are
checked and exact (:mod:`course_lib.cost.inputs`).

References
----------
Source lesson 001, "Inference Optimisation and Scaling", section "CPU or GPU" (replicas from peak
traffic with 30% headroom and a minimum of two replicas; cost per 1,000 at full use).
Source lesson 000, "Inference Engineering Basics: Latency, Batching, and Cost", section "Cost per
prediction modeling" (720-hour month, cost per 1,000,000 predictions, spot batch scoring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from course_lib.cost.inputs import (
    HOURS_PER_MONTH,
    MAX_HOURS_PER_YEAR,
    SECONDS_PER_HOUR,
    check_at_most,
    check_headroom,
    check_hours_per_month,
    check_min_replicas,
    check_non_negative,
    check_positive,
    check_utilization,
)

__all__ = [
    "YEAR_CONVENTIONS",
    "ScheduledJobComparison",
    "always_on_vs_scheduled",
    "batch_job_cost",
    "cost_per_million",
    "cost_per_million_at_full_use",
    "cost_per_thousand",
    "cost_per_thousand_at_full_use",
    "monthly_cost",
    "predictions_per_month",
    "replicas_needed",
]

#: Two ways to count a year for "every Monday" jobs: (runs_per_year, hours_per_year).
#: 52 weekly runs against a 365-day year is the usual back-of-envelope answer; 365.25 / 7 runs against
#: a 365.25-day year is the long-run average (a real year has 52 or 53 Mondays).
YEAR_CONVENTIONS: dict[str, tuple[float, float]] = {
    "52 weeks, 8,760 h (365-day year)": (52.0, 8760.0),
    "365.25/7 weeks, 8,766 h (365.25-day year)": (365.25 / 7, 8766.0),
}


def _replicas_exact(
    peak: Fraction, capacity: Fraction, headroom: Fraction, utilization: Fraction, floor: int
) -> int:
    return max(floor, math.ceil(peak * (1 + headroom) / (capacity * utilization)))


def replicas_needed(
    peak_rps: float,
    rps_per_replica: float,
    *,
    headroom: float = 0.3,
    target_utilization: float = 1.0,
    min_replicas: int = 2,
) -> int:
    """Replicas to run so the peak, plus headroom, fits at the target utilization.

    ``max(min_replicas, ceil(peak_rps x (1 + headroom) / (rps_per_replica x target_utilization)))``,
    computed exactly on the decimal inputs (an exact multiple never rounds up).

    The hardened form of :func:`course_lib.cost.core.replicas_for_peak` (same answers on shared
    vectors). It adds: exact decimal arithmetic (a float ``ceil`` can add a replica at an exact
    multiple), a target utilization below 1, and checked inputs (a percentage such as 30 refused).

    Parameters
    ----------
    peak_rps : float > 0
        Highest sustained traffic the service must absorb, requests per second (peak, not average).
    rps_per_replica : float > 0
        Requests per second one replica serves within the latency limit (measured, e.g. by
        ``benchmarks/measure_throughput.py``).
    headroom : float in [0, 10], default 0.3
        Extra capacity above the peak as a fraction (0.3 = 30%) for spikes and a failed replica.
    target_utilization : float in (0, 1], default 1.0
        Fraction of ``rps_per_replica`` you are willing to run at (queues grow fast near 1).
    min_replicas : int >= 1, default 2
        Floor for reliability: with two, one can fail or be redeployed.

    Returns
    -------
    int
        Number of replicas, >= ``min_replicas``.

    Raises
    ------
    TypeError
        If a rate is not a number (e.g. the string ``"50 req/s"``).
    ValueError
        If a rate is zero, negative or not finite, ``headroom`` is outside [0, 10] (a percentage such
        as 30 is refused), ``target_utilization`` is outside (0, 1], or ``min_replicas`` is not an
        integer >= 1.

    References
    ----------
    Source lesson 001, "CPU or GPU": 278 req/s peak, 30% headroom, at least 2 replicas.
    """
    peak = check_positive("peak_rps", peak_rps, "requests per second")
    capacity = check_positive("rps_per_replica", rps_per_replica, "requests per second per replica")
    return _replicas_exact(
        peak,
        capacity,
        check_headroom(headroom),
        check_utilization(target_utilization),
        check_min_replicas(min_replicas),
    )


def monthly_cost(hourly_price: float, replicas: float, *, hours_per_month: float = HOURS_PER_MONTH) -> float:
    """What a fleet costs in a month: ``hourly_price x replicas x hours_per_month``.

    Parameters
    ----------
    hourly_price : float > 0
        Price of one replica for one hour, in the currency the result should be in.
    replicas : float >= 0
        Replicas running; may be fractional for an autoscaled fleet's *average* (e.g. 1.2).
    hours_per_month : float in (0, 744], default 720
        Billed hours; 720 is the sources' 30-day month.

    Returns
    -------
    float
        Cost per month, in the unit of ``hourly_price``.

    Raises
    ------
    TypeError, ValueError
        For a non-number, a price <= 0, negative replicas or hours outside (0, 744].
    """
    price = check_positive("hourly_price", hourly_price, "currency per replica-hour")
    count = check_non_negative("replicas", replicas, "replicas running, the monthly average if autoscaled")
    return float(price * count * check_hours_per_month(hours_per_month))


def predictions_per_month(mean_rps: float, *, hours_per_month: float = HOURS_PER_MONTH) -> float:
    """Predictions served in a month at the *mean* traffic: ``mean_rps x 3600 x hours_per_month``.

    Parameters
    ----------
    mean_rps : float > 0
        Average requests per second over the month (not the peak).
    hours_per_month : float in (0, 744], default 720

    Raises
    ------
    TypeError, ValueError
        For a non-number, ``mean_rps`` <= 0 or hours outside (0, 744].
    """
    mean = check_positive("mean_rps", mean_rps, "average requests per second over the month")
    return float(mean * SECONDS_PER_HOUR * check_hours_per_month(hours_per_month))


def _per_unit(monthly: object, predictions: object, unit: int) -> float:
    bill = check_non_negative("monthly_cost", monthly, "currency per month")
    count = check_positive("predictions_per_month", predictions, "predictions served per month")
    return float(bill / count * unit)


def cost_per_thousand(monthly_cost: float, predictions_per_month: float) -> float:
    """Cost of 1,000 predictions: the monthly bill divided by the predictions actually served.

    Parameters
    ----------
    monthly_cost : float >= 0
        The month's bill (e.g. from :func:`monthly_cost`), any currency.
    predictions_per_month : float > 0
        Predictions served that month, from the *mean* traffic (see :func:`predictions_per_month`).

    Returns
    -------
    float
        ``monthly_cost / predictions_per_month x 1,000``, in the unit of the bill.

    Raises
    ------
    TypeError, ValueError
        For a non-number, a negative bill or ``predictions_per_month`` <= 0.
    """
    return _per_unit(monthly_cost, predictions_per_month, 1_000)


def cost_per_million(monthly_cost: float, predictions_per_month: float) -> float:
    """Cost of 1,000,000 predictions: ``monthly_cost / predictions_per_month x 1,000,000``.

    Same parameters, units and errors as :func:`cost_per_thousand`.

    References
    ----------
    Source lesson 000, "Cost per prediction modeling" (the unit the StayWell table reports).
    """
    return _per_unit(monthly_cost, predictions_per_month, 1_000_000)


def _full_use(hourly_price: object, rps_per_replica: object, unit: int) -> float:
    price = check_positive("hourly_price", hourly_price, "currency per replica-hour")
    capacity = check_positive("rps_per_replica", rps_per_replica, "requests per second per replica")
    return float(price / (capacity * SECONDS_PER_HOUR) * unit)


def cost_per_thousand_at_full_use(hourly_price: float, rps_per_replica: float) -> float:
    """Cost of 1,000 predictions on a replica that is busy every second: ``price / (rps x 3600) x 1,000``.

    This is a floor, reached only at 100% utilization; real traffic (and ``min_replicas``) leaves
    replicas partly idle, so compare options with :func:`plan_serving` at your traffic as well.

    Parameters
    ----------
    hourly_price : float > 0
        Price of one replica-hour, any currency.
    rps_per_replica : float > 0
        Requests per second one replica serves.

    Returns
    -------
    float
        Cost per 1,000 predictions, in the unit of ``hourly_price``.

    Raises
    ------
    TypeError, ValueError
        For a non-number or a value <= 0.

    References
    ----------
    Source lesson 001, "CPU or GPU" table: 40 / (50 x 3600) x 1000 = 0.222; 250 / (600 x 3600) x 1000 = 0.116.
    """
    return _full_use(hourly_price, rps_per_replica, 1_000)


def cost_per_million_at_full_use(hourly_price: float, rps_per_replica: float) -> float:
    """Cost of 1,000,000 predictions at full use; 1,000 x :func:`cost_per_thousand_at_full_use`."""
    return _full_use(hourly_price, rps_per_replica, 1_000_000)


def batch_job_cost(hourly_price: float, hours: float) -> float:
    """Cost of one scheduled batch job on an instance that exists only while it runs: ``price x hours``.

    Parameters
    ----------
    hourly_price : float > 0
        Instance price per hour (e.g. a spot rate), any currency.
    hours : float > 0
        Wall time of the job in hours (12 minutes = 0.2).

    Raises
    ------
    TypeError, ValueError
        For a non-number or a value <= 0.

    References
    ----------
    Source lesson 000, architecture 4: $0.102/h spot x 0.2 h = $0.0204.
    """
    price = check_positive("hourly_price", hourly_price, "currency per instance-hour")
    return float(price * check_positive("hours", hours, "hours the job runs"))


@dataclass(frozen=True)
class ScheduledJobComparison:
    """Annual cost of keeping an instance on all year versus starting one only for a scheduled job.

    All money fields are in the unit of the prices passed to :func:`always_on_vs_scheduled`.
    """

    always_on_annual: float
    scheduled_annual: float
    savings: float
    cost_ratio: float
    runs_per_year: float
    hours_per_year: float


def always_on_vs_scheduled(
    always_on_hourly: float,
    job_hourly: float,
    job_hours_per_run: float,
    *,
    runs_per_year: float,
    hours_per_year: float,
) -> ScheduledJobComparison:
    """Compare an always-on instance with a per-run (e.g. spot) instance for a scheduled job, per year.

    ``runs_per_year`` and ``hours_per_year`` have no defaults on purpose: "every Monday" is 52 runs in
    a 365-day year of 8,760 hours by the usual convention, 365.25 / 7 = 52.18 on average, and 52 or 53
    in a real calendar year. :data:`YEAR_CONVENTIONS` holds the first two.

    Parameters
    ----------
    always_on_hourly : float > 0
        Price per hour of the instance kept running.
    job_hourly : float > 0
        Price per hour of the instance started for each run (spot or on-demand).
    job_hours_per_run : float > 0
        Hours each run takes (30 minutes = 0.5).
    runs_per_year : float > 0
        Runs a year, may be an average such as 365.25 / 7.
    hours_per_year : float in (0, 8784]
        Hours the always-on instance is billed a year.

    Returns
    -------
    ScheduledJobComparison
        Annual cost of each, the saving (always-on minus scheduled) and always-on / scheduled.

    Raises
    ------
    TypeError, ValueError
        For a non-number, a value <= 0, or more than 8,784 hours a year.

    References
    ----------
    Source lesson 000, exercise "Calculate annual savings from spot batch scoring" ($0.17/h always on
    versus $0.04/h spot for 30 minutes every Monday).
    """
    always = check_positive("always_on_hourly", always_on_hourly, "currency per hour")
    job = check_positive("job_hourly", job_hourly, "currency per hour")
    per_run = check_positive("job_hours_per_run", job_hours_per_run, "hours per run")
    runs = check_positive("runs_per_year", runs_per_year, "runs per year")
    hours = check_at_most(
        "hours_per_year",
        check_positive("hours_per_year", hours_per_year, "hours billed per year"),
        hours_per_year,
        MAX_HOURS_PER_YEAR,
        "a leap year has 8,784 hours",
    )
    always_annual = always * hours
    scheduled_annual = job * per_run * runs
    return ScheduledJobComparison(
        always_on_annual=float(always_annual),
        scheduled_annual=float(scheduled_annual),
        savings=float(always_annual - scheduled_annual),
        cost_ratio=float(always_annual / scheduled_annual),
        runs_per_year=float(runs),
        hours_per_year=float(hours),
    )
