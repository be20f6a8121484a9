"""The Kubernetes Horizontal Pod Autoscaler's control rule, written out so a simulator can run it.

Each sync period (15 s by default) the HPA controller:

1. turns every metric into a replica count, ``desired = ceil(current x metric / target)``, skipping the
   change when ``|metric / target - 1| <= tolerance`` (0.1 by default), and takes the **largest** count
   over all metrics;
2. **stabilizes** it: the result is kept between the *lowest* recommendation of the scale-up window and
   the *highest* recommendation of the scale-down window (default windows: 0 s up, 300 s down), so a
   brief dip does not remove replicas that a minute later would be needed again;
3. **limits the rate** with the scaling policies: each policy allows, per ``period_s``, either a number
   of pods (``Pods``) or a percentage of the replicas at the start of the period (``Percent``); with
   ``select_policy="Max"`` the most permissive policy wins. Default scale-up: the larger of +4 pods and
   +100 % per 15 s; default scale-down: -100 % per 15 s;
4. clamps to ``[min_replicas, max_replicas]``.

The Kubernetes numbers (defaults and the API server's bounds) are named once, here, and
:mod:`course_lib.simulate.fleet` and :mod:`course_lib.operate.hpa_manifest` use these names.

References
----------
Kubernetes documentation, "Horizontal Pod Autoscaling", sections "Algorithm details", "Stabilization
window", "Scaling policies" and "Default behavior"; kubernetes/kubernetes
``pkg/controller/podautoscaler/horizontal.go`` (``stabilizeRecommendationWithBehaviors``,
``calculateScaleUpLimitWithScalingRules``, ``calculateScaleDownLimitWithBehaviors``),
``pkg/apis/autoscaling/v2/defaults.go`` (the default policies quoted above) and
``pkg/apis/autoscaling/validation/validation.go`` (``MaxPeriodSeconds``, ``MaxStabilizationWindowSeconds``);
kube-controller-manager's flags ``--horizontal-pod-autoscaler-sync-period`` and
``--horizontal-pod-autoscaler-tolerance``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from course_lib.core.checks import InvalidArgumentError, integer, non_empty, number, one_of, positive_number

__all__ = [
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "DEFAULT_SYNC_PERIOD_S",
    "DEFAULT_TOLERANCE",
    "HPA",
    "MAX_POLICY_PERIOD_S",
    "MAX_STABILIZATION_WINDOW_S",
    "POLICY_TYPES",
    "SELECT_POLICIES",
    "ScalingPolicy",
    "ScalingRules",
    "check_replica_bounds",
    "desired_replicas",
    "hpa_step",
]

#: ``--horizontal-pod-autoscaler-tolerance``: changes within 10 % of the target are ignored.
DEFAULT_TOLERANCE = 0.1
#: ``--horizontal-pod-autoscaler-sync-period``: the controller reads the metrics every 15 s.
DEFAULT_SYNC_PERIOD_S = 15
#: Longest scaling-policy ``periodSeconds`` the API server accepts (validation.go ``MaxPeriodSeconds``).
MAX_POLICY_PERIOD_S = 1800
#: Longest ``stabilizationWindowSeconds`` it accepts (validation.go ``MaxStabilizationWindowSeconds``).
MAX_STABILIZATION_WINDOW_S = 3600
#: ``HPAScalingPolicy.type``: a number of pods or a percentage of the current replicas per period.
POLICY_TYPES: tuple[str, ...] = ("Pods", "Percent")
#: ``HPAScalingRules.selectPolicy``: the most permissive policy, the least, or no scaling that way.
SELECT_POLICIES: tuple[str, ...] = ("Max", "Min", "Disabled")


@dataclass(frozen=True)
class ScalingPolicy:
    """One rate limit: at most ``value`` pods (``"Pods"``) or ``value`` % (``"Percent"``) per ``period_s``."""

    type: Literal["Pods", "Percent"]
    value: int
    period_s: int

    def __post_init__(self) -> None:
        one_of("type", self.type, POLICY_TYPES)
        integer("value", self.value, min=1)
        integer("period_s", self.period_s, min=1, max=MAX_POLICY_PERIOD_S)


@dataclass(frozen=True)
class ScalingRules:
    """A direction's behaviour: stabilization window, policies and how to pick among them."""

    stabilization_window_s: int
    policies: tuple[ScalingPolicy, ...]
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"

    def __post_init__(self) -> None:
        integer("stabilization_window_s", self.stabilization_window_s, min=0, max=MAX_STABILIZATION_WINDOW_S)
        one_of("select_policy", self.select_policy, SELECT_POLICIES)
        if not self.policies and self.select_policy != "Disabled":
            raise InvalidArgumentError("policies must not be empty unless select_policy is 'Disabled'")


#: Kubernetes' default scale-up behaviour (defaults.go): no stabilization, max(+4 pods, +100 %) per 15 s.
DEFAULT_SCALE_UP = ScalingRules(
    stabilization_window_s=0,
    policies=(
        ScalingPolicy(type="Pods", value=4, period_s=15),
        ScalingPolicy(type="Percent", value=100, period_s=15),
    ),
)
#: Kubernetes' default scale-down behaviour: 300 s stabilization
#: (``--horizontal-pod-autoscaler-downscale-stabilization``), up to -100 % per 15 s.
DEFAULT_SCALE_DOWN = ScalingRules(
    stabilization_window_s=300,
    policies=(ScalingPolicy(type="Percent", value=100, period_s=15),),
)


def check_replica_bounds(min_replicas: int, max_replicas: int) -> tuple[int, int]:
    """``(min_replicas, max_replicas)`` as ints if ``1 <= min_replicas <= max_replicas``.

    The API server's rule for ``spec.minReplicas`` / ``spec.maxReplicas`` (a ``minReplicas`` of 0 needs
    the ``HPAScaleToZero`` feature gate, which the course does not assume).

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For a non-integer bound, ``min_replicas`` < 1 or ``max_replicas`` < ``min_replicas``.
    """
    min_replicas = integer("min_replicas", min_replicas, min=1)
    max_replicas = integer("max_replicas", max_replicas, min=1)
    if max_replicas < min_replicas:
        raise InvalidArgumentError(f"max_replicas must be >= min_replicas={min_replicas}, got {max_replicas}")
    return min_replicas, max_replicas


def desired_replicas(
    current_replicas: int, metric: float, target: float, *, tolerance: float = DEFAULT_TOLERANCE
) -> int:
    """The HPA's raw recommendation for one metric: ``ceil(current x metric / target)``.

    Parameters
    ----------
    current_replicas : int >= 1
        Replicas now (the HPA does not scale a target that has 0 replicas).
    metric : float >= 0
        The metric's current value, averaged per replica (e.g. 90 for 90 % CPU, or requests per second
        per replica).
    target : float > 0
        The target value of the same metric.
    tolerance : float in [0, 1), default 0.1
        No change while ``|metric / target - 1| <= tolerance``.

    Returns
    -------
    int
        Recommended replicas before stabilization, rate limits and min/max.

    Raises
    ------
    ValueError
        For replicas < 1, a negative or non-finite metric, a target <= 0 or a tolerance outside [0, 1).

    Examples
    --------
    The Kubernetes documentation's example, 50 replicas at 90 % against a 75 % target:

    >>> desired_replicas(50, 90, 75)
    60
    >>> desired_replicas(50, 80, 75)   # ratio 1.067 is within the 10 % tolerance
    50
    """
    current_replicas = integer("current_replicas", current_replicas, min=1)
    metric = positive_number("metric", metric, allow_zero=True)
    target = positive_number("target", target)
    tolerance = number("tolerance", tolerance, min=0, max=1, max_open=True)
    ratio = metric / target
    if abs(ratio - 1.0) <= tolerance:
        return current_replicas
    # Kubernetes computes the product in float64 and rounds up; round first so that 50 x 1.2 is 60.
    return math.ceil(round(ratio * current_replicas, 9))


def hpa_step(
    current_replicas: int,
    metric: float,
    target: float,
    *,
    min_replicas: int,
    max_replicas: int,
    window_recommendations: Sequence[int] = (),
    tolerance: float = DEFAULT_TOLERANCE,
) -> tuple[int, int]:
    """One HPA sync period, the core: proportional rule, tolerance, scale-down window, min/max.

    The mechanism :class:`HPA` hardens, for one metric: the raw recommendation is
    :func:`desired_replicas` (``ceil(current x metric / target)``, unchanged inside the tolerance); a
    scale-down goes only as far as the **highest** recommendation of the scale-down stabilization
    window (``window_recommendations``: the raw recommendations of the last 300 s by default, this one
    excluded), never above ``current_replicas``; the result is clamped to ``[min_replicas, max_replicas]``.

    Parameters
    ----------
    current_replicas : int >= 1
    metric, target : float
        The metric per replica and its target, same unit (e.g. % CPU).
    min_replicas, max_replicas : int
        ``1 <= min_replicas <= max_replicas``.
    window_recommendations : sequence of int
        Earlier raw recommendations still inside the scale-down window.
    tolerance : float, default 0.1

    Returns
    -------
    (replicas, recommendation) : tuple of int
        The new replica count, and this period's raw recommendation (the caller keeps it for the window).

    Raises
    ------
    ValueError
        For the bad inputs :func:`desired_replicas` and :func:`check_replica_bounds` refuse.

    References
    ----------
    Kubernetes documentation, "Horizontal Pod Autoscaling", "Algorithm details" and "Stabilization window".

    Examples
    --------
    >>> hpa_step(4, 90, 60, min_replicas=2, max_replicas=10)   # ceil(4 x 90 / 60) = 6
    (6, 6)
    >>> hpa_step(6, 30, 60, min_replicas=2, max_replicas=10, window_recommendations=[6, 5])
    (6, 3)
    """
    min_replicas, max_replicas = check_replica_bounds(min_replicas, max_replicas)
    raw = desired_replicas(current_replicas, metric, target, tolerance=tolerance)
    new = raw
    if raw < current_replicas:  # scale down only to the highest recommendation of the window
        new = min(current_replicas, max([raw, *window_recommendations]))
    return min(max(new, min_replicas), max_replicas), raw


@dataclass
class HPA:
    """A stateful HPA controller: call :meth:`step` once per sync period with the metrics' values.

    The hardened form of :func:`hpa_step` (tests check both give the same replicas where no rate
    limit binds). It adds what the controller does beyond the core: several metrics (the largest
    recommendation wins), a scale-up stabilization window, the scaling policies' rate limits (pods or
    percent per period, counted from the replicas at the start of the period), ``Disabled`` directions,
    the rescale of a target outside ``[min, max]`` without reading metrics, a target scaled to 0 left
    alone, and the history of recommendations and scale events kept for those windows.

    Parameters
    ----------
    min_replicas, max_replicas : int
        Bounds, ``1 <= min_replicas <= max_replicas``.
    targets : sequence of float
        One target per metric passed to :meth:`step` (same order).
    scale_up, scale_down : ScalingRules
        Behaviour; Kubernetes' defaults if omitted.
    tolerance : float, default 0.1
    """

    min_replicas: int
    max_replicas: int
    targets: Sequence[float]
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN
    tolerance: float = DEFAULT_TOLERANCE
    _recommendations: list[tuple[float, int]] = field(default_factory=list, repr=False)
    _events: list[tuple[float, int]] = field(default_factory=list, repr=False)
    _last_s: float = field(default=-math.inf, repr=False)

    def __post_init__(self) -> None:
        check_replica_bounds(self.min_replicas, self.max_replicas)
        non_empty("targets", self.targets)
        self.targets = tuple(positive_number(f"targets[{i}]", t) for i, t in enumerate(self.targets))
        self.tolerance = number("tolerance", self.tolerance, min=0, max=1, max_open=True)

    def step(self, now_s: float, current_replicas: int, metrics: Sequence[float]) -> int:
        """One sync period at time ``now_s`` (seconds, increasing): the new replica count.

        ``metrics`` holds one per-replica value per target. ``current_replicas`` is what runs now,
        starting replicas included. As the controller does, a target scaled to 0 replicas by hand is
        left alone (autoscaling is disabled while ``spec.replicas`` is 0). Raises ``ValueError`` if the
        number of metrics differs from the number of targets, or ``now_s`` is not finite or goes backwards.
        """
        if len(metrics) != len(self.targets):
            raise ValueError(
                f"metrics must have {len(self.targets)} values (one per target), got {len(metrics)}"
            )
        if not math.isfinite(now_s) or now_s < self._last_s:
            raise ValueError(f"now_s must be finite and must not go backwards: {now_s} after {self._last_s}")
        self._last_s = now_s
        if current_replicas == 0:
            return 0
        if not self.min_replicas <= current_replicas <= self.max_replicas:
            # As the controller does: outside [min, max] it rescales to the bound without reading metrics.
            new = min(max(current_replicas, self.min_replicas), self.max_replicas)
            self._events.append((now_s, new - current_replicas))
            return new
        raw = max(
            desired_replicas(current_replicas, m, t, tolerance=self.tolerance)
            for m, t in zip(metrics, self.targets, strict=True)
        )
        stabilized = self._stabilize(now_s, current_replicas, raw)
        new = self._limit_rate(now_s, current_replicas, stabilized)
        if new != current_replicas:
            self._events.append((now_s, new - current_replicas))
        return new

    def _stabilize(self, now_s: float, current: int, raw: int) -> int:
        up_cut = now_s - self.scale_up.stabilization_window_s
        down_cut = now_s - self.scale_down.stabilization_window_s
        up_rec, down_rec = raw, raw
        for t, rec in self._recommendations:
            if t > up_cut:
                up_rec = min(up_rec, rec)
            if t > down_cut:
                down_rec = max(down_rec, rec)
        keep = max(self.scale_up.stabilization_window_s, self.scale_down.stabilization_window_s)
        self._recommendations = [(t, r) for t, r in self._recommendations if t > now_s - keep]
        self._recommendations.append((now_s, raw))
        return min(max(current, up_rec), down_rec)

    def _change_in(self, now_s: float, period_s: int, sign: int) -> int:
        return sum(abs(d) for t, d in self._events if t > now_s - period_s and (d > 0) == (sign > 0))

    def _period_start(self, now_s: float, current: int, period_s: int) -> int:
        """Replicas at the start of the policy period: undo the scale events inside it."""
        return current - self._change_in(now_s, period_s, +1) + self._change_in(now_s, period_s, -1)

    def _limit_rate(self, now_s: float, current: int, desired: int) -> int:
        if desired == current:
            return min(max(desired, self.min_replicas), self.max_replicas)
        up = desired > current
        rules = self.scale_up if up else self.scale_down
        if rules.select_policy == "Disabled":
            return current
        proposals = []
        for p in rules.policies:
            start = self._period_start(now_s, current, p.period_s)
            if p.type == "Pods":
                proposals.append(start + p.value if up else start - p.value)
            else:  # rounded up when growing, down when shrinking, as the controller does
                proposals.append(
                    math.ceil(start * (1 + p.value / 100)) if up else int(start * (1 - p.value / 100))
                )
        # "Max" selects the policy allowing the largest change: the highest limit up, the lowest down.
        if up:
            limit = max(proposals) if rules.select_policy == "Max" else min(proposals)
            return min(desired, max(limit, current), self.max_replicas)
        limit = min(proposals) if rules.select_policy == "Max" else max(proposals)
        return max(desired, min(limit, current), self.min_replicas)
