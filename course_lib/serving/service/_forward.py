"""The model-forward stage: adapters from a fitted model to ``records -> probabilities``.

``ChurnService`` calls its forward with a list of request records (one feature dict per customer)
and expects the churn probabilities back, one per record. ``native_forward`` wraps the fitted
scikit-learn + XGBoost pipeline (``ChurnModel.pipeline``), ``onnx_forward`` an ONNX Runtime scorer
(``course_lib.churn.export.OnnxChurnScorer``). The protocols say what each adapter needs of its
model, so a test double or another runtime with the same methods serves as well.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd

from course_lib.churn.data import FEATURE_COLUMNS
from course_lib.churn.schema import check_records
from course_lib.core.checks import InvalidArgumentError

#: One request record: a customer's features, column name -> value (``None`` for missing).
Record = dict[str, object]
#: The lookup stage: customer_id -> the customer's record, or ``None`` for an unknown customer.
Lookup = Callable[[str], "Record | None"]
#: The forward stage: n records -> churn probabilities, a float array of shape (n,).
Forward = Callable[[list[Record]], np.ndarray]
#: The forward stage for an event loop (e.g. a dynamic batcher's ``submit``): n records -> n probabilities.
AsyncForward = Callable[[list[Record]], Awaitable[Sequence[float] | np.ndarray]]


class ProbabilityModel(Protocol):
    """A fitted classifier: scikit-learn's ``predict_proba`` (n rows -> (n, n_classes) probabilities)."""

    def predict_proba(self, X: pd.DataFrame) -> Any: ...


class RecordScorer(Protocol):
    """What ``onnx_forward`` needs of ``course_lib.churn.export.OnnxChurnScorer``."""

    def feeds_from_records(self, records: list[Record]) -> dict[str, np.ndarray]: ...

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray: ...


def native_forward(pipeline: ProbabilityModel) -> Forward:
    """Model-forward stage with the native scikit-learn + XGBoost pipeline.

    Parameters
    ----------
    pipeline : fitted sklearn Pipeline (``ChurnModel.pipeline``).

    Returns
    -------
    callable
        records (list of n feature dicts) -> churn probabilities, float array of shape (n,). Each
        call checks the records against ``course_lib.churn.schema`` (``FeatureError`` otherwise)
        and builds a DataFrame of them: that and the pipeline's per-call overhead is what a
        Python-native model costs per request.

    Raises
    ------
    TypeError
        If ``pipeline`` has no ``predict_proba``.
    """
    if not hasattr(pipeline, "predict_proba"):
        raise InvalidArgumentError(f"pipeline must have predict_proba, got {type(pipeline).__name__}")
    columns = list(FEATURE_COLUMNS)

    def forward(records: list[Record]) -> np.ndarray:
        check_records(records)
        frame = pd.DataFrame.from_records(records, columns=columns)
        return pipeline.predict_proba(frame)[:, 1]

    return forward


def onnx_forward(scorer: RecordScorer) -> Forward:
    """Model-forward stage with ONNX Runtime: ``scorer.run(scorer.feeds_from_records(records))``.

    Parameters
    ----------
    scorer : course_lib.churn.export.OnnxChurnScorer

    Returns
    -------
    callable
        records (list of n feature dicts) -> churn probabilities, float32 array of shape (n,).
        A malformed record raises ``ValueError`` (``FeatureError`` for a value outside the schema)
        from ``feeds_from_records``.

    Raises
    ------
    TypeError
        If ``scorer`` has no ``feeds_from_records``.
    """
    if not hasattr(scorer, "feeds_from_records"):
        raise InvalidArgumentError(f"scorer must be an OnnxChurnScorer, got {type(scorer).__name__}")

    def forward(records: list[Record]) -> np.ndarray:
        return scorer.run(scorer.feeds_from_records(records))

    return forward
