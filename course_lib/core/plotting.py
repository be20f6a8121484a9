"""Small plotting aids shared by the lessons: readable tick labels on log axes.

Matplotlib labels a log axis only at powers of ten, so a latency histogram spanning 0.4 to 3 ms shows
a single label ("10^0") or none. :func:`log_ticks` picks round values (1-2-5, refined to 1-1.5-2-3-5-7
when the range is narrow) that fall inside the data, and :func:`set_log_ticks` applies them as plain
numbers (thousands separators from 10,000 up, never "1e+06"). A wide range can ask for at most
``max_ticks`` labels: the 1-2-5 series is then thinned to 1-3 per decade, then to the powers of ten.
"""

from __future__ import annotations

import math
from typing import Any

from course_lib.core.checks import InvalidArgumentError, integer, one_of

__all__ = ["log_ticks", "set_log_ticks", "tick_label"]

_COARSE = (1.0, 2.0, 5.0)
_FINE = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
_THINNER = ((1.0, 3.0), (1.0,))


def _series_ticks(low: float, high: float, series: tuple[float, ...]) -> list[float]:
    return [
        round(m * 10.0**d, 12)
        for d in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        for m in series
        if low <= m * 10.0**d <= high
    ]


def log_ticks(low: float, high: float, *, min_ticks: int = 4, max_ticks: int | None = None) -> list[float]:
    """Round tick values in [low, high] for a log axis, at least ``min_ticks`` of them where possible.

    Parameters
    ----------
    low, high : float, 0 < low <= high (e.g. the smallest and largest latency in ms).
    min_ticks : int >= 2
    max_ticks : int >= 2, optional
        At most this many labels (a wide range on a narrow axis): the series is thinned to 1-3 per
        decade, then to the powers of ten alone, as long as two labels remain. Default: no limit.

    Returns
    -------
    list of float, increasing; the 1-2-5 series per decade, or the finer 1-1.5-2-3-5-7 series when
    the coarse one leaves fewer than ``min_ticks`` values in range; [low, high] themselves if even
    the fine series has fewer than two.

    Raises
    ------
    ValueError
        If ``low`` is not positive, ``high`` < ``low``, or ``max_ticks`` is below 2.
    """
    if not (math.isfinite(low) and math.isfinite(high)) or low <= 0 or high < low:
        raise InvalidArgumentError(f"need 0 < low <= high (finite), got low={low!r}, high={high!r}")
    if max_ticks is not None:
        integer("max_ticks", max_ticks, min=2)
    ticks: list[float] = []
    for series in (_COARSE, _FINE):
        ticks = _series_ticks(low, high, series)
        if len(ticks) >= min_ticks:
            break
    else:
        return ticks if len(ticks) >= 2 else [low, high]
    for thinner in _THINNER:
        if max_ticks is None or len(ticks) <= max_ticks:
            break
        thinned = _series_ticks(low, high, thinner)
        if len(thinned) < 2:  # a narrow range: keep two labels rather than honour the limit
            break
        ticks = thinned
    return ticks


def tick_label(value: float) -> str:
    """A plain-number tick label: ``0.05``, ``500``, ``5000``, ``10,000``, ``1,000,000`` (never ``1e+06``)."""
    return f"{value:,.0f}" if value >= 10_000 and value == int(value) else f"{value:g}"


def set_log_ticks(
    ax: Any, low: float, high: float, *, axis: str = "x", min_ticks: int = 4, max_ticks: int | None = None
) -> list[float]:
    """Put :func:`log_ticks` on ``ax``'s ``axis`` ("x" or "y"), labelled by :func:`tick_label`.

    Minor tick labels are turned off. Returns the ticks placed.
    """
    from matplotlib.ticker import NullFormatter  # noqa: PLC0415 (heavy optional dependency)

    one_of("axis", axis, ("x", "y"))
    ticks = log_ticks(low, high, min_ticks=min_ticks, max_ticks=max_ticks)
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xticks if axis == "x" else ax.set_yticks)(ticks, [tick_label(t) for t in ticks])
    target.set_minor_formatter(NullFormatter())
    return ticks
