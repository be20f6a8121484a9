"""Words for a measured comparison, chosen from the numbers of the run.

A lesson that prints "16x shorter" from a fixed template says something false the day the ratio is
below 1 ("0x shorter"). :func:`ratio_phrase` picks the direction word from the measured values, so the
printed sentence stays true whichever way the run went.
"""

from __future__ import annotations

from course_lib.core.checks import integer, positive_number

__all__ = ["ratio_phrase"]


def ratio_phrase(
    before: float,
    after: float,
    *,
    less: str = "lower",
    more: str = "higher",
    same: str = "unchanged",
    digits: int = 1,
) -> str:
    """Describe ``after`` relative to ``before`` as "N.Nx <less>" or "N.Nx <more>".

    Parameters
    ----------
    before, after : float
        Two measurements of one quantity in the same unit (latencies in ms, counts ...), both >= 0.
    less, more : str
        The word for ``after < before`` ("shorter", "lower", "faster") and for ``after > before``
        ("longer", "higher", "slower").
    same : str
        The phrase when both values print as the same ratio "1.0x" at ``digits`` decimals (or both are 0).
    digits : int
        Decimals of the ratio, >= 0.

    Returns
    -------
    str
        ``f"{before / after:.{digits}f}x {less}"`` when ``after < before``,
        ``f"{after / before:.{digits}f}x {more}"`` when ``after > before``, so the ratio is always >= 1;
        ``f"{less}, down to zero"`` when ``after == 0 < before``, ``f"{more}, up from zero"`` when ``before == 0 < after``.

    Raises
    ------
    ValueError
        If ``before`` or ``after`` is negative or not finite, or ``digits`` is negative.
    """
    before = positive_number("before", before, allow_zero=True)
    after = positive_number("after", after, allow_zero=True)
    digits = integer("digits", digits, min=0)
    if before == after:
        return same
    if after == 0:
        return f"{less}, down to zero"
    if before == 0:
        return f"{more}, up from zero"
    factor, word = (before / after, less) if after < before else (after / before, more)
    text = f"{factor:.{digits}f}"
    if float(text) == 1.0:
        return same
    return f"{text}x {word}"
