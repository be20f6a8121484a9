"""Serving options (a replica type, its price, throughput and provenance) and what each costs at a traffic.

:func:`plan_serving` sizes one option for a peak and prices it per prediction at the mean traffic with
the fleet model of :mod:`course_lib.cost.fleet`; :func:`compare_options` puts several side by side.
Options in different currencies are never compared (nothing here converts currencies).

References
----------
Source lesson 001, "CPU or GPU" (two serving options priced side by side). Source lesson 004, "Serving
Models at Scale", section "Capacity Planning and Cost Analysis".
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import pandas as pd

from course_lib.core.checks import InvalidArgumentError, distinct, instance_of, non_empty
from course_lib.cost.fleet import _replicas_exact
from course_lib.cost.inputs import (
    HOURS_PER_MONTH,
    SECONDS_PER_HOUR,
    check_currency,
    check_headroom,
    check_hours_per_month,
    check_min_replicas,
    check_positive,
    check_utilization,
)

__all__ = ["ServingOption", "ServingPlan", "check_same_currency", "compare_options", "plan_serving"]


@dataclass(frozen=True)
class ServingOption:
    """One way to serve the model: a replica type with its price, throughput and where both come from.

    Parameters
    ----------
    name : str
        Label for tables, e.g. ``"CPU replica"``.
    hourly_price : float > 0
        Price of one replica-hour in ``currency``.
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
        ISO 4217 code of ``hourly_price`` and of every cost derived from this option (e.g. "INR").

    Raises
    ------
    TypeError, ValueError
        For a bad number (see :func:`replicas_needed`), a ``price_as_of`` that is not a date or None, an
        empty ``name`` or ``source``, or a ``currency`` that is not three capital letters.
    """

    name: str
    hourly_price: float
    rps_per_replica: float
    price_as_of: _dt.date | None
    source: str
    min_replicas: int = 2
    currency: str = "USD"

    def __post_init__(self) -> None:
        if not instance_of("name", self.name, str).strip():
            raise InvalidArgumentError(f"name must not be blank, got {self.name!r}")
        check_positive("hourly_price", self.hourly_price, f"{self.currency} per replica-hour")
        check_positive("rps_per_replica", self.rps_per_replica, "requests per second per replica")
        check_min_replicas(self.min_replicas)
        if self.price_as_of is not None and (
            not isinstance(self.price_as_of, _dt.date) or isinstance(self.price_as_of, _dt.datetime)
        ):
            raise InvalidArgumentError(
                f"price_as_of must be a datetime.date (or None for an undated illustrative price), "
                f"got {self.price_as_of!r}"
            )
        if not instance_of("source", self.source, str).strip():
            raise InvalidArgumentError(
                f"source must say where the price and throughput come from, got {self.source!r}"
            )
        check_currency(self.currency)

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
    monthly_cost: float
    predictions_per_month: float
    cost_per_thousand: float
    cost_per_million: float
    cost_per_thousand_at_full_use: float
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
    instance_of("option", option, ServingOption)
    peak = check_positive("peak_rps", peak_rps, "requests per second")
    mean = check_positive("mean_rps", mean_rps, "average requests per second")
    if mean > peak:
        raise InvalidArgumentError(f"mean_rps ({mean_rps!r}) cannot exceed peak_rps ({peak_rps!r})")
    hours = check_hours_per_month(hours_per_month)
    price = Fraction(str(float(option.hourly_price)))
    capacity = Fraction(str(float(option.rps_per_replica)))
    replicas = _replicas_exact(
        peak, capacity, check_headroom(headroom), check_utilization(target_utilization), option.min_replicas
    )
    monthly = price * replicas * hours
    predictions = mean * SECONDS_PER_HOUR * hours
    return ServingPlan(
        option=option.name,
        currency=option.currency,
        peak_rps=float(peak),
        mean_rps=float(mean),
        replicas=replicas,
        monthly_cost=float(monthly),
        predictions_per_month=float(predictions),
        cost_per_thousand=float(monthly / predictions * 1_000),
        cost_per_million=float(monthly / predictions * 1_000_000),
        cost_per_thousand_at_full_use=float(price / (capacity * SECONDS_PER_HOUR) * 1_000),
        mean_utilization=float(mean / (replicas * capacity)),
    )


def check_same_currency(options: Sequence[ServingOption]) -> str:
    """The one currency all ``options`` are priced in; ValueError naming them if they differ."""
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
    non_empty("options", options)
    distinct("option names", [o.name for o in options])
    currency = check_same_currency(options)
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
                "hourly_price": float(option.hourly_price),
                "cost_per_1k_at_full_use": plan.cost_per_thousand_at_full_use,
                "replicas": plan.replicas,
                "monthly_cost": plan.monthly_cost,
                "cost_per_1M_at_mean": plan.cost_per_million,
                "mean_utilization": plan.mean_utilization,
                "price_as_of": option.as_of_label,
                "source": option.source,
            }
        )
    table = pd.DataFrame(rows).set_index("option")
    table.attrs["currency"] = currency
    return table
