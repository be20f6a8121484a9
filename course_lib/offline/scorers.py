"""The batch job's model runtimes: the same trees run three ways on the encoded float32 matrix.

One concept: turning the model's input (``(n, 40)`` float32, from :func:`course_lib.offline.rows.encode_rows`)
into churn probabilities, as fast as this machine allows. Each runtime gets the same trees, the
booster's served iteration range:

* ``"xgboost"``: XGBoost's own predictor, ``Booster.inplace_predict`` (no DMatrix, no copy of a
  C-contiguous float32 array). Bit for bit the numbers of the pipeline's ``predict_proba``.
* ``"onnxruntime"``: the booster converted by onnxmltools to an ONNX ``TreeEnsembleClassifier`` on the
  40 encoded columns, in a pinned ONNX Runtime session (within 1e-5 of XGBoost).
* ``"treelite"``: the trees compiled to C by treelite + tl2cgen (:mod:`course_lib.offline.compiled`),
  where a C compiler exists (within 1e-5 of XGBoost).

A :class:`ScorerSpec` carries one runtime's model as bytes (or the compiled library's path), small and
picklable, so that each worker process builds its own scorer once (:meth:`ScorerSpec.build`).
:func:`choose_runtime` times every available runtime model-only on one encoded chunk, side by side.
:func:`make_scorer` is the convenience form for a DataFrame of valid rows.
``course_lib.offline.job`` re-exports these names.

References
----------
XGBoost documentation, ``Booster.inplace_predict`` and model slicing (``booster[begin:end]``);
onnxmltools ``convert_xgboost``; ONNX Runtime documentation, ``SessionOptions.intra_op_num_threads``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd
import pyarrow as pa

from course_lib.churn.data import FEATURE_COLUMNS, ID_COLUMN
from course_lib.core.bench import compare_latency
from course_lib.core.checks import integer, one_of
from course_lib.core.vocabulary import BATCH_RUNTIMES
from course_lib.offline.compiled import compile_trees, compiled_trees_unavailable, trees_predictor
from course_lib.offline.rows import Encoding, check_rows, encode_rows, row_problems

if TYPE_CHECKING:
    import xgboost as xgb
    from sklearn.pipeline import Pipeline

    from course_lib.churn.model import ChurnModel

__all__ = [
    "ScorerSpec",
    "choose_runtime",
    "make_scorer",
    "row_problems",
    "runtime_unavailable",
    "scorer_spec",
]

_ONNX_OPSET = 15  # the highest default-domain opset onnxmltools' XGBoost converter accepts


@dataclass(frozen=True)
class ScorerSpec:
    """One runtime's model, ready to send to a worker: ``build()`` there gives the scorer.

    Attributes
    ----------
    runtime : one of :data:`course_lib.core.vocabulary.BATCH_RUNTIMES`
    model_version : str
    artifact : bytes or str
        XGBoost: the booster as UBJSON bytes; ONNX Runtime: the ONNX model bytes; treelite: the
        compiled library's path (on storage every worker can read).
    encoding : Encoding
        The model's input columns (40 for the churn model).
    threads : int
        XGBoost ``nthread``, ONNX Runtime ``intra_op_num_threads``, tl2cgen ``nthread``.
    """

    runtime: str
    model_version: str
    artifact: bytes | str = field(repr=False)
    encoding: Encoding = field(repr=False)
    threads: int = 1

    @property
    def key(self) -> tuple[str, str, int]:
        """What makes two specs the same scorer: model version, runtime and threads."""
        return self.model_version, self.runtime, self.threads

    def build(self) -> Callable[[np.ndarray], np.ndarray]:
        """The scorer: float32 ``(n, width)`` C-contiguous -> churn probabilities float64 ``(n,)``."""
        if self.runtime == "xgboost":
            # each runtime's library loads only in the processes that score with it
            import xgboost as xgb  # noqa: PLC0415 (heavy optional dependency)

            booster = xgb.Booster()
            booster.load_model(bytearray(cast(bytes, self.artifact)))
            booster.set_param({"nthread": self.threads})

            def score(X: np.ndarray) -> np.ndarray:
                p = booster.inplace_predict(X, predict_type="value")
                return np.asarray(p, dtype=np.float64).reshape(len(X), -1)[:, -1]

            return score
        if self.runtime == "onnxruntime":
            # onnx, ONNX Runtime and scikit-learn: only for this runtime
            from course_lib.churn.export import make_session  # noqa: PLC0415 (heavy optional dependency)

            session = make_session(bytes(cast(bytes, self.artifact)), intra_op_num_threads=self.threads)
            name = session.get_inputs()[0].name
            return lambda X: np.asarray(session.run(["probabilities"], {name: X})[0][:, 1], dtype=np.float64)
        return trees_predictor(cast(str, self.artifact), threads=self.threads)


def _served_booster(pipeline: Pipeline) -> xgb.Booster:
    """The trees ``predict_proba`` uses: up to the best iteration of an early-stopped model, else all."""
    booster = pipeline[-1].get_booster()
    try:
        return booster[0 : int(pipeline[-1].best_iteration) + 1]
    except AttributeError:  # trained without early stopping
        return booster.copy()


def runtime_unavailable(runtime: str) -> str | None:
    """Why ``runtime`` cannot run on this machine (only compiled trees can be missing), or None."""
    one_of("runtime", runtime, BATCH_RUNTIMES)
    return compiled_trees_unavailable() if runtime == "treelite" else None


def scorer_spec(model: ChurnModel, runtime: str, *, threads: int = 1) -> ScorerSpec:
    """Prepare ``runtime``'s form of ``model`` (a :class:`course_lib.churn.model.ChurnModel`).

    Converting to ONNX takes about a second; compiling the trees takes seconds the first time for a
    model (the library is cached). Raises ``ValueError`` for an unknown runtime or ``threads < 1``, and
    ``RuntimeError`` if compiled trees are asked for where they are unavailable.
    """
    one_of("runtime", runtime, BATCH_RUNTIMES)
    threads = integer("threads", threads, min=1)
    encoding = Encoding.from_pipeline(model.pipeline)
    booster = _served_booster(model.pipeline)
    raw = bytes(booster.save_raw("ubj"))
    if runtime == "xgboost":
        artifact: bytes | str = raw
    elif runtime == "onnxruntime":
        # the converter loads only to prepare this runtime
        from onnxmltools import convert_xgboost  # noqa: PLC0415 (heavy optional dependency)
        from onnxmltools.convert.common.data_types import FloatTensorType  # noqa: PLC0415 (heavy optional dependency)

        onnx_model = convert_xgboost(
            booster,
            initial_types=[("features", FloatTensorType([None, encoding.width]))],
            target_opset=_ONNX_OPSET,
        )
        artifact = onnx_model.SerializeToString()
    else:
        artifact = str(compile_trees(raw, model.model_version)[0])
    return ScorerSpec(runtime, model.model_version, artifact, encoding, threads)


def _encoded(sample: pd.DataFrame | pa.Table, encoding: Encoding) -> np.ndarray:
    table = sample if isinstance(sample, pa.Table) else pa.Table.from_pandas(sample, preserve_index=False)
    if ID_COLUMN not in table.column_names:
        table = table.append_column(ID_COLUMN, pa.array([f"row-{i:09d}" for i in range(table.num_rows)]))
    checked = check_rows(table)
    if len(checked.bad_rows):
        raise ValueError(
            f"row {int(checked.bad_rows[0])} is outside the feature schema ({checked.reasons[0]}); "
            "check rows with row_problems first"
        )
    return encode_rows(checked, encoding)


def make_scorer(model: ChurnModel, runtime: str, *, threads: int = 1) -> Callable[[pd.DataFrame], np.ndarray]:
    """A function ``DataFrame of the 19 features -> churn probabilities (float64, shape (n,))``.

    Checks and encodes the rows as the batch job does, then scores them with ``runtime``. Raises
    ``ValueError`` for an unknown runtime, ``threads < 1``, or (when called) a row outside the schema.
    """
    spec = scorer_spec(model, runtime, threads=threads)
    score = spec.build()
    return lambda X: score(_encoded(X[list(FEATURE_COLUMNS)], spec.encoding))


def choose_runtime(
    model: ChurnModel, sample: pd.DataFrame | pa.Table, *, rounds: int = 3, threads: int = 1
) -> tuple[str, pd.DataFrame]:
    """Time every available runtime model-only on ``sample`` (one chunk, encoded once), side by side.

    Returns
    -------
    (fastest, table)
        ``table`` is indexed by runtime: ``median_us`` per call on the whole sample, ``us_per_item``,
        ``rows_per_s`` (= 1e6 / ``us_per_item``), ``speedup`` over XGBoost, ``max_abs_diff`` from
        XGBoost's probabilities and ``note`` (why a runtime is missing, e.g. no C compiler: its
        timings are NaN). Uses :func:`course_lib.core.bench.compare_latency` (interleaved rounds, one
        warm-up call each).
    """
    integer("rounds", rounds, min=1)
    specs, notes = {}, {}
    for runtime in BATCH_RUNTIMES:
        notes[runtime] = runtime_unavailable(runtime) or ""
        if not notes[runtime]:
            specs[runtime] = scorer_spec(model, runtime, threads=threads)
    X = _encoded(sample, specs["xgboost"].encoding)
    scorers = {r: s.build() for r, s in specs.items()}
    reference = scorers["xgboost"](X)

    def on_sample(f: Callable[[np.ndarray], np.ndarray]) -> Callable[[], object]:
        return lambda: f(X)

    calls = {r: on_sample(f) for r, f in scorers.items()}
    table = compare_latency(
        calls,
        n_calls=1,
        rounds=rounds,
        warmup_calls=1,
        items_per_call=len(X),
    )
    table = table.reindex(list(BATCH_RUNTIMES))
    table.index.name = "runtime"
    table["rows_per_s"] = 1e6 / table["us_per_item"]
    table["max_abs_diff"] = [
        float(np.abs(scorers[r](X) - reference).max()) if r in scorers else np.nan for r in BATCH_RUNTIMES
    ]
    table["note"] = [notes[r] for r in BATCH_RUNTIMES]
    return str(table["median_us"].idxmin()), table
