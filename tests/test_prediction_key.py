"""The prediction cache's key: model version, customer, snapshot; the feature digest is exact and stable."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas as pd
import pytest

from course_lib.churn.data import FEATURE_COLUMNS
from course_lib.core.checks import InvalidArgumentError
from course_lib.serving.cache.key import PredictionKey, check_key_part, features_digest


def test_a_key_depends_on_every_part_and_reads_as_its_redis_string():
    key = PredictionKey("v1", "SC-0000001", "snap-3")
    assert key.as_str() == "churn|v1|snap-3|SC-0000001"
    assert key != PredictionKey("v2", "SC-0000001", "snap-3") != PredictionKey("v1", "SC-0000001", "snap-4")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", r"namespace must be non-empty, got an empty str"),
        ("a|b", r"namespace must be a str without '\|', got 'a\|b'"),
        (7, r"namespace must be a str, got 7 \(int\)"),
        (None, r"namespace must be a str, got None \(NoneType\)"),
    ],
)
def test_key_parts_must_be_non_empty_strings_without_the_separator(value, message):
    with pytest.raises(InvalidArgumentError, match=message):
        check_key_part("namespace", value)


def test_features_key_is_stable_and_exact():
    record = {name: 0 for name in FEATURE_COLUMNS}
    record["total_charges"] = math.nan
    digest = features_digest(record)
    assert digest == features_digest(dict(record)) and len(digest) == 24
    changed = {**record, "tenure": 1}
    assert features_digest(changed) != digest
    assert PredictionKey.for_features("v1", record) != PredictionKey.for_features("v2", record)
    with pytest.raises(ValueError, match="missing feature"):
        features_digest({"tenure": 1})


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("tenure", [1, 1.0, np.int64(1), np.float32(1.0), np.float64(1.0), True, np.bool_(True)]),
        ("total_charges", [None, math.nan, np.float32("nan"), np.float64("nan"), pd.NA, pd.NaT]),
        ("monthly_charges", [29.85, np.float64(29.85)]),
        ("contract", ["Month-to-month", np.str_("Month-to-month")]),
    ],
)
def test_features_digest_normalises_equal_values(column, values):
    base = {name: 0 for name in FEATURE_COLUMNS}
    digests = {features_digest({**base, column: v}) for v in values}
    assert len(digests) == 1, f"{column}: {values} give {len(digests)} different digests"


def test_features_digest_keeps_different_values_apart_and_names_bad_types():
    base = {name: 0 for name in FEATURE_COLUMNS}
    distinct = [0, 1, 1.5, np.float32(0.1), 0.1, None, "1", math.inf, -math.inf]
    assert len({features_digest({**base, "tenure": v}) for v in distinct}) == len(distinct)
    missing = features_digest({**base, "total_charges": np.float32("nan")})
    assert (
        missing
        == hashlib.sha256(
            json.dumps(
                [None if n == "total_charges" else 0 for n in FEATURE_COLUMNS], separators=(",", ":")
            ).encode()
        ).hexdigest()[:24]
    )  # missing is written as JSON null
    with pytest.raises(TypeError, match=r"'tenure'.*list"):
        features_digest({**base, "tenure": [1]})
