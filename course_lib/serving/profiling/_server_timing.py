"""The ``Server-Timing`` HTTP header: stage durations written by a server and read by its client.

One concept: the header's syntax, ``name;dur=<ms>`` entries joined by commas. A server reports where
a request's time went (parse, lookup, forward, format) in the answer itself, and a client or a browser's
developer tools read it back; :func:`format_server_timing` writes it, :func:`parse_server_timing` reads
it (also other servers' headers). Metric names are RFC 9110 tokens; durations are finite
milliseconds >= 0.

References
----------
W3C, "Server Timing" (Working Draft), section "The Server-Timing header field".
IETF RFC 9110, section 5.6.2 "Tokens".
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from course_lib.core.checks import InvalidArgumentError, instance_of, positive_number

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 token: a valid metric name


_CHECKED: set[str] = set()  # names already found valid: every request of a server times the same few stages
_CHECKED_MAX = 1024


def check_metric_name(name: object, *, what: str = "metric name") -> str:
    """Return ``name`` if it is a header token (RFC 9110 ``token``).

    Valid names are remembered (a server times the same few stages on every request), so a repeated
    name costs one set lookup.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        Naming ``what`` and the value: a non-str, an empty string or a character outside the token set.
    """
    if type(name) is str and name in _CHECKED:
        return name
    name = instance_of(what, name, str)
    if not _TOKEN.match(name):
        raise InvalidArgumentError(
            f"{what} must be a non-empty token of letters, digits or !#$%&'*+-.^_`|~ "
            f"(it becomes a Server-Timing metric name), got {name!r}"
        )
    if type(name) is str and len(_CHECKED) < _CHECKED_MAX:
        _CHECKED.add(name)
    return name


def format_server_timing(stages_ms: Mapping[str, float], *, decimals: int = 3) -> str:
    """Format stage durations as a ``Server-Timing`` header value.

    Parameters
    ----------
    stages_ms : mapping of str -> float
        Metric name (a token) -> duration in milliseconds.
    decimals : int
        Digits after the decimal point (3 = microsecond resolution).

    Returns
    -------
    str
        ``name;dur=1.234`` entries joined by ``", "``.

    Raises
    ------
    ValueError
        For a name that is not a token or a negative/non-finite duration.

    References
    ----------
    W3C, "Server Timing", section "The Server-Timing header field".
    """
    entries = []
    for name, ms in stages_ms.items():
        metric = check_metric_name(name)
        dur_ms = positive_number(f"stages_ms[{name!r}]", ms, allow_zero=True)
        entries.append(f"{metric};dur={dur_ms:.{decimals}f}")
    return ", ".join(entries)


def parse_server_timing(header: str) -> dict[str, float]:
    """Parse a ``Server-Timing`` header value into {name: duration_ms}.

    Every metric must carry a ``dur`` parameter (other parameters such as ``desc`` are ignored), so a
    stage can never vanish silently. Optional whitespace around ``;`` and ``=`` is allowed, as in the
    W3C grammar (``db; dur = 53`` is 53.0 ms). Quoted parameter values holding commas are not supported (they
    raise rather than being mis-read).

    Returns
    -------
    dict of str -> float
        Metric name -> duration in ms, in header order.

    Raises
    ------
    ValueError
        If an entry has no valid name, no ``dur`` parameter, a ``dur`` that is not a number, or a
        name appears twice.
    TypeError
        If ``header`` is not a string.
    """
    instance_of("header", header, str)
    out: dict[str, float] = {}
    for entry in (part.strip() for part in header.split(",")):
        if not entry:
            continue
        name, *params = (p.strip() for p in entry.split(";"))
        if not _TOKEN.match(name):
            raise ValueError(f"Server-Timing entry {entry!r} has no valid metric name")
        # W3C Server Timing grammar: param = name OWS "=" OWS value, params joined by OWS ";" OWS.
        pairs = [p.partition("=") for p in params]
        durations = [
            value.strip().strip('"') for key, eq, value in pairs if eq and key.strip().lower() == "dur"
        ]
        if not durations:
            raise ValueError(f"Server-Timing entry {entry!r} has no dur=<ms> parameter")
        try:
            value = float(durations[0])
        except ValueError:
            raise ValueError(f"Server-Timing entry {entry!r} has a dur that is not a number") from None
        if name in out:
            raise ValueError(f"Server-Timing metric {name!r} appears twice in {header!r}")
        out[name] = value
    return out
