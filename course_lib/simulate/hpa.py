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

References
----------
Kubernetes documentation, "Horizontal Pod Autoscaling", sections "Algorithm details", "Stabilization
window", "Scaling policies" and "Default behavior"; kubernetes/kubernetes
``pkg/controller/podautoscaler/horizontal.go`` (``stabilizeRecommendationWithBehaviors``,
``calculateScaleUpLimitWithScalingRules``, ``calculateScaleDownLimitWithBehaviors``) and
``pkg/apis/autoscaling/v2/defaults.go`` (the default policies quoted above).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "DEFAULT_TOLERANCE",
    "HPA",
    "ScalingPolicy",
    "ScalingRules",
    "desired_replicas",
]

#: ``--horizontal-pod-autoscaler-tolerance``: changes within 10 % of the target are ignored.
DEFAULT_TOLERANCE = 0.1


@dataclass(frozen=True)
class ScalingPolicy:
    """One rate limit: at most ``value`` pods (``"Pods"``) or ``value`` % (``"Percent"``) per ``period_s``."""

    type: Literal["Pods", "Percent"]
    value: int
    period_s: int

    def __post_init__(self) -> None:
        if self.type not in ("Pods", "Percent"):
            raise ValueError(f"type must be 'Pods' or 'Percent', got {self.type!r}")
        if not isinstance(self.value, int) or self.value < 1:
            raise ValueError(f"value must be an integer >= 1, got {self.value!r}")
        if not isinstance(self.period_s, int) or not 1 <= self.period_s <= 1800:
            raise ValueError(f"period_s must be an integer in [1, 1800] seconds, got {self.period_s!r}")


@dataclass(frozen=True)
class ScalingRules:
    """A direction's behaviour: stabilization window, policies and how to pick among them."""

    stabilization_window_s: int
    policies: tuple[ScalingPolicy, ...]
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"

    def __post_init__(self) -> None:
        if not isinstance(self.stabilization_window_s, int) or not 0 <= self.stabilization_window_s <= 3600:
            raise ValueError(
                f"stabilization_window_s must be an integer in [0, 3600], got {self.stabilization_window_s!r}"
            )
        if self.select_policy not in ("Max", "Min", "Disabled"):
            raise ValueError(f"select_policy must be 'Max', 'Min' or 'Disabled', got {self.select_policy!r}")
        if not self.policies and self.select_policy != "Disabled":
            raise ValueError("policies must not be empty unless select_policy is 'Disabled'")


#: Kubernetes' default scale-up behaviour (defaults.go): no stabilization, max(+4 pods, +100 %) per 15 s.
DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy("Pods", 4, 15), ScalingPolicy("Percent", 100, 15)))
#: Kubernetes' default scale-down behaviour: 300 s stabilization, up to -100 % per 15 s.
DEFAULT_SCALE_DOWN = ScalingRules(300, (ScalingPolicy("Percent", 100, 15),))


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
    if (
        isinstance(current_replicas, bool)
        or not isinstance(current_replicas, numbers.Integral)
        or current_replicas < 1
    ):
        raise ValueError(f"current_replicas must be an integer >= 1, got {current_replicas!r}")
    current_replicas = int(current_replicas)
    if not math.isfinite(metric) or metric < 0:
        raise ValueError(f"metric must be finite and >= 0, got {metric!r}")
    if not math.isfinite(target) or target <= 0:
        raise ValueError(f"target must be finite and > 0, got {target!r}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1) (0.1 = 10 %), got {tolerance!r}")
    ratio = metric / target
    if abs(ratio - 1.0) <= tolerance:
        return current_replicas
    # Kubernetes computes the product in float64 and rounds up; round first so that 50 x 1.2 is 60.
    return math.ceil(round(ratio * current_replicas, 9))


@dataclass
class HPA:
    """A stateful HPA controller: call :meth:`step` once per sync period with the metrics' values.

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
        if not isinstance(self.min_replicas, int) or self.min_replicas < 1:
            raise ValueError(f"min_replicas must be an integer >= 1, got {self.min_replicas!r}")
        if not isinstance(self.max_replicas, int) or self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas must be an integer >= min_replicas, got {self.max_replicas!r}")
        if not self.targets:
            raise ValueError("targets must name at least one metric target")
        self.targets = tuple(float(t) for t in self.targets)
        bad = [t for t in self.targets if not (math.isfinite(t) and t > 0)]
        if bad:
            raise ValueError(f"targets must be finite and > 0, got {bad}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1) (0.1 = 10 %), got {self.tolerance!r}")

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
