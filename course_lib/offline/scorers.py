"""The batch job's scorers: which rows may be scored, and a fast chunk scorer per runtime.

One concept: turning one chunk of rows into churn probabilities. :func:`row_problems` gives, per row,
the first violation of the one feature schema (:mod:`course_lib.churn.schema`), so a bad row is
rejected with its reason and never scored; :func:`make_scorer` builds an XGBoost or ONNX Runtime
scorer for whole chunks; :func:`choose_runtime` times both side by side on one chunk.
``course_lib.offline.job`` re-exports these names.

References
----------
XGBoost documentation, ``Booster.inplace_predict`` (``iteration_range``); ONNX Runtime documentation,
``SessionOptions.intra_op_num_threads``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from course_lib.churn.data import CATEGORICAL_LEVELS, FEATURE_COLUMNS, ID_COLUMN
from course_lib.churn.schema import NUMERIC_SCHEMA
from course_lib.core.bench import compare_latency

__all__ = ["RUNTIMES", "choose_runtime", "make_scorer", "row_problems"]

RUNTIMES = ("xgboost", "onnxruntime")


def _shown(value: object) -> str:
    plain = value.item() if isinstance(value, np.generic) else value
    return repr(plain)


def row_problems(X: pd.DataFrame) -> np.ndarray:
    """Per row, the first schema violation as text (``None`` for a valid row), shape ``(len(X),)``.

    The same ranges as :func:`course_lib.churn.schema.check_frame`, row by row instead of raising on
    the first: a missing or repeated ``customer_id`` (within the chunk; ids are unique across a store
    built by :func:`course_lib.offline.store.build_parquet_store`), a missing flag or category, an unknown category, a number outside its range, a
    non-integer where an integer is required. Missing ``tenure``/charges are allowed (the model
    handles them), as the schema says.
    """
    reasons = np.full(len(X), None, dtype=object)
    ids = X[ID_COLUMN]
    reasons[ids.isna().to_numpy()] = f"{ID_COLUMN} is missing"
    repeated = ids.duplicated(keep="first").to_numpy() & ids.notna().to_numpy()
    reasons[repeated] = f"{ID_COLUMN} appears earlier in the same chunk"
    for name, spec in NUMERIC_SCHEMA.items():
        values = pd.to_numeric(X[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        not_number = X[name].notna().to_numpy() & np.isnan(values)
        missing = X[name].isna().to_numpy()
        bad = not_number | (
            ~np.isnan(values) & ((values < spec.low) | (values > spec.high) | ~np.isfinite(values))
        )
        if spec.integer:
            bad |= ~np.isnan(values) & np.isfinite(values) & (values != np.round(values))
        if not spec.missing_allowed:
            bad |= missing
        for i in np.flatnonzero(bad & (reasons == None)):  # noqa: E711 (elementwise on an object array)
            reasons[i] = f"{name}={_shown(X[name].iloc[i])}: must be {spec.describe()}"
    for name, levels in CATEGORICAL_LEVELS.items():
        bad = ~X[name].isin(levels).to_numpy()
        for i in np.flatnonzero(bad & (reasons == None)):  # noqa: E711
            reasons[i] = f"{name}={_shown(X[name].iloc[i])}: must be one of {list(levels)}"
    return reasons


def _served_iteration_range(clf: object) -> tuple[int, int]:
    """The trees ``predict_proba`` uses: up to the best iteration of an early-stopped model, else all."""
    try:
        return 0, int(clf.best_iteration) + 1
    except AttributeError:  # trained without early stopping
        return 0, 0


def _xgboost_batch_scorer(pipeline: object, threads: int):
    """Encode with the fitted one-hot categories in NumPy, then ``inplace_predict`` on the booster.

    The same numbers as ``pipeline.predict_proba`` (a test checks it), several times faster on large
    chunks: scikit-learn's ``OneHotEncoder.transform`` maps strings to codes one value at a time in
    Python, ``pandas.Categorical`` does it in C. Only rows that passed :func:`row_problems` reach it.
    """
    pre, clf = pipeline.named_steps["preprocess"], pipeline[-1]
    (_, encoder, cat_cols), (_, _, num_cols) = pre.transformers_[0], pre.transformers_[1]
    categories = [list(c) for c in encoder.categories_]
    width = sum(len(c) for c in categories) + len(num_cols)
    booster, iterations = clf.get_booster().copy(), _served_iteration_range(clf)
    booster.set_param({"nthread": threads})  # a copy: the served model keeps its own thread setting

    def score(X: pd.DataFrame) -> np.ndarray:
        encoded = np.zeros((len(X), width), dtype=np.float32)
        col = 0
        for name, levels in zip(cat_cols, categories, strict=True):
            codes = pd.Categorical(X[name], categories=levels).codes
            if (codes < 0).any():
                raise ValueError(
                    f"column {name!r} holds a level outside {levels}; check rows with row_problems"
                )
            encoded[np.arange(len(X)), col + codes] = 1.0
            col += len(levels)
        encoded[:, col:] = X[list(num_cols)].to_numpy(dtype=np.float32, na_value=np.nan)
        margin = booster.inplace_predict(encoded, iteration_range=iterations, predict_type="value")
        return np.asarray(margin, dtype=np.float64).reshape(len(X), -1)[:, -1]

    return score


def make_scorer(model: object, runtime: str, *, onnx_model: object | None = None, threads: int = 1):
    """A function ``DataFrame of the 19 features -> churn probabilities (float64, shape (n,))``.

    ``runtime="xgboost"``: the fitted pipeline's encoding and booster (:func:`_xgboost_batch_scorer`);
    ``"onnxruntime"``: a pinned one-thread session of ``onnx_model`` (exported from the pipeline if not
    given). ``threads``: XGBoost ``nthread`` or ONNX Runtime ``intra_op_num_threads`` (a batch job that
    owns the machine may use every core; the online service stays at 1). Raises ``ValueError`` for
    another runtime or ``threads < 1``.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if runtime == "xgboost":
        return _xgboost_batch_scorer(model.pipeline, threads)
    if runtime == "onnxruntime":
        from course_lib.churn.export import OnnxChurnScorer, make_session, pipeline_to_onnx

        onnx_model = onnx_model if onnx_model is not None else pipeline_to_onnx(model.pipeline)
        scorer = OnnxChurnScorer(make_session(onnx_model, intra_op_num_threads=threads))
        return lambda X: np.asarray(scorer.predict_proba(X), dtype=np.float64)
    raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")


def choose_runtime(
    model: object, sample: pd.DataFrame, *, rounds: int = 3, threads: int = 1
) -> tuple[str, pd.DataFrame]:
    """Time both runtimes on ``sample`` (one chunk) side by side; return the faster and the table.

    Uses :func:`course_lib.core.bench.compare_latency` (interleaved rounds, one warm-up call each).
    """
    X = sample[list(FEATURE_COLUMNS)]
    scorers = {r: make_scorer(model, r, threads=threads) for r in RUNTIMES}
    table = compare_latency(
        {r: (lambda f=f: f(X)) for r, f in scorers.items()},
        n_calls=1,
        rounds=rounds,
        warmup_calls=1,
        items_per_call=len(X),
    )
    return str(table["median_us"].idxmin()), table
