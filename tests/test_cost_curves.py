"""Cost per 1M predictions over traffic (Lesson 5's curve, moved into course_lib)."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.cost import ServingOption, cost_per_million_at_full_use, plan_serving
from course_lib.cost.curves import cost_per_million_curve, full_use_level_per_million

CPU = ServingOption("CPU replica", 40, 50, price_as_of=None, source="source lesson 001", currency="INR")


def test_curve_is_plan_serving_at_each_peak_with_the_mean_from_the_ratio():
    peaks = [1.0, 278.0, 5000.0]
    curve = cost_per_million_curve(CPU, peaks, peak_to_mean=2.0, headroom=0.3)
    expected = [plan_serving(CPU, peak_rps=p, mean_rps=p / 2, headroom=0.3).cost_per_million for p in peaks]
    assert curve.shape == (3,) and curve == pytest.approx(expected)


def test_high_traffic_settles_on_the_full_use_level_from_above():
    level = full_use_level_per_million(CPU, peak_to_mean=2.0, headroom=0.3)
    assert level == pytest.approx(cost_per_million_at_full_use(40, 50) * 1.3 * 2.0)
    high = cost_per_million_curve(CPU, np.geomspace(1e4, 1e5, 50), peak_to_mean=2.0, headroom=0.3)
    assert (high >= level * (1 - 1e-9)).all() and high.min() == pytest.approx(level, rel=0.02)


def test_the_level_follows_headroom_and_utilization_rather_than_a_fixed_factor():
    base = full_use_level_per_million(CPU, peak_to_mean=1.0, headroom=0.0)
    assert full_use_level_per_million(
        CPU, peak_to_mean=3.0, headroom=0.5, target_utilization=0.5
    ) == pytest.approx(base * 3.0 * 1.5 / 0.5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"peak_to_mean": 0.5, "headroom": 0.3}, "peak_to_mean"),
        ({"peak_to_mean": 2.0, "headroom": 30}, "headroom"),
        ({"peak_to_mean": 2.0, "headroom": 0.3, "target_utilization": 70}, "target_utilization"),
    ],
)
def test_bad_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        full_use_level_per_million(CPU, **kwargs)
    with pytest.raises(ValueError, match=match):
        cost_per_million_curve(CPU, [100.0], **kwargs)
