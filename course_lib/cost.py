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
Traffic is in requests per second (``_rps``); one request is one prediction. Money: every ``_usd``
parameter and result is in the unit of the price you pass in. The arithmetic is linear in price and
never converts, so Kirana Kart's rupee prices give rupee results; :class:`ServingOption` records the
unit in ``currency`` and the functions that compare two options refuse to mix currencies. Prices are
always arguments (with an as-of date on :class:`ServingOption`), never constants in this module.

Arithmetic is exact on the decimals you type: each input is read as the decimal it prints as
(``str(float(x))``) and combined with :class:`fractions.Fraction`, so 100 req/s x 1.1 / 10 req/s is
exactly 11 replicas (binary floating point gives 11.000000000000002, which ``math.ceil`` turns into 12),
and 0.17 x 1.2 x 720 prints as 146.88. Results are returned as the nearest ``float``.

References
----------
Source lesson 001, "Inference Optimisation and Scaling", section "CPU or GPU" (replicas from peak
traffic with 30% headroom and a minimum of two replicas; cost per 1,000 at full use).
Source lesson 000, "Inference Engineering Basics: Latency, Batching, and Cost", section "Cost per
prediction modeling" (720-hour month, cost per 1,000,000 predictions, spot batch scoring).
Source lesson 004, "Serving Models at Scale", section "Capacity Planning and Cost Analysis".
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import pandas as pd

__all__ = [
    "HOURS_PER_MONTH",
    "SECONDS_PER_HOUR",
    "YEAR_CONVENTIONS",
    "BreakEven",
    "ScheduledJobComparison",
    "ServingOption",
    "ServingPlan",
    "always_on_vs_scheduled",
    "batch_job_cost_usd",
    "break_even_rps",
    "compare_options",
    "cost_per_million_at_full_use_usd",
    "cost_per_million_usd",
    "cost_per_thousand_at_full_use_usd",
    "cost_per_thousand_usd",
    "monthly_cost_usd",
    "plan_serving",
    "predictions_per_month",
    "replicas_needed",
]

#: The sources' billing month: 30 days x 24 hours. A calendar month has 672 to 744 hours.
HOURS_PER_MONTH = 720.0
SECONDS_PER_HOUR = 3600
#: Two ways to count a year for "every Monday" jobs: (runs_per_year, hours_per_year).
#: 52 weekly runs against a 365-day year is the usual back-of-envelope answer; 365.25 / 7 runs against
#: a 365.25-day year is the long-run average (a real year has 52 or 53 Mondays).
YEAR_CONVENTIONS: dict[str, tuple[float, float]] = {
    "52 weeks, 8,760 h (365-day year)": (52.0, 8760.0),
    "365.25/7 weeks, 8,766 h (365.25-day year)": (365.25 / 7, 8766.0),
}
_MAX_HOURS_PER_MONTH = 31 * 24
_MAX_HOURS_PER_YEAR = 366 * 24
_MAX_HEADROOM = 10.0
_MAX_BREAK_EVEN_STEPS = 250_000
_CURRENCY = re.compile(r"^[A-Z]{3}$")


# ----------------------------------------------------------------------------------------------------
# input checks: every error names the parameter, the value and what is allowed
# ----------------------------------------------------------------------------------------------------
def _number(name: str, value: object, unit: str) -> Fraction:
    """``value`` as an exact Fraction of its printed decimal; TypeError/ValueError if not a finite number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a number in {unit}, got {value!r} ({type(value).__name__}); "
            "pass the number alone, the unit is part of the parameter's name"
        )
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ValueError(f"{name} must be a finite number in {unit}, got {value!r}")
    return Fraction(str(as_float))


def _positive(name: str, value: object, unit: str) -> Fraction:
    exact = _number(name, value, unit)
    if exact <= 0:
        raise ValueError(f"{name} must be > 0 ({unit}), got {value!r}")
    return exact


def _non_negative(name: str, value: object, unit: str) -> Fraction:
    exact = _number(name, value, unit)
    if exact < 0:
        raise ValueError(f"{name} must be >= 0 ({unit}), got {value!r}")
    return exact


def _at_most(name: str, exact: Fraction, value: object, limit: float, why: str) -> Fraction:
    if exact > limit:
        raise ValueError(f"{name} must be <= {limit:g} ({why}), got {value!r}")
    return exact


def _headroom(value: object) -> Fraction:
    exact = _non_negative("headroom", value, "a fraction of peak traffic, 0.3 for 30%")
    if exact > _MAX_HEADROOM:
        raise ValueError(
            f"headroom must be a fraction between 0 and {_MAX_HEADROOM:g} (0.3 means 30% above peak), "
            f"got {value!r}; did you pass a percentage?"
        )
    return exact


def _utilization(value: object) -> Fraction:
    exact = _number("target_utilization", value, "a fraction of one replica's capacity")
    if not 0 < exact <= 1:
        raise ValueError(
            f"target_utilization must be in (0, 1] (0.7 means run replicas at 70% of their measured "
            f"capacity), got {value!r}"
        )
    return exact


def _min_replicas(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"min_replicas must be a whole number (int) >= 1, got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise ValueError(f"min_replicas must be >= 1 (a service needs a replica to answer), got {value!r}")
    return int(value)


def _hours_per_month(value: object) -> Fraction:
    exact = _positive("hours_per_month", value, "hours billed per month, 720 for 30 days")
    return _at_most("hours_per_month", exact, value, _MAX_HOURS_PER_MONTH, "a month has at most 744 hours")


# ----------------------------------------------------------------------------------------------------
# the formulas
# ----------------------------------------------------------------------------------------------------
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
    peak = _positive("peak_rps", peak_rps, "requests per second")
    capacity = _positive("rps_per_replica", rps_per_replica, "requests per second per replica")
    return _replicas_exact(
        peak, capacity, _headroom(headroom), _utilization(target_utilization), _min_replicas(min_replicas)
    )


def monthly_cost_usd(
    hourly_price_usd: float, replicas: float, *, hours_per_month: float = HOURS_PER_MONTH
) -> float:
    """What a fleet costs in a month: ``hourly_price_usd x replicas x hours_per_month``.

    Parameters
    ----------
    hourly_price_usd : float > 0
        Price of one replica for one hour, in the currency the result should be in.
    replicas : float >= 0
        Replicas running; may be fractional for an autoscaled fleet's *average* (e.g. 1.2).
    hours_per_month : float in (0, 744], default 720
        Billed hours; 720 is the sources' 30-day month.

    Returns
    -------
    float
        Cost per month, in the unit of ``hourly_price_usd``.

    Raises
    ------
    TypeError, ValueError
        For a non-number, a price <= 0, negative replicas or hours outside (0, 744].
    """
    price = _positive("hourly_price_usd", hourly_price_usd, "currency per replica-hour")
    count = _non_negative("replicas", replicas, "replicas running, the monthly average if autoscaled")
    return float(price * count * _hours_per_month(hours_per_month))


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
    mean = _positive("mean_rps", mean_rps, "average requests per second over the month")
    return float(mean * SECONDS_PER_HOUR * _hours_per_month(hours_per_month))


def _per_unit(monthly: object, predictions: object, unit: int) -> float:
    bill = _non_negative("monthly_cost_usd", monthly, "currency per month")
    count = _positive("predictions_per_month", predictions, "predictions served per month")
    return float(bill / count * unit)


def cost_per_thousand_usd(monthly_cost_usd: float, predictions_per_month: float) -> float:
    """Cost of 1,000 predictions: the monthly bill divided by the predictions actually served.

    Parameters
    ----------
    monthly_cost_usd : float >= 0
        The month's bill (e.g. from :func:`monthly_cost_usd`), any currency.
    predictions_per_month : float > 0
        Predictions served that month, from the *mean* traffic (see :func:`predictions_per_month`).

    Returns
    -------
    float
        ``monthly_cost_usd / predictions_per_month x 1,000``, in the unit of the bill.

    Raises
    ------
    TypeError, ValueError
        For a non-number, a negative bill or ``predictions_per_month`` <= 0.
    """
    return _per_unit(monthly_cost_usd, predictions_per_month, 1_000)


def cost_per_million_usd(monthly_cost_usd: float, predictions_per_month: float) -> float:
    """Cost of 1,000,000 predictions: ``monthly_cost_usd / predictions_per_month x 1,000,000``.

    Same parameters, units and errors as :func:`cost_per_thousand_usd`.

    References
    ----------
    Source lesson 000, "Cost per prediction modeling" (the unit the StayWell table reports).
    """
    return _per_unit(monthly_cost_usd, predictions_per_month, 1_000_000)


def _full_use(hourly_price_usd: object, rps_per_replica: object, unit: int) -> float:
    price = _positive("hourly_price_usd", hourly_price_usd, "currency per replica-hour")
    capacity = _positive("rps_per_replica", rps_per_replica, "requests per second per replica")
    return float(price / (capacity * SECONDS_PER_HOUR) * unit)


def cost_per_thousand_at_full_use_usd(hourly_price_usd: float, rps_per_replica: float) -> float:
    """Cost of 1,000 predictions on a replica that is busy every second: ``price / (rps x 3600) x 1,000``.

    This is a floor, reached only at 100% utilization; real traffic (and ``min_replicas``) leaves
    replicas partly idle, so compare options with :func:`plan_serving` at your traffic as well.

    Parameters
    ----------
    hourly_price_usd : float > 0
        Price of one replica-hour, any currency.
    rps_per_replica : float > 0
        Requests per second one replica serves.

    Returns
    -------
    float
        Cost per 1,000 predictions, in the unit of ``hourly_price_usd``.

    Raises
    ------
    TypeError, ValueError
        For a non-number or a value <= 0.

    References
    ----------
    Source lesson 001, "CPU or GPU" table: 40 / (50 x 3600) x 1000 = 0.222; 250 / (600 x 3600) x 1000 = 0.116.
    """
    return _full_use(hourly_price_usd, rps_per_replica, 1_000)


def cost_per_million_at_full_use_usd(hourly_price_usd: float, rps_per_replica: float) -> float:
    """Cost of 1,000,000 predictions at full use; 1,000 x :func:`cost_per_thousand_at_full_use_usd`."""
    return _full_use(hourly_price_usd, rps_per_replica, 1_000_000)


def batch_job_cost_usd(hourly_price_usd: float, hours: float) -> float:
    """Cost of one scheduled batch job on an instance that exists only while it runs: ``price x hours``.

    Parameters
    ----------
    hourly_price_usd : float > 0
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
    price = _positive("hourly_price_usd", hourly_price_usd, "currency per instance-hour")
    return float(price * _positive("hours", hours, "hours the job runs"))


@dataclass(frozen=True)
class ScheduledJobComparison:
    """Annual cost of keeping an instance on all year versus starting one only for a scheduled job.

    All money fields are in the unit of the prices passed to :func:`always_on_vs_scheduled`.
    """

    always_on_annual_usd: float
    scheduled_annual_usd: float
    savings_usd: float
    cost_ratio: float
    runs_per_year: float
    hours_per_year: float


def always_on_vs_scheduled(
    always_on_hourly_usd: float,
    job_hourly_usd: float,
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
    always_on_hourly_usd : float > 0
        Price per hour of the instance kept running.
    job_hourly_usd : float > 0
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
    always = _positive("always_on_hourly_usd", always_on_hourly_usd, "currency per hour")
    job = _positive("job_hourly_usd", job_hourly_usd, "currency per hour")
    per_run = _positive("job_hours_per_run", job_hours_per_run, "hours per run")
    runs = _positive("runs_per_year", runs_per_year, "runs per year")
    hours = _at_most(
        "hours_per_year",
        _positive("hours_per_year", hours_per_year, "hours billed per year"),
        hours_per_year,
        _MAX_HOURS_PER_YEAR,
        "a leap year has 8,784 hours",
    )
    always_annual = always * hours
    scheduled_annual = job * per_run * runs
    return ScheduledJobComparison(
        always_on_annual_usd=float(always_annual),
        scheduled_annual_usd=float(scheduled_annual),
        savings_usd=float(always_annual - scheduled_annual),
        cost_ratio=float(always_annual / scheduled_annual),
        runs_per_year=float(runs),
        hours_per_year=float(hours),
    )


# ----------------------------------------------------------------------------------------------------
# serving options and plans
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServingOption:
    """One way to serve the model: a replica type with its price, throughput and where both come from.

    Parameters
    ----------
    name : str
        Label for tables, e.g. ``"CPU replica"``.
    hourly_price_usd : float > 0
        Price of one replica-hour in ``currency`` (the ``_usd`` suffix is the course's default unit).
    rps_per_replica : float > 0
        Requests per second one replica serves within the latency limit.
    price_as_of : datetime.date or None
        Date the price was read. Required: pass ``None`` explicitly only for an undated, illustrative
        price, and say so in ``source``.
    source : str
        Provenance of the price and throughput (a price page and date, a measurement file, or "source
        lesson 001, illustrative"). Must not be empty.
    min_replicas : int >= 1, default 2
    currency : str, default "USD"
        ISO 4217 code of ``hourly_price_usd`` and of every cost derived from this option (e.g. "INR").

    Raises
    ------
    TypeError, ValueError
        For a bad number (see :func:`replicas_needed`), a ``price_as_of`` that is not a date or None, an
        empty ``name`` or ``source``, or a ``currency`` that is not three capital letters.
    """

    name: str
    hourly_price_usd: float
    rps_per_replica: float
    price_as_of: _dt.date | None
    source: str
    min_replicas: int = 2
    currency: str = "USD"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        _positive("hourly_price_usd", self.hourly_price_usd, f"{self.currency} per replica-hour")
        _positive("rps_per_replica", self.rps_per_replica, "requests per second per replica")
        _min_replicas(self.min_replicas)
        if self.price_as_of is not None and (
            not isinstance(self.price_as_of, _dt.date) or isinstance(self.price_as_of, _dt.datetime)
        ):
            raise TypeError(
                f"price_as_of must be a datetime.date (or None for an undated illustrative price), "
                f"got {self.price_as_of!r}"
            )
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"source must say where the price and throughput come from, got {self.source!r}")
        if not isinstance(self.currency, str) or not _CURRENCY.match(self.currency):
            raise ValueError(
                f"currency must be an ISO 4217 code such as 'USD' or 'INR', got {self.currency!r}"
            )

    @property
    def as_of_label(self) -> str:
        """``price_as_of`` as ISO text, or ``"undated"``."""
        return self.price_as_of.isoformat() if self.price_as_of is not None else "undated"


@dataclass(frozen=True)
class ServingPlan:
    """What one option needs and costs at a given peak and mean traffic (see :func:`plan_serving`).

    Money fields are in ``currency``. ``mean_utilization`` is the share of the fleet's capacity the
    mean traffic uses; the rest is paid for and idle.
    """

    option: str
    currency: str
    peak_rps: float
    mean_rps: float
    replicas: int
    monthly_cost_usd: float
    predictions_per_month: float
    cost_per_thousand_usd: float
    cost_per_million_usd: float
    cost_per_thousand_at_full_use_usd: float
    mean_utilization: float


def plan_serving(
    option: ServingOption,
    *,
    peak_rps: float,
    mean_rps: float,
    headroom: float = 0.3,
    target_utilization: float = 1.0,
    hours_per_month: float = HOURS_PER_MONTH,
) -> ServingPlan:
    """Size ``option`` for ``peak_rps`` and price it per prediction at ``mean_rps``.

    Parameters
    ----------
    option : ServingOption
    peak_rps : float > 0
        Traffic the fleet is sized for (replicas come from this).
    mean_rps : float in (0, peak_rps]
        Average traffic over the month (predictions, hence cost per prediction, come from this).
    headroom, target_utilization : see :func:`replicas_needed`.
    hours_per_month : float in (0, 744], default 720

    Returns
    -------
    ServingPlan

    Raises
    ------
    TypeError
        If ``option`` is not a ServingOption, or a number is not a number.
    ValueError
        For any invalid number (see :func:`replicas_needed`) or ``mean_rps`` > ``peak_rps``.
    """
    if not isinstance(option, ServingOption):
        raise TypeError(f"option must be a ServingOption, got {type(option).__name__}")
    peak = _positive("peak_rps", peak_rps, "requests per second")
    mean = _positive("mean_rps", mean_rps, "average requests per second")
    if mean > peak:
        raise ValueError(f"mean_rps ({mean_rps!r}) cannot exceed peak_rps ({peak_rps!r})")
    hours = _hours_per_month(hours_per_month)
    price = Fraction(str(float(option.hourly_price_usd)))
    capacity = Fraction(str(float(option.rps_per_replica)))
    replicas = _replicas_exact(
        peak, capacity, _headroom(headroom), _utilization(target_utilization), option.min_replicas
    )
    monthly = price * replicas * hours
    predictions = mean * SECONDS_PER_HOUR * hours
    return ServingPlan(
        option=option.name,
        currency=option.currency,
        peak_rps=float(peak),
        mean_rps=float(mean),
        replicas=replicas,
        monthly_cost_usd=float(monthly),
        predictions_per_month=float(predictions),
        cost_per_thousand_usd=float(monthly / predictions * 1_000),
        cost_per_million_usd=float(monthly / predictions * 1_000_000),
        cost_per_thousand_at_full_use_usd=float(price / (capacity * SECONDS_PER_HOUR) * 1_000),
        mean_utilization=float(mean / (replicas * capacity)),
    )


def _same_currency(options: Sequence[ServingOption]) -> str:
    currencies = sorted({o.currency for o in options})
    if len(currencies) > 1:
        raise ValueError(
            f"options are priced in different currencies {currencies}; convert the prices first "
            "(this module never converts currencies)"
        )
    return currencies[0]


def compare_options(
    options: Sequence[ServingOption],
    *,
    peak_rps: float,
    mean_rps: float,
    headroom: float = 0.3,
    target_utilization: float = 1.0,
    hours_per_month: float = HOURS_PER_MONTH,
) -> pd.DataFrame:
    """One row per option: replicas, monthly cost, cost per 1,000 at full use and per 1M at mean traffic.

    Parameters are those of :func:`plan_serving`; all options must share one currency.

    Returns
    -------
    DataFrame indexed by option name with columns ``rps_per_replica``, ``hourly_price``,
    ``cost_per_1k_at_full_use``, ``replicas``, ``monthly_cost``, ``cost_per_1M_at_mean``,
    ``mean_utilization``, ``price_as_of``, ``source``. ``DataFrame.attrs["currency"]`` holds the unit.

    Raises
    ------
    ValueError
        For no options, duplicate names, mixed currencies, or any invalid number.
    """
    if not options:
        raise ValueError("options must hold at least one ServingOption")
    names = [o.name for o in options]
    if len(set(names)) != len(names):
        raise ValueError(f"option names must be unique, got {names}")
    currency = _same_currency(options)
    rows = []
    for option in options:
        plan = plan_serving(
            option,
            peak_rps=peak_rps,
            mean_rps=mean_rps,
            headroom=headroom,
            target_utilization=target_utilization,
            hours_per_month=hours_per_month,
        )
        rows.append(
            {
                "option": option.name,
                "rps_per_replica": float(option.rps_per_replica),
                "hourly_price": float(option.hourly_price_usd),
                "cost_per_1k_at_full_use": plan.cost_per_thousand_at_full_use_usd,
                "replicas": plan.replicas,
                "monthly_cost": plan.monthly_cost_usd,
                "cost_per_1M_at_mean": plan.cost_per_million_usd,
                "mean_utilization": plan.mean_utilization,
                "price_as_of": option.as_of_label,
                "source": option.source,
            }
        )
    table = pd.DataFrame(rows).set_index("option")
    table.attrs["currency"] = currency
    return table


# ----------------------------------------------------------------------------------------------------
# break-even traffic
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BreakEven:
    """Where option B becomes cheaper than option A, as peak traffic in requests per second.

    Attributes
    ----------
    option_a, option_b : str
        Names of the two options.
    rps : float or None
        Lowest peak traffic above which B is strictly cheaper per month (B is cheaper just above it);
        0.0 if B is cheaper from the first request, None if B is never cheaper.
    continuous_rps : float or None
        The same threshold for the smooth approximation that ignores the whole-replica steps
        (``price x max(min_replicas, peak x (1 + headroom) / (rps_per_replica x utilization))``).
    stays_cheaper_above_rps : float or None
        Traffic above which B is cheaper at every higher traffic; None if B is not cheaper for all
        large traffic (it costs more per unit of capacity, or the same).
    cheaper_ranges_rps : tuple of (low, high)
        Every range (low, high] of peak traffic up to ``scanned_to_rps`` where B is strictly cheaper;
        ``high`` is ``math.inf`` for the range that never ends.
    scanned_to_rps : float
        Traffic up to which every replica step was checked exactly.
    """

    option_a: str
    option_b: str
    rps: float | None
    continuous_rps: float | None
    stays_cheaper_above_rps: float | None
    cheaper_ranges_rps: tuple[tuple[float, float], ...]
    scanned_to_rps: float


def _continuous_threshold(
    price_a: Fraction, cover_a: Fraction, min_a: int, price_b: Fraction, cover_b: Fraction, min_b: int
) -> Fraction | None:
    """Infimum of {p >= 0 : cost_b(p) < cost_a(p)} for cost(p) = price x max(min, p / cover)."""

    def cost(price: Fraction, cover: Fraction, floor: int, p: Fraction) -> Fraction:
        return price * max(Fraction(floor), p / cover)

    def gap(p: Fraction) -> Fraction:  # > 0 where B is cheaper
        return cost(price_a, cover_a, min_a, p) - cost(price_b, cover_b, min_b, p)

    if gap(Fraction(0)) > 0:
        return Fraction(0)
    # Between knots both costs are linear, so the gap is linear; it is <= 0 at each piece's start
    # (otherwise an earlier piece would have ended positive). Find the first piece where it rises above 0.
    knots = sorted({Fraction(0), min_a * cover_a, min_b * cover_b})
    for low, high in [*itertools.pairwise(knots), (knots[-1], None)]:
        probe = high if high is not None else low + 1
        slope = (gap(probe) - gap(low)) / (probe - low)
        if (high is not None and gap(high) > 0) or (high is None and slope > 0):
            return low - gap(low) / slope
    return None


def break_even_rps(
    option_a: ServingOption,
    option_b: ServingOption,
    *,
    headroom: float = 0.3,
    target_utilization: float = 1.0,
) -> BreakEven:
    """Peak traffic at which option B (e.g. GPU) starts to cost less per month than option A (e.g. CPU).

    Each option's monthly cost is ``hourly_price x replicas_needed(peak) x hours``, a step function
    of the peak that starts at the ``min_replicas`` floor. Hours and the mean traffic cancel out (both
    options serve the same predictions), so the break-even point is the same per month and per
    prediction. Every replica step is checked exactly up to the traffic beyond which the cheaper option
    can no longer change (B cheaper forever once ``slope_a x p > max(price_b x min_b, slope_b x p + price_b)``,
    with ``slope = price x (1 + headroom) / (rps_per_replica x utilization)``), so
    near-ties caused by the steps are reported, not smoothed away.

    Parameters
    ----------
    option_a, option_b : ServingOption
        The incumbent and the challenger; same currency.
    headroom, target_utilization : see :func:`replicas_needed`.

    Returns
    -------
    BreakEven

    Raises
    ------
    TypeError
        If an option is not a ServingOption.
    ValueError
        For mixed currencies, an invalid ``headroom``/``target_utilization``, or options so close in
        cost per unit of capacity that more than 250,000 replica steps would have to be checked.
    """
    for label, option in (("option_a", option_a), ("option_b", option_b)):
        if not isinstance(option, ServingOption):
            raise TypeError(f"{label} must be a ServingOption, got {type(option).__name__}")
    _same_currency([option_a, option_b])
    grow = 1 + _headroom(headroom)
    util = _utilization(target_utilization)
    price_a = Fraction(str(float(option_a.hourly_price_usd)))
    price_b = Fraction(str(float(option_b.hourly_price_usd)))
    # Peak traffic one replica covers once headroom and utilization are applied.
    cover_a = Fraction(str(float(option_a.rps_per_replica))) * util / grow
    cover_b = Fraction(str(float(option_b.rps_per_replica))) * util / grow
    min_a, min_b = option_a.min_replicas, option_b.min_replicas
    slope_a, slope_b = price_a / cover_a, price_b / cover_b

    floors = max(min_a * cover_a, min_b * cover_b)
    if slope_a > slope_b:
        settled = max(price_b * min_b / slope_a, price_b / (slope_a - slope_b), floors)
    elif slope_b > slope_a:
        settled = max(price_a * min_a / slope_b, price_a / (slope_b - slope_a), floors)
    else:  # equal cost per unit of capacity: the steps keep alternating; check a long stretch
        settled = floors + 1000 * max(cover_a, cover_b)
    steps = settled / cover_a + settled / cover_b
    if steps > _MAX_BREAK_EVEN_STEPS:
        raise ValueError(
            f"{option_a.name!r} and {option_b.name!r} cost almost the same per unit of capacity "
            f"(slopes {float(slope_a):.6g} and {float(slope_b):.6g} per req/s); finding the exact "
            f"break-even would need about {float(steps):,.0f} replica steps. Use the continuous estimate "
            "or round the inputs."
        )

    # Walk the intervals (low, high] on which both replica counts are constant.
    ranges: list[list[Fraction]] = []
    k_a = k_b = 0  # replica steps passed: on (k x cover, (k + 1) x cover] ceil() gives k + 1
    low = Fraction(0)
    while low < settled:
        high = min((k_a + 1) * cover_a, (k_b + 1) * cover_b)
        cost_a = price_a * max(min_a, k_a + 1)
        cost_b = price_b * max(min_b, k_b + 1)
        if cost_b < cost_a:
            if ranges and ranges[-1][1] == low:
                ranges[-1][1] = high
            else:
                ranges.append([low, high])
        if (k_a + 1) * cover_a == high:
            k_a += 1
        if (k_b + 1) * cover_b == high:
            k_b += 1
        low = high
    stays: Fraction | None = None
    if slope_a > slope_b:  # beyond `low` B is cheaper at every traffic
        if ranges and ranges[-1][1] == low:
            stays = ranges[-1][0]
        else:
            ranges.append([low, low])
            stays = low
    out_ranges = tuple(
        (float(a), math.inf if stays is not None and a == stays else float(b)) for a, b in ranges
    )
    continuous = _continuous_threshold(price_a, cover_a, min_a, price_b, cover_b, min_b)
    return BreakEven(
        option_a=option_a.name,
        option_b=option_b.name,
        rps=float(ranges[0][0]) if ranges else None,
        continuous_rps=float(continuous) if continuous is not None else None,
        stays_cheaper_above_rps=float(stays) if stays is not None else None,
        cheaper_ranges_rps=out_ranges,
        scanned_to_rps=float(low),
    )
