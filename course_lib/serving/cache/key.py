"""What a cached churn score is keyed by: model version, customer and feature snapshot (or a feature digest).

One concept: the cache key. A score is only correct for the model that computed it and the features
it was computed from, so a :class:`PredictionKey` always holds the model version, the customer id and
the version of the feature snapshot, or (``PredictionKey.for_features``) a digest of the exact
feature values from :func:`features_digest`. A new model version or a refreshed snapshot makes every
old key unreachable. ``course_lib.serving.cache.stores`` re-exports these names.

References
----------
Python documentation, ``hashlib.sha256`` and ``PYTHONHASHSEED`` (why ``hash()`` of a str differs
between processes). Source lesson 000 (a cache key of ``hash(customer_id, model_version)``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from course_lib.churn.data import FEATURE_COLUMNS
from course_lib.core.checks import InvalidArgumentError, instance_of, non_empty

__all__ = ["KEY_SEPARATOR", "PredictionKey", "check_key_part", "features_digest"]

#: Joins the parts of a key in its string form (``PredictionKey.as_str``); no part may contain it.
KEY_SEPARATOR = "|"


def check_key_part(name: str, value: object) -> str:
    """Return ``value`` if it is a non-empty str without ``KEY_SEPARATOR``.

    Raises
    ------
    InvalidArgumentError
        Naming ``name``: for a value that is not a str, an empty str, or one holding ``KEY_SEPARATOR``.
    """
    text = non_empty(name, instance_of(name, value, str))
    if KEY_SEPARATOR in text:
        raise InvalidArgumentError(f"{name} must be a str without {KEY_SEPARATOR!r}, got {text!r}")
    return text


def _canonical_value(name: str, value: object) -> object:
    """One feature value in canonical form: equal numbers alike, every kind of missing as None."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (str, np.str_)):
        return str(value)
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isnan(number):
            return None
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        return int(number) if number.is_integer() else number
    raise TypeError(
        f"feature {name!r} must be a str, a number or missing (None, NaN, pd.NA), "
        f"got {type(value).__name__}: {value!r}"
    )


def features_digest(record: Mapping[str, Any]) -> str:
    """A stable digest of one customer's 19 feature values (sha256 of canonical JSON, 24 hex digits).

    Stable across processes and machines (unlike Python's ``hash()``, which is salted per process
    for strings), so replicas sharing a Redis cache agree on it. Values are normalised first, so
    equal values give equal digests whatever their Python or NumPy type: integers, booleans and
    integral floats become the same integer (``1``, ``True``, ``1.0`` and ``np.float32(1)`` alike),
    other floats their exact ``float`` value (so ``np.float32(0.1)`` differs from ``0.1``: they
    are different numbers), every missing value (``None``, NaN of any float type, ``pd.NA``,
    ``pd.NaT``) becomes JSON ``null``, and infinities the strings ``"inf"`` / ``"-inf"``.

    Raises
    ------
    ValueError
        If a feature column is missing.
    TypeError
        If a value is not a str, a number or missing (the message names the feature).
    """
    try:
        values = [(name, record[name]) for name in FEATURE_COLUMNS]
    except KeyError as exc:
        raise ValueError(
            f"record is missing feature {exc.args[0]!r}; it needs {list(FEATURE_COLUMNS)}"
        ) from None
    canonical = [_canonical_value(name, value) for name, value in values]
    return hashlib.sha256(json.dumps(canonical, separators=(",", ":")).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class PredictionKey:
    """What a cached score depends on: model version, customer and feature snapshot.

    Parameters
    ----------
    model_version : str
        ``ChurnModel.model_version`` of the model that computed the score.
    customer_id : str
        E.g. ``"SC-0000042"``; ``"*"`` for a key built from feature values (``for_features``).
    feature_snapshot : str
        Version of the features the score was computed from (e.g. the feature store's file and the
        refresh it holds), or ``"sha256:<digest>"`` of the exact values.

    Raises
    ------
    ValueError
        If a part is empty or contains ``"|"``.
    """

    model_version: str
    customer_id: str
    feature_snapshot: str

    def __post_init__(self) -> None:
        check_key_part("model_version", self.model_version)
        check_key_part("customer_id", self.customer_id)
        check_key_part("feature_snapshot", self.feature_snapshot)

    @classmethod
    def for_features(cls, model_version: str, record: Mapping[str, Any]) -> PredictionKey:
        """Key by the exact feature values (any customer with identical features shares it)."""
        return cls(model_version, "*", "sha256:" + features_digest(record))

    def as_str(self, namespace: str = "churn") -> str:
        """``namespace|model_version|feature_snapshot|customer_id``: the Redis key."""
        return KEY_SEPARATOR.join((namespace, self.model_version, self.feature_snapshot, self.customer_id))
