"""A deliberately slow churn scorer: the starting point of the capstone (problem set 4), and nothing else.

**Do not serve churn this way.** ``SlowChurnScorer`` scores one customer per call and makes, on
purpose, the mistakes the lessons teach you to find, each in its own named stage so that
``course_lib.serving.profiling._stages`` can time it:

``lookup``
    the features are read from the Lesson 2 SQLite store with its index switched off
    (``FeatureStore.get(..., use_index=False)``, SQLite's ``NOT INDEXED``): a full scan of every row
    for every request, O(n) in the population;
``load_model``
    the model object is re-created for every request, deserialised from the pickled pipeline bytes
    (as a handler that opens its model file on each call would);
``to_frame``
    a one-row pandas DataFrame is built from the feature dict;
``predict``
    the native scikit-learn pipeline (``ColumnTransformer`` + ``XGBClassifier``, all 400 trees)
    scores that single row;
``log``
    the whole feature dict is written as indented JSON to a log file, opened and closed per request.

There is no batching: every customer pays every stage. The code is ordinary library code, with no
``time.sleep``; how slow each stage is depends on your machine, which is the point of profiling it.

Only the capstone uses this module. The fast paths live where the lessons built them:
``course_lib.serving.feature_store._lookup`` (index, cache), ``course_lib.churn.export._onnx`` (ONNX Runtime),
``course_lib.churn.pruning`` (fewer trees), ``course_lib.optimize.accuracy_budget`` (the per-slice check).

References
----------
Source 001's closing exercise ("make a model three times faster, no slice losing more accuracy than a
limit set in advance"); MLOps course lesson 19 (source 000): un-indexed feature-store queries and a
model loaded per request as the usual causes of a slow inference path.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from sklearn.pipeline import Pipeline

from course_lib.churn.data import DATA_DIR, FEATURE_COLUMNS
from course_lib.churn.model import ChurnModel, load_or_train_churn_model
from course_lib.core.checks import callable_, instance_of
from course_lib.serving.feature_store import FeatureStore
from course_lib.serving.profiling import RequestProfile

__all__ = [
    "CAPSTONE_N_CUSTOMERS",
    "CAPSTONE_SEED",
    "STAGES",
    "SlowChurnScorer",
]

#: Customers in the capstone's feature store: enough that a full scan is the slowest stage.
CAPSTONE_N_CUSTOMERS = 200_000
#: Seed of the capstone's population (``make_customers``).
CAPSTONE_SEED = 4
#: The baseline's stages, in the order each request runs them.
STAGES: tuple[str, ...] = ("lookup", "load_model", "to_frame", "predict", "log")


class SlowChurnScorer:
    """Score one customer at a time the slow way (see the module docstring for each mistake).

    Parameters
    ----------
    store : FeatureStore
        Read with its index switched off.
    pipeline : sklearn Pipeline
        The reference model (preprocessing + XGBoost); it is pickled once here and unpickled per call.
    log_path : str or Path
        The request log; emptied when the scorer is created, one JSON record appended per request.
    lookup : callable, optional
        customer_id -> feature dict or None, replacing the un-indexed read in the ``lookup`` stage
        (e.g. ``course_lib.serving.feature_store._lookup.make_lookup(store, "indexed")``), so one fix can be
        re-measured with every other mistake still in place. Default: the full scan.

    Notes
    -----
    ``score`` returns exactly what ``pipeline.predict_proba`` gives for the customer's stored
    features, so it is also the reference the capstone's faster scorers are compared with.
    """

    def __init__(
        self,
        store: FeatureStore,
        pipeline: Pipeline,
        *,
        log_path: str | Path,
        lookup: Callable[[str], dict[str, object] | None] | None = None,
    ):
        instance_of("store", store, FeatureStore)
        instance_of("pipeline", pipeline, Pipeline)
        if lookup is not None:
            callable_("lookup", lookup)
        self.store = store
        self._lookup = lookup if lookup is not None else (lambda cid: store.get(cid, use_index=False))
        self._model_bytes = pickle.dumps(pipeline)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("", encoding="utf-8")

    @classmethod
    def open(
        cls,
        *,
        n_customers: int = CAPSTONE_N_CUSTOMERS,
        seed: int = CAPSTONE_SEED,
        model: ChurnModel | None = None,
        log_path: str | Path | None = None,
    ) -> SlowChurnScorer:
        """The capstone's baseline: build (or reuse) the store of ``n_customers``, load the course model.

        Parameters
        ----------
        n_customers, seed : int
            The population of the feature store (``FeatureStore.open``); the first call builds it
            under ``build/feature_store`` (a few seconds), later calls reuse it.
        model : ChurnModel, optional
            Default: ``load_or_train_churn_model()``.
        log_path : str or Path, optional
            Default: ``build/capstone/requests.log`` in the repository, or the same name under the
            temporary folder where ``build/`` is read-only (the grading sandbox).
        """
        store = FeatureStore.open(n_customers, seed)
        churn = model if model is not None else load_or_train_churn_model()
        path = Path(log_path) if log_path is not None else _default_log_path()
        return cls(store, churn.pipeline, log_path=path)

    def reference_pipeline(self) -> Pipeline:
        """A fresh copy of the reference model (all trees), e.g. to prune or export to ONNX."""
        return pickle.loads(self._model_bytes)

    def score_profiled(self, customer_id: str) -> tuple[float, RequestProfile]:
        """Churn probability of one customer, and the time each stage took.

        Returns
        -------
        (float, RequestProfile)
            The probability in [0, 1] and a profile with the stages ``STAGES`` in milliseconds.

        Raises
        ------
        KeyError
            If ``customer_id`` is not in the store.
        TypeError
            If ``customer_id`` is not a str.
        """
        profile = RequestProfile(customer_id)
        with profile.stage("lookup"):
            record = self._lookup(customer_id)
        if record is None:
            raise KeyError(f"customer_id {customer_id!r} is not in the feature store")
        with profile.stage("load_model"):
            pipeline = pickle.loads(self._model_bytes)
        with profile.stage("to_frame"):
            frame = pd.DataFrame([record], columns=list(FEATURE_COLUMNS))
        with profile.stage("predict"):
            p_churn = float(pipeline.predict_proba(frame)[0, 1])
        with profile.stage("log"):
            entry = {"customer_id": customer_id, "features": record, "churn_probability": p_churn}
            with self.log_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry, indent=2, sort_keys=True) + "\n")
        return p_churn, profile

    def score(self, customer_id: str) -> float:
        """Churn probability of one customer (raises like ``score_profiled``)."""
        return self.score_profiled(customer_id)[0]

    def timed_score(self, customer_id: str) -> RequestProfile:
        """The stage profile of one request, for ``course_lib.serving.profiling._stages.profile_requests``."""
        return self.score_profiled(customer_id)[1]

    def close(self) -> None:
        """Close the feature store's connection."""
        self.store.close()

    def __enter__(self) -> SlowChurnScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _default_log_path() -> Path:
    folder = DATA_DIR.parent / "build" / "capstone"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder / "requests.log"
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "capstone" / "requests.log"
