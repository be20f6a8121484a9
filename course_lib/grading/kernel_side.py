"""What the grader runs inside a grading kernel: one request in, one answer of plain JSON out.

The grader (:mod:`course_lib.grading.calls`) drives a student's kernel with requests of three kinds and
reads back only data:

* ``call``: call one of the student's functions (``"fast_scorer"``, or a dotted path such as
  ``"baseline.score"``) with arguments the grader chose;
* ``eval``: evaluate a grader-written expression in the notebook's namespace (``"DOMINANT_STAGE"``);
* ``run``: run a grader-written ``check(ns, *args)`` function (a scenario with the grader's own fake
  replicas, for instance) with the notebook's namespace as ``ns``.

Arguments arrive as JSON with a few tags (:func:`decode`: arrays, frames, tuples, grader-written
lambdas). The answer, or the exception the call raised (its class names and a short message), is
encoded by :func:`encode` into JSON of numbers, strings, lists and dicts with the same tags, and kept
under the request's random ``nonce`` until the grader's ``user_expressions`` takes it (:func:`take`).
Output the call prints is discarded.

Nothing here is trusted: student code runs in this interpreter and can patch this module. It can
therefore change what comes back, but only to other *values*; the grader checks their types on
arrival and compares them with answers it computed itself, outside the kernel. This module imports
only the standard library (numpy and pandas are used when the notebook has imported them).
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import inspect
import io
import json
import math
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_ITEMS", "decode", "encode", "float_tag", "serve", "serve_async", "take"]

#: Most numbers, strings and containers in one answer; beyond it the answer is "too large".
MAX_ITEMS = 500_000
_ANSWERS: dict[str, str] = {}


class _TooLargeError(Exception):
    pass


def _modules():
    return sys.modules.get("numpy"), sys.modules.get("pandas")


def _charge(budget: list[int], items: int) -> None:
    """Take ``items`` from an answer's budget (:data:`MAX_ITEMS` at the start); past it, too large."""
    budget[0] -= items
    if budget[0] < 0:
        raise _TooLargeError


def float_tag(value: float) -> Any:
    """A float as the wire carries it: itself, or ``{"$float": "nan" | "inf" | "-inf"}`` (JSON has no
    non-finite numbers). The grader's side (:func:`course_lib.grading.wire.to_wire`) uses it too.

    Examples
    --------
    >>> float_tag(1.5), float_tag(float("-inf"))
    (1.5, {'$float': '-inf'})
    """
    if math.isnan(value):
        return {"$float": "nan"}
    if math.isinf(value):
        return {"$float": "inf" if value > 0 else "-inf"}
    return value


def encode(value: Any, budget: list[int] | None = None) -> Any:
    """``value`` as JSON data: exact built-in types as themselves, numpy and pandas objects tagged.

    Anything else becomes ``{"$opaque": "<module>.<type>"}``; subclasses of built-in types (an
    ``int`` that equals everything) are opaque too.

    Examples
    --------
    >>> encode((1, 2.5, float("nan"), "a", None, True))
    {'$tuple': [1, 2.5, {'$float': 'nan'}, 'a', None, True]}
    >>> encode({1: [2]})
    {'$dict': [[1, [2]]]}
    """
    budget = [MAX_ITEMS] if budget is None else budget
    _charge(budget, 1)
    kind = type(value)
    if value is None or kind in (bool, int, str):
        if kind is str:
            budget[0] -= len(value) // 64
        return value
    if kind is float:
        return float_tag(value)
    if kind in (list, tuple):
        items = [encode(item, budget) for item in value]
        return items if kind is list else {"$tuple": items}
    if kind is dict:
        if all(type(key) is str and not key.startswith("$") for key in value):
            return {key: encode(item, budget) for key, item in value.items()}
        return {"$dict": [[encode(key, budget), encode(item, budget)] for key, item in value.items()]}
    np, pd = _modules()
    if np is not None and kind is np.ndarray:
        _charge(budget, value.size)
        data = [encode(item, budget) for item in value.ravel().tolist()]
        return {"$array": {"dtype": str(value.dtype), "shape": list(value.shape), "data": data}}
    if np is not None and isinstance(value, np.generic) and kind.__module__ == "numpy":
        return {"$scalar": {"dtype": str(value.dtype), "value": encode(value.item(), budget)}}
    if pd is not None and kind is pd.DataFrame:
        _charge(budget, value.size)
        return {
            "$frame": {
                "columns": [encode(_plain(c), budget) for c in value.columns],
                "index": [encode(_plain(i), budget) for i in value.index],
                "dtypes": [str(dtype) for dtype in value.dtypes],
                "data": [
                    [encode(_plain(v), budget) for v in value.iloc[:, j]] for j in range(value.shape[1])
                ],
            }
        }
    if pd is not None and kind is pd.Series:
        _charge(budget, value.size)
        return {
            "$series": {
                "index": [encode(_plain(i), budget) for i in value.index],
                "name": encode(_plain(value.name), budget),
                "dtype": str(value.dtype),
                "data": [encode(_plain(v), budget) for v in value],
            }
        }
    return {"$opaque": f"{kind.__module__}.{kind.__qualname__}"}


def _plain(value: Any) -> Any:
    """numpy scalars inside frames as Python numbers (a frame's cells are not graded by type)."""
    np, _ = _modules()
    if np is not None and isinstance(value, np.generic):
        return value.item()
    return value


def _grader_namespace() -> dict:
    namespace: dict[str, Any] = {"__builtins__": builtins, "math": math}
    np, pd = _modules()
    for name in ("numpy", "pandas", "asyncio"):
        with contextlib.suppress(ImportError):
            namespace[name] = __import__(name)
    namespace["np"], namespace["pd"] = namespace.get("numpy", np), namespace.get("pandas", pd)
    return namespace


def decode(value: Any) -> Any:
    """The grader's JSON arguments as Python objects (the inverse of :func:`encode`, plus ``$code``).

    Examples
    --------
    >>> decode({"$tuple": [1, {"$float": "inf"}]})
    (1, inf)
    >>> decode({"$code": "lambda size: 1.0"})(8)
    1.0
    """
    if isinstance(value, list):
        return [decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1 or not next(iter(value)).startswith("$"):
        return {key: decode(item) for key, item in value.items()}
    [(tag, body)] = value.items()
    if tag == "$float":
        return float(body)
    if tag == "$tuple":
        return tuple(decode(item) for item in body)
    if tag == "$dict":
        return {decode(key): decode(item) for key, item in body}
    if tag == "$code":
        return eval(body, _grader_namespace())  # the grader's own source, never the kernel's
    if tag == "$array":
        import numpy as np  # noqa: PLC0415 (subprocess entry point: runs in the student kernel)

        return np.array(decode(body["data"]), dtype=body["dtype"]).reshape(body["shape"])
    if tag == "$records":
        import pandas as pd  # noqa: PLC0415 (subprocess entry point: runs in the student kernel)

        return pd.DataFrame(decode(body))
    if tag == "$frame":
        import pandas as pd  # noqa: PLC0415 (subprocess entry point: runs in the student kernel)

        frame = pd.DataFrame({i: decode(column) for i, column in enumerate(body["data"])})
        frame.columns = decode(body["columns"])
        if "index" in body:
            frame.index = decode(body["index"])
        return frame.astype(dict(zip(frame.columns, body.get("dtypes", []), strict=False)))
    raise ValueError(f"unknown tag {tag!r}")


def _namespace() -> dict:
    """The notebook's namespace (IPython's user namespace, else ``__main__``'s)."""
    try:
        from IPython import get_ipython  # noqa: PLC0415 (subprocess entry point: runs in the student kernel)

        shell = get_ipython()
    except ImportError:  # pragma: no cover - a kernel always has IPython
        shell = None
    return shell.user_ns if shell is not None else vars(sys.modules["__main__"])


def _resolve(ns: dict, target: str) -> Any:
    head, *rest = target.split(".")
    if head not in ns:
        raise NameError(f"name {head!r} is not defined")
    found = ns[head]
    for name in rest:
        found = getattr(found, name)
    return found


class _ArgsAfter:
    """A call's result with its arguments as they are after the call (``return_args``)."""

    def __init__(self, result: Any, args: list) -> None:
        self.result, self.args = result, args


def _run(request: dict) -> Any:
    ns = _namespace()
    args = decode(request.get("args", []))
    kwargs = decode(request.get("kwargs", {}))
    op = request["op"]
    if op == "call" and request.get("return_args"):  # the arguments after the call: did it change them?
        return _ArgsAfter(_resolve(ns, request["target"])(*args, **kwargs), args)
    if op == "call":
        return _resolve(ns, request["target"])(*args, **kwargs)
    if op == "eval":
        return eval(request["source"], ns)
    if op == "run":
        scope = _grader_namespace()
        exec(request["source"], scope)
        return scope["check"](ns, *args, **kwargs)
    raise ValueError(f"unknown op {op!r}")


def _raised(error: BaseException) -> dict:
    try:
        message = str(error)[:300]
    except Exception:
        message = "<unprintable>"
    return {"types": [c.__name__ for c in type(error).__mro__], "message": message}


def _keep(request: dict, answer: dict) -> None:
    text = json.dumps(answer, allow_nan=False)
    if len(text) > int(request.get("max_bytes", 8 * 1024**2)):
        text = json.dumps({"too_large": len(text)})
    _ANSWERS[request["nonce"]] = base64.b64encode(text.encode()).decode("ascii")


@contextlib.contextmanager
def _answering(request: dict) -> Iterator[list]:
    """Run the ``with`` body with its output discarded and keep ``request``'s answer.

    The body appends its result to the yielded list; the answer is ``{"ok": encode(result)}``, or
    ``{"too_large": ...}``, or ``{"raised": ...}`` when the body raised (``KeyboardInterrupt``, the
    grader's interrupt, propagates).
    """
    sink = io.StringIO()
    results: list = []
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield results
        answer: dict = {"ok": encode(results[0])}
    except _TooLargeError:
        answer = {"too_large": MAX_ITEMS}
    except (Exception, SystemExit) as error:  # the student's exception is the answer
        answer = {"raised": _raised(error)}
    _keep(request, answer)


def serve(request_text: str) -> None:
    """Run one request (JSON text) and keep its answer for :func:`take`; prints nothing.

    ``KeyboardInterrupt`` (the grader's interrupt when a call runs past its time) propagates, so the
    grader sees the request fail; any other exception of the call becomes the answer
    ``{"raised": {"types": [...], "message": ...}}``. An awaitable result is an error here: the grader
    sends requests into ``async`` functions through :func:`serve_async`.
    """
    request = json.loads(request_text)
    with _answering(request) as results:
        result = _run(request)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError("the call returned an awaitable (an async function)")
        if isinstance(result, _ArgsAfter):
            result = (result.result, result.args)
        results.append(result)


async def serve_async(request_text: str) -> None:
    """:func:`serve` for calls that return an awaitable (``async def`` functions): awaits it.

    The grader awaits this at the top level of a cell (IPython's autoawait). A blocking call inside
    cannot be interrupted there (asyncio turns the interrupt into a cancellation, which waits for
    the next ``await``); the grader then replaces the kernel.
    """
    request = json.loads(request_text)
    with _answering(request) as results:
        result = _run(request)
        if inspect.isawaitable(result):
            result = await result
        results.append(result)


def take(nonce: str) -> str:
    """The answer kept for ``nonce`` (base64 of its JSON), removed; ``""`` if there is none."""
    return _ANSWERS.pop(nonce, "")
