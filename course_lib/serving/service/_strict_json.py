"""A strict JSON decoder for request bodies: every refusal is a ``JSONRefusedError`` with a short reason.

Python's ``json.loads`` is lenient where a service must not be, and fails with the wrong exception
where a service must answer 400: it accepts ``NaN`` and ``Infinity`` (not JSON), keeps the *last* of
two equal keys (RFC 8259 section 4 leaves duplicates undefined, so a body could be read differently by
a proxy and by us), decodes UTF-16/32 (RFC 8259 section 8.1: JSON exchanged between systems must be
UTF-8), raises ``RecursionError`` on deep nesting and ``ValueError`` on integers over 4,300 digits.

References
----------
RFC 8259, "The JavaScript Object Notation (JSON) Data Interchange Format", sections 4, 6 and 8.1.
Python documentation, "Integer string conversion length limitation".
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable


class JSONRefusedError(ValueError):
    """A body that is not acceptable JSON; the message is a short reason for the client."""


class _HookRefusalError(ValueError):
    """Raised by the parser hooks with the course's own reason."""


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            shown = key if len(key) <= 40 else key[:37] + "..."
            raise _HookRefusalError(f"key {shown!r} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> float:
    raise _HookRefusalError(f"{name} is not a JSON number")


def _bounded_number(kind: type, limit: int) -> Callable[[str], object]:
    def parse(text: str) -> object:
        if len(text) > limit:
            raise _HookRefusalError(f"a number has {len(text)} characters; the limit is {limit}")
        return kind(text)

    return parse


def _depth_exceeds(text: str, limit: int) -> bool:
    """True if brackets outside strings nest deeper than ``limit`` (a linear scan, no recursion)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def decode_json(body: bytes, *, max_depth: int = 32, max_number_chars: int = 64) -> object:
    """Decode a request body strictly: UTF-8 JSON (RFC 8259), no duplicate keys, bounded nesting and numbers.

    Parameters
    ----------
    body : bytes
        The raw request body. A leading UTF-8 byte-order mark is ignored (RFC 8259 section 8.1).
    max_depth : int
        Deepest nesting of arrays/objects accepted (checked by a linear scan before parsing, so
        Python's recursive parser never hits its recursion limit).
    max_number_chars : int
        Longest number literal accepted (Python refuses integers over 4,300 digits with a bare
        ``ValueError``).

    Returns
    -------
    The decoded value (dict, list, str, int, float, bool or None).

    Raises
    ------
    JSONRefusedError
        With a short reason: not UTF-8, not JSON, nested too deeply, a number too long,
        ``NaN``/``Infinity``, or a key that appears twice in one object (the message names the key).
    """
    if body.startswith(codecs.BOM_UTF8):
        body = body[len(codecs.BOM_UTF8) :]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONRefusedError(f"request body is not valid JSON: not UTF-8 at byte {exc.start}") from None
    if _depth_exceeds(text, max_depth):
        raise JSONRefusedError(f"request body is not valid JSON for this API: nested deeper than {max_depth}")
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicate_keys,
            parse_constant=_no_constant,
            parse_int=_bounded_number(int, max_number_chars),
            parse_float=_bounded_number(float, max_number_chars),
        )
    except _HookRefusalError as exc:
        raise JSONRefusedError(f"request body is not valid JSON for this API: {exc}") from None
    except json.JSONDecodeError as exc:
        raise JSONRefusedError(f"request body is not valid JSON: {exc}") from None
    except (ValueError, RecursionError):  # belt and braces: never a 500 from the parser
        raise JSONRefusedError("request body is not valid JSON") from None
