"""An accuracy budget declared before measuring, and the per-slice check of every model variant against it.

A compressed, pruned or distilled model is only a candidate until it has been scored on the same
evaluation set and the same slices as the model it replaces. The budget is written down first (how
much ROC AUC any slice may lose, how much overall log loss may grow), then every variant gets a
verdict. Averages hide damage: a variant can keep the overall AUC while one contract type or tenure
band loses far more, so the budget applies to every slice.

References
----------
Kirana Kart module 19, "Quantisation" and the "make a model three times faster" exercise ("no slice
lost more accuracy than a limit you set in advance").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from course_lib.churn.model import metrics_by_slice
from course_lib.core.checks import instance_of, integer, non_empty, number, positive_number

__all__ = [
    "AccuracyBudget",
    "auc_difference_ci",
    "budget_verdicts",
    "slice_auc_drops",
    "slices_over_budget",
]


@dataclass(frozen=True)
class AccuracyBudget:
    """How much accuracy a cheaper variant may lose relative to the reference model.

    Parameters
    ----------
    max_slice_auc_drop : float
        Largest allowed drop in ROC AUC on any slice, the whole evaluation set included (>= 0).
    max_log_loss_increase : float
        Largest allowed growth of the overall log loss (>= 0); guards calibration, which AUC ignores.

    Raises
    ------
    ValueError
        For a negative or non-finite limit.
    """

    max_slice_auc_drop: float = 0.01
    max_log_loss_increase: float = 0.01

    def __post_init__(self) -> None:
        positive_number("max_slice_auc_drop", self.max_slice_auc_drop, allow_zero=True)
        positive_number("max_log_loss_increase", self.max_log_loss_increase, allow_zero=True)

    def __str__(self) -> str:
        return (
            f"AccuracyBudget: every slice may lose at most {self.max_slice_auc_drop:.3f} ROC AUC; "
            f"overall log loss may grow by at most {self.max_log_loss_increase:.3f}"
        )


def slices_over_budget(
    reference: Mapping[str, float], candidate: Mapping[str, float], max_drop: float
) -> dict[str, float]:
    """The accuracy-budget check, small: the slices on which a candidate lost more than ``max_drop``.

    A candidate passes when the answer is empty: on every slice, ``reference - candidate`` (the drop
    of a higher-is-better metric such as ROC AUC) stays within the budget declared beforehand.

    Parameters
    ----------
    reference : mapping of slice name -> metric of the reference model (e.g. FP32), higher is better.
    candidate : mapping of slice name -> metric of the candidate, at least the reference's slices.
    max_drop : float
        The budget: the largest drop allowed on any slice, in the metric's units (0.01 = 0.01 AUC).

    Returns
    -------
    dict of slice name -> drop, only for the slices whose drop exceeds ``max_drop`` (in the
    reference's order); empty means the candidate passes.

    Raises
    ------
    KeyError
        If ``candidate`` lacks one of the reference's slices.

    References
    ----------
    Kirana Kart module 19, the "make a model three times faster" exercise ("no slice lost more
    accuracy than a limit you set in advance"). :func:`budget_verdicts` is the hardened version.
    """
    drops = {name: reference[name] - candidate[name] for name in reference}
    return {name: drop for name, drop in drops.items() if drop > max_drop}


def slice_auc_drops(
    df: pd.DataFrame, p_reference: np.ndarray, candidates: Mapping[str, np.ndarray]
) -> pd.DataFrame:
    """ROC AUC drop of every candidate on every slice, relative to the reference model.

    Parameters
    ----------
    df : DataFrame
        Evaluation customers with ``churn`` and the slice columns (see ``metrics_by_slice``).
    p_reference : array of shape (n,)
        Churn probabilities of the reference model (e.g. FP32).
    candidates : mapping of variant name -> array of shape (n,)

    Returns
    -------
    DataFrame indexed by (slice, level) with ``n``, ``reference_auc`` and one column per candidate
    holding ``reference_auc - candidate_auc`` (positive = the candidate is worse). Slices where AUC is
    undefined (a single class) are kept, with NaN, so they are visible rather than dropped.

    Raises
    ------
    ValueError
        If ``candidates`` is empty or an array's length differs from ``len(df)``.
    """
    non_empty("candidates", candidates)
    for name, p in {"p_reference": p_reference, **candidates}.items():
        if len(p) != len(df):
            raise ValueError(f"{name} has {len(p)} probabilities for {len(df)} customers")
    ref = metrics_by_slice(df, p_reference)
    table = ref[["n"]].assign(reference_auc=ref["roc_auc"])
    for name, p in candidates.items():
        table[name] = ref["roc_auc"] - metrics_by_slice(df, p)["roc_auc"]
    return table


def _overall(df: pd.DataFrame, p_churn: np.ndarray) -> pd.Series:
    """The ("all", "all") row of ``metrics_by_slice``: the metrics over every customer."""
    # a row of the (slice, level) MultiIndex; pandas-stubs read a tuple key as (row, column), a scalar
    return cast(pd.Series, metrics_by_slice(df, p_churn).loc[("all", "all")])


def budget_verdicts(
    df: pd.DataFrame,
    p_reference: np.ndarray,
    candidates: Mapping[str, np.ndarray],
    budget: AccuracyBudget,
) -> pd.DataFrame:
    """One verdict per candidate: overall metrics, its worst slice, and pass/fail against ``budget``.

    The hardened form of :func:`slices_over_budget` (same pass/fail on the AUC part, tested on shared
    vectors). It adds: the slices computed from the evaluation frame (``metrics_by_slice``, the
    whole set included) so no slice can be forgotten; a log-loss limit, because AUC ignores
    calibration; slices with a single class kept and counted (AUC undefined there) instead of
    silently passing; checked inputs (lengths, budget type).

    Parameters
    ----------
    df, p_reference, candidates : as in ``slice_auc_drops``.
    budget : AccuracyBudget
        Declared before any candidate was measured.

    Returns
    -------
    DataFrame indexed by candidate with ``roc_auc``, ``log_loss`` (overall), ``log_loss_increase``,
    ``max_slice_auc_drop``, ``worst_slice`` ("slice=level"), ``n_slices_undefined`` (slices with a
    single class, where AUC cannot be checked) and ``passes`` (bool).

    Raises
    ------
    TypeError
        If ``budget`` is not an ``AccuracyBudget``.
    ValueError
        As ``slice_auc_drops``.
    """
    instance_of("budget", budget, AccuracyBudget)
    drops = slice_auc_drops(df, p_reference, candidates)
    ref_all = _overall(df, p_reference)
    rows = {}
    for name, p in candidates.items():
        overall = _overall(df, p)
        col = drops[name]
        worst = cast(tuple[str, str], col.idxmax()) if col.notna().any() else ("-", "-")  # (slice, level)
        ll_increase = float(overall["log_loss"] - ref_all["log_loss"])
        max_drop = float(col.max())
        rows[name] = {
            "roc_auc": float(overall["roc_auc"]),
            "log_loss": float(overall["log_loss"]),
            "log_loss_increase": ll_increase,
            "max_slice_auc_drop": max_drop,
            "worst_slice": f"{worst[0]}={worst[1]}",
            "n_slices_undefined": int(col.isna().sum()),
            "passes": bool(
                max_drop <= budget.max_slice_auc_drop and ll_increase <= budget.max_log_loss_increase
            ),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "variant"
    return table


def auc_difference_ci(
    y_true: np.ndarray,
    p_a: np.ndarray,
    p_b: np.ndarray,
    *,
    n_boot: int = 500,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """ROC AUC of model A minus model B, with a paired bootstrap confidence interval.

    Both models are scored on the same resampled customers in each of ``n_boot`` rounds, so the
    interval reflects how much the difference would move with another evaluation set of this size.
    An interval that contains 0 means this test set cannot tell the two models apart.

    Parameters
    ----------
    y_true : array of shape (n,), 0/1 labels.
    p_a, p_b : arrays of shape (n,), churn probabilities of the two models.
    n_boot : int
        Bootstrap rounds (>= 100); rounds whose resample holds a single class are skipped and counted.
    level : float
        Confidence level in (0, 1); the interval is the central percentile interval.
    seed : int
        Seed of the resampling.

    Returns
    -------
    dict with ``auc_a``, ``auc_b``, ``difference`` (on the full set), ``ci_low``, ``ci_high`` and
    ``n_boot_used``.

    Raises
    ------
    ValueError
        Arrays of different lengths, ``n_boot`` < 100, ``level`` outside (0, 1), or labels for which
        every resample holds a single class (e.g. all 0s: AUC is undefined).

    References
    ----------
    Efron and Tibshirani (1993), "An Introduction to the Bootstrap", ch. 13 (percentile intervals).
    """
    y = np.asarray(y_true).astype(int)
    a = np.asarray(p_a, dtype=float)
    b = np.asarray(p_b, dtype=float)
    if not (y.shape == a.shape == b.shape) or y.ndim != 1:
        raise ValueError(
            f"y_true, p_a and p_b must be 1-D of equal length, got {y.shape}, {a.shape}, {b.shape}"
        )
    n_boot = integer("n_boot", n_boot, min=100)
    level = number("level", level, min=0, max=1, min_open=True, max_open=True)
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(y), size=len(y))
        if y[idx].min() == y[idx].max():
            continue
        diffs.append(roc_auc_score(y[idx], a[idx]) - roc_auc_score(y[idx], b[idx]))
    if not diffs:
        raise ValueError(
            f"every one of the {n_boot} bootstrap resamples of {len(y)} labels holds a single class, so "
            "ROC AUC is undefined on all of them; evaluate on a set with both churners and non-churners"
        )
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(diffs, [tail, 100 - tail])
    auc_a, auc_b = roc_auc_score(y, a), roc_auc_score(y, b)
    return {
        "auc_a": float(auc_a),
        "auc_b": float(auc_b),
        "difference": float(auc_a - auc_b),
        "ci_low": float(low),
        "ci_high": float(high),
        "n_boot_used": len(diffs),
    }
