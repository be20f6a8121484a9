"""The churn model's throughput candidates: one per runtime (ONNX Runtime, XGBoost) and device.

:mod:`course_lib.measure.throughput._measure` measures any
:class:`~course_lib.measure.throughput._measure.Candidate`; this module builds the ones for the course's
model, which score synthetic customers with their features already prepared (only the model call is
timed). The XGBoost candidate scores with the trees the model serves: after early stopping that is
``best_iteration + 1`` rounds, not every round trained (dmlc/xgboost#8034: an ``inplace_predict`` without
``iteration_range`` times and scores a different model).

References
----------
XGBoost documentation, "Prediction" (``inplace_predict``, ``iteration_range``, ``device``) and
"Early Stopping" (``best_iteration``). ONNX Runtime documentation, "Execution Providers".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xgboost

from course_lib.churn.data import make_customers
from course_lib.churn.export import OnnxChurnScorer, make_session
from course_lib.churn.model import ChurnModel, features
from course_lib.churn.pruning import served_rounds
from course_lib.core.checks import non_empty, one_of
from course_lib.core.vocabulary import SERVING_RUNTIMES
from course_lib.measure.throughput._measure import Candidate

if TYPE_CHECKING:
    import onnx
    import pandas as pd


def churn_candidates(
    churn_model: ChurnModel,
    onnx_model: onnx.ModelProto | bytes | str | Path,
    *,
    runtimes: Sequence[str] = ("onnxruntime", "xgboost"),
    device: str = "cpu",
    n_rows: int = 4096,
    max_batch_size: int | None = None,
    seed: int = 0,
) -> list[Candidate]:
    """Candidates that score synthetic customers with the course model, one per runtime, on one device.

    Parameters
    ----------
    churn_model : course_lib.churn.model.ChurnModel
    onnx_model : onnx.ModelProto
        ``pipeline_to_onnx(churn_model.pipeline)``.
    runtimes : subset of {"onnxruntime", "xgboost"}
        ``onnxruntime``: the whole pipeline as one ONNX graph (one-hot + trees) fed prepared arrays,
        as ``OnnxChurnScorer.run``. ``xgboost``: the booster's ``inplace_predict`` on the already
        one-hot-encoded float32 matrix (preprocessing excluded), over the trees the model serves
        (``iteration_range=(0, best_iteration + 1)`` after early stopping, as ``predict_proba``;
        :func:`course_lib.churn.pruning.served_rounds`). Both with one thread.
    device : {"cpu", "cuda"}
        ``cuda`` uses ONNX Runtime's CUDAExecutionProvider (CPU as fallback for nodes it lacks) and
        XGBoost ``device="cuda"``. Inputs stay in host memory, as a request's would, so each call
        includes the copy to the GPU.
    n_rows : int >= 1
        Synthetic customers (``make_customers(n_rows, seed)``); the largest batch that can be timed.
    max_batch_size : int, optional
        Skip larger batch sizes for these candidates.

    Returns
    -------
    list of Candidate named ``"<runtime>/<device>"``.

    Raises
    ------
    ValueError
        For an unknown runtime or device.
    RuntimeError
        If ``device="cuda"`` and this XGBoost was built without CUDA, or ONNX Runtime did not put the
        CUDA provider in the session (``onnxruntime`` instead of ``onnxruntime-gpu``, or CUDA libraries
        missing).
    """
    for i, runtime in enumerate(non_empty("runtimes", runtimes)):
        one_of(f"runtimes[{i}]", runtime, SERVING_RUNTIMES)
    one_of("device", device, ("cpu", "cuda"))
    customers = features(make_customers(n_rows, seed=seed))
    out: list[Candidate] = []
    if "onnxruntime" in runtimes:
        out.append(_onnxruntime_candidate(onnx_model, customers, device, max_batch_size))
    if "xgboost" in runtimes:
        out.append(_xgboost_candidate(churn_model, customers, device, max_batch_size))
    return out


def _onnxruntime_candidate(
    onnx_model: onnx.ModelProto | bytes | str | Path,
    customers: pd.DataFrame,
    device: str,
    max_batch_size: int | None,
) -> Candidate:
    """The whole pipeline as one ONNX graph, fed the first ``batch`` prepared rows (one thread).

    Raises RuntimeError if the session did not get the provider ``device`` asks for.
    """
    providers = (
        ("CUDAExecutionProvider", "CPUExecutionProvider") if device == "cuda" else ("CPUExecutionProvider",)
    )
    session = make_session(onnx_model, providers=providers)
    if session.get_providers()[0] != providers[0]:
        raise RuntimeError(
            f"ONNX Runtime did not enable {providers[0]} (session providers: {session.get_providers()}); "
            "install onnxruntime-gpu and the CUDA/cuDNN libraries it needs"
        )
    scorer = OnnxChurnScorer(session)
    feeds = scorer.feeds(customers)

    def onnx_call(batch: int, scorer: OnnxChurnScorer = scorer) -> Callable[[], object]:
        part = {name: values[:batch] for name, values in feeds.items()}
        return lambda: scorer.run(part)

    return Candidate(f"onnxruntime/{device}", "onnxruntime", device, onnx_call, max_batch_size)


def _xgboost_candidate(
    churn_model: ChurnModel, customers: pd.DataFrame, device: str, max_batch_size: int | None
) -> Candidate:
    """The booster's ``inplace_predict`` on the one-hot float32 matrix, over the served rounds (one thread).

    Raises RuntimeError for ``device="cuda"`` on an XGBoost built without CUDA.
    """
    if device == "cuda" and not xgboost.build_info().get("USE_CUDA", False):
        raise RuntimeError(
            f"xgboost {xgboost.__version__} was built without CUDA; install a CUDA build "
            "(xgboost or xgboost-cu13 from PyPI, not xgboost-cpu)"
        )
    pipeline = churn_model.pipeline
    matrix = np.ascontiguousarray(pipeline.named_steps["preprocess"].transform(customers), dtype=np.float32)
    booster = pipeline.named_steps["xgb"].get_booster().copy()
    booster.set_param({"nthread": 1, "device": device})
    served = (0, served_rounds(pipeline.named_steps["xgb"]))

    def xgb_call(batch: int, booster: xgboost.Booster = booster) -> Callable[[], object]:
        part = matrix[:batch]
        return lambda: booster.inplace_predict(part, iteration_range=served)

    return Candidate(f"xgboost/{device}", "xgboost", device, xgb_call, max_batch_size)
