"""The one declared schema of the 19 model inputs: types, finiteness and ranges, checked at every entry.

A tree model scores anything it is given: ``monthly_charges = inf`` or ``tenure = -5`` falls down some
branch and comes out as an ordinary-looking probability. So every path that hands features to a model
(``OnnxChurnScorer.feeds`` / ``feeds_from_records``, ``course_lib.serving.service.native_forward``,
``ChurnModel.predict_proba``) first checks them against the table below, and refuses a bad value with a
``FeatureError`` that names the column, the value and the allowed range (over HTTP: a 422).

The ranges and where they come from (``data/README.md``'s column dictionary and the training data):

=================== ========= ============================ =========================================
column              type      allowed                      source
=================== ========= ============================ =========================================
six 0/1 flags       integer   0 or 1                       dictionary: "0/1"
``tenure``          integer   0 .. 72 months               dictionary "0 – 72"; the file's min/max
``monthly_charges`` number    18.25 .. 118.75 US dollars   dictionary; the file's min/max
``total_charges``   number    0 .. 13,680 US dollars       0 = not billed yet (``clean_telco``); the
                                                           top is 72 months x 118.75 x 1.6: in IBM's
                                                           file total / (tenure x monthly) reaches 1.57
                                                           (customers whose plan got cheaper)
ten categoricals    string    the levels of                dictionary
                              ``CATEGORICAL_LEVELS``
=================== ========= ============================ =========================================

Missing values: ``None`` or NaN in ``tenure``, ``monthly_charges`` or ``total_charges`` means
*missing*, which the XGBoost model handles by routing the row down each split's learned default branch
(and the MLP pipeline imputes); the 0/1 flags and the categoricals may not be missing. ``True``/``False``
are not numbers here (JSON ``true`` is not a tenure), and neither is the string ``"70.5"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np
import pandas as pd

from course_lib.churn.data import BINARY_COLUMNS, CATEGORICAL_LEVELS, FEATURE_COLUMNS
from course_lib.core.checks import instance_of, non_empty

__all__ = [
    "NUMERIC_SCHEMA",
    "TOTAL_CHARGES_MAX",
    "FeatureError",
    "NumericRange",
    "check_frame",
    "check_records",
]

#: Largest observed total / (tenure x monthly_charges) in IBM's file is 1.57; 1.6 leaves a small margin.
_TOTAL_OVER_TENURE_X_MONTHLY = 1.6
_TENURE_MAX, _MONTHLY_MIN, _MONTHLY_MAX = 72, 18.25, 118.75
#: Upper bound of ``total_charges`` in US dollars: 72 x 118.75 x 1.6 = 13,680.
TOTAL_CHARGES_MAX = round(_TENURE_MAX * _MONTHLY_MAX * _TOTAL_OVER_TENURE_X_MONTHLY, 2)


@dataclass(frozen=True)
class NumericRange:
    """Allowed values of one numeric model input.

    Attributes
    ----------
    low, high : float
        Inclusive bounds, in the column's unit.
    integer : bool
        Whole numbers only.
    missing_allowed : bool
        ``None``/NaN accepted as *missing*.
    source : str
        Where the bounds come from.
    """

    low: float
    high: float
    integer: bool
    missing_allowed: bool
    source: str

    def describe(self) -> str:
        """E.g. ``"an integer in [0, 72] (or null for missing)"``."""
        kind = "an integer" if self.integer else "a finite number"
        low = int(self.low) if self.integer else self.low
        high = int(self.high) if self.integer else self.high
        return f"{kind} in [{low:g}, {high:g}]" + (" (or null for missing)" if self.missing_allowed else "")


_FLAG = NumericRange(0, 1, True, False, "data/README.md: 0/1 flag")
#: Every numeric model input and its allowed range (see the module docstring for the sources).
NUMERIC_SCHEMA: dict[str, NumericRange] = {
    **{name: _FLAG for name in BINARY_COLUMNS},
    "tenure": NumericRange(0, _TENURE_MAX, True, True, "data/README.md: 0 - 72 months; training min/max"),
    "monthly_charges": NumericRange(
        _MONTHLY_MIN, _MONTHLY_MAX, False, True, "data/README.md: 18.25 - 118.75 USD; training min/max"
    ),
    "total_charges": NumericRange(
        0.0,
        TOTAL_CHARGES_MAX,
        False,
        True,
        "0 = not billed yet; 72 x 118.75 x 1.6 USD (total / (tenure x monthly) <= 1.57 in the file)",
    ),
}


class FeatureError(ValueError):
    """A model input outside the declared schema; the message names column, value and what is allowed.

    Attributes
    ----------
    column : str
    value : object
        The offending value (the first one found).
    allowed : str
        What the schema allows.
    """

    def __init__(self, column: str, value: object, allowed: str, *, row: int | None = None):
        where = "" if row is None else f" (row {row})"
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        super().__init__(f"feature {column!r}{where} must be {allowed}, got {shown}")
        self.column, self.value, self.allowed = column, value, allowed


def _is_number(value: object) -> TypeGuard[float | np.integer | np.floating]:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def _check_value(name: str, value: object, row: int | None) -> None:
    spec = NUMERIC_SCHEMA[name]
    if value is None or (isinstance(value, (float, np.floating)) and math.isnan(value)):
        if not spec.missing_allowed:
            raise FeatureError(name, value, f"{spec.describe()} (never missing)", row=row)
        return
    if not _is_number(value):
        raise FeatureError(name, value, spec.describe(), row=row)
    x = float(value)
    if not (spec.low <= x <= spec.high) or (spec.integer and not x.is_integer()):
        raise FeatureError(name, value, spec.describe(), row=row)


def check_records(records: Sequence[Mapping[str, object]]) -> None:
    """Check request-shaped records (one dict of the 19 inputs per customer) against the schema.

    Raises
    ------
    FeatureError
        The first value outside the schema (column, value, allowed range, row).
    ValueError
        An empty list, or a record with a missing or unexpected key.
    """
    non_empty("records", records)
    expected = set(FEATURE_COLUMNS)
    for i, record in enumerate(records):
        row = i if len(records) > 1 else None
        if record.keys() != expected:
            missing = sorted(expected - set(record))
            if missing:
                raise ValueError(f"missing field {missing[0]!r}; each record needs {list(FEATURE_COLUMNS)}")
            extra = sorted(map(str, set(record) - expected))
            raise ValueError(f"unexpected fields {extra}; allowed: {list(FEATURE_COLUMNS)}")
        for name in NUMERIC_SCHEMA:
            _check_value(name, record[name], row)
        for name, levels in CATEGORICAL_LEVELS.items():
            if record[name] not in levels:
                raise FeatureError(name, record[name], f"one of {list(levels)}", row=row)


def check_frame(X: pd.DataFrame) -> None:
    """Check a DataFrame of the 19 inputs (a batch) against the schema, column by column (vectorised).

    Raises
    ------
    FeatureError
        A numeric column of the wrong type, or a value outside its range (the first offending row).
    ValueError
        A missing column, or a categorical column holding an unknown level.
    TypeError
        If ``X`` is not a DataFrame.
    """
    instance_of("X", X, pd.DataFrame)
    for name in FEATURE_COLUMNS:
        if name not in X.columns:
            raise ValueError(f"missing column {name!r}; the model expects {list(FEATURE_COLUMNS)}")
    for name, spec in NUMERIC_SCHEMA.items():
        col = X[name]
        if pd.api.types.is_bool_dtype(col) or not pd.api.types.is_numeric_dtype(col):
            bad = next(
                (v for v in col if not _is_number(v) and v is not None), col.iloc[0] if len(col) else None
            )
            raise FeatureError(name, bad, f"{spec.describe()}, as a numeric column (got dtype {col.dtype})")
        values = col.to_numpy(dtype=np.float64, na_value=np.nan)
        missing = np.isnan(values)
        bad = (~missing) & ((values < spec.low) | (values > spec.high) | ~np.isfinite(values))
        if spec.integer:
            bad |= (~missing) & np.isfinite(values) & (values != np.round(values))
        if not spec.missing_allowed:
            bad |= missing
        if bad.any():
            i = int(np.argmax(bad))
            raise FeatureError(name, col.iloc[i], spec.describe(), row=i)
    for name, levels in CATEGORICAL_LEVELS.items():
        labels = X[name].astype(object)
        unknown = ~labels.isin(levels)
        if unknown.any():
            raise ValueError(
                f"column {name!r} has unknown levels {sorted(map(str, set(labels[unknown])))[:5]}; "
                f"allowed: {list(levels)}"
            )
