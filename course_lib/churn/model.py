"""The churn model: a seeded split, preprocessing + XGBoost, a logistic baseline, metrics by slice.

Every later lesson serves the model trained here. Training is deterministic (fixed seeds, one
thread), so ``model_version`` (a content hash of the trained artifact) is stable on a given machine.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, brier_score_loss, log_loss, roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from xgboost import XGBClassifier

from course_lib.churn.data import (
    BINARY_COLUMNS,
    CATEGORICAL_LEVELS,
    DATA_DIR,
    FEATURE_COLUMNS,
    NUMERIC_COLUMNS,
    TARGET_COLUMN,
    TELCO_SHA256,
    clean_telco,
    load_telco,
)
from course_lib.churn.schema import check_frame
from course_lib.core.checks import InvalidArgumentError, number
from course_lib.core.files import atomic_path

__all__ = [
    "DEFAULT_NTHREAD",
    "SEED",
    "SLICE_COLUMNS",
    "XGB_PARAMS",
    "ChurnModel",
    "DataSplit",
    "classification_metrics",
    "features",
    "labels",
    "load_or_train_churn_model",
    "make_baseline_pipeline",
    "make_preprocessor",
    "make_xgb_pipeline",
    "metrics_by_slice",
    "model_cache_key",
    "model_version",
    "split_telco",
    "tenure_band",
    "train_churn_model",
]

SEED = 42
#: Threads for XGBoost in every lesson: pinned so timings are comparable (printed by env_report).
DEFAULT_NTHREAD = 1
#: Hyper-parameters of the course model (chosen on the validation set in Lesson 1).
XGB_PARAMS: dict[str, object] = {
    "n_estimators": 400,
    "max_depth": 3,
    "learning_rate": 0.03,
    "subsample": 0.8,
    "colsample_bytree": 0.8,
    "min_child_weight": 2.0,
    "reg_lambda": 1.0,
    "tree_method": "hist",
    "eval_metric": "logloss",
}
SLICE_COLUMNS: tuple[str, ...] = ("contract", "internet_service", "tenure_band", "senior_citizen")
_TENURE_EDGES = (0, 12, 24, 48, 73)
_TENURE_LABELS = ("0-11 mo", "12-23 mo", "24-47 mo", "48-72 mo")
_CATEGORICAL = tuple(CATEGORICAL_LEVELS)
_PASSTHROUGH = (*BINARY_COLUMNS, *NUMERIC_COLUMNS)


def features(df: pd.DataFrame) -> pd.DataFrame:
    """The 19 model inputs of ``df`` in the course's column order (raises ``KeyError`` if one is missing)."""
    return df.loc[:, list(FEATURE_COLUMNS)]


def labels(df: pd.DataFrame) -> np.ndarray:
    """Churn labels as an int array of shape (n,): 1 = churned."""
    return df[TARGET_COLUMN].astype(int).to_numpy()


def tenure_band(tenure: pd.Series) -> pd.Series:
    """Tenure in months -> one of four bands (0-11, 12-23, 24-47, 48-72 months) as a categorical."""
    return pd.cut(tenure, bins=list(_TENURE_EDGES), right=False, labels=list(_TENURE_LABELS))


@dataclass(frozen=True)
class DataSplit:
    """Train / validation / test frames from one seeded, stratified split."""

    train: pd.DataFrame
    valid: pd.DataFrame
    test: pd.DataFrame

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "valid": len(self.valid), "test": len(self.test)}


def split_telco(
    df: pd.DataFrame, *, valid_fraction: float = 0.2, test_fraction: float = 0.2, seed: int = SEED
) -> DataSplit:
    """Stratified train/validation/test split on ``churn``.

    Parameters
    ----------
    df : DataFrame with a ``churn`` column.
    valid_fraction, test_fraction : float
        Shares of all rows, each in (0, 1) and summing to less than 1.
    seed : int
        ``random_state`` of both ``train_test_split`` calls.

    Raises
    ------
    ValueError
        If the fractions are outside (0, 1) or leave no training rows.
    """
    valid_fraction = number("valid_fraction", valid_fraction, min=0, max=1, min_open=True, max_open=True)
    test_fraction = number("test_fraction", test_fraction, min=0, max=1, min_open=True, max_open=True)
    if valid_fraction + test_fraction >= 1:
        raise InvalidArgumentError(
            f"valid_fraction + test_fraction must be < 1, got {valid_fraction + test_fraction:.3f}"
        )
    rest, test = train_test_split(df, test_size=test_fraction, stratify=df[TARGET_COLUMN], random_state=seed)
    train, valid = train_test_split(
        rest,
        test_size=valid_fraction / (1 - test_fraction),
        stratify=rest[TARGET_COLUMN],
        random_state=seed,
    )
    return DataSplit(train=train, valid=valid, test=test)


def make_preprocessor() -> ColumnTransformer:
    """One-hot encode the ten categorical columns (31 columns), pass the nine numeric ones through.

    Output: 40 float columns. Unknown levels raise (``handle_unknown="error"``): a request with a
    level the model never saw is rejected, not silently encoded as all zeros.
    """
    return ColumnTransformer(
        [
            (
                "onehot",
                OneHotEncoder(
                    categories=[list(CATEGORICAL_LEVELS[c]) for c in _CATEGORICAL],
                    handle_unknown="error",
                    sparse_output=False,
                ),
                list(_CATEGORICAL),
            ),
            ("numeric", "passthrough", list(_PASSTHROUGH)),
        ],
        verbose_feature_names_out=False,
    )


def make_xgb_pipeline(*, nthread: int = DEFAULT_NTHREAD, seed: int = SEED, **overrides: object) -> Pipeline:
    """Preprocessing + ``XGBClassifier`` with the course's parameters (``XGB_PARAMS`` plus ``overrides``).

    Missing ``total_charges`` are passed to XGBoost as NaN, which routes them down each split's learned
    default branch.
    """
    params = {**XGB_PARAMS, **overrides}
    return Pipeline(
        [
            ("preprocess", make_preprocessor()),
            ("xgb", XGBClassifier(n_jobs=nthread, random_state=seed, **params)),
        ]
    )


def make_baseline_pipeline(*, seed: int = SEED) -> Pipeline:
    """Logistic-regression baseline: the same one-hot encoding, numeric columns imputed (0) and scaled."""
    numeric = Pipeline(
        [("impute", SimpleImputer(strategy="constant", fill_value=0.0)), ("scale", StandardScaler())]
    )
    pre = ColumnTransformer(
        [
            (
                "onehot",
                OneHotEncoder(
                    categories=[list(CATEGORICAL_LEVELS[c]) for c in _CATEGORICAL], sparse_output=False
                ),
                list(_CATEGORICAL),
            ),
            ("numeric", numeric, list(_PASSTHROUGH)),
        ]
    )
    return Pipeline([("preprocess", pre), ("logreg", LogisticRegression(max_iter=2000, random_state=seed))])


def classification_metrics(y_true: np.ndarray, p_churn: np.ndarray) -> dict[str, float]:
    """ROC AUC, PR AUC (average precision), log loss and Brier score of churn probabilities.

    Parameters
    ----------
    y_true : array of shape (n,), 0/1 labels.
    p_churn : array of shape (n,), predicted probability of churn in [0, 1].

    Returns
    -------
    dict with ``n``, ``churn_rate``, ``roc_auc``, ``pr_auc``, ``log_loss``, ``brier``. AUCs are NaN
    when a slice holds a single class (they are undefined there).

    Raises
    ------
    ValueError
        If the arrays differ in length or are empty.
    """
    y = np.asarray(y_true).astype(int)
    p = np.asarray(p_churn, dtype=float)
    if y.shape != p.shape or y.ndim != 1 or len(y) == 0:
        raise ValueError(
            f"y_true and p_churn must be non-empty 1-D arrays of equal length, got {y.shape} and {p.shape}"
        )
    both = len(np.unique(y)) == 2
    return {
        "n": len(y),
        "churn_rate": float(y.mean()),
        "roc_auc": float(roc_auc_score(y, p)) if both else float("nan"),
        "pr_auc": float(average_precision_score(y, p)) if both else float("nan"),
        "log_loss": float(log_loss(y, p, labels=[0, 1])),
        "brier": float(brier_score_loss(y, p)),
    }


def metrics_by_slice(
    df: pd.DataFrame, p_churn: np.ndarray, slices: tuple[str, ...] = SLICE_COLUMNS
) -> pd.DataFrame:
    """``classification_metrics`` overall and for every level of every slice column, with row counts.

    ``tenure_band`` is derived from ``tenure``. Returns a DataFrame indexed by (slice, level); the first
    row is ("all", "all").
    """
    frame = df.assign(tenure_band=tenure_band(df["tenure"]), _p=np.asarray(p_churn, dtype=float))
    rows = [{"slice": "all", "level": "all", **classification_metrics(labels(frame), frame["_p"].to_numpy())}]
    for col in slices:
        for level, part in frame.groupby(col, observed=True, sort=True):
            rows.append(
                {
                    "slice": col,
                    "level": str(level),
                    **classification_metrics(labels(part), part["_p"].to_numpy()),
                }
            )
    return pd.DataFrame(rows).set_index(["slice", "level"])


def model_version(pipeline: Pipeline) -> str:
    """Content hash of a trained pipeline: sha256 of the booster's JSON plus the encoder's categories.

    Two trainings that produce identical trees and preprocessing give the same 12-hex-digit version;
    any change of data, parameters or library behaviour gives another.
    """
    digest = hashlib.sha256()
    xgb = pipeline.named_steps["xgb"]
    digest.update(bytes(xgb.get_booster().save_raw(raw_format="json")))
    encoder = pipeline.named_steps["preprocess"].named_transformers_["onehot"]
    digest.update(json.dumps([list(map(str, c)) for c in encoder.categories_]).encode())
    return digest.hexdigest()[:12]


@dataclass
class ChurnModel:
    """A trained churn pipeline with the split it was trained on and its content-hash version."""

    pipeline: Pipeline
    split: DataSplit
    model_version: str
    params: dict[str, object] = field(default_factory=dict)

    def predict_proba(self, df: pd.DataFrame) -> np.ndarray:
        """Churn probability, shape (n,), for the 19 feature columns of ``df``.

        Raises
        ------
        course_lib.churn.schema.FeatureError
            A value outside the declared schema (named with its column, value and allowed range).
        """
        X = features(df)
        check_frame(X)
        return self.pipeline.predict_proba(X)[:, 1]


def train_churn_model(
    df: pd.DataFrame | None = None, *, nthread: int = DEFAULT_NTHREAD, seed: int = SEED, **overrides: object
) -> ChurnModel:
    """Clean the data, split it, and fit the XGBoost pipeline on the training part.

    Parameters
    ----------
    df : DataFrame, optional
        Customers with labels; defaults to ``load_telco()``.
    nthread : int
        XGBoost threads (pinned to 1 by default for reproducible timing).
    seed : int
        Seed for the split and for XGBoost's row/column sampling.
    **overrides
        Replace entries of ``XGB_PARAMS`` (e.g. ``n_estimators=100``).
    """
    data = clean_telco(load_telco() if df is None else df)
    split = split_telco(data, seed=seed)
    pipe = make_xgb_pipeline(nthread=nthread, seed=seed, **overrides)
    pipe.fit(features(split.train), labels(split.train))
    return ChurnModel(
        pipe, split, model_version(pipe), {**XGB_PARAMS, **overrides, "nthread": nthread, "seed": seed}
    )


#: Modules whose code decides what ``train_churn_model`` produces (hashed into the cache key).
_TRAINING_CODE = ("data.py", "model.py")
#: Libraries whose version can change the trained artifact (hashed into the cache key).
_TRAINING_LIBRARIES = ("numpy", "pandas", "scikit-learn", "xgboost")


def model_cache_key() -> str:
    """Key of the cached course model: everything that decides what ``train_churn_model()`` returns.

    sha256 over the data checksum, ``XGB_PARAMS``, thread count and seed, the installed versions of
    ``_TRAINING_LIBRARIES`` and the source bytes of the training code (``course_lib/churn/data.py`` and
    ``course_lib/churn/model.py``); 10 hex digits. An edit to the preprocessing or a library upgrade gives a
    new key, so a stale pickle is never served.
    """

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    here = Path(__file__).resolve().parent
    digest = hashlib.sha256(
        json.dumps(
            [TELCO_SHA256, XGB_PARAMS, DEFAULT_NTHREAD, SEED, [installed(n) for n in _TRAINING_LIBRARIES]],
            default=str,
        ).encode()
    )
    for name in _TRAINING_CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:10]


def load_or_train_churn_model(cache_dir: str | Path = "build/models") -> ChurnModel:
    """The course model from ``cache_dir`` if a previous lesson saved it, else train it and save it.

    The cache file is named after ``model_cache_key()`` (data checksum, parameters, library versions,
    training code), so a change of any of them retrains. Relative ``cache_dir`` paths are taken from the
    repository root. Processes that train at the same time write their own temporary files.
    """
    folder = Path(cache_dir)
    if not folder.is_absolute():
        folder = DATA_DIR.parent / folder
    path = folder / f"churn_model_{model_cache_key()}.pkl"
    if path.is_file():
        with path.open("rb") as fh:
            return pickle.load(fh)
    model = train_churn_model()
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "xb") as fh:  # two kernels training at once: both finish
        pickle.dump(model, fh)
    return model
