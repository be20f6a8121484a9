"""A small neural churn model: the course's 40 preprocessed columns -> impute -> scale -> MLP.

Tree ensembles cannot be quantized by ONNX Runtime (their numbers live in node attributes), so the
quantization lesson needs a model whose weights are matrices. This is that model: the same one-hot
preprocessing as the XGBoost pipeline, missing ``total_charges`` imputed as 0 (customers with no
tenure have paid nothing yet), standard scaling, and a scikit-learn ``MLPClassifier``. The whole
pipeline exports to one ONNX graph with ``course_lib.churn.export._onnx.pipeline_to_onnx``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.impute import SimpleImputer
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from course_lib.churn.model import SEED, features, labels, make_preprocessor

__all__ = ["MLP_PARAMS", "make_mlp_pipeline", "mlp_n_parameters", "train_mlp_churn_model"]

#: Hyper-parameters of the course MLP. Two hidden layers of 256 and 128 units hold about 43,000
#: weights, so the graph's fixed overhead (encoder categories, scaler) is small next to them.
MLP_PARAMS: dict[str, object] = {
    "hidden_layer_sizes": (256, 128),
    "alpha": 1e-2,
    "learning_rate_init": 1e-3,
    "batch_size": 128,
    "early_stopping": True,
    "validation_fraction": 0.15,
    "n_iter_no_change": 8,
    "max_iter": 200,
}


def make_mlp_pipeline(*, seed: int = SEED, **overrides: object) -> Pipeline:
    """Preprocessing (40 columns) + zero imputation + standard scaling + ``MLPClassifier``.

    Parameters
    ----------
    seed : int
        ``random_state`` of the MLP (weight initialisation, shuffling, early-stopping split).
    **overrides
        Replace entries of ``MLP_PARAMS`` (e.g. ``hidden_layer_sizes=(16,)``, ``max_iter=20``).

    Raises
    ------
    ValueError
        If an override is not an ``MLPClassifier`` parameter.
    """
    unknown = set(overrides) - set(MLPClassifier().get_params())
    if unknown:
        raise ValueError(f"unknown MLPClassifier parameters {sorted(unknown)}")
    params = {**MLP_PARAMS, **overrides}
    return Pipeline(
        [
            ("preprocess", make_preprocessor()),
            ("impute", SimpleImputer(strategy="constant", fill_value=0.0)),
            ("scale", StandardScaler()),
            ("mlp", MLPClassifier(random_state=seed, **params)),
        ]
    )


def train_mlp_churn_model(train: pd.DataFrame, *, seed: int = SEED, **overrides: object) -> Pipeline:
    """Fit ``make_mlp_pipeline`` on the labelled customers in ``train`` (a frame with ``churn``)."""
    pipe = make_mlp_pipeline(seed=seed, **overrides)
    pipe.fit(features(train), labels(train))
    return pipe


def mlp_n_parameters(pipeline: Pipeline) -> int:
    """Weights plus biases of the fitted MLP in ``pipeline`` (the parameters that quantization shrinks).

    Raises
    ------
    ValueError
        If the pipeline has no fitted ``mlp`` step.
    """
    mlp = dict(pipeline.steps).get("mlp")
    if mlp is None or not hasattr(mlp, "coefs_"):
        raise ValueError("pipeline must end in a fitted 'mlp' step (see make_mlp_pipeline)")
    return int(sum(np.size(w) for w in mlp.coefs_) + sum(np.size(b) for b in mlp.intercepts_))
