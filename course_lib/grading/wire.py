"""The grader's side of the wire: its arguments as JSON, a kernel's answers checked on arrival.

A grading kernel answers with text (:mod:`course_lib.grading.kernel_side`); :func:`parse_answer` turns
it into an :class:`Answer` without evaluating or unpickling anything: the text must be a quoted
base64 string within a size limit, its JSON must have a bounded depth and size, and every tagged
value must be well formed (an ``$array`` of a numeric, boolean or string dtype whose data fits its
shape, a ``$frame`` whose columns have the index's length...). What the kernel sends that does not
pass is a :class:`MalformedAnswerError`, which the checks count as a wrong answer; it never raises out of
the grader. Values arrive as the Python, numpy and pandas objects they describe (built here from
the data), and anything the kernel could not describe as data arrives as :class:`Opaque`, which
equals nothing.

:func:`to_wire` is the other direction: the grader's arguments (numbers, strings, lists, dicts,
tuples, numpy arrays, DataFrames, records for ``pd.DataFrame(records)``, and :class:`Code`, a
grader-written expression such as ``"lambda size: 1.0"``) as the tagged JSON the kernel decodes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from course_lib.grading.kernel_side import float_tag

__all__ = [
    "Answer",
    "Code",
    "MalformedAnswerError",
    "Opaque",
    "Raised",
    "Records",
    "from_wire",
    "parse_answer",
    "to_wire",
]

MAX_DEPTH = 24
MAX_ITEMS = 600_000
#: dtypes an ``$array`` or a frame's column may have; anything else is malformed (frames: object).
NUMERIC_DTYPES = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    ]
)
_QUOTED_BASE64 = re.compile(r"'([A-Za-z0-9+/]*={0,2})'")


class MalformedAnswerError(ValueError):
    """A kernel's answer that is not well-formed data (the checks count it as a wrong answer)."""


@dataclass(frozen=True)
class Opaque:
    """A value the kernel could not send as data: only its type's name arrived. Equals nothing."""

    type_name: str

    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return hash(self.type_name)


@dataclass(frozen=True)
class Raised:
    """The call raised: the exception's class names (its MRO, most derived first) and message."""

    types: tuple[str, ...]
    message: str

    @property
    def name(self) -> str:
        """The exception's class name (``"KeyError"``)."""
        return self.types[0] if self.types else "?"

    def is_a(self, name: str) -> bool:
        """Whether the exception is an instance of the built-in class ``name`` (by its MRO's names)."""
        return name in self.types


@dataclass(frozen=True)
class Answer:
    """What one request brought back: ``value`` when the call returned, else ``raised``."""

    value: Any = None
    raised: Raised | None = None


@dataclass(frozen=True)
class Code:
    """A grader-written Python expression the kernel evaluates as an argument (``"lambda b: 5 + b"``)."""

    source: str


@dataclass(frozen=True)
class Records:
    """Rows (a list of dicts) that arrive in the kernel as ``pandas.DataFrame(rows)``."""

    rows: list


def to_wire(value: Any) -> Any:
    """The grader's argument as tagged JSON for :func:`course_lib.grading.kernel_side.decode`.

    Raises
    ------
    TypeError
        For a type the wire does not carry (a grader's mistake, not a student's).

    Examples
    --------
    >>> to_wire((1, float("inf"), Code("lambda b: b")))
    {'$tuple': [1, {'$float': 'inf'}, {'$code': 'lambda b: b'}]}
    >>> to_wire(np.array([1.0, 2.0]))
    {'$array': {'dtype': 'float64', 'shape': [2], 'data': [1.0, 2.0]}}
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float_tag(float(value))
    if isinstance(value, Code):
        return {"$code": value.source}
    if isinstance(value, Records):
        return {"$records": [to_wire(row) for row in value.rows]}
    if isinstance(value, list):
        return [to_wire(item) for item in value]
    if isinstance(value, tuple):
        return {"$tuple": [to_wire(item) for item in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: to_wire(v) for k, v in value.items()}
        return {"$dict": [[to_wire(k), to_wire(v)] for k, v in value.items()]}
    if isinstance(value, np.ndarray):
        data = [to_wire(item) for item in value.ravel().tolist()]
        return {"$array": {"dtype": str(value.dtype), "shape": list(value.shape), "data": data}}
    if isinstance(value, pd.DataFrame):
        return {
            "$frame": {
                "columns": [to_wire(c) for c in value.columns],
                "index": [to_wire(i) for i in value.index],
                "dtypes": [str(d) for d in value.dtypes],
                "data": [[to_wire(v) for v in value.iloc[:, j].tolist()] for j in range(value.shape[1])],
            }
        }
    raise TypeError(f"the grader cannot send a {type(value).__name__} to a kernel")


class _Reader:
    """Builds values from a kernel's JSON, counting items and depth; raises MalformedAnswerError."""

    def __init__(self) -> None:
        self.items = 0

    def read(self, node: Any, depth: int = 0) -> Any:
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise MalformedAnswerError("the answer is nested too deeply or holds too many items")
        if node is None or isinstance(node, (bool, str)):
            return node
        if isinstance(node, int):
            return node
        if isinstance(node, float):
            if not math.isfinite(node):
                raise MalformedAnswerError("a bare non-finite number")
            return node
        if isinstance(node, list):
            return [self.read(item, depth + 1) for item in node]
        if not isinstance(node, dict):
            raise MalformedAnswerError(f"unexpected JSON value {type(node).__name__}")
        if not (len(node) == 1 and next(iter(node)).startswith("$")):
            if any(not isinstance(k, str) or k.startswith("$") for k in node):
                raise MalformedAnswerError("a dict key starting with $ outside a tag")
            return {k: self.read(v, depth + 1) for k, v in node.items()}
        [(tag, body)] = node.items()
        return self._tagged(tag, body, depth + 1)

    def _number(self, node: Any, depth: int) -> Any:
        value = self.read(node, depth)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MalformedAnswerError("a non-number where a number was due")
        return value

    def _tagged(self, tag: str, body: Any, depth: int) -> Any:
        if tag == "$float":
            if body not in ("nan", "inf", "-inf"):
                raise MalformedAnswerError(f"bad $float {body!r}")
            return float(body)
        if tag == "$tuple":
            if not isinstance(body, list):
                raise MalformedAnswerError("$tuple needs a list")
            return tuple(self.read(item, depth) for item in body)
        if tag == "$dict":
            if not (isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body)):
                raise MalformedAnswerError("$dict needs [key, value] pairs")
            pairs = [(self.read(k, depth), self.read(v, depth)) for k, v in body]
            try:
                return dict(pairs)
            except TypeError as error:  # an unhashable key (a list)
                raise MalformedAnswerError(f"$dict key: {error}") from None
        if tag == "$opaque":
            if not isinstance(body, str):
                raise MalformedAnswerError("$opaque needs a type name")
            return Opaque(body[:200])
        if not isinstance(body, dict):
            raise MalformedAnswerError(f"{tag} needs an object")
        if tag == "$array":
            return self._array(body, depth)
        if tag == "$scalar":
            dtype = body.get("dtype")
            if dtype not in NUMERIC_DTYPES:
                raise MalformedAnswerError(f"$scalar of dtype {dtype!r}")
            value = self.read(body.get("value"), depth)
            try:
                return np.array(value, dtype=dtype)[()]
            except (TypeError, ValueError, OverflowError) as error:
                raise MalformedAnswerError(f"$scalar: {error}") from None
        if tag == "$frame":
            return self._frame(body, depth)
        if tag == "$series":
            index, data = self._list(body.get("index"), depth), self._list(body.get("data"), depth)
            if len(index) != len(data):
                raise MalformedAnswerError("$series index and data differ in length")
            return pd.Series(
                self._column(data, body.get("dtype")), index=index, name=self._label(body, depth)
            )
        raise MalformedAnswerError(f"unknown tag {tag!r}")

    def _label(self, body: dict, depth: int) -> Any:
        name = self.read(body.get("name"), depth)
        if not (name is None or isinstance(name, (str, int, float))):
            raise MalformedAnswerError("a label that is not a string or number")
        return name

    def _list(self, node: Any, depth: int) -> list:
        if not isinstance(node, list):
            raise MalformedAnswerError("expected a list")
        return [self.read(item, depth) for item in node]

    def _array(self, body: dict, depth: int) -> np.ndarray:
        dtype, shape, data = body.get("dtype"), body.get("shape"), body.get("data")
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
            raise MalformedAnswerError("$array shape must be a list of sizes")
        if not isinstance(data, list) or math.prod(shape) != len(data):
            raise MalformedAnswerError("$array data does not fill its shape")
        values = [self.read(item, depth) for item in data]
        if dtype in NUMERIC_DTYPES:
            if any(isinstance(v, (str, list, dict, tuple)) or v is None for v in values):
                raise MalformedAnswerError("$array of a numeric dtype holds a non-number")
        elif not (isinstance(dtype, str) and re.fullmatch(r"<U\d{1,6}", dtype)):
            raise MalformedAnswerError(f"$array of dtype {dtype!r}")
        elif any(not isinstance(v, str) for v in values):
            raise MalformedAnswerError("$array of strings holds a non-string")
        try:
            return np.array(values, dtype=dtype).reshape(shape)
        except (TypeError, ValueError, OverflowError) as error:
            raise MalformedAnswerError(f"$array: {error}") from None

    def _column(self, values: list, dtype: Any) -> Any:
        if dtype in NUMERIC_DTYPES:
            try:
                return np.array(values, dtype=dtype)
            except (TypeError, ValueError, OverflowError) as error:
                raise MalformedAnswerError(f"column of dtype {dtype}: {error}") from None
        if any(isinstance(v, (list, dict)) for v in values):
            raise MalformedAnswerError("a table cell that is a container")
        return np.array(values, dtype=object)

    def _frame(self, body: dict, depth: int) -> pd.DataFrame:
        columns = self._list(body.get("columns"), depth)
        index = self._list(body.get("index"), depth)
        data = body.get("data")
        dtypes = body.get("dtypes")
        if not (
            isinstance(data, list) and isinstance(dtypes, list) and len(data) == len(columns) == len(dtypes)
        ):
            raise MalformedAnswerError("$frame columns, dtypes and data differ in length")
        cells = [self._list(column, depth) for column in data]
        if any(len(column) != len(index) for column in cells):
            raise MalformedAnswerError("$frame column and index differ in length")
        for label in [*columns, *index]:
            if not (label is None or isinstance(label, (str, int, float, tuple))):
                raise MalformedAnswerError("a label that is not a string, number or tuple")
        frame = pd.DataFrame(
            {
                i: self._column(column, dtype)
                for i, (column, dtype) in enumerate(zip(cells, dtypes, strict=True))
            },
            index=pd.Index(index, dtype=object) if index else None,
        )
        frame.columns = pd.Index(columns, dtype=object) if columns else frame.columns
        return frame


def from_wire(node: Any) -> Any:
    """The value a kernel's JSON describes (see :class:`_Reader`); raises :class:`MalformedAnswerError`.

    Examples
    --------
    >>> from_wire({"$array": {"dtype": "float64", "shape": [2], "data": [1.0, {"$float": "nan"}]}})
    array([ 1., nan])
    >>> from_wire({"$opaque": "__main__.AlwaysEqual"}) == 0
    False
    """
    return _Reader().read(node)


def parse_answer(text: Any, *, max_bytes: int) -> Answer:
    """Read the ``text/plain`` value of the ``take(nonce)`` user expression into an :class:`Answer`.

    Parameters
    ----------
    text : object
        What the kernel's reply holds (should be the repr of a base64 string).
    max_bytes : int
        Largest answer accepted, bytes of JSON.

    Raises
    ------
    MalformedAnswerError
        For anything but a well-formed answer within ``max_bytes``.
    """
    if not isinstance(text, str) or len(text) > 2 + 4 * (max_bytes // 3 + 1):
        raise MalformedAnswerError("no answer, or an answer over the size limit")
    found = _QUOTED_BASE64.fullmatch(text)
    if found is None or not found[1]:
        raise MalformedAnswerError("the kernel sent no answer for this request")
    try:
        raw = base64.b64decode(found[1], validate=True)
        document = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise MalformedAnswerError(f"the answer is not JSON: {type(error).__name__}") from None
    if not isinstance(document, dict) or len(document) != 1:
        raise MalformedAnswerError("the answer is not one of ok / raised / too_large")
    [(kind, body)] = document.items()
    if kind == "ok":
        return Answer(value=from_wire(body))
    if kind == "raised":
        if not isinstance(body, dict):
            raise MalformedAnswerError("raised needs an object")
        types, message = body.get("types"), body.get("message")
        if not (
            isinstance(types, list) and all(isinstance(t, str) for t in types) and isinstance(message, str)
        ):
            raise MalformedAnswerError("raised needs class names and a message")
        return Answer(raised=Raised(tuple(t[:100] for t in types[:32]), message[:300]))
    if kind == "too_large":
        raise MalformedAnswerError("the answer was over the size limit")
    raise MalformedAnswerError(f"unknown answer kind {kind!r}")
