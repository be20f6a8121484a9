"""The course's churn service for one model runtime, over the course's feature store.

``churn_service(runtime)`` builds Lesson 2's ``ChurnService`` from the course's cached churn model
(``course_lib.churn.model.load_or_train_churn_model``), its forward stage for the runtime (native
XGBoost, or ONNX Runtime on the exported graph) and the feature store (built on first use). Every
course server builds its service here: Lesson 2's and Lesson 3's apps, the prototype and the
production service.

``course_lib.serving.service`` exposes ``churn_service`` on first use, so importing the package (a
client, the request stages) does not load scikit-learn, XGBoost or ONNX.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from course_lib.churn.export import OnnxChurnScorer, make_session, pipeline_to_onnx
from course_lib.churn.model import load_or_train_churn_model
from course_lib.core.checks import one_of
from course_lib.core.vocabulary import SERVING_RUNTIMES
from course_lib.serving.feature_store import DEFAULT_N_CUSTOMERS, DEFAULT_SEED, FeatureStore, make_lookup
from course_lib.serving.service._forward import native_forward, onnx_forward
from course_lib.serving.service._pipeline import ChurnService

#: A model runtime that serves requests (``course_lib.core.vocabulary.SERVING_RUNTIMES``).
Runtime = Literal["xgboost", "onnxruntime"]


def churn_service(
    runtime: Runtime = "xgboost",
    *,
    lookup_mode: str = "cached",
    n_customers: int = DEFAULT_N_CUSTOMERS,
    seed: int = DEFAULT_SEED,
    store_folder: str | Path | None = None,
    churn_model: Any = None,
    onnx_scorer: Any = None,
    encoder: str = "json",
) -> ChurnService:
    """The Lesson 2 ``ChurnService`` for one runtime, over the (built-or-reused) feature store.

    Parameters
    ----------
    runtime : {"xgboost", "onnxruntime"}
        Model-forward stage: ``course_lib.serving.service.native_forward`` or ``onnx_forward``.
    lookup_mode : {"indexed", "unindexed", "cached"}
        Feature lookup (``course_lib.serving.feature_store._lookup.make_lookup``).
    n_customers, seed, store_folder
        Population of the feature store (``FeatureStore.open``; built on first use).
    churn_model : course_lib.churn.model.ChurnModel, optional
        Default ``load_or_train_churn_model()``.
    onnx_scorer : OnnxChurnScorer, optional
        Reused for ``onnxruntime`` if given (it must have been exported from ``churn_model``: its
        ``model_version`` metadata must match), else built from ``churn_model``.
    encoder : {"json", "orjson"}
        How the answer is encoded (``encode_answer``; the same JSON either way).

    Returns
    -------
    ChurnService
        Its answers carry the ``model_version`` of the model that actually scores them.

    Raises
    ------
    ValueError
        Unknown runtime, lookup mode or encoder.
    course_lib.churn.export._onnx.ModelMismatchError
        If ``onnx_scorer`` was exported from another model than ``churn_model`` (or has no version).
    """
    one_of("runtime", runtime, SERVING_RUNTIMES)
    if churn_model is None:
        churn_model = load_or_train_churn_model()
    version = str(churn_model.model_version)
    if runtime == "xgboost":
        forward = native_forward(churn_model.pipeline)
    else:
        if onnx_scorer is None:
            onnx_scorer = OnnxChurnScorer(make_session(pipeline_to_onnx(churn_model.pipeline)))
        onnx_scorer.check_model_version(version)
        forward = onnx_forward(onnx_scorer)
    store = FeatureStore.open(n_customers, seed, folder=store_folder)
    return ChurnService(
        make_lookup(store, lookup_mode),
        forward,
        model_version=version,
        lookup_mode=lookup_mode,
        runtime=runtime,
        encoder=encoder,
    )
