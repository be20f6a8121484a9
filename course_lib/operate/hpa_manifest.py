"""Write a Kubernetes ``autoscaling/v2`` HorizontalPodAutoscaler for a policy, and validate manifests.

Validation has two layers:

1. **Schema**: the manifest is parsed into the official Kubernetes Python client's generated model
   ``kubernetes.client.models.V2HorizontalPodAutoscaler`` (pydantic, unknown fields forbidden), so a
   misspelt or retired field (``targetCPUUtilizationPercentage`` is ``autoscaling/v1``) is an error,
   as the API server's strict field validation would make it.
2. **Semantics** the schema cannot express, from the API reference and the API server's validation
   (``pkg/apis/autoscaling/validation``): enum values, ``1 <= minReplicas <= maxReplicas``, the metric
   source matching its ``type``, policy periods in (0, 1800] s, stabilization windows in [0, 3600] s
   (``course_lib.simulate.hpa.MAX_POLICY_PERIOD_S`` and ``MAX_STABILIZATION_WINDOW_S``),
   and ``Resource`` metrics limited to what the resource metrics API (metrics-server) serves: cpu and
   memory. A GPU-utilisation or latency target needs a custom or external metrics adapter
   (for example NVIDIA's DCGM exporter or the service's own ``/metrics``, read through Prometheus
   Adapter or KEDA) and is written as a ``Pods``, ``Object`` or ``External`` metric.

References
----------
Kubernetes API reference, "HorizontalPodAutoscaler v2 (autoscaling/v2)"; Kubernetes documentation,
"Horizontal Pod Autoscaling" ("Support for resource metrics", "Autoscaling on multiple metrics": with
several metrics the HPA takes the largest desired replica count).
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

import pydantic
import yaml
from kubernetes.client.models import V2HorizontalPodAutoscaler

from course_lib.core.checks import instance_of, one_of
from course_lib.simulate.fleet import SIGNALS
from course_lib.simulate.hpa import (
    MAX_POLICY_PERIOD_S,
    MAX_STABILIZATION_WINDOW_S,
    POLICY_TYPES,
    SELECT_POLICIES,
    ScalingRules,
    check_replica_bounds,
)

__all__ = ["SOURCE004_HPA_FIELDS", "hpa_manifest", "to_yaml", "validate_hpa"]

_METRIC_SOURCES = {
    "Resource": "resource",
    "Pods": "pods",
    "Object": "object",
    "External": "external",
    "ContainerResource": "containerResource",
}

#: The fields source 004's example sets, as it sets them (recomputed here, not endorsed): the v1 field
#: ``targetCPUUtilizationPercentage``, the v2beta1 field ``targetAverageValue`` and behaviour blocks named
#: ``scaleUpBehavior``/``scaleDownBehavior`` at the top level instead of ``spec.behavior.scaleUp/scaleDown``.
SOURCE004_HPA_FIELDS: dict[str, Any] = {
    "spec": {
        "minReplicas": 10,
        "maxReplicas": 100,
        "targetCPUUtilizationPercentage": 70,
        "targetAverageValue": "50m",
    },
    "scaleUpBehavior": {
        "stabilizationWindowSeconds": 30,
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 30}],
    },
    "scaleDownBehavior": {
        "stabilizationWindowSeconds": 300,
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
    },
}


def _rules(rules: ScalingRules) -> dict[str, Any]:
    return {
        "stabilizationWindowSeconds": rules.stabilization_window_s,
        "selectPolicy": rules.select_policy,
        "policies": [{"type": p.type, "value": p.value, "periodSeconds": p.period_s} for p in rules.policies],
    }


def _metric(signal: str, target: float) -> dict[str, Any]:
    one_of("signal", signal, SIGNALS)
    if signal == "cpu":
        return {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": round(target)},
            },
        }
    if signal in ("rps", "queue"):
        name = {"rps": "http_requests_per_second", "queue": "queued_requests"}[signal]
        return {
            "type": "Pods",
            "pods": {
                "metric": {"name": name},
                "target": {"type": "AverageValue", "averageValue": f"{target:g}"},
            },
        }
    return {  # p99
        "type": "External",
        "external": {
            "metric": {"name": "churn_request_latency_p99_seconds"},
            "target": {"type": "Value", "value": f"{target / 1000:g}"},
        },
    }


def hpa_manifest(
    *,
    name: str,
    deployment: str,
    min_replicas: int,
    max_replicas: int,
    metrics: list[tuple[str, float]],
    scale_up: ScalingRules,
    scale_down: ScalingRules,
) -> dict[str, Any]:
    """An ``autoscaling/v2`` HPA as a dict (``to_yaml`` prints it).

    ``metrics`` is a list of ``(signal, target)`` in :mod:`course_lib.simulate.fleet`'s units: cpu as %,
    rps as requests/s per pod (a Pods metric), queue as queued requests per pod (Pods), p99 in ms
    (an External metric, written in seconds). Raises ``ValueError`` for an unknown signal or
    replica bounds outside ``1 <= min_replicas <= max_replicas``.
    """
    min_replicas, max_replicas = check_replica_bounds(min_replicas, max_replicas)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [_metric(s, t) for s, t in metrics],
            "behavior": {"scaleUp": _rules(scale_up), "scaleDown": _rules(scale_down)},
        },
    }


def to_yaml(doc: dict[str, Any]) -> str:
    """The manifest as YAML, keys in the order written."""
    return yaml.safe_dump(doc, sort_keys=False)


#: Which target types each metric source accepts (API reference, MetricTarget; ``Utilization`` is a
#: percentage of the pods' resource request, so only resource metrics have it).
_TARGETS_FOR_SOURCE = {
    "Resource": {"Utilization", "AverageValue"},
    "ContainerResource": {"Utilization", "AverageValue"},
    "Pods": {"AverageValue"},
    "Object": {"Value", "AverageValue"},
    "External": {"Value", "AverageValue"},
}
_TARGET_FIELD = {"Utilization": "averageUtilization", "Value": "value", "AverageValue": "averageValue"}
#: A Kubernetes quantity: a decimal number with an optional suffix (the API's resource.Quantity grammar).
_QUANTITY = re.compile(r"^[+]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def _is_int(value: object) -> TypeGuard[int]:
    """A YAML integer (the manifest's own values, not a function argument)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_quantity(value: object) -> bool:
    """A Kubernetes quantity above zero ('30', '500m', 2.5): the grammar, then the number before its suffix."""
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not _QUANTITY.match(str(value)):
        return False
    return float(re.sub(r"[a-zA-Z]+$", "", str(value)) or 0) > 0


def _metric_errors(i: int, metric: object) -> list[str]:
    where = f"spec.metrics[{i}]"
    if not isinstance(metric, dict):
        return [f"{where}: must be a mapping with a 'type', got {metric!r}"]
    kind = metric.get("type")
    if kind not in _METRIC_SOURCES:
        return [f"{where}.type: must be one of {sorted(_METRIC_SOURCES)}, got {kind!r}"]
    source = metric.get(_METRIC_SOURCES[kind])
    if not isinstance(source, dict):
        return [f"{where}: type {kind} needs the field {_METRIC_SOURCES[kind]!r}"]
    errors = []
    if kind in ("Resource", "ContainerResource") and source.get("name") not in ("cpu", "memory"):
        errors.append(
            f"{where}: Resource metrics come from metrics-server, which serves cpu and memory only; "
            f"{source.get('name')!r} needs a custom or external metrics adapter (a Pods/Object/External metric)"
        )
    target = source.get("target")
    if not isinstance(target, dict):
        target = {}
    ttype = target.get("type")
    if ttype not in _TARGETS_FOR_SOURCE[kind]:
        return [
            *errors,
            f"{where}.target.type: a {kind} metric takes {sorted(_TARGETS_FOR_SOURCE[kind])}, got {ttype!r}",
        ]
    value = target.get(_TARGET_FIELD[ttype])
    if ttype == "Utilization":
        if not (_is_int(value) and value > 0):
            errors.append(
                f"{where}.target.averageUtilization: must be an integer percentage > 0, got {value!r}"
            )
    elif not _is_positive_quantity(value):
        errors.append(
            f"{where}.target.{_TARGET_FIELD[ttype]}: must be a positive quantity such as '30' or '500m', got {value!r}"
        )
    return errors


def _behavior_errors(direction: str, rules: object) -> list[str]:
    where = f"spec.behavior.{direction}"
    if rules is None:
        return []
    if not isinstance(rules, dict):
        return [f"{where}: must be a mapping, got {rules!r}"]
    errors = []
    window = rules.get("stabilizationWindowSeconds")
    if window is not None and not (_is_int(window) and 0 <= window <= MAX_STABILIZATION_WINDOW_S):
        errors.append(
            f"{where}.stabilizationWindowSeconds: must be an integer in [0, {MAX_STABILIZATION_WINDOW_S}], "
            f"got {window!r}"
        )
    if rules.get("selectPolicy") not in (None, *SELECT_POLICIES):
        errors.append(
            f"{where}.selectPolicy: must be {', '.join(SELECT_POLICIES[:-1])} or {SELECT_POLICIES[-1]}, "
            f"got {rules.get('selectPolicy')!r}"
        )
    policies = rules.get("policies")
    if policies is not None and not policies:
        errors.append(f"{where}.policies: must hold at least one policy when given")
    for j, policy in enumerate(policies or []):
        if not isinstance(policy, dict):
            errors.append(f"{where}.policies[{j}]: must be a mapping, got {policy!r}")
            continue
        if policy.get("type") not in POLICY_TYPES:
            errors.append(
                f"{where}.policies[{j}].type: must be {' or '.join(POLICY_TYPES)}, got {policy.get('type')!r}"
            )
        period, value = policy.get("periodSeconds"), policy.get("value")
        if not (_is_int(period) and 0 < period <= MAX_POLICY_PERIOD_S):
            errors.append(
                f"{where}.policies[{j}].periodSeconds: must be an integer in (0, {MAX_POLICY_PERIOD_S}], "
                f"got {period!r}"
            )
        if not (_is_int(value) and value > 0):
            errors.append(f"{where}.policies[{j}].value: must be an integer > 0, got {value!r}")
    return errors


def _semantic_errors(doc: dict[str, Any]) -> list[str]:
    errors = []
    if doc.get("apiVersion") != "autoscaling/v2":
        errors.append(f"apiVersion: must be 'autoscaling/v2', got {doc.get('apiVersion')!r}")
    if doc.get("kind") != "HorizontalPodAutoscaler":
        errors.append(f"kind: must be 'HorizontalPodAutoscaler', got {doc.get('kind')!r}")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        spec = {}
    lo, hi = spec.get("minReplicas", 1), spec.get("maxReplicas")
    if _is_int(lo) and _is_int(hi) and not 1 <= lo <= hi:
        errors.append(f"spec: need 1 <= minReplicas <= maxReplicas, got {lo} and {hi}")
    metrics = spec.get("metrics") or []
    if not isinstance(metrics, list):
        return [*errors, f"spec.metrics: must be a list, got {metrics!r}"]
    for i, metric in enumerate(metrics):
        errors += _metric_errors(i, metric)
    behavior = spec.get("behavior")
    if not isinstance(behavior, dict):
        behavior = {}
    for direction in ("scaleUp", "scaleDown"):
        errors += _behavior_errors(direction, behavior.get(direction))
    return errors


def validate_hpa(doc: dict[str, Any]) -> list[str]:
    """Every problem found in an HPA manifest (an empty list means valid).

    Schema errors come from ``V2HorizontalPodAutoscaler.model_validate`` (field path and pydantic's
    message), then the semantic checks listed in the module docstring. Raises ``TypeError`` if ``doc``
    is not a mapping.
    """
    instance_of("doc", doc, dict)
    errors = []
    try:
        V2HorizontalPodAutoscaler.model_validate(doc)
    except pydantic.ValidationError as exc:
        errors += [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    return errors + _semantic_errors(doc)
