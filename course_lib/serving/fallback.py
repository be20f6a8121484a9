"""A per-call timeout on a slow dependency, with a fallback answer that says it is one.

``SlowDependency`` wraps a feature lookup (customer id -> features) and delays a seeded fraction of
calls (a dependency that sometimes stalls). ``FallbackScorer`` scores a customer with the churn
model but gives the feature lookup at most ``timeout_ms``: when it is late, the lookup is cancelled
(counted) and the answer is the population prior (the churn rate of the training data), flagged
``"fallback": true`` and counted. Nothing is left running after a timeout: ``asyncio.timeout``
cancels the awaited lookup, and ``SlowDependency`` counts started, finished and cancelled calls so a
test can check that started = finished + cancelled.

References
----------
Dean, J. and Barroso, L. A. (2013), "The Tail at Scale", CACM 56(2): 74-80 (good-enough answers).
Python documentation, ``asyncio.timeout`` (3.11+): cancels the enclosed task on expiry.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from course_lib.core.checks import callable_, number, positive_number
from course_lib.serving.replica import is_slow

__all__ = ["FallbackScorer", "SlowDependency", "auc_with_fallbacks"]

Lookup = Callable[[str], "dict[str, object] | None"]
Forward = Callable[[list[dict[str, object]]], np.ndarray]


class SlowDependency:
    """A feature lookup that takes ``base_ms``, or ``slow_ms`` for a seeded ``slow_fraction`` of calls.

    Parameters
    ----------
    lookup : callable customer_id -> features or None
    base_ms, slow_ms : float >= 0
        Time of a normal and of a stalled call (an ``asyncio.sleep``: cancellable, like network I/O).
    slow_fraction : float in [0, 1]
        Which calls stall is a hash of ``(seed, call_id)`` (``course_lib.serving.replica._replica.is_slow``),
        so the same calls stall in every run.
    seed : int

    Attributes
    ----------
    started, finished, cancelled : int
        Calls begun, completed, and cancelled while waiting.
    """

    def __init__(
        self,
        lookup: Lookup,
        *,
        base_ms: float = 1.0,
        slow_ms: float = 80.0,
        slow_fraction: float = 0.03,
        seed: int = 0,
    ):
        callable_("lookup", lookup)
        base_ms = positive_number("base_ms", base_ms, allow_zero=True)
        slow_ms = positive_number("slow_ms", slow_ms, allow_zero=True)
        slow_fraction = number("slow_fraction", slow_fraction, min=0, max=1)
        self.lookup = lookup
        self.base_ms, self.slow_ms, self.slow_fraction, self.seed = base_ms, slow_ms, slow_fraction, seed
        self.started = self.finished = self.cancelled = 0

    def stalls(self, call_id: str) -> bool:
        """Whether call ``call_id`` is one of the stalled ones."""
        return is_slow(call_id, seed=self.seed, slow_fraction=self.slow_fraction)

    async def get(self, customer_id: str, *, call_id: str) -> dict[str, object] | None:
        """The customer's features after the injected delay."""
        self.started += 1
        try:
            await asyncio.sleep((self.slow_ms if self.stalls(call_id) else self.base_ms) / 1000.0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return self.lookup(customer_id)

    @property
    def running(self) -> int:
        """Calls started but neither finished nor cancelled (0 once every caller is done)."""
        return self.started - self.finished - self.cancelled


@dataclass
class FallbackScorer:
    """Score customers with a per-call timeout on the feature lookup and a flagged fallback answer.

    Parameters
    ----------
    dependency : SlowDependency
    forward : callable records -> probabilities, shape (n,)
        E.g. ``course_lib.serving.service.onnx_forward(scorer)``.
    prior : float in [0, 1]
        The fallback churn probability (e.g. the training churn rate).
    timeout_ms : float > 0 or None
        Deadline of the lookup; None waits for ever (no fallback).
    """

    dependency: SlowDependency
    forward: Forward
    prior: float
    timeout_ms: float | None = None
    requests: int = 0
    fallbacks: int = 0

    def __post_init__(self) -> None:
        number("prior", self.prior, min=0, max=1)
        if self.timeout_ms is not None:
            positive_number("timeout_ms", self.timeout_ms)

    async def score(self, customer_id: str, *, call_id: str) -> dict[str, Any]:
        """``{"customer_id", "churn_probability", "fallback"}``; fallback answers carry the prior.

        Raises
        ------
        KeyError
            If the customer is unknown (a 404 in the service, not a fallback).
        """
        self.requests += 1
        timeout_s = None if self.timeout_ms is None else self.timeout_ms / 1000.0
        try:
            async with asyncio.timeout(timeout_s):
                record = await self.dependency.get(customer_id, call_id=call_id)
        except TimeoutError:
            self.fallbacks += 1
            return {"customer_id": customer_id, "churn_probability": self.prior, "fallback": True}
        if record is None:
            raise KeyError(f"customer_id {customer_id!r} is not in the feature store")
        p = float(self.forward([record])[0])
        return {"customer_id": customer_id, "churn_probability": p, "fallback": False}

    @property
    def fallback_rate(self) -> float:
        """fallbacks / requests (NaN before any request)."""
        return self.fallbacks / self.requests if self.requests else math.nan


def auc_with_fallbacks(
    y_true: Sequence[int] | np.ndarray, p_model: np.ndarray, fallback: np.ndarray, prior: float
) -> dict[str, float]:
    """ROC AUC of the model's scores and of the same scores with fallback rows set to ``prior``.

    Parameters
    ----------
    y_true : 0/1 labels, shape (n,)
    p_model : model probabilities, shape (n,)
    fallback : bool, shape (n,): rows answered by the fallback
    prior : float

    Returns
    -------
    dict with ``auc_model``, ``auc_served`` (with fallbacks), ``auc_loss`` (model - served) and
    ``fallback_rate``.

    Raises
    ------
    ValueError
        If the shapes differ.
    """
    from sklearn.metrics import roc_auc_score  # noqa: PLC0415 (heavy optional dependency)

    y = np.asarray(y_true)
    p = np.asarray(p_model, dtype=float)
    mask = np.asarray(fallback, dtype=bool)
    if not (y.shape == p.shape == mask.shape):
        raise ValueError(
            f"y_true, p_model and fallback must have one shape, got {y.shape}, {p.shape}, {mask.shape}"
        )
    served = np.where(mask, prior, p)
    auc_model = float(roc_auc_score(y, p))
    auc_served = float(roc_auc_score(y, served))
    return {
        "auc_model": auc_model,
        "auc_served": auc_served,
        "auc_loss": auc_model - auc_served,
        "fallback_rate": float(mask.mean()),
    }
