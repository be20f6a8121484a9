"""Scale to zero (request by request) and the HPA manifest writer/validator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from course_lib.operate.hpa_manifest import SOURCE004_HPA_FIELDS, hpa_manifest, to_yaml, validate_hpa
from course_lib.simulate.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HPA,
    ScalingPolicy,
    ScalingRules,
    hpa_step,
)
from course_lib.simulate.scale_to_zero import scale_to_zero
from course_lib.simulate.traffic import poisson_arrival_times_s


def test_cold_start_hand_worked_vector():
    # Requests at 0, 5 and 100 s; idle timeout 30 s, cold start 10 s, service 1 s.
    r = scale_to_zero(np.array([0.0, 5.0, 100.0]), idle_timeout_s=30, cold_start_s=10, service_s=1)
    # t=0: cold start, served 10..11 (11 s); t=5 waits for it, served 11..12 (7 s); t=100: idle since 12,
    # stopped at 42, cold again: 11 s.
    assert (r.requests, r.cold_starts, r.requests_that_waited) == (3, 2, 3)
    assert r.max_ms == pytest.approx(11_000)
    assert r.replica_hours == pytest.approx(((42 - 0) + (141 - 100)) / 3600)


def test_always_on_has_no_cold_start_and_bills_the_horizon():
    r = scale_to_zero(
        np.array([10.0, 500.0]), idle_timeout_s=math.inf, cold_start_s=10, service_s=1, horizon_s=3600
    )
    assert r.cold_starts == 0 and r.requests_that_waited == 0
    assert r.p99_ms == pytest.approx(1000)
    assert r.replica_hours == pytest.approx(1.0)


def test_arrivals_are_seeded_and_checked():
    a, b = poisson_arrival_times_s(6, 24, seed=1), poisson_arrival_times_s(6, 24, seed=1)
    assert np.array_equal(a, b) and (np.diff(a) >= 0).all()
    with pytest.raises(ValueError, match="non-decreasing"):
        scale_to_zero(np.array([5.0, 1.0]), idle_timeout_s=1, cold_start_s=1, service_s=1)
    with pytest.raises(ValueError, match="service_s"):
        scale_to_zero(np.array([1.0]), idle_timeout_s=1, cold_start_s=1, service_s=0)


def _manifest(**changes):
    args = dict(
        name="ranker",
        deployment="ranker",
        min_replicas=4,
        max_replicas=12,
        metrics=[("rps", 30), ("cpu", 60), ("p99", 230)],
        scale_up=DEFAULT_SCALE_UP,
        scale_down=DEFAULT_SCALE_DOWN,
    )
    return hpa_manifest(**{**args, **changes})


def test_generated_manifest_is_valid_and_round_trips_through_yaml():
    doc = _manifest()
    assert validate_hpa(doc) == []
    assert validate_hpa(yaml.safe_load(to_yaml(doc))) == []
    assert doc["spec"]["metrics"][2]["external"]["target"]["value"] == "0.23"


def test_source_004_fields_fail_the_schema():
    errors = validate_hpa(SOURCE004_HPA_FIELDS)
    for field in (
        "targetCPUUtilizationPercentage",
        "targetAverageValue",
        "scaleUpBehavior",
        "scaleTargetRef",
    ):
        assert any(field in e for e in errors), field


def test_gpu_as_a_resource_metric_is_refused_with_the_reason():
    doc = _manifest(metrics=[("cpu", 60)])
    doc["spec"]["metrics"][0]["resource"]["name"] = "nvidia.com/gpu"
    (error,) = validate_hpa(doc)
    assert "metrics-server" in error and "adapter" in error


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["spec"].update(minReplicas=20), "minReplicas <= maxReplicas"),
        (lambda d: d["spec"].update(maxReplicas="12"), "maxReplicas"),
        (lambda d: d["spec"]["metrics"][0].update(type="Bogus"), "type"),
        (lambda d: d["spec"]["behavior"]["scaleUp"].update(stabilizationWindowSeconds=7200), "[0, 3600]"),
        (lambda d: d["spec"]["behavior"]["scaleDown"]["policies"][0].update(periodSeconds=3600), "(0, 1800]"),
        (lambda d: d.update(apiVersion="autoscaling/v1"), "autoscaling/v2"),
    ],
)
def test_semantic_errors_are_named(mutate, needle):
    doc = _manifest()
    mutate(doc)
    assert any(needle in e for e in validate_hpa(doc)), validate_hpa(doc)


def test_behavior_is_written_as_configured():
    down = ScalingRules(300, (ScalingPolicy("Pods", 1, 300),))
    doc = _manifest(scale_down=down)
    assert doc["spec"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 300,
        "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
    }
    with pytest.raises(ValueError, match="signal"):
        _manifest(metrics=[("gpu", 80)])
    with pytest.raises(TypeError, match="dict"):
        validate_hpa("spec: {}")


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (
            lambda d: d["spec"]["metrics"][0]["pods"]["target"].update(type="Utilization"),
            "takes ['AverageValue']",
        ),
        (lambda d: d["spec"]["metrics"][0]["pods"]["target"].pop("averageValue"), "positive quantity"),
        (lambda d: d["spec"]["metrics"][0]["pods"]["target"].update(averageValue="abc"), "positive quantity"),
        (lambda d: d["spec"]["metrics"][0]["pods"]["target"].update(averageValue="-5"), "positive quantity"),
        (lambda d: d["spec"]["behavior"]["scaleDown"].update(policies=[]), "at least one policy"),
        (
            lambda d: d["spec"]["behavior"]["scaleUp"]["policies"][0].update(periodSeconds="15"),
            "periodSeconds",
        ),
        (lambda d: d["spec"]["behavior"]["scaleUp"].update(stabilizationWindowSeconds="300"), "[0, 3600]"),
        (lambda d: d["spec"].update(metrics=["cpu"]), "mapping"),
    ],
)
def test_review_vectors_are_errors_not_crashes(mutate, needle):
    doc = _manifest()
    mutate(doc)
    errors = validate_hpa(doc)
    assert any(needle in e for e in errors), errors


def test_quantities_with_suffixes_are_accepted():
    doc = _manifest()
    doc["spec"]["metrics"][0]["pods"]["target"]["averageValue"] = "500m"
    assert validate_hpa(doc) == []


def test_manifest_writer_refuses_bad_replica_bounds():
    with pytest.raises(ValueError, match="min_replicas"):
        _manifest(min_replicas=0, max_replicas=-1)


def test_the_hpa_core_gives_the_controllers_replicas_where_no_rate_limit_binds():
    """Lesson 10's vectors: the core step and the hardened controller agree, sync by sync."""
    assert hpa_step(4, 90, 60, min_replicas=2, max_replicas=12) == (6, 6)  # the lesson's hand example
    assert hpa_step(4, 64, 60, min_replicas=2, max_replicas=12) == (4, 4)  # inside the 10 % tolerance
    assert hpa_step(10, 90, 60, min_replicas=2, max_replicas=12)[0] == 12  # clamped to max
    free_up = ScalingRules(0, (ScalingPolicy("Pods", 1000, 15),))
    down = ScalingRules(300, (ScalingPolicy("Percent", 100, 15),))
    hpa = HPA(2, 12, [60.0], free_up, down)
    cpu = [90, 90, 30, 20, 20, 95, 61, 10] + [10] * 25 + [100, 5]
    current, recs = 4, []
    for k, m in enumerate(cpu):
        now = 15.0 * (k + 1)
        window = [r for t, r in recs if t > now - down.stabilization_window_s]
        core, raw = hpa_step(current, m, 60, min_replicas=2, max_replicas=12, window_recommendations=window)
        recs.append((now, raw))
        assert hpa.step(now, current, [m]) == core, f"sync {k}: metric {m}"
        current = core
