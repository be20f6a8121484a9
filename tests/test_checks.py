"""course_lib.core.checks: one vocabulary, one wording; and no hand-written argument check outside it.

The second half scans ``course_lib`` with :mod:`ast` for the pattern the vocabulary replaced: an ``if``
that tests one parameter with ``isinstance``/``callable``/``isfinite``/a comparison/``not`` and raises
``ValueError``, ``TypeError`` or ``InvalidArgumentError`` with a message saying what it "must" be. A
rule that relates two arguments (``max_calls >= min_calls``) or checks data (rows, columns, a file's
schema) is not that pattern and is left alone.
"""

from __future__ import annotations

import ast
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from course_lib.core.checks import (
    InvalidArgumentError,
    callable_,
    distinct,
    instance_of,
    integer,
    integers,
    non_empty,
    number,
    one_of,
    positive_number,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"

# ------------------------------------------------------------------------------------------------
# The vocabulary
# ------------------------------------------------------------------------------------------------


def test_the_error_is_both_a_value_error_and_a_type_error():
    assert issubclass(InvalidArgumentError, ValueError) and issubclass(InvalidArgumentError, TypeError)
    with pytest.raises(TypeError):
        integer("n", "3")
    with pytest.raises(ValueError):
        integer("n", 0, min=1)


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3)])
def test_integer_accepts_every_integral_type_and_returns_an_int(value):
    out = integer("n", value, min=1)
    assert out == 3 and type(out) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "n must be an integer >= 1 and <= 10, got True"),
        (2.0, "n must be an integer >= 1 and <= 10, got 2.0"),
        (0, "n must be an integer >= 1 and <= 10, got 0"),
        (11, "n must be an integer >= 1 and <= 10, got 11"),
        ("5", "n must be an integer >= 1 and <= 10, got '5'"),
    ],
)
def test_integer_names_the_parameter_the_rule_and_the_value(value, message):
    with pytest.raises(InvalidArgumentError) as err:
        integer("n", value, min=1, max=10)
    assert str(err.value) == message


def test_bounds_are_written_as_given():
    with pytest.raises(InvalidArgumentError, match=r"n must be an integer >= 1000000, got 5"):
        integer("n", 5, min=1_000_000)
    with pytest.raises(InvalidArgumentError, match=r"x must be a finite number >= 1e-07, got 0"):
        number("x", 0, min=1e-7)


@pytest.mark.parametrize("value", [0.5, 1, np.float32(0.5), np.int64(1)])
def test_number_accepts_reals_and_returns_a_float(value):
    out = number("q", value, min=0, max=1)
    assert type(out) is float and out == float(value)


@pytest.mark.parametrize(
    ("kwargs", "value", "message"),
    [
        ({"min": 0, "min_open": True}, 0, "rate_rps must be a finite number > 0, got 0"),
        (
            {"min": 0, "max": 1, "max_open": True},
            1.0,
            "rate_rps must be a finite number >= 0 and < 1, got 1.0",
        ),
        ({}, math.nan, "rate_rps must be a finite number, got nan"),
        ({}, math.inf, "rate_rps must be a finite number, got inf"),
        ({"finite": False, "min": 0}, math.nan, "rate_rps must be a number >= 0, got nan"),
        ({}, False, "rate_rps must be a finite number, got False"),
        (
            {"unit": "requests per second"},
            "5/s",
            "rate_rps must be a finite number (requests per second), got '5/s'",
        ),
    ],
)
def test_number_refuses_with_one_message_shape(kwargs, value, message):
    with pytest.raises(InvalidArgumentError) as err:
        number("rate_rps", value, **kwargs)
    assert str(err.value) == message


def test_number_allows_an_infinity_only_when_asked():
    assert number("ttl_s", math.inf, min=0, min_open=True, finite=False) == math.inf


def test_positive_number_is_the_common_case():
    assert positive_number("delay_ms", 0, allow_zero=True) == 0.0
    with pytest.raises(InvalidArgumentError, match=r"delay_ms must be a finite number > 0, got 0"):
        positive_number("delay_ms", 0)


def test_one_of_lists_the_options_and_compares_types_exactly():
    assert one_of("method", "linear", ("nearest-rank", "linear")) == "linear"
    with pytest.raises(
        InvalidArgumentError, match=r"method must be one of 'nearest-rank', 'linear', got 'mid'"
    ):
        one_of("method", "mid", ("nearest-rank", "linear"))
    with pytest.raises(InvalidArgumentError):
        one_of("flag", 1, (True, False))  # 1 == True, but it is not the bool asked for


def test_callable_refuses_a_value():
    assert callable_("send", print) is print
    with pytest.raises(InvalidArgumentError, match=r"send must be callable, got 'print'"):
        callable_("send", "print")


def test_non_empty_refuses_an_empty_collection_and_a_non_collection():
    frame = pd.DataFrame({"a": [1]})
    assert non_empty("X", frame) is frame
    with pytest.raises(InvalidArgumentError, match=r"X must be non-empty, got an empty DataFrame"):
        non_empty("X", frame.iloc[:0])
    with pytest.raises(InvalidArgumentError, match=r"keys must be non-empty, got an empty list"):
        non_empty("keys", [])
    with pytest.raises(InvalidArgumentError, match=r"keys must be a sized collection, got 3"):
        non_empty("keys", 3)


def test_non_empty_can_ask_for_more_than_one_item():
    assert non_empty("replicas", ["a", "b"], min_items=2) == ["a", "b"]
    with pytest.raises(InvalidArgumentError, match=r"replicas must hold at least 2 items, got 1"):
        non_empty("replicas", ["a"], min_items=2)


def test_distinct_names_the_repeated_item():
    assert distinct("names", ("a", "b")) == ["a", "b"]
    with pytest.raises(InvalidArgumentError, match=r"names must not repeat an item, got 'a' twice"):
        distinct("names", ["a", "b", "a"])
    with pytest.raises(InvalidArgumentError, match=r"replicas must not repeat an item, got \[1\] twice"):
        distinct("replicas", [[1], [1]], key=repr)  # unhashable items compared by a key


def test_integers_names_the_bad_item_by_position():
    assert integers("batch_sizes", (np.int64(1), 8), min=1) == [1, 8]
    assert integers("sizes", [], min=1, allow_empty=True) == []
    with pytest.raises(InvalidArgumentError, match=r"batch_sizes\[1\] must be an integer >= 1, got 0"):
        integers("batch_sizes", [4, 0], min=1)
    with pytest.raises(InvalidArgumentError, match=r"batch_sizes must be non-empty, got an empty tuple"):
        integers("batch_sizes", (), min=1)
    with pytest.raises(InvalidArgumentError, match=r"batch_sizes must be a sequence of integers, got '12'"):
        integers("batch_sizes", "12")


def test_instance_of_names_the_class_and_the_value_type():
    assert instance_of("path", "a.onnx", (str, Path)) == "a.onnx"
    with pytest.raises(InvalidArgumentError, match=r"path must be a str or pathlib\.Path, got 3 \(int\)"):
        instance_of("path", 3, (str, Path))
    with pytest.raises(InvalidArgumentError, match=r"X must be a pandas\.DataFrame, got \[\] \(list\)"):
        instance_of("X", [], pd.DataFrame)


def test_a_long_value_is_cut():
    with pytest.raises(InvalidArgumentError) as err:
        integer("n", list(range(1000)))
    assert len(str(err.value)) < 140 and str(err.value).endswith("...")


# ------------------------------------------------------------------------------------------------
# No hand-written argument check outside core/checks.py
# ------------------------------------------------------------------------------------------------

#: Files other helpers rewrite on their branches; they convert their checks to core.checks there, and
#: the entry goes when their branch lands (the test below fails on an entry that no longer matches).
ALLOWED: dict[str, str] = {}

#: Single checks that stay hand-written, each with the reason it is not a call of core.checks.
ALLOWED_CHECKS: dict[tuple[str, str, str], str] = {
    ("course_lib/cost/options.py", "__post_init__", "price_as_of"): (
        "a date without a time: datetime.datetime is a subclass of datetime.date, so "
        "instance_of(..., datetime.date) cannot refuse it"
    ),
}

_RAISED = {"ValueError", "TypeError", "InvalidArgumentError"}
#: Calls that test one value's type or size: ``isinstance(x, int)``, ``math.isfinite(x)``, ``len(x)``.
_GUARD_CALLS = {"isinstance", "callable", "isfinite", "isnan", "isinf", "len"}


@dataclass(frozen=True)
class HandWrittenCheck:
    path: str
    line: int
    function: str
    parameter: str
    message: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line} in {self.function}(): "
            f"checks {self.parameter!r} by hand: {self.message!r}"
        )


def _literal_text(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _raise_message(stmt: ast.stmt) -> str | None:
    """The message of ``raise ValueError/TypeError/InvalidArgumentError("...must...")``, else None."""
    if not (isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call) and stmt.exc.args):
        return None
    func = stmt.exc.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    text = _literal_text(stmt.exc.args[0]) if name in _RAISED else None
    return text if text is not None and " must " in f" {text} " else None


def _clauses(test: ast.expr) -> list[ast.expr]:
    """The conditions an ``if`` joins with ``and``/``or``/``not``: ``a or not (b and c)`` -> a, b, c."""
    if isinstance(test, ast.BoolOp):
        return [c for value in test.values for c in _clauses(value)]
    if (
        isinstance(test, ast.UnaryOp)
        and isinstance(test.op, ast.Not)
        and not isinstance(test.operand, ast.Name)
    ):
        return _clauses(test.operand)
    return [test]


class _Scanner(ast.NodeVisitor):
    """Finds ``if <one value tested>: raise ...("... must ...")`` in every function of one module.

    The tested value is a parameter, a variable of a loop over a literal list of arguments
    (``for name, value in (("a", a), ...)``), or a dataclass field in ``__post_init__``. A test that
    also reads another local name or an attribute of ``self`` relates the value to something else,
    and a test of a local computed from data checks the data; neither is counted.
    """

    def __init__(self, path: str):
        self.path = path
        self.found: list[HandWrittenCheck] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - {"self", "cls"}
        params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        local = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        loop_vars = {
            t.id
            for n in ast.walk(node)
            if isinstance(n, ast.For) and isinstance(n.iter, ast.Tuple | ast.List)
            for t in ast.walk(n.target)
            if isinstance(t, ast.Name)
        }
        fields = node.name == "__post_init__"  # a dataclass's fields are its arguments
        for stmt in ast.walk(node):
            if isinstance(stmt, ast.If):
                self._check_if(node.name, stmt, params | local, params | loop_vars, fields)
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(node)

    @staticmethod
    def _ref(node: ast.expr, names: set[str], fields: bool) -> str | None:
        """The name of the value ``node`` reads: a parameter or local, or ``self.x`` (``x`` for a field)."""
        if isinstance(node, ast.Name) and node.id in names:
            return node.id
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr if fields else f"self.{node.attr}"
        return None

    def _check_if(
        self, function: str, stmt: ast.If, names: set[str], arguments: set[str], fields: bool
    ) -> None:
        branches = [*stmt.body, *([] if stmt.orelse and isinstance(stmt.orelse[0], ast.If) else stmt.orelse)]
        messages = [m for m in map(_raise_message, branches) if m is not None]
        if not messages:
            return
        refs = {r for n in ast.walk(stmt.test) if (r := self._ref(n, names, fields))}
        tested = set()
        for clause in _clauses(stmt.test):
            operands: list[ast.expr] = []
            if isinstance(clause, ast.Call) and clause.args:  # isinstance(x, int), math.isfinite(x)
                f = clause.func
                if (
                    f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                ) in _GUARD_CALLS:
                    operands = [clause.args[0]]
            elif isinstance(clause, ast.Compare):  # x < 1, 0 <= x <= 100, len(x) < 2, x not in OPTIONS
                operands = [clause.left, *clause.comparators]
                operands = [o.args[0] if isinstance(o, ast.Call) and o.args else o for o in operands]
            elif isinstance(clause, ast.UnaryOp) and isinstance(clause.op, ast.Not):  # not x
                operands = [clause.operand]
            tested |= {
                r for o in operands if (r := self._ref(o, arguments, fields)) and not r.startswith("self.")
            }
        if len(refs) == 1 and tested == refs:
            self.found.append(HandWrittenCheck(self.path, stmt.lineno, function, refs.pop(), messages[0]))


def hand_written_checks(package: Path) -> list[HandWrittenCheck]:
    """Every single-parameter ``if ...: raise ...("... must ...")`` under ``package`` but core/checks.py."""
    found = []
    for file in sorted(package.rglob("*.py")):
        rel = file.relative_to(package.parent).as_posix()
        if rel == "course_lib/core/checks.py":
            continue
        scanner = _Scanner(rel)
        scanner.visit(ast.parse(file.read_text(encoding="utf-8"), filename=rel))
        found += scanner.found
    return found


def _not_allowed(found: list[HandWrittenCheck]) -> list[HandWrittenCheck]:
    return [
        c for c in found if c.path not in ALLOWED and (c.path, c.function, c.parameter) not in ALLOWED_CHECKS
    ]


def test_no_hand_written_argument_check_outside_core_checks():
    found = _not_allowed(hand_written_checks(PACKAGE))
    assert not found, (
        "use course_lib.core.checks (integer, integers, number, positive_number, one_of, callable_, "
        "non_empty, instance_of) instead of:\n" + "\n".join(map(str, found))
    )


def test_every_allowlist_entry_still_holds_a_hand_written_check():
    """An entry whose file was converted (or moved) must leave the list, so the list stays short."""
    found = hand_written_checks(PACKAGE)
    stale = sorted(set(ALLOWED) - {c.path for c in found})
    stale += sorted(set(ALLOWED_CHECKS) - {(c.path, c.function, c.parameter) for c in found})
    assert not stale, f"remove these allowlist entries, they match no hand-written check now: {stale}"


@pytest.fixture
def copied_package(tmp_path: Path) -> Path:
    shutil.copytree(PACKAGE, tmp_path / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "course_lib"


PLANTED = {
    "isinstance": (
        "def planted(n_rounds: int) -> int:\n"
        "    if isinstance(n_rounds, bool) or not isinstance(n_rounds, int) or n_rounds < 1:\n"
        '        raise ValueError(f"n_rounds must be an integer >= 1, got {n_rounds!r}")\n'
        "    return n_rounds\n"
    ),
    "comparison": (
        "def planted(rate_rps: float) -> float:\n"
        "    if not rate_rps > 0:\n"
        '        raise ValueError("rate_rps must be > 0")\n'
        "    return rate_rps\n"
    ),
    "emptiness": (
        "def planted(keys: list) -> list:\n"
        "    if not keys:\n"
        '        raise ValueError("keys must hold at least one key")\n'
        "    return keys\n"
    ),
    "type error in an else branch": (
        "def planted(send):\n"
        "    if callable(send):\n"
        "        return send\n"
        "    else:\n"
        '        raise TypeError(f"send must be callable, got {send!r}")\n'
    ),
    "private validator": (
        "def _check(name: str, value: float) -> float:\n"
        "    if value < 0:\n"
        '        raise ValueError(f"{name} must be >= 0, got {value}")\n'
        "    return value\n"
    ),
    "dataclass field": (
        "from dataclasses import dataclass\n\n\n"
        "@dataclass\n"
        "class Planted:\n"
        "    share: float\n\n"
        "    def __post_init__(self) -> None:\n"
        "        if not 0 < self.share < 1:\n"
        '            raise ValueError(f"share must be in (0, 1), got {self.share}")\n'
    ),
    "a loop over arguments": (
        "def planted(a_ms: float, b_ms: float) -> None:\n"
        '    for name, value in (("a_ms", a_ms), ("b_ms", b_ms)):\n'
        "        if value < 0:\n"
        '            raise ValueError(f"{name} must be >= 0 ms")\n'
    ),
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_planted_hand_written_check_is_caught(copied_package, kind):
    target = copied_package / "simulate" / "tail.py"
    target.write_text(target.read_text(encoding="utf-8") + "\n\n" + PLANTED[kind], encoding="utf-8")
    found = _not_allowed(hand_written_checks(copied_package))
    function = {"private validator": "_check", "dataclass field": "__post_init__"}.get(kind, "planted")
    assert [(c.path, c.function) for c in found] == [("course_lib/simulate/tail.py", function)]


@pytest.mark.parametrize(
    "code",
    [
        # a rule relating two arguments
        "def fine(min_calls: int, max_calls: int) -> None:\n"
        "    if max_calls < min_calls:\n"
        "        raise InvalidArgumentError(\n"
        '            f"max_calls must be >= min_calls={min_calls}, got {max_calls}"\n'
        "        )\n",
        # a data check on a local value
        "def fine(frame) -> None:\n"
        "    arr = frame.to_numpy()\n"
        "    if arr.ndim != 1:\n"
        '        raise ValueError("arrivals must be one-dimensional")\n',
        # a domain rule that is not a type, range, emptiness or callable test
        "def fine(name: str) -> str:\n"
        "    if not TOKEN.match(name):\n"
        '        raise InvalidArgumentError(f"name must be a header token, got {name!r}")\n'
        "    return name\n",
        # a state check without "must"
        "def fine(stage: str, seen: set) -> None:\n"
        "    if stage in seen:\n"
        '        raise ValueError(f"stage {stage!r} was already recorded")\n',
    ],
)
def test_what_is_not_a_hand_written_argument_check_passes(copied_package, code):
    target = copied_package / "simulate" / "tail.py"
    target.write_text(target.read_text(encoding="utf-8") + "\n\n" + code, encoding="utf-8")
    assert _not_allowed(hand_written_checks(copied_package)) == []
