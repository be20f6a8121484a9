"""Canary rollout: sticky hash routing, decision rules per stage, and automatic rollback.

``HashRouter`` sends a customer to the canary when a hash of its ``customer_id`` falls below the
canary percentage, so a customer sees the same version on every request at a given percentage, and
raising the percentage only moves customers from the stable version to the canary (never back).
``RandomRouter`` is source 004's ``random.random() < percent / 100``: the same customer flips
between versions from one request to the next.

``RampController`` walks the stages (5 -> 25 -> 100 % by default). At each decision it checks the
canary's window of requests against ``DecisionRules``: p95 latency (absolute SLO and relative to
the stable version), error ratio, the PSI of its score distribution against the stable version's,
and, once enough delayed labels have arrived, per-slice AUC and calibration. A failed check with
enough data rolls the canary back to 0 % at once; all checks passed with enough data for the
stage's minimum number of windows promotes it; anything else holds.

References
----------
Google SRE Workbook, chapter 16 "Canarying Releases" (sticky assignment, comparing canary with
control over the same window, automatic rollback). Kayenta / Spinnaker canary analysis (metric
comparisons between canary and baseline).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from course_lib.core.checks import InvalidArgumentError, instance_of, integer, number
from course_lib.core.percentiles import percentile
from course_lib.operate.drift import PSI_ALERT, psi

__all__ = [
    "HASH_BUCKETS",
    "STAGES_PERCENT",
    "Check",
    "Decision",
    "DecisionRules",
    "HashRouter",
    "RampController",
    "RandomRouter",
    "canary_bucket",
    "check_window",
    "refresh_flips",
    "sticky_version",
]

#: Routing resolution: a percentage is honoured in steps of 0.01 %.
HASH_BUCKETS = 10_000
STAGES_PERCENT: tuple[float, ...] = (5.0, 25.0, 100.0)


def canary_bucket(customer_id: str, *, salt: str = "canary") -> int:
    """The customer's fixed bucket in [0, HASH_BUCKETS): sha256 of ``salt:customer_id``.

    A new ``salt`` per rollout gives each rollout its own (still sticky) set of canary customers.

    Raises
    ------
    TypeError
        If ``customer_id`` is not a string.
    """
    instance_of("customer_id", customer_id, str)
    digest = hashlib.sha256(f"{salt}:{customer_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HASH_BUCKETS


def sticky_version(customer_id: str, canary_percent: float, stable: str = "v1", canary: str = "v2") -> str:
    """The version that scores a customer: the canary when the customer's fixed bucket is below the percent.

    The core of :class:`HashRouter`: a hash of the customer id is a number in [0, 100) in steps of
    0.01 that never changes, so the same customer gets the same version on every request, and raising
    ``canary_percent`` only adds customers to the canary.

    Parameters
    ----------
    customer_id : str
    canary_percent : float
        Share of customers on the canary, 0 to 100 (percent).
    stable, canary : str
        The version names.

    Notes
    -----
    ``HashRouter`` adds over this: checked inputs, a per-rollout salt and a percentage it can move
    (``set_percent``) during the ramp. A unit test checks both on the same customers and percents.

    References
    ----------
    Google SRE Workbook, chapter 16 "Canarying Releases" (sticky assignment).
    """
    digest = hashlib.sha256(f"canary:{customer_id}".encode()).digest()
    bucket = (int.from_bytes(digest[:8], "big") % 10_000) / 100  # fixed per customer, in [0, 100)
    return canary if bucket < canary_percent else stable


@dataclass
class HashRouter:
    """Sticky canary routing by customer id.

    Parameters
    ----------
    stable, canary : str
        Version names (e.g. ``"v1"``, ``"v2"``).
    percent : float
        Share of customers on the canary, in [0, 100].
    salt : str
        Per-rollout salt of ``canary_bucket``.
    """

    stable: str
    canary: str
    percent: float = 0.0
    salt: str = "canary"

    def __post_init__(self) -> None:
        self.percent = number("percent", self.percent, min=0, max=100)

    def set_percent(self, percent: float) -> None:
        """Move the canary to ``percent`` (0 = rolled back, 100 = everyone)."""
        self.percent = number("percent", percent, min=0, max=100)

    def version_for(self, customer_id: str) -> str:
        """The version that scores ``customer_id`` at the current percentage."""
        threshold = round(self.percent * HASH_BUCKETS / 100)
        return self.canary if canary_bucket(customer_id, salt=self.salt) < threshold else self.stable


@dataclass
class RandomRouter:
    """Source 004's routing: each request independently goes to the canary with probability percent/100."""

    stable: str
    canary: str
    percent: float = 0.0
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.percent = number("percent", self.percent, min=0, max=100)
        self._rng = random.Random(self.seed)

    def set_percent(self, percent: float) -> None:
        self.percent = number("percent", percent, min=0, max=100)

    def version_for(self, customer_id: str) -> str:
        return self.canary if self._rng.random() < self.percent / 100 else self.stable


def refresh_flips(
    router: HashRouter | RandomRouter, customer_ids: Sequence[str], refreshes: int
) -> pd.DataFrame:
    """What a support rep sees when reloading each customer's page ``refreshes`` times.

    Returns
    -------
    DataFrame indexed by customer with ``canary_answers`` (of ``refreshes``) and ``flipped`` (saw
    both versions: the churn score on the page changed between reloads for no reason).
    """
    refreshes = integer("refreshes", refreshes, min=1)
    rows = []
    for cid in customer_ids:
        seen = [router.version_for(cid) for _ in range(refreshes)]
        k = sum(v == router.canary for v in seen)
        rows.append({"customer_id": cid, "canary_answers": k, "flipped": 0 < k < refreshes})
    return pd.DataFrame(rows).set_index("customer_id")


@dataclass(frozen=True)
class DecisionRules:
    """Limits a canary must stay within at every stage, and how much data a judgement needs.

    ``max_p95_ms`` is the service's SLO; ``max_p95_ratio`` bounds canary p95 / stable p95 in the
    same window; ``max_error_ratio`` the share of 5xx answers; ``max_score_psi`` the PSI of the
    canary's scores against the stable version's (both routed at random by the hash, so their
    populations match); ``max_slice_auc_drop`` and ``max_slice_calibration_gap`` compare, per slice
    with ``min_labels`` labelled rows, the canary's AUC with the stable version's and its mean
    score with the observed churn rate.

    The sample minimums keep noise from deciding: the PSI of two samples of one distribution is
    about (bins - 1) x (1/n1 + 1/n2) (0.03 for 300 canary requests), far below the 0.25 limit; a
    slice's churn rate from 300 labels has a standard error of at most 0.029, a third of the 0.10
    calibration limit. From ``labels_before_leaving_percent`` on (25 %), a stage is left only
    once every slice has ``min_labels`` labelled canary requests: quality is judged before the
    canary takes all traffic.
    """

    max_p95_ms: float = 20.0
    max_p95_ratio: float = 1.5
    max_error_ratio: float = 0.01
    max_score_psi: float = PSI_ALERT
    max_slice_auc_drop: float = 0.10
    max_slice_calibration_gap: float = 0.10
    min_requests: int = 300
    min_labels: int = 300
    labels_before_leaving_percent: float = 25.0
    slice_column: str = "tenure_band"


@dataclass(frozen=True)
class Check:
    """One rule evaluated on one window: value, limit, whether it passed, whether data sufficed."""

    rule: str
    value: float
    limit: float
    passed: bool
    enough_data: bool


def _auc(y: np.ndarray, p: np.ndarray) -> float:
    return float(roc_auc_score(y, p)) if len(np.unique(y)) == 2 else math.nan


def check_window(
    window: pd.DataFrame, stable: str, canary: str, rules: DecisionRules, labelled: pd.DataFrame | None = None
) -> list[Check]:
    """Evaluate every rule on one window of requests.

    Parameters
    ----------
    window : DataFrame with ``version``, ``latency_ms``, ``status`` (HTTP code), ``score`` (NaN for
        failed requests), ``rules.slice_column`` and ``label`` (0/1, NaN until it arrives).
    labelled : DataFrame of the same columns, optional
        Requests whose delayed labels have arrived, for the slice rules (default: ``window``'s).

    Returns
    -------
    list of Check (p95, p95 ratio, errors, score PSI, and per-slice AUC drop and calibration gap).
    """
    can, sta = window[window["version"] == canary], window[window["version"] == stable]
    n_ok = len(can) >= rules.min_requests
    both = n_ok and len(sta) >= rules.min_requests
    p95 = percentile(can["latency_ms"], 95) if len(can) else math.nan
    p95_sta = percentile(sta["latency_ms"], 95) if len(sta) else math.nan
    err = float((can["status"] >= 500).mean()) if len(can) else math.nan
    checks = [
        Check("p95_ms", p95, rules.max_p95_ms, not p95 > rules.max_p95_ms, n_ok),
        Check(
            "p95_ratio",
            p95 / p95_sta if both else math.nan,
            rules.max_p95_ratio,
            not p95 / p95_sta > rules.max_p95_ratio if both else True,
            both,
        ),
        Check("error_ratio", err, rules.max_error_ratio, not err > rules.max_error_ratio, n_ok),
    ]
    s_can, s_sta = can["score"].dropna(), sta["score"].dropna()
    value = psi(s_sta, s_can) if both and len(s_can) and len(s_sta) else math.nan
    checks.append(
        Check(
            "score_psi",
            value,
            rules.max_score_psi,
            not value > rules.max_score_psi,
            both and not math.isnan(value),
        )
    )
    labelled = window if labelled is None else labelled
    labelled = labelled[labelled["label"].notna() & labelled["score"].notna()]
    for level, part in labelled.groupby(rules.slice_column, observed=True, sort=True):
        pc, ps = part[part["version"] == canary], part[part["version"] == stable]
        enough = len(pc) >= rules.min_labels
        gap = abs(float(pc["score"].mean() - pc["label"].mean())) if len(pc) else math.nan
        checks.append(
            Check(
                f"calibration_gap[{level}]",
                gap,
                rules.max_slice_calibration_gap,
                not gap > rules.max_slice_calibration_gap,
                enough,
            )
        )
        if enough and len(ps) >= rules.min_labels:
            drop = _auc(ps["label"].to_numpy(int), ps["score"].to_numpy()) - _auc(
                pc["label"].to_numpy(int), pc["score"].to_numpy()
            )
            checks.append(
                Check(
                    f"auc_drop[{level}]",
                    drop,
                    rules.max_slice_auc_drop,
                    not drop > rules.max_slice_auc_drop,
                    not math.isnan(drop),
                )
            )
    return checks


@dataclass(frozen=True)
class Decision:
    """One entry of the decision log."""

    t: float
    stage_percent: float
    action: str  # "hold", "promote", "rollback" or "complete"
    new_percent: float
    reasons: tuple[str, ...]


class RampController:
    """Drive a router through the canary stages with ``DecisionRules``, logging every decision.

    Parameters
    ----------
    router : HashRouter
        Its ``percent`` is set by the controller (starts at the first stage).
    rules : DecisionRules
    stages : increasing percentages ending at 100.
    min_windows : int
        Passing windows needed at a stage before promotion.

    Raises
    ------
    ValueError
        If the stages are not increasing percentages ending at 100, or ``min_windows`` < 1.
    """

    def __init__(
        self,
        router: HashRouter,
        rules: DecisionRules | None = None,
        *,
        stages: Iterable[float] = STAGES_PERCENT,
        min_windows: int = 2,
    ):
        self.stages = tuple(number(f"stages[{i}]", s, min=0, max=100) for i, s in enumerate(stages))
        if (
            not self.stages
            or self.stages[-1] != 100
            or any(b <= a for a, b in itertools.pairwise(self.stages))
        ):
            raise InvalidArgumentError(
                f"stages must be increasing percentages ending at 100, got {self.stages}"
            )
        min_windows = integer("min_windows", min_windows, min=1)
        self.router, self.rules, self.min_windows = router, rules or DecisionRules(), min_windows
        self.stage_index, self.passed_windows, self.state = 0, 0, "ramping"
        self.router.set_percent(self.stages[0])
        self.log: list[Decision] = []
        self.checks: list[tuple[float, Check]] = []

    def decide(self, t: float, window: pd.DataFrame, labelled: pd.DataFrame | None = None) -> Decision:
        """Judge one window of requests (and the labelled ones, see ``check_window``); act on the router.

        Returns
        -------
        Decision; after a rollback or completion every later call returns ``hold`` at that percent.
        """
        stage = self.router.percent
        if self.state != "ramping":
            return self._record(Decision(t, stage, "hold", stage, (f"rollout {self.state}",)))
        checks = check_window(window, self.router.stable, self.router.canary, self.rules, labelled)
        self.checks.extend((t, c) for c in checks)
        failed = [c for c in checks if c.enough_data and not c.passed]
        if failed:
            self.router.set_percent(0.0)
            self.state = "rolled back"
            reasons = tuple(f"{c.rule}={c.value:.3g} > {c.limit:g}" for c in failed)
            return self._record(Decision(t, stage, "rollback", 0.0, reasons))
        core = [c for c in checks if c.rule in ("p95_ms", "error_ratio", "score_psi")]
        if self.stages[self.stage_index] == 100:
            core = [c for c in core if c.rule != "score_psi"]  # no stable traffic left to compare with
        short = [c.rule for c in core if not c.enough_data]
        if self.rules.labels_before_leaving_percent <= stage < 100:
            calibration = [c for c in checks if c.rule.startswith("calibration_gap")]
            short += [c.rule for c in calibration if not c.enough_data] or (
                [] if calibration else ["slice labels"]
            )
        if short:
            return self._record(Decision(t, stage, "hold", stage, ("waiting for data: " + ", ".join(short),)))
        self.passed_windows += 1
        if self.passed_windows < self.min_windows:
            return self._record(
                Decision(
                    t, stage, "hold", stage, (f"{self.passed_windows}/{self.min_windows} windows passed",)
                )
            )
        if self.stage_index == len(self.stages) - 1:
            self.state = "complete"
            return self._record(Decision(t, stage, "complete", stage, ("all checks passed at 100 %",)))
        self.stage_index += 1
        self.passed_windows = 0
        self.router.set_percent(self.stages[self.stage_index])
        return self._record(Decision(t, stage, "promote", self.router.percent, ("all checks passed",)))

    def _record(self, decision: Decision) -> Decision:
        self.log.append(decision)
        return decision

    def log_frame(self) -> pd.DataFrame:
        """The decision log as a DataFrame (one row per decision)."""
        return pd.DataFrame([d.__dict__ for d in self.log]).assign(
            reasons=lambda f: f["reasons"].map("; ".join)
        )
