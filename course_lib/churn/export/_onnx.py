"""Export the churn pipeline to one ONNX graph, open it in ONNX Runtime, and prove parity.

The whole scikit-learn pipeline (one-hot encoding + XGBoost) becomes a single graph: skl2onnx
converts the preprocessing and, once the converter from onnxmltools is registered, the
``XGBClassifier``. Each of the 19 input columns is one graph input of shape (n, 1): strings for the
categorical columns, float32 for the numeric ones.

References
----------
skl2onnx documentation, "Convert a pipeline with a XGBoost model" (``update_registered_converter``
with ``onnxmltools.convert.xgboost.operator_converters.XGBoost.convert_xgboost``).
ONNX Runtime documentation, "Thread management" (``intra_op_num_threads``) and "Graph optimizations".
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
from sklearn.pipeline import Pipeline

from course_lib.churn.data import CATEGORICAL_LEVELS, FEATURE_COLUMNS, TELCO_SHA256
from course_lib.churn.export._metadata import METADATA_DATA_SHA256, METADATA_MODEL_VERSION, stamp_identity
from course_lib.churn.export.parity import parity_gaps
from course_lib.churn.schema import check_frame, check_records
from course_lib.core.checks import instance_of, integer, non_empty, one_of, positive_number

#: Largest allowed |p_native - p_onnx| on the test set (issue 2 of the workbook).
PARITY_ATOL = 1e-5
_GRAPH_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_registered = False


class ModelMismatchError(ValueError):
    """Two artifacts that must come from the same trained model (e.g. a model and its ONNX file) do not."""


def _register_xgboost_converter() -> None:
    global _registered
    if _registered:
        return
    # the converters (and XGBoost's) load only when a pipeline is exported, never in a server
    from onnxmltools.convert.xgboost.operator_converters.XGBoost import convert_xgboost  # noqa: PLC0415 (heavy optional dependency)
    from skl2onnx import update_registered_converter  # noqa: PLC0415 (heavy optional dependency)
    from skl2onnx.common.shape_calculator import calculate_linear_classifier_output_shapes  # noqa: PLC0415 (heavy optional dependency)
    from xgboost import XGBClassifier  # noqa: PLC0415 (heavy optional dependency)

    update_registered_converter(
        XGBClassifier,
        "XGBoostXGBClassifier",
        calculate_linear_classifier_output_shapes,
        convert_xgboost,
        options={"nocl": [True, False], "zipmap": [True, False, "columns"]},
    )
    _registered = True


def pipeline_to_onnx(
    pipeline: Pipeline,
    *,
    target_opset: int = 17,
    ml_opset: int = 3,
    model_version: str | None = None,
    data_sha256: str = TELCO_SHA256,
) -> onnx.ModelProto:
    """Convert the fitted preprocessing + XGBoost pipeline into one ONNX model.

    Parameters
    ----------
    pipeline : sklearn Pipeline
        Output of ``course_lib.churn.model.make_xgb_pipeline`` after ``fit`` (or any pipeline skl2onnx
        converts).
    target_opset, ml_opset : int
        Opsets of the default and ``ai.onnx.ml`` domains.
    model_version : str, optional
        Stored in the file's metadata (``METADATA_MODEL_VERSION``). Default: the content hash
        ``course_lib.churn.model.model_version(pipeline)`` for an XGBoost pipeline; other pipelines get
        no version unless one is given.
    data_sha256 : str
        sha256 of the training data, stored as ``METADATA_DATA_SHA256`` (default: the course CSV's).

    Returns
    -------
    onnx.ModelProto
        Inputs: one per feature column, shape (n, 1). Outputs: ``label`` (int64, (n,)) and
        ``probabilities`` (float32, (n, 2)); column 1 is the churn probability. ``metadata_props``
        hold the model version and the data checksum (``OnnxChurnScorer.model_version`` reads them).
    """
    # skl2onnx loads only here: a server that opens a saved .onnx file never needs it
    from skl2onnx import convert_sklearn  # noqa: PLC0415 (heavy optional dependency)
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType  # noqa: PLC0415 (heavy optional dependency)

    _register_xgboost_converter()
    initial_types = [
        (col, StringTensorType([None, 1]) if col in CATEGORICAL_LEVELS else FloatTensorType([None, 1]))
        for col in FEATURE_COLUMNS
    ]
    model = convert_sklearn(
        pipeline,
        initial_types=initial_types,
        target_opset={"": target_opset, "ai.onnx.ml": ml_opset},
        options={id(pipeline): {"zipmap": False}},
    )
    model.doc_string = "Telco churn: one-hot preprocessing + XGBoost (course_lib.churn.export._onnx)"
    model.graph.name = (
        "telco_churn_pipeline"  # skl2onnx names graphs with a random uuid; keep files repeatable
    )
    if model_version is None and "xgb" in getattr(pipeline, "named_steps", {}):
        # churn.model loads XGBoost and the training stack, needed here only to hash the model
        from course_lib.churn.model import model_version as content_hash  # noqa: PLC0415 (heavy optional dependency)

        model_version = content_hash(pipeline)
    version = None if model_version is None else str(model_version)
    return stamp_identity(model, model_version=version, data_sha256=data_sha256)


def make_session(
    model: onnx.ModelProto | bytes | str | Path,
    *,
    intra_op_num_threads: int = 1,
    inter_op_num_threads: int = 1,
    graph_optimization_level: str = "all",
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
) -> ort.InferenceSession:
    """An ONNX Runtime session with its thread counts pinned.

    Parameters
    ----------
    model : ModelProto, serialized bytes, or path to a ``.onnx`` file.
    intra_op_num_threads, inter_op_num_threads : int
        Threads inside one operator and across operators; >= 0, where 0 means ONNX Runtime's own
        default (one per physical core). The course pins both to 1 so that several processes on a
        2-core laptop do not oversubscribe the cores.
    graph_optimization_level : {"disabled", "basic", "extended", "all"}
    providers : execution providers in priority order, e.g. ("CUDAExecutionProvider", "CPUExecutionProvider").

    Raises
    ------
    ValueError
        For a negative or non-integer thread count, an unknown optimization level, or an unavailable provider.
    FileNotFoundError
        If ``model`` is a path that does not exist.
    """
    intra_op_num_threads = integer("intra_op_num_threads", intra_op_num_threads, min=0)
    inter_op_num_threads = integer("inter_op_num_threads", inter_op_num_threads, min=0)
    one_of("graph_optimization_level", graph_optimization_level, sorted(_GRAPH_LEVELS))
    available = ort.get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing:
        raise ValueError(f"execution providers {missing} are not available here; available: {available}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_num_threads
    opts.inter_op_num_threads = inter_op_num_threads
    opts.graph_optimization_level = _GRAPH_LEVELS[graph_optimization_level]
    if isinstance(model, onnx.ModelProto):
        source: bytes | str = model.SerializeToString()
    elif isinstance(model, (bytes, bytearray)):
        source = bytes(model)
    else:
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"ONNX model file not found: {path}")
        source = str(path)
    return ort.InferenceSession(source, sess_options=opts, providers=list(providers))


class OnnxChurnScorer:
    """Score a DataFrame of customers with an ONNX Runtime session, checking the columns first.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        From ``make_session(pipeline_to_onnx(...))``.

    The boundary check turns the errors ONNX Runtime would raise deep inside the graph (or worse, the
    wrong answers it would silently give) into a ``ValueError`` that names the offending column; values
    outside ``course_lib.churn.schema`` raise its ``FeatureError`` (a ``ValueError``).

    Attributes
    ----------
    model_version, data_sha256 : str or None
        From the file's metadata (``pipeline_to_onnx`` writes them); None for a file without them.
    """

    def __init__(self, session: ort.InferenceSession):
        self.session = session
        meta = session.get_modelmeta().custom_metadata_map
        self.model_version: str | None = meta.get(METADATA_MODEL_VERSION)
        self.data_sha256: str | None = meta.get(METADATA_DATA_SHA256)
        self.input_names = [i.name for i in session.get_inputs()]
        self._string_inputs = {i.name for i in session.get_inputs() if i.type == "tensor(string)"}
        self._output = "probabilities"
        self._numeric_order = [n for n in self.input_names if n not in self._string_inputs]
        self._string_order = [n for n in self.input_names if n in self._string_inputs]

    def feeds(self, X: pd.DataFrame) -> dict[str, np.ndarray]:
        """Validate ``X`` and turn it into ONNX Runtime feeds: one (n, 1) array per input.

        Raises
        ------
        ValueError
            A missing column, an unexpected column (with the closest expected name), a categorical
            column that is not strings or holds an unknown level, or a numeric column that is not numeric.
        TypeError
            If ``X`` is not a DataFrame.
        """
        instance_of("X", X, pd.DataFrame)
        extra = [c for c in X.columns if c not in self.input_names]
        if extra:
            hint = difflib.get_close_matches(str(extra[0]), self.input_names, n=1)
            raise ValueError(
                f"unexpected column {extra[0]!r}"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
                + "; pass only course_lib.churn.model.features(df)"
            )
        for name in self.input_names:
            if name not in X.columns:
                raise ValueError(f"missing column {name!r}; the model expects {self.input_names}")
            col = X[name]
            if name in self._string_inputs:
                if pd.api.types.is_numeric_dtype(col) and not isinstance(col.dtype, pd.CategoricalDtype):
                    raise ValueError(
                        f"column {name!r} must hold strings (one of {list(CATEGORICAL_LEVELS[name])}), "
                        f"got dtype {col.dtype}"
                    )
            elif not pd.api.types.is_numeric_dtype(col):
                raise ValueError(f"column {name!r} must be numeric, got dtype {col.dtype}")
        check_frame(X)  # types, finiteness, ranges and levels of course_lib.churn.schema
        feeds: dict[str, np.ndarray] = {}
        for name in self.input_names:
            col = X[name]
            if name in self._string_inputs:
                feeds[name] = col.astype(object).to_numpy().astype(str).reshape(-1, 1)
            else:
                feeds[name] = col.to_numpy(dtype=np.float32, na_value=np.nan).reshape(-1, 1)
        return feeds

    def feeds_from_records(self, records: list[dict[str, object]]) -> dict[str, np.ndarray]:
        """Validate request-shaped records (one dict per customer) and build feeds without pandas.

        This is the serving path: a JSON body arrives as dicts, and building a DataFrame for one row
        costs more than the model itself. ``None`` in a numeric field means missing (NaN).

        Raises
        ------
        ValueError
            An empty list, a missing or unexpected key; ``FeatureError`` for a value outside
            ``course_lib.churn.schema`` (wrong type, not finite, out of range, unknown level).
        """
        check_records(records)
        return self.feeds_from_checked_records(records)

    def feeds_from_checked_records(self, records: list[dict[str, object]]) -> dict[str, np.ndarray]:
        """``feeds_from_records`` for records that already passed ``course_lib.churn.schema.check_records``.

        For a server that checks each record once, before the model stage (the production service's
        ``check_features``), so that the check is not done twice per request. The numeric inputs are
        built as one float32 array of shape (n_numeric, n), ``None`` becoming NaN, and each input is a
        row of it (a contiguous view, no copy); the string inputs likewise as one object array. A
        record that was not checked gets no error here (a numeric string would even be parsed), only
        ONNX Runtime's.
        """
        n = len(records)
        numeric = np.array(
            [[rec[name] for rec in records] for name in self._numeric_order], dtype=np.float32
        ).reshape(len(self._numeric_order), n, 1)
        strings = np.array(
            [[rec[name] for rec in records] for name in self._string_order], dtype=object
        ).reshape(len(self._string_order), n, 1)
        feeds = dict(zip(self._numeric_order, numeric, strict=True))
        feeds.update(zip(self._string_order, strings, strict=True))
        return feeds

    def predict_proba(self, X: pd.DataFrame) -> np.ndarray:
        """Churn probability for each row of ``X``, float32 array of shape (n,)."""
        return self.run(self.feeds(X))

    def check_model_version(self, model_version: str) -> None:
        """Refuse to serve this file under another model's version.

        Raises
        ------
        ModelMismatchError
            If the file's ``model_version`` metadata is missing or differs from ``model_version``.
        """
        if self.model_version != str(model_version):
            raise ModelMismatchError(
                f"the ONNX file was exported from model {self.model_version!r}, not {str(model_version)!r}; "
                "export it again with pipeline_to_onnx(model.pipeline) so scores and versions match"
            )

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Run the session on prepared feeds (skips validation; for timing the runtime alone)."""
        return self.session.run([self._output], feeds)[0][:, 1]


@dataclass(frozen=True)
class ParityReport:
    """Result of ``check_parity``: the worst absolute difference and what was compared."""

    max_abs_diff: float
    n_rows: int
    n_rows_with_missing: int
    atol: float

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.atol


class ParityError(AssertionError):
    """ONNX and native predictions differ by more than the tolerance; ``worst_rows`` holds the evidence."""

    def __init__(self, message: str, worst_rows: pd.DataFrame):
        super().__init__(message)
        self.worst_rows = worst_rows


def check_parity(
    pipeline: Pipeline, scorer: OnnxChurnScorer, X: pd.DataFrame, *, atol: float = PARITY_ATOL
) -> ParityReport:
    """Compare native ``predict_proba`` with ONNX Runtime on every row of ``X``.

    The core is :func:`course_lib.churn.export.parity.parity_gaps` (per-row ``|p_native - p_onnx|``);
    this adds what a release check needs: ``X`` must be non-empty and ``atol`` a number >= 0, the rows
    with a missing value are counted (they exercise the trees' default branches), and a failure raises
    with the five worst rows and both probabilities, so the error is its own evidence.

    Parameters
    ----------
    pipeline : fitted sklearn Pipeline; scorer : OnnxChurnScorer; X : DataFrame of the 19 features.
    atol : float
        Largest allowed absolute difference in churn probability (default 1e-5).

    Returns
    -------
    ParityReport

    Raises
    ------
    ParityError
        If any row differs by more than ``atol``; the message and ``worst_rows`` show the five worst
        rows with both probabilities.
    ValueError
        If ``X`` is empty or ``atol`` is negative.
    """
    non_empty("X", X)
    atol = positive_number("atol", atol, allow_zero=True)
    diff = parity_gaps(lambda rows: pipeline.predict_proba(rows)[:, 1], scorer.predict_proba, X)
    report = ParityReport(float(diff.max()), len(X), int(X.isna().any(axis=1).sum()), atol)
    if not report.passed:
        worst = np.argsort(-diff)[:5]
        p_native = pipeline.predict_proba(X.iloc[worst])[:, 1]
        p_onnx = scorer.predict_proba(X.iloc[worst]).astype(np.float64)
        rows = X.iloc[worst].assign(p_native=p_native, p_onnx=p_onnx, abs_diff=diff[worst])
        raise ParityError(
            f"ONNX parity failed: max |p_native - p_onnx| = {report.max_abs_diff:.3g} > atol {atol:g} "
            f"on {int((diff > atol).sum())} of {len(X)} rows; worst rows:\n{rows.to_string()}",
            rows,
        )
    return report
