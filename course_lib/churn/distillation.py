"""Distillation: train a small student on the teacher's churn probabilities over unlabelled customers.

The teacher (the 400-tree course model) scores a large synthetic population that nobody labelled;
the student, a much smaller boosted model, learns to reproduce those probabilities. The comparison
that decides whether distillation helped is the *same* student trained on the real labels only.

Soft targets need no special loss: XGBoost's ``binary:logistic`` objective is the cross-entropy
``-[q log p + (1 - q) log(1 - p)]``, whose gradient ``p - q`` is defined for any target ``q`` in
[0, 1], so ``XGBRegressor(objective="binary:logistic")`` fits 0/1 labels and teacher probabilities
alike and predicts probabilities.

References
----------
Hinton, Vinyals and Dean (2015), "Distilling the Knowledge in a Neural Network", arXiv:1503.02531.
Kirana Kart module 19, "Distillation" (teacher probabilities over unlabelled data).
XGBoost documentation, "Learning Task Parameters" (``binary:logistic``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sklearn.pipeline import Pipeline
from xgboost import XGBRegressor

from course_lib.churn.model import DEFAULT_NTHREAD, SEED, features, make_preprocessor

__all__ = [
    "STUDENT_PARAMS",
    "make_student_pipeline",
    "student_proba",
    "teacher_probabilities",
    "train_student",
]

#: The student: 30 trees of depth 2 (at most 120 leaves), against the teacher's 400 trees of depth 3
#: (up to 3,200 leaves).
STUDENT_PARAMS: dict[str, object] = {
    "n_estimators": 30,
    "max_depth": 2,
    "learning_rate": 0.3,
    "tree_method": "hist",
}


def make_student_pipeline(
    *, nthread: int = DEFAULT_NTHREAD, seed: int = SEED, **overrides: object
) -> Pipeline:
    """The course preprocessing + ``XGBRegressor(objective="binary:logistic")`` with ``STUDENT_PARAMS``.

    Raises
    ------
    ValueError
        If ``overrides`` tries to change the objective.
    """
    if "objective" in overrides:
        raise ValueError(
            "the student's objective is fixed to 'binary:logistic' (cross-entropy on soft targets)"
        )
    params = {**STUDENT_PARAMS, **overrides}
    return Pipeline(
        [
            ("preprocess", make_preprocessor()),
            (
                "student",
                XGBRegressor(objective="binary:logistic", n_jobs=nthread, random_state=seed, **params),
            ),
        ]
    )


def teacher_probabilities(teacher: Pipeline, population: pd.DataFrame) -> np.ndarray:
    """The teacher's churn probability for every customer of ``population``, shape (n,).

    Only the 19 feature columns are read: a ``churn`` column, if present, is ignored (the population is
    treated as unlabelled).
    """
    return teacher.predict_proba(features(population))[:, 1]


def train_student(df: pd.DataFrame, targets: np.ndarray, **overrides: Any) -> Pipeline:
    """Fit a student on customers ``df`` with targets in [0, 1] (0/1 labels or teacher probabilities).

    Parameters
    ----------
    df : DataFrame with the 19 feature columns, n rows.
    targets : array of shape (n,), values in [0, 1].
    **overrides : passed to ``make_student_pipeline``.

    Raises
    ------
    ValueError
        If ``targets`` has the wrong length, or values outside [0, 1] or NaN.
    """
    y = np.asarray(targets, dtype=float)
    if y.shape != (len(df),):
        raise ValueError(f"targets must have shape ({len(df)},), got {y.shape}")
    if not np.all((y >= 0) & (y <= 1)):
        raise ValueError("targets must be probabilities or labels in [0, 1] (no NaN)")
    student = make_student_pipeline(**overrides)
    student.fit(features(df), y)
    return student


def student_proba(student: Pipeline, df: pd.DataFrame) -> np.ndarray:
    """The student's churn probability for every customer of ``df``, shape (n,)."""
    return student.predict(features(df))
