"""The parity check's core: score the same rows two ways and measure how far apart the answers are.

An exported model is only trustworthy if it gives the answers the trained one gives. The core is
three lines: score every row with both, take the absolute difference per row. A tolerance turns the
worst difference into a verdict. :func:`course_lib.churn.export.check_parity` is this core plus what a
release check needs (input checks, the rows with missing values counted, the five worst rows in the
error).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

__all__ = ["parity_gaps"]

Scorer = Callable[[pd.DataFrame], np.ndarray]


def parity_gaps(score_native: Scorer, score_exported: Scorer, X: pd.DataFrame) -> np.ndarray:
    """Per-row absolute difference between two scorers' churn probabilities on the same rows.

    Parameters
    ----------
    score_native, score_exported : callable
        ``X -> probabilities``, shape (n,): the model as trained and the exported copy.
    X : DataFrame, n rows
        The rows both score (the 19 feature columns for the churn model).

    Returns
    -------
    ndarray of float64, shape (n,)
        ``|p_native - p_exported|`` per row, in probability units; parity holds at tolerance
        ``atol`` when ``gaps.max() <= atol``.

    References
    ----------
    ONNX Runtime, "Convert a pipeline" (sklearn-onnx tutorial): compare ``predict_proba`` with the
    session's output on the same rows before trusting the export.

    Examples
    --------
    >>> X = pd.DataFrame({"p": [0.1, 0.5, 0.9]})
    >>> parity_gaps(lambda X: X["p"].to_numpy(), lambda X: X["p"].to_numpy() + [0, 0.25, 0], X)
    array([0.  , 0.25, 0.  ])
    """
    p_native = np.asarray(score_native(X), dtype=np.float64)
    p_exported = np.asarray(score_exported(X), dtype=np.float64)
    return np.abs(p_native - p_exported)
