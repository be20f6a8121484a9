"""One chunk of rows, checked and encoded on Arrow and NumPy arrays: no per-row Python for valid rows.

One concept: turning an Arrow table of ``customer_id`` and the 19 features into (a) which rows may be
scored, with the reason for every row that may not, and (b) the model's input, a C-contiguous float32
matrix of shape ``(n_valid, 40)`` in the column order of the fitted one-hot pipeline.

* :func:`check_rows` applies the one feature schema (:mod:`course_lib.churn.schema`) column by column
  with vectorised comparisons. A categorical column read as an Arrow *dictionary* is mapped to level
  codes with one lookup per dictionary entry (a handful of strings), then ``codes = lut[indices]`` for
  the whole column. Only a rejected row costs Python: its reason names the column, the value and what
  the schema allows, the first violation in the order id, numeric columns, categorical columns.
* :func:`encode_rows` writes each model column as one contiguous row of a ``(40, n)`` array (a one-hot
  column is ``codes == j``) and transposes it once into the ``(n, 40)`` matrix the model reads.
* :func:`row_problems` is the same check for a pandas DataFrame.

References
----------
Apache Arrow, "Dictionary-encoded layout"; pyarrow documentation, ``DictionaryArray`` and
``pyarrow.compute``. scikit-learn ``OneHotEncoder`` (the column order this reproduces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from course_lib.churn.data import CATEGORICAL_LEVELS, FEATURE_COLUMNS, ID_COLUMN
from course_lib.churn.schema import NUMERIC_SCHEMA

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

__all__ = ["CheckedRows", "Encoding", "check_rows", "encode_rows", "row_problems"]

#: Rows encoded per block: 40 float32 columns x 4,096 rows = 640 KiB, which stays in a core's L2 cache.
_BLOCK_ROWS = 4_096


@dataclass(frozen=True)
class Encoding:
    """The model's input columns: one-hot blocks for the categoricals, then the numeric columns.

    Attributes
    ----------
    categorical : tuple of (column, levels)
        In the model's order; each contributes ``len(levels)`` 0/1 columns.
    numeric : tuple of str
        Passed through as float32 (NaN = missing), after the one-hot blocks.
    """

    categorical: tuple[tuple[str, tuple[str, ...]], ...]
    numeric: tuple[str, ...]

    @property
    def width(self) -> int:
        """Number of model input columns (40 for the churn pipeline)."""
        return sum(len(levels) for _, levels in self.categorical) + len(self.numeric)

    @classmethod
    def from_pipeline(cls, pipeline: Pipeline) -> Encoding:
        """Read the encoding off a fitted ``make_xgb_pipeline`` (its ``OneHotEncoder`` and passthrough).

        Raises ``ValueError`` if the pipeline's one-hot categories hold a level outside
        ``CATEGORICAL_LEVELS`` (the schema could then never produce it).
        """
        pre = pipeline.named_steps["preprocess"]
        (_, encoder, cat_cols), (_, _, num_cols) = pre.transformers_[0], pre.transformers_[1]
        categorical = tuple(
            (str(name), tuple(str(v) for v in levels))
            for name, levels in zip(cat_cols, encoder.categories_, strict=True)
        )
        for name, levels in categorical:
            extra = set(levels) - set(CATEGORICAL_LEVELS[name])
            if extra:
                raise ValueError(
                    f"the pipeline's column {name!r} has levels {sorted(extra)} outside the schema"
                )
        return cls(categorical, tuple(str(c) for c in num_cols))


@dataclass
class CheckedRows:
    """A checked chunk: which rows are valid, why the others are not, and their decoded columns.

    Attributes
    ----------
    ok : numpy.ndarray of bool, shape (n,)
    bad_rows : numpy.ndarray of int64, shape (n_bad,)
        Positions of the rejected rows, ascending.
    reasons : list of str, length n_bad
        The first schema violation of each rejected row.
    ids : pyarrow.Array of string, length n
    codes : dict column -> int8 array (n,)
        Index into ``CATEGORICAL_LEVELS[column]`` (-1 where invalid).
    values : dict column -> float64 array (n,)
        Numeric columns, NaN where missing.
    """

    ok: np.ndarray
    bad_rows: np.ndarray
    reasons: list[str]
    ids: pa.Array
    codes: dict[str, np.ndarray]
    values: dict[str, np.ndarray]

    @property
    def n_valid(self) -> int:
        return len(self.ok) - len(self.bad_rows)


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _plain(array: pa.ChunkedArray | pa.Array) -> pa.Array:
    if not isinstance(array, pa.ChunkedArray):
        return array
    return array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()


def _category_codes(array: pa.Array, levels: tuple[str, ...]) -> np.ndarray:
    """Level index per row (-1 for a null, an unknown level or a non-string column), int8."""
    if _is_text(array.type):
        array = array.dictionary_encode()  # only stores written without dictionaries pay this hash
    if not (pa.types.is_dictionary(array.type) and _is_text(array.type.value_type)):
        return np.full(len(array), -1, dtype=np.int8)  # numbers, booleans ...: never a level
    where = {level: i for i, level in enumerate(levels)}
    lut = np.array([where.get(v, -1) for v in array.dictionary.to_pylist()], dtype=np.int8)
    if not array.null_count:
        return lut[array.indices.to_numpy()]
    codes = lut[array.indices.fill_null(0).to_numpy()] if len(lut) else np.full(len(array), -1, np.int8)
    codes[array.is_null().to_numpy(zero_copy_only=False)] = -1
    return codes


def _numeric_values(array: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """(values, mask of present values that are not numbers, or None if all are numbers).

    Integer columns without nulls stay integers (a zero-copy view); other numbers become float64
    with NaN where missing.
    """
    if pa.types.is_integer(array.type) and not array.null_count:
        return array.to_numpy(), None
    if pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
        as_float = array if pa.types.is_float64(array.type) else pc.cast(array, pa.float64())
        return as_float.to_numpy(zero_copy_only=False), None
    present = array.is_valid().to_numpy(zero_copy_only=False)
    return np.full(len(array), np.nan), present  # strings, booleans, ...: not numbers (as check_frame)


def _repeated(ids: pa.Array) -> np.ndarray:
    """True where a non-null id appeared earlier in the chunk."""
    valid = ids.drop_null() if ids.null_count else ids
    if len(valid) < 2 or pc.all(pc.less(valid[:-1], valid[1:])).as_py():
        return np.zeros(len(ids), dtype=bool)  # strictly increasing (a store in id order): no repeats
    # dictionary_encode numbers distinct values in order of first appearance, so a row repeats an
    # earlier id exactly when its index is not above every index before it.
    index = ids.dictionary_encode().indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    before = np.concatenate([[-1], np.maximum.accumulate(index)[:-1]])
    return (index >= 0) & (index <= before)


def check_rows(table: pa.Table) -> CheckedRows:
    """Check every row of ``table`` against the feature schema, vectorised.

    Parameters
    ----------
    table : pyarrow.Table
        ``customer_id`` and the 19 features; categorical columns as dictionary or string arrays,
        numeric columns of any integer or floating type (nulls and NaN mean *missing*).

    Returns
    -------
    CheckedRows
        Rejected rows and their reasons: a missing or repeated ``customer_id`` (within the chunk), a
        missing flag or category, an unknown category, a number outside its range or not a number, a
        non-integer where an integer is required (the rules of :func:`course_lib.churn.schema.check_frame`,
        row by row). Missing ``tenure`` and charges are allowed.

    Raises
    ------
    KeyError
        If a column is missing (``course_lib.offline.store.check_store`` refuses such stores first).
    """
    n = table.num_rows
    ids = _plain(table.column(ID_COLUMN))
    if not _is_text(ids.type):
        ids = pc.cast(ids, pa.string())
    # (bad mask, reason: str or (column, rule, array))
    checks: list[tuple[np.ndarray, str | tuple[str, str, pa.Array]]] = []
    if ids.null_count:
        checks.append((ids.is_null().to_numpy(zero_copy_only=False), f"{ID_COLUMN} is missing"))
    checks.append((_repeated(ids), f"{ID_COLUMN} appears earlier in the same chunk"))
    values: dict[str, np.ndarray] = {}
    for name, spec in NUMERIC_SCHEMA.items():
        column = _plain(table.column(name))
        v, not_number = _numeric_values(column)
        values[name] = v
        if v.dtype.kind in "iu":  # whole numbers, none missing: only the range to check
            bad = (v < spec.low) | (v > spec.high)
        else:
            bad = (v < spec.low) | (v > spec.high) | np.isinf(v)
            if spec.integer:
                bad |= np.isfinite(v) & (v != np.round(v))
            if not spec.missing_allowed:
                bad |= np.isnan(v) if not_number is None else np.isnan(v) & ~not_number
            if not_number is not None:
                bad |= not_number
        checks.append((bad, (name, spec.describe(), column)))
    codes: dict[str, np.ndarray] = {}
    for name, levels in CATEGORICAL_LEVELS.items():
        column = _plain(table.column(name))
        codes[name] = _category_codes(column, levels)
        checks.append((codes[name] < 0, (name, f"one of {list(levels)}", column)))
    ok = np.ones(n, dtype=bool)
    reason_of: dict[int, str] = {}
    for bad, reason in checks:
        rows = np.flatnonzero(bad & ok)
        if not len(rows):
            continue
        ok[rows] = False
        if isinstance(reason, str):
            reason_of.update(dict.fromkeys(rows.tolist(), reason))
        else:
            name, rule, column = reason
            shown = column.take(pa.array(rows)).to_pylist()
            reason_of.update(
                {int(i): f"{name}={v!r}: must be {rule}" for i, v in zip(rows, shown, strict=True)}
            )
    bad_rows = np.flatnonzero(~ok)
    return CheckedRows(ok, bad_rows, [reason_of[int(i)] for i in bad_rows], ids, codes, values)


def encode_rows(checked: CheckedRows, encoding: Encoding, *, out: np.ndarray | None = None) -> np.ndarray:
    """The valid rows as the model's input, float32, shape ``(n_valid, encoding.width)``, C-contiguous.

    One-hot columns are 0/1, numeric columns their value (NaN = missing, which XGBoost routes down each
    split's default branch). Equal to the fitted pipeline's ``preprocess.transform`` cast to float32
    (a test checks it). The rows are built ``_BLOCK_ROWS`` at a time: each model column is one
    contiguous pass over a block (a one-hot column is ``codes == j``), and the small ``(width, block)``
    array, still in cache, is transposed into the result.

    Parameters
    ----------
    out : numpy.ndarray of float32, shape (>= n_valid, width), C-contiguous, optional
        Written and returned as ``out[:n_valid]`` (a process reuses one buffer for all its chunks
        instead of asking the allocator, and the kernel, for fresh pages every time).
    """
    keep = None if checked.n_valid == len(checked.ok) else checked.ok
    n, width = checked.n_valid, encoding.width
    if out is None:
        out = np.empty((n, width), dtype=np.float32)
    elif (
        out.dtype != np.float32
        or out.ndim != 2
        or out.shape[1] != width
        or len(out) < n
        or not out.flags["C_CONTIGUOUS"]
    ):
        raise ValueError(
            f"out must be a C-contiguous float32 array of shape (>= {n}, {width}), got {out.dtype} {out.shape}"
        )
    X = out[:n]
    codes = {
        name: checked.codes[name] if keep is None else checked.codes[name][keep]
        for name, _ in encoding.categorical
    }
    values = {
        name: checked.values[name] if keep is None else checked.values[name][keep]
        for name in encoding.numeric
    }
    where = [
        (codes[name], [CATEGORICAL_LEVELS[name].index(level) for level in levels])
        for name, levels in encoding.categorical
    ]
    block = np.empty((width, min(_BLOCK_ROWS, max(n, 1))), dtype=np.float32)
    for lo in range(0, n, _BLOCK_ROWS):
        hi = min(lo + _BLOCK_ROWS, n)
        rows = block[:, : hi - lo]
        at = 0
        for code, indices in where:
            part = code[lo:hi]
            for j in indices:  # one contiguous pass per one-hot column
                np.equal(part, j, out=rows[at], casting="unsafe")
                at += 1
        for name in encoding.numeric:
            rows[at] = values[name][lo:hi]
            at += 1
        X[lo:hi] = rows.T
    return X


def row_problems(X: pd.DataFrame) -> np.ndarray:
    """Per row of a DataFrame, the first schema violation as text (``None`` for a valid row), shape ``(len(X),)``.

    The same rules and wording as :func:`check_rows` (the batch job's check), for a pandas frame with
    ``customer_id`` and the 19 features.
    """
    columns = [ID_COLUMN, *FEATURE_COLUMNS]
    frame = X[columns].copy()
    for name in (ID_COLUMN, *CATEGORICAL_LEVELS):
        if frame[name].dtype == object:  # mixed Python objects: strings, with None/NaN/NA as null
            frame[name] = frame[name].map(lambda v: None if v is None or v is pd.NA or v != v else str(v))
    checked = check_rows(pa.Table.from_pandas(frame, preserve_index=False))
    reasons = np.full(len(X), None, dtype=object)
    reasons[checked.bad_rows] = checked.reasons
    return reasons
