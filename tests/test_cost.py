"""The cost model against the source lessons' tables, recomputed from their own stated assumptions."""

from __future__ import annotations

import datetime as dt
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from course_lib.cost import (
    HOURS_PER_MONTH,
    YEAR_CONVENTIONS,
    ServingOption,
    always_on_vs_scheduled,
    batch_job_cost,
    break_even_rps,
    compare_options,
    core,
    cost_per_million,
    cost_per_million_at_full_use,
    cost_per_thousand,
    cost_per_thousand_at_full_use,
    monthly_cost,
    plan_serving,
    predictions_per_month,
    replicas_needed,
)

SOURCE_001 = "source lesson 001 (Kirana Kart), illustrative"


def kirana_cpu(**overrides) -> ServingOption:
    fields = {
        "name": "CPU replica",
        "hourly_price": 40,
        "rps_per_replica": 50,
        "price_as_of": None,
        "source": SOURCE_001,
        "currency": "INR",
    }
    return ServingOption(**{**fields, **overrides})


def kirana_gpu(**overrides) -> ServingOption:
    fields = {
        "name": "GPU replica",
        "hourly_price": 250,
        "rps_per_replica": 600,
        "price_as_of": None,
        "source": SOURCE_001,
        "currency": "INR",
    }
    return ServingOption(**{**fields, **overrides})


# --------------------------------------------------------------------------------------------------
# source lesson 001: the CPU-vs-GPU replica table (278 req/s peak, 30% headroom, min 2 replicas)
# --------------------------------------------------------------------------------------------------
def test_kirana_table_replicas_match_source():
    assert replicas_needed(278, 50, headroom=0.3, min_replicas=2) == 8  # 278 x 1.3 / 50 = 7.228
    assert replicas_needed(278, 600, headroom=0.3, min_replicas=2) == 2  # 0.60 -> 1, floor 2


def test_kirana_table_cost_per_thousand_at_full_use_matches_source():
    assert round(cost_per_thousand_at_full_use(40, 50), 3) == 0.222
    assert round(cost_per_thousand_at_full_use(250, 600), 3) == 0.116
    assert cost_per_million_at_full_use(40, 50) == pytest.approx(222.222, abs=1e-3)


def test_kirana_table_monthly_cost_matches_source():
    assert monthly_cost(40, 8, hours_per_month=720) == 230_400  # "2.3 lakh"
    assert monthly_cost(250, 2, hours_per_month=720) == 360_000  # "3.6 lakh"


def test_kirana_table_from_compare_options():
    table = compare_options([kirana_cpu(), kirana_gpu()], peak_rps=278, mean_rps=278)
    assert table.attrs["currency"] == "INR"
    assert table.loc["CPU replica", "replicas"] == 8
    assert table.loc["GPU replica", "replicas"] == 2
    assert table.loc["CPU replica", "monthly_cost"] == 230_400
    assert table.loc["GPU replica", "monthly_cost"] == 360_000
    # cheaper per request at full use, dearer per month at this traffic
    assert (
        table.loc["GPU replica", "cost_per_1k_at_full_use"]
        < table.loc["CPU replica", "cost_per_1k_at_full_use"]
    )
    assert table.loc["GPU replica", "cost_per_1M_at_mean"] > table.loc["CPU replica", "cost_per_1M_at_mean"]
    assert table.loc["GPU replica", "price_as_of"] == "undated"


def test_kirana_gpu_pays_off_above_twelve_cpu_replicas_not_several_times_peak():
    result = break_even_rps(kirana_cpu(), kirana_gpu())
    # 13 CPU replicas (520/h) first cost more than 2 GPUs (500/h): just above 12 x 50 / 1.3 req/s
    assert result.rps == pytest.approx(12 * 50 / 1.3)
    assert result.rps / 278 == pytest.approx(1.66, abs=0.01)  # the source says "several times"
    assert result.continuous_rps == pytest.approx(500 / (40 * 1.3 / 50))  # 480.77
    assert result.stays_cheaper_above_rps == pytest.approx(12 * 50 / 1.3)
    assert result.cheaper_ranges_rps[-1][1] == math.inf
    below, above = result.rps - 0.01, result.rps + 0.01
    for peak, gpu_cheaper in ((below, False), (above, True)):
        cpu = 40 * replicas_needed(peak, 50)
        gpu = 250 * replicas_needed(peak, 600)
        assert (gpu < cpu) is gpu_cheaper


def test_break_even_the_other_way_round_is_cheaper_from_zero():
    result = break_even_rps(kirana_gpu(), kirana_cpu())
    assert result.rps == 0.0
    assert result.stays_cheaper_above_rps is None
    assert result.cheaper_ranges_rps == ((0.0, pytest.approx(12 * 50 / 1.3)),)


def test_break_even_never_when_challenger_costs_more_per_capacity_and_floor():
    dear = kirana_gpu(hourly_price=1000, rps_per_replica=100)
    result = break_even_rps(kirana_cpu(), dear)
    assert result.rps is None and result.continuous_rps is None and result.stays_cheaper_above_rps is None


def test_break_even_refuses_mixed_currencies():
    with pytest.raises(ValueError, match="currencies"):
        break_even_rps(kirana_cpu(), kirana_gpu(currency="USD"))


# --------------------------------------------------------------------------------------------------
# source lesson 000: StayWell's four-architecture table, recomputed from its stated assumptions
# --------------------------------------------------------------------------------------------------
def test_staywell_dedicated_gpu_row_holds():
    monthly = monthly_cost(1.01, 1)
    assert monthly == 727.20
    assert cost_per_million(monthly, 1_000_000) == 727.20
    assert round(monthly / 1_000_000, 6) == 0.000727


def test_staywell_autoscaled_cpu_row_is_97_92_not_98_40():
    monthly = monthly_cost(0.17, 1.2)  # 1.2 instances on average x $0.17/h x 720 h
    assert monthly == 146.88  # the text says 146.88; the table's "Monthly cost" says 98.40
    assert cost_per_million(monthly, 1_500_000) == 97.92  # the text's 1.5M requests
    assert cost_per_million(monthly, 1_000_000) == 146.88  # the table's "1,000,000 a month"
    assert 98.40 not in (97.92, 146.88)
    assert round(727.20 / 97.92, 1) == 7.4  # the "7.4x" holds only with 1.5M predictions
    assert round(727.20 / 146.88, 2) == 4.95


def test_staywell_batching_row_18_20_does_not_follow_from_5x_throughput():
    monthly = monthly_cost(0.17, 1)  # one c6i.xlarge, always on
    assert monthly == 122.40
    # capacity is not traffic: at the table's 1M predictions one instance costs 122.40 per 1M
    assert cost_per_million(monthly, 1_000_000) == 122.40
    # even if the 5x capacity were filled with 5 x 1.5M predictions, it is 16.32, not 18.20
    assert cost_per_million(monthly, 7_500_000) == 16.32
    assert round(727.20 / 40, 2) == 18.18  # 18.20 is what the claimed "40x" back-computes to
    assert round(727.20 / 122.40, 2) == 5.94


def test_staywell_spot_batch_row_is_0_0204_per_run():
    per_run = batch_job_cost(0.102, 0.2)  # 12 minutes on a $0.102/h spot instance
    assert per_run == 0.0204
    assert cost_per_million(per_run, 1_000_000) == 0.0204
    assert round(4 * per_run, 4) == 0.0816  # four Sunday runs a month: the table's 0.08 is a monthly bill
    assert round(727.20 / 0.0204) == 35_647  # not 9,000x
    assert round(727.20 / 0.08) == 9_090  # the "9,000x" comes from the 0.08 figure


def test_staywell_4200_a_month_for_30_qps_is_54_per_million_at_best():
    predictions = predictions_per_month(30)  # 30 req/s every second of a 720-hour month
    assert predictions == 77_760_000
    assert round(cost_per_million(4200, predictions), 2) == 54.01
    assert round(4200 / monthly_cost(1.01, 1), 2) == 5.78  # g5.xlarge instances the bill pays for


# --------------------------------------------------------------------------------------------------
# source lesson 004: capacity planning with predictions counted at peak traffic
# --------------------------------------------------------------------------------------------------
def test_capacity_plan_gpu_count_needs_ceil_not_fractional_gpus():
    per_gpu_rps = 32 / 100 * 1000  # batch of 32 in 100 ms
    assert per_gpu_rps == 320
    assert 50_000 / per_gpu_rps * 1.2 == 187.5  # the source multiplies out fractional GPUs
    assert replicas_needed(50_000, per_gpu_rps, headroom=0.2, min_replicas=1) == 188
    assert 187.5 * 500 == 93_750  # source's monthly cost
    assert 188 * 500 == 94_000


@pytest.mark.parametrize("peak_to_mean", [1.5, 2.0, 3.0])
def test_capacity_plan_peak_based_predictions_understate_cost_by_peak_to_mean(peak_to_mean):
    monthly = 187.5 * 500
    at_peak = predictions_per_month(50_000)  # what the source computes ("average case" in its comment)
    assert at_peak == 50_000 * 86_400 * 30
    at_mean = predictions_per_month(50_000 / peak_to_mean)
    ratio = cost_per_million(monthly, at_mean) / cost_per_million(monthly, at_peak)
    assert ratio == pytest.approx(peak_to_mean)
    assert f"{monthly / at_peak:.6f}" == "0.000001"  # the source's print hides 7.2e-7 as 1e-6


# --------------------------------------------------------------------------------------------------
# source lesson 000 exercise: always-on $0.17/h versus $0.04/h spot 30 minutes every Monday
# --------------------------------------------------------------------------------------------------
def test_monday_spot_job_with_52_weeks_and_365_day_year():
    runs, hours = YEAR_CONVENTIONS["52 weeks, 8,760 h (365-day year)"]
    result = always_on_vs_scheduled(0.17, 0.04, 0.5, runs_per_year=runs, hours_per_year=hours)
    assert result.always_on_annual == 1489.20
    assert result.scheduled_annual == 1.04
    assert result.savings == 1488.16


def test_monday_spot_job_with_365_25_day_year():
    runs, hours = YEAR_CONVENTIONS["365.25/7 weeks, 8,766 h (365.25-day year)"]
    result = always_on_vs_scheduled(0.17, 0.04, 0.5, runs_per_year=runs, hours_per_year=hours)
    assert result.always_on_annual == pytest.approx(1490.22)
    assert result.scheduled_annual == pytest.approx(1.0436, abs=1e-4)
    assert round(result.savings, 2) == 1489.18


def test_scheduled_comparison_has_no_default_year():
    with pytest.raises(TypeError):
        always_on_vs_scheduled(0.17, 0.04, 0.5)  # type: ignore[call-arg]


# --------------------------------------------------------------------------------------------------
# exact arithmetic
# --------------------------------------------------------------------------------------------------
def test_exact_multiple_does_not_round_up():
    assert math.ceil(100 * 1.1 / 10) == 12  # binary floating point: 11.000000000000002
    assert replicas_needed(100, 10, headroom=0.1, min_replicas=1) == 11


def test_just_above_a_multiple_rounds_up():
    assert replicas_needed(100.001, 10, headroom=0.1, min_replicas=1) == 12


def test_numpy_scalars_are_accepted():
    assert replicas_needed(np.float64(278.0), np.int64(50)) == 8


def test_money_prints_as_the_decimal_answer():
    assert repr(monthly_cost(0.17, 1.2)) == "146.88"


def test_cost_per_thousand_is_a_thousandth_of_per_million():
    assert cost_per_thousand(230_400, 1e9) * 1000 == pytest.approx(cost_per_million(230_400, 1e9))


def test_plan_serving_prices_predictions_at_mean_not_peak():
    plan = plan_serving(kirana_cpu(), peak_rps=278, mean_rps=139)
    assert plan.replicas == 8
    assert plan.predictions_per_month == 139 * 3600 * HOURS_PER_MONTH
    assert plan.cost_per_million == pytest.approx(230_400 / (139 * 3600 * 720) * 1e6)
    assert plan.mean_utilization == pytest.approx(139 / 400)


# --------------------------------------------------------------------------------------------------
# bad input: every error names the parameter
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"peak_rps": 0}, "peak_rps"),
        ({"peak_rps": -5}, "peak_rps"),
        ({"peak_rps": math.nan}, "peak_rps"),
        ({"rps_per_replica": 0}, "rps_per_replica"),
        ({"rps_per_replica": -50}, "rps_per_replica"),
        ({"rps_per_replica": math.inf}, "rps_per_replica"),
        ({"headroom": -0.1}, "headroom"),
        ({"headroom": 30}, "headroom"),
        ({"target_utilization": 0}, "target_utilization"),
        ({"target_utilization": 1.2}, "target_utilization"),
        ({"target_utilization": 70}, "target_utilization"),
        ({"min_replicas": 2.5}, "min_replicas"),
        ({"min_replicas": 2.0}, "min_replicas"),
        ({"min_replicas": 0}, "min_replicas"),
        ({"min_replicas": True}, "min_replicas"),
    ],
)
def test_replicas_needed_rejects_bad_input_naming_the_parameter(kwargs, name):
    args = {"peak_rps": 278, "rps_per_replica": 50, **kwargs}
    with pytest.raises(ValueError, match=name):
        replicas_needed(args.pop("peak_rps"), args.pop("rps_per_replica"), **args)


def test_a_rate_with_its_unit_in_a_string_is_refused():
    with pytest.raises(
        TypeError,
        match=r"rps_per_replica must be a finite number > 0 \(requests per second per replica\), got '50 req/s'",
    ):
        replicas_needed(278, "50 req/s")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="hourly_price"):
        monthly_cost("$40/h", 8)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: monthly_cost(0, 8), "hourly_price"),
        (lambda: monthly_cost(40, -1), "replicas"),
        (lambda: monthly_cost(40, 8, hours_per_month=8760), "hours_per_month"),
        (lambda: monthly_cost(40, 8, hours_per_month=0), "hours_per_month"),
        (lambda: predictions_per_month(0), "mean_rps"),
        (lambda: cost_per_million(100, 0), "predictions_per_month"),
        (lambda: cost_per_million(-1, 10), "monthly_cost"),
        (lambda: cost_per_thousand_at_full_use(40, 0), "rps_per_replica"),
        (lambda: batch_job_cost(0.102, 0), "hours"),
        (lambda: batch_job_cost(-0.1, 0.2), "hourly_price"),
        (
            lambda: always_on_vs_scheduled(0.17, 0.04, 0.5, runs_per_year=0, hours_per_year=8760),
            "runs_per_year",
        ),
        (
            lambda: always_on_vs_scheduled(0.17, 0.04, 0.5, runs_per_year=52, hours_per_year=9000),
            "hours_per_year",
        ),
        (lambda: plan_serving(kirana_cpu(), peak_rps=100, mean_rps=200), "mean_rps"),
    ],
)
def test_cost_functions_reject_bad_input_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize(
    ("overrides", "error", "name"),
    [
        ({"hourly_price": 0}, ValueError, "hourly_price"),
        ({"rps_per_replica": -1}, ValueError, "rps_per_replica"),
        ({"min_replicas": 1.5}, ValueError, "min_replicas"),
        ({"source": " "}, ValueError, "source"),
        ({"currency": "rupees"}, ValueError, "currency"),
        ({"price_as_of": "2026-01-01"}, TypeError, "price_as_of"),
        ({"name": ""}, ValueError, "name"),
    ],
)
def test_serving_option_validates_its_fields(overrides, error, name):
    with pytest.raises(error, match=name):
        kirana_cpu(**overrides)


def test_serving_option_keeps_its_as_of_date():
    option = kirana_cpu(price_as_of=dt.date(2026, 11, 1))
    assert option.as_of_label == "2026-11-01"


def test_compare_options_refuses_mixed_currencies_and_duplicate_names():
    with pytest.raises(ValueError, match="currencies"):
        compare_options([kirana_cpu(), kirana_gpu(currency="USD")], peak_rps=10, mean_rps=5)
    with pytest.raises(ValueError, match="option names must not repeat an item, got 'CPU replica' twice"):
        compare_options([kirana_cpu(), kirana_cpu()], peak_rps=10, mean_rps=5)


# --------------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------------
rates = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
headrooms = st.floats(min_value=0, max_value=2, allow_nan=False)
utilizations = st.floats(min_value=0.05, max_value=1.0, allow_nan=False)
floors = st.integers(min_value=1, max_value=20)


@given(peak=rates, capacity=rates, headroom=headrooms, utilization=utilizations, floor=floors)
def test_replicas_never_below_min_replicas(peak, capacity, headroom, utilization, floor):
    n = replicas_needed(peak, capacity, headroom=headroom, target_utilization=utilization, min_replicas=floor)
    assert isinstance(n, int) and n >= floor


@given(peaks=st.lists(rates, min_size=2, max_size=2), capacity=rates, headroom=headrooms, floor=floors)
def test_replicas_are_monotone_in_peak_traffic(peaks, capacity, headroom, floor):
    low, high = sorted(peaks)
    kw = {"headroom": headroom, "min_replicas": floor}
    assert replicas_needed(low, capacity, **kw) <= replicas_needed(high, capacity, **kw)


@given(
    peak_c=st.integers(1, 10**7),
    capacity_c=st.integers(1, 10**7),
    headroom_pct=st.integers(0, 200),
    util_pct=st.integers(1, 100),
    floor=floors,
)
def test_replicas_match_integer_reference_on_cent_inputs(peak_c, capacity_c, headroom_pct, util_pct, floor):
    # peak = peak_c/100, capacity = capacity_c/100: replicas = ceil(peak (1+h) / (capacity u)) in integers
    numerator = peak_c * (100 + headroom_pct)
    denominator = capacity_c * util_pct
    expected = max(floor, -(-numerator // denominator))
    got = replicas_needed(
        peak_c / 100,
        capacity_c / 100,
        headroom=headroom_pct / 100,
        target_utilization=util_pct / 100,
        min_replicas=floor,
    )
    assert got == expected


@given(
    peak=rates,
    capacity=rates,
    price=st.floats(0.01, 1000),
    utilizations=st.lists(utilizations, min_size=2, max_size=2),
    share=st.floats(0.01, 1.0),
)
def test_cost_per_prediction_falls_as_target_utilization_rises(peak, capacity, price, utilizations, share):
    low, high = sorted(utilizations)
    option = ServingOption("x", price, capacity, None, "test")
    costs = [
        plan_serving(option, peak_rps=peak, mean_rps=peak * share, target_utilization=u).cost_per_million
        for u in (low, high)
    ]
    assert costs[1] <= costs[0]


@given(
    price=st.floats(0.01, 1000), replicas=st.integers(1, 100), means=st.lists(rates, min_size=2, max_size=2)
)
def test_cost_per_prediction_falls_as_a_fixed_fleet_gets_busier(price, replicas, means):
    low, high = sorted(means)
    assume(low < high)
    bill = monthly_cost(price, replicas)
    idle = cost_per_million(bill, predictions_per_month(low))
    busy = cost_per_million(bill, predictions_per_month(high))
    assert busy < idle


@given(
    peak=rates, capacity=rates, price=st.floats(0.01, 1000), share=st.floats(0.01, 1.0), headroom=headrooms
)
def test_cost_at_mean_traffic_never_beats_cost_at_full_use(peak, capacity, price, share, headroom):
    option = ServingOption("x", price, capacity, None, "test", min_replicas=1)
    plan = plan_serving(option, peak_rps=peak, mean_rps=peak * share, headroom=headroom)
    assert plan.mean_utilization <= 1.0
    assert plan.cost_per_million >= cost_per_million_at_full_use(price, capacity) * (1 - 1e-12)


options_st = st.builds(
    lambda price, capacity, floor: ServingOption("o", price, capacity, None, "test", min_replicas=floor),
    st.integers(1, 500),
    st.integers(1, 2000),
    st.integers(1, 4),
)


@settings(max_examples=60, deadline=None)
@given(
    a=options_st,
    b=options_st,
    headroom_pct=st.integers(0, 50),
    probes=st.lists(st.integers(1, 10**6), max_size=40),
)
def test_break_even_ranges_agree_with_brute_force(a, b, headroom_pct, probes):
    headroom = headroom_pct / 100
    try:
        result = break_even_rps(a, b, headroom=headroom)
    except ValueError as exc:  # near-equal cost per capacity: documented refusal, not a wrong answer
        assert "replica steps" in str(exc)
        assume(False)

    def b_cheaper(peak: Fraction) -> bool:
        cost_a = a.hourly_price * replicas_needed(
            float(peak), a.rps_per_replica, headroom=headroom, min_replicas=a.min_replicas
        )
        cost_b = b.hourly_price * replicas_needed(
            float(peak), b.rps_per_replica, headroom=headroom, min_replicas=b.min_replicas
        )
        return cost_b < cost_a

    def in_ranges(peak: float) -> bool:
        return any(low < peak <= high for low, high in result.cheaper_ranges_rps)

    # probe traffic spread over the scanned range and beyond it, plus just either side of every range edge
    top = max(result.scanned_to_rps, 1.0) * 3
    points = [top * p / 10**6 for p in probes]
    for low, high in result.cheaper_ranges_rps:
        points += [low * 0.999, low * 1.001 + 1e-9] + (
            [high * 0.999, high * 1.001] if math.isfinite(high) else []
        )
    # With equal cost per unit of capacity the steps alternate for ever: the result covers only the
    # stretch it scanned (its documented contract), so points beyond it are not checked then.
    equal_slopes = Fraction(str(float(a.hourly_price))) / Fraction(str(float(a.rps_per_replica))) == Fraction(
        str(float(b.hourly_price))
    ) / Fraction(str(float(b.rps_per_replica)))
    for peak in points:
        if peak > 0 and not (equal_slopes and peak > result.scanned_to_rps):
            assert b_cheaper(Fraction(peak)) == in_ranges(peak), (peak, result)
    if result.rps is not None:
        assert b_cheaper(Fraction(result.rps * 1.0001 + 1e-9))


def test_cost_names_carry_no_currency():
    import course_lib.cost as cost

    assert {"batch_job_cost", "monthly_cost", "cost_per_million", "cost_per_thousand"} <= set(cost.__all__)
    for name in cost.__all__:
        assert "usd" not in name.lower(), name


# The core (course_lib.cost.core) against the hardened functions, on the same vectors.
_CORE_VECTORS = [  # (peak_rps, mean_rps, price_per_h, rps_per_replica, headroom, min_replicas)
    (278, 278, 40, 50, 0.3, 2),
    (278, 139, 250, 600, 0.3, 2),
    (30, 15, 0.17, 67, 0.3, 2),
    (1000, 400, 0.17, 113, 0.2, 1),
    (90, 45, 0.5, 30, 0.0, 1),
]


@pytest.mark.parametrize(("peak", "mean", "price", "rps", "headroom", "floor"), _CORE_VECTORS)
def test_core_replicas_and_cost_match_the_hardened_functions(peak, mean, price, rps, headroom, floor):
    replicas = core.replicas_for_peak(peak, rps, headroom, floor)
    assert replicas == replicas_needed(peak, rps, headroom=headroom, min_replicas=floor)
    hardened = cost_per_million(monthly_cost(price, replicas), predictions_per_month(mean))
    assert core.fleet_cost_per_million(price, replicas, mean) == pytest.approx(hardened, rel=1e-12)


@pytest.mark.parametrize(
    ("cheap", "big", "headroom", "floor"),
    [((40, 50), (250, 600), 0.3, 2), ((40, 50), (250, 600), 0.3, 1), ((0.17, 67), (1.01, 600), 0.3, 2)],
)
def test_core_break_even_matches_break_even_rps(cheap, big, headroom, floor):
    options = [
        ServingOption(name, price, rps, None, "test", min_replicas=floor)
        for name, (price, rps) in (("cheap", cheap), ("big", big))
    ]
    hardened = break_even_rps(*options, headroom=headroom)
    small = core.break_even_peak_rps(cheap, big, headroom, floor, max_rps=5 * hardened.scanned_to_rps)
    assert small == pytest.approx(hardened.stays_cheaper_above_rps)
