"""Smaller by design: how many of the boosted trees the churn model actually needs.

Gradient boosting adds trees one after another, so the model's first ``k`` trees are themselves a
complete, smaller model. XGBoost scores any such prefix with ``iteration_range=(0, k)``, which gives
the validation curve "accuracy against number of trees" without retraining, and ``Booster[:k]``
cuts the prefix out as a model of its own that can be exported and timed.

References
----------
XGBoost documentation, "Prediction" (``iteration_range``) and "Model slicing" (``booster[begin:end]``).
Kirana Kart module 19, "Smaller models by design" (fraud model cut from 1,500 to 500 trees after
validation PR-AUC flattened at 450).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score
from sklearn.pipeline import Pipeline
from xgboost import XGBClassifier

from course_lib.churn.model import DEFAULT_NTHREAD, features, labels
from course_lib.core.checks import InvalidArgumentError, instance_of, integer, integers, positive_number

__all__ = ["flattening_point", "prefix_probabilities", "prune_trees", "served_rounds", "trees_curve"]


def served_rounds(xgb: XGBClassifier) -> int:
    """How many boosting rounds a fitted ``XGBClassifier`` predicts with: its served iteration range's end.

    After early stopping, ``predict_proba`` uses only the first ``best_iteration + 1`` rounds; every other
    path that scores or times the booster (``Booster.inplace_predict``, ``iteration_range``) must use the
    same ``(0, served_rounds(xgb))`` or it scores a different model.

    Parameters
    ----------
    xgb : fitted xgboost.XGBClassifier

    Returns
    -------
    int >= 1: ``best_iteration + 1`` if the model was early-stopped, else every boosted round.

    Raises
    ------
    ValueError
        If ``xgb`` is not a fitted ``XGBClassifier``.

    References
    ----------
    XGBoost documentation, "Early Stopping" and ``XGBModel._get_iteration_range`` (xgboost/sklearn.py);
    dmlc/xgboost#8034 (``inplace_predict`` ignores ``best_iteration``).
    """
    instance_of("xgb", xgb, XGBClassifier)
    booster = xgb.get_booster()
    total = int(booster.num_boosted_rounds())
    best = booster.attr("best_iteration")
    return min(total, int(best) + 1) if best is not None else total


def _booster_rounds(pipeline: Pipeline) -> int:
    xgb = dict(pipeline.steps).get("xgb")
    if not isinstance(xgb, XGBClassifier):
        raise ValueError("pipeline must end in a fitted 'xgb' XGBClassifier step (see make_xgb_pipeline)")
    return served_rounds(xgb)


def _grid(total: int, n_trees: Sequence[int] | None) -> list[int]:
    if n_trees is None:
        grid = [k for k in (10, 20, 30, 40, 50) if k < total] + list(range(100, total, 50))
    else:
        grid = integers("n_trees", n_trees, min=1, max=total, allow_empty=True)
        if any(b <= a for a, b in itertools.pairwise(grid)):
            raise InvalidArgumentError(f"n_trees must be strictly increasing, got {grid}")
    if not grid or grid[-1] != total:
        grid.append(total)
    return grid


def prefix_probabilities(
    pipeline: Pipeline, df: pd.DataFrame, n_trees: Sequence[int] | None = None
) -> dict[int, np.ndarray]:
    """Churn probabilities of the model's first ``k`` trees, for each ``k`` in ``n_trees``.

    Parameters
    ----------
    pipeline : fitted course pipeline (``preprocess`` + ``xgb``).
    df : DataFrame with the 19 feature columns, n rows.
    n_trees : strictly increasing sequence of ints in [1, served trees] (:func:`served_rounds`), optional
        Defaults to 10, 20, ..., 50, then every 50 up to the total. The full model is always added
        as the last key.

    Returns
    -------
    dict of k -> array of shape (n,), in increasing k.

    Raises
    ------
    ValueError
        If the pipeline has no fitted XGBoost step, or ``n_trees`` holds values outside
        [1, served trees] (:func:`served_rounds`) or is not strictly increasing.
    """
    grid = _grid(_booster_rounds(pipeline), n_trees)
    X = pipeline.named_steps["preprocess"].transform(features(df))
    xgb = pipeline.named_steps["xgb"]
    return {k: xgb.predict_proba(X, iteration_range=(0, k))[:, 1] for k in grid}


def trees_curve(pipeline: Pipeline, df: pd.DataFrame, n_trees: Sequence[int] | None = None) -> pd.DataFrame:
    """Validation metrics of the model's first ``k`` trees, for each ``k`` in ``n_trees``.

    Parameters
    ----------
    pipeline, n_trees : as in ``prefix_probabilities``.
    df : DataFrame of labelled customers (the validation split: never the test set when choosing k).

    Returns
    -------
    DataFrame indexed by ``n_trees`` with ``roc_auc``, ``pr_auc``, ``log_loss`` and ``auc_vs_full``
    (AUC minus the full model's AUC; the full model is always included as the last row).

    Raises
    ------
    ValueError
        As ``prefix_probabilities``.
    """
    y = labels(df)
    rows = [
        {
            "n_trees": k,
            "roc_auc": float(roc_auc_score(y, p)),
            "pr_auc": float(average_precision_score(y, p)),
            "log_loss": float(log_loss(y, p, labels=[0, 1])),
        }
        for k, p in prefix_probabilities(pipeline, df, n_trees).items()
    ]
    curve = pd.DataFrame(rows).set_index("n_trees")
    curve["auc_vs_full"] = curve["roc_auc"] - curve["roc_auc"].iloc[-1]
    return curve


def flattening_point(
    curve: pd.DataFrame, *, auc_tolerance: float = 0.005, log_loss_tolerance: float | None = None
) -> int:
    """The fewest trees whose validation AUC is within ``auc_tolerance`` of the full model's.

    Parameters
    ----------
    curve : output of ``trees_curve`` (the last row is the full model).
    auc_tolerance : float
        Allowed AUC shortfall against the full model, >= 0.
    log_loss_tolerance : float, optional
        If given, the point must also keep log loss within this much of the full model's; a short
        prefix of a boosted model ranks customers well before its probabilities are calibrated.

    Returns
    -------
    int
        Number of trees (always found: the full model qualifies).

    Raises
    ------
    ValueError
        For a negative tolerance or a curve without the ``roc_auc``/``log_loss`` columns.
    """
    auc_tolerance = positive_number("auc_tolerance", auc_tolerance, allow_zero=True)
    if log_loss_tolerance is not None:
        log_loss_tolerance = positive_number("log_loss_tolerance", log_loss_tolerance, allow_zero=True)
    missing = {"roc_auc", "log_loss"} - set(curve.columns)
    if missing or curve.empty:
        raise ValueError(f"curve must come from trees_curve (missing columns {sorted(missing)} or no rows)")
    full = curve.iloc[-1]
    ok = curve["roc_auc"] >= full["roc_auc"] - auc_tolerance
    if log_loss_tolerance is not None:
        ok &= curve["log_loss"] <= full["log_loss"] + log_loss_tolerance
    return int(curve.index[int(np.argmax(ok.to_numpy()))])


def prune_trees(pipeline: Pipeline, n_trees: int, *, nthread: int = DEFAULT_NTHREAD) -> Pipeline:
    """A copy of ``pipeline`` whose XGBoost step keeps only the first ``n_trees`` trees (no retraining).

    The booster is sliced (``Booster[:n_trees]``) and loaded into a fresh ``XGBClassifier``, so the
    result predicts exactly like ``iteration_range=(0, n_trees)`` and exports to ONNX like the full
    model (``course_lib.churn.export._onnx.pipeline_to_onnx``).

    Raises
    ------
    ValueError
        If the pipeline has no fitted XGBoost step or ``n_trees`` is outside [1, served trees]
        (:func:`served_rounds`).
    """
    total = _booster_rounds(pipeline)
    n_trees = integer("n_trees", n_trees, min=1, max=total)
    sliced = pipeline.named_steps["xgb"].get_booster()[:n_trees]
    sliced.set_attr(best_iteration=None, best_score=None)  # the prefix serves all of its own trees
    small = XGBClassifier()
    small.load_model(bytearray(sliced.save_raw(raw_format="ubj")))
    small.set_params(n_jobs=nthread)
    pruned = copy.deepcopy(pipeline)
    pruned.steps[-1] = ("xgb", small)
    return pruned
