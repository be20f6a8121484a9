"""The HPA control rule against the Kubernetes documentation and controller source."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.simulate.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HPA,
    ScalingPolicy,
    ScalingRules,
    desired_replicas,
)

NO_LIMITS = ScalingRules(0, (ScalingPolicy("Percent", 1000, 15),))


def test_documentation_worked_example():
    # Kubernetes docs: 50 replicas at 90 % CPU against a 75 % target -> ceil(50 x 90 / 75) = 60.
    assert desired_replicas(50, 90, 75) == 60


def test_doubling_and_halving_examples():
    # Docs: current 200m vs desired 100m doubles; 50m halves.
    assert desired_replicas(4, 200, 100) == 8
    assert desired_replicas(4, 50, 100) == 2


@pytest.mark.parametrize("metric", [68, 70, 75, 80, 82])
def test_within_ten_percent_tolerance_no_change(metric):
    assert desired_replicas(50, metric, 75) == 50


def test_just_outside_tolerance_changes():
    assert desired_replicas(10, 83, 75) == 12  # ratio 1.107
    assert desired_replicas(10, 67, 75) == 9  # ratio 0.893


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 1, 1), "current_replicas"),
        ((1, -1, 1), "metric"),
        ((1, 1, 0), "target"),
        ((1, float("nan"), 1), "metric"),
    ],
)
def test_bad_inputs_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        desired_replicas(*args)


def test_tolerance_given_as_percentage_is_refused():
    with pytest.raises(ValueError, match="tolerance"):
        desired_replicas(5, 90, 75, tolerance=10)


def test_min_and_max_clamp():
    hpa = HPA(4, 12, [30.0], NO_LIMITS, ScalingRules(0, (ScalingPolicy("Percent", 100, 15),)))
    assert hpa.step(15, 6, [300.0]) == 12  # would be 60
    assert hpa.step(30, 12, [0.5]) == 4  # would be 1


def test_several_metrics_take_the_largest_recommendation():
    hpa = HPA(1, 100, [50.0, 10.0], NO_LIMITS, DEFAULT_SCALE_DOWN)
    assert hpa.step(15, 10, [100.0, 15.0]) == 20  # cpu says 20, rps says 15


def test_default_scale_up_is_max_of_four_pods_and_doubling_per_15_s():
    hpa = HPA(1, 1000, [10.0])
    assert hpa.step(15, 2, [100.0]) == 6  # +4 pods beats +100 % (4)
    hpa = HPA(1, 1000, [10.0])
    assert hpa.step(15, 10, [100.0]) == 20  # +100 % beats +4
    # Within the same 15 s period the limit counts what was already added.
    assert hpa.step(20, 20, [100.0]) == 20
    assert hpa.step(31, 20, [100.0]) == 40


def test_scale_down_stabilization_window_uses_highest_recent_recommendation():
    hpa = HPA(1, 100, [10.0], DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)  # 300 s down window
    assert hpa.step(0, 10, [10.0]) == 10
    assert hpa.step(15, 10, [2.0]) == 10  # recommendation 2, but 10 was recommended within 300 s
    assert hpa.step(299, 10, [2.0]) == 10
    assert hpa.step(301, 10, [2.0]) == 2  # the 10 at t=0 left the window


def test_source_004_scale_down_policy_removes_one_pod_per_five_minutes():
    down = ScalingRules(300, (ScalingPolicy("Pods", 1, 300),))
    hpa = HPA(1, 100, [10.0], DEFAULT_SCALE_UP, down)
    current = hpa.step(0, 10, [1.0])  # no earlier recommendation to stabilize against: one pod goes
    assert current == 9
    changes = []
    for t in range(15, 1215, 15):
        new = hpa.step(t, current, [1.0])
        if new != current:
            changes.append((t, new))
        current = new
    assert changes == [(300, 8), (600, 7), (900, 6), (1200, 5)]


def test_scale_up_stabilization_window_uses_lowest_recent_recommendation():
    up = ScalingRules(60, (ScalingPolicy("Percent", 1000, 15),))
    hpa = HPA(1, 100, [10.0], up, DEFAULT_SCALE_DOWN)
    assert hpa.step(0, 5, [10.0]) == 5
    assert hpa.step(15, 5, [40.0]) == 5  # lowest recommendation in the last 60 s is 5
    assert hpa.step(61, 5, [40.0]) == 20


def test_disabled_direction_never_moves():
    off = ScalingRules(0, (), "Disabled")
    hpa = HPA(1, 100, [10.0], off, off)
    assert hpa.step(15, 5, [100.0]) == 5
    assert hpa.step(30, 5, [1.0]) == 5


def test_policy_and_rules_validation():
    with pytest.raises(ValueError, match="type"):
        ScalingPolicy("Replicas", 1, 15)
    with pytest.raises(ValueError, match="period_s"):
        ScalingPolicy("Pods", 1, 0)
    with pytest.raises(ValueError, match="stabilization_window_s"):
        ScalingRules(-1, (ScalingPolicy("Pods", 1, 15),))
    with pytest.raises(ValueError, match="max_replicas"):
        HPA(5, 4, [1.0])
    with pytest.raises(ValueError, match="metrics"):
        HPA(1, 4, [1.0]).step(0, 2, [1.0, 2.0])
    hpa = HPA(1, 4, [1.0])
    hpa.step(30, 2, [1.0])
    with pytest.raises(ValueError, match="backwards"):
        hpa.step(15, 2, [1.0])


@given(
    current=st.integers(1, 50),
    metric=st.floats(0, 1000, allow_nan=False),
    target=st.floats(0.5, 500),
    lo=st.integers(1, 10),
    span=st.integers(0, 40),
)
def test_result_always_within_min_and_max(current, metric, target, lo, span):
    hpa = HPA(lo, lo + span, [target])
    assert lo <= hpa.step(15, current, [metric]) <= lo + span


def test_a_target_scaled_to_zero_by_hand_is_left_alone():
    # horizontal.go: spec.replicas == 0 and minReplicas != 0 -> autoscaling disabled.
    assert HPA(2, 10, [50.0]).step(0, 0, [100.0]) == 0


def test_bad_targets_and_times_are_refused_early():
    with pytest.raises(ValueError, match="targets"):
        HPA(1, 10, [-5.0])
    with pytest.raises(ValueError, match="tolerance"):
        HPA(1, 10, [5.0], tolerance=5)
    hpa = HPA(1, 10, [5.0])
    with pytest.raises(ValueError, match="finite"):
        hpa.step(float("nan"), 4, [5.0])
    hpa.step(100, 20, [5.0])  # a clamp step counts as a step in time too
    with pytest.raises(ValueError, match="backwards"):
        hpa.step(50, 10, [5.0])


def test_numpy_integers_are_replica_counts():
    import numpy as np

    assert desired_replicas(np.int64(50), 90, 75) == 60
