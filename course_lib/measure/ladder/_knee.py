"""The one knee reader: per climb, the highest rung met with every rung above its start met too.

:func:`knees` reads it off a climb's rows (``course_lib.measure.ladder.climb``), with the first rung that
missed every try and what the run at the knee measured; :func:`sustainable_rate` reads the same knee off
a table that no climb made (a simulator's sweep).
"""

from __future__ import annotations

import math
from typing import Any, cast

import pandas as pd

from course_lib.core.checks import number, positive_number

# -- the knee ---------------------------------------------------------------------------------------
#: Columns of the run at the knee that :func:`knees` carries (where the climb has them).
_AT_KNEE = ("offered_rps", "achieved_rps", "p99_ms", "mean_batch_size")


def _knee_row(runs: pd.DataFrame) -> dict[str, Any]:
    """The knee of one climb of one target (its rows, any order)."""
    met = runs.groupby("rate_rps", sort=True)["met_slo"].any()
    failed = met.index[~met.to_numpy().astype(bool)]
    first_fail = float(failed[0]) if len(failed) else math.nan
    passed = met.index[met.to_numpy().astype(bool) & (met.index < (first_fail if len(failed) else math.inf))]
    knee = float(passed.max()) if len(passed) else 0.0
    last = runs[runs["rate_rps"] == first_fail] if len(failed) else runs.iloc[0:0]
    upto = runs[runs["rate_rps"] <= knee] if len(passed) else runs.iloc[0:0]
    best = runs[(runs["rate_rps"] == knee) & runs["met_slo"].astype(bool)]
    row: dict[str, Any] = {"knee_rps": knee, "first_fail_rps": first_fail}
    for column in _AT_KNEE:
        if column in runs.columns:
            row[column] = float(best[column].iloc[0]) if len(best) else math.nan
    if "generator_ok" in runs.columns:
        row["generator_ok"] = bool(len(upto) and upto["generator_ok"].astype(bool).all())
        row["generator_bound"] = bool(len(last) and not last["generator_ok"].astype(bool).any())
    return row


def knees(runs: pd.DataFrame) -> pd.DataFrame:
    """The knee of every climb: per ``repeat`` and ``target`` (where the table has those columns).

    Parameters
    ----------
    runs : a climb's rows (:func:`climb`, or several concatenated): ``rate_rps`` and ``met_slo``; a
        rung counts as met if any of its tries met.

    Returns
    -------
    DataFrame, one row per (repeat, target) in the order first run, with ``repeat`` and ``target`` (where
    present), ``knee_rps`` (the highest rung met with every rung above its start met up to it; 0 if none
    was), ``first_fail_rps`` (the lowest rung that missed every try; NaN if none did: the ladder ended
    first, so the knee is only a lower bound), ``offered_rps``, ``achieved_rps``, ``p99_ms`` and
    ``mean_batch_size`` of the try that met the knee (where the rows have them; NaN without a knee),
    ``generator_ok`` (the generator kept its send-lag bound on every run up to the knee; if not, the
    knee may be the generator's) and ``generator_bound`` (the first failed rung missed with the
    generator behind on every try: the generator, not the server, may have failed it).

    Raises
    ------
    ValueError
        If ``rate_rps`` or ``met_slo`` is missing.
    """
    missing = {"rate_rps", "met_slo"} - set(runs.columns)
    if missing:
        raise ValueError(f"runs is missing columns {sorted(missing)}")
    keys = [k for k in ("repeat", "target") if k in runs.columns]
    if not keys:
        return pd.DataFrame([_knee_row(runs)])
    out = []
    for key, part in runs.groupby(keys, sort=False):
        named = dict(zip(keys, cast(tuple, key), strict=True))
        out.append({**named, **_knee_row(part)})
    return pd.DataFrame(out)


def sustainable_rate(
    table: pd.DataFrame,
    *,
    p99_limit_ms: float,
    min_achieved_fraction: float = 0.95,
    achieved_column: str = "achieved_rps",
) -> float:
    """The knee of a table of offered rates that no climb made: the highest rate met, every lower one met too.

    A row meets the SLO when its ``errors`` are 0 (a table without that column, like the simulator's,
    has none), ``p99_ms <= p99_limit_ms`` and ``achieved_column`` is at least
    ``min_achieved_fraction`` of ``offered_rps``; :func:`knees` reads the knee with ``offered_rps`` as
    the rung. Returns 0.0 if the lowest rate missed. The answer is only as fine as the sweep: the true
    limit lies between this rate and the next one measured.

    Parameters
    ----------
    table : DataFrame with ``offered_rps``, ``p99_ms`` and ``achieved_column`` (one row per rate),
        e.g. ``LoadResult.summary()`` rows or ``course_lib.simulate.batching.sweep_offered_load`` output
        (the default ``achieved_column`` names it).
    p99_limit_ms : float > 0
    min_achieved_fraction : float in (0, 1]
    achieved_column : str

    Raises
    ------
    ValueError
        For a limit that is not > 0, a fraction outside (0, 1], or a missing column.
    """
    positive_number("p99_limit_ms", p99_limit_ms)
    number("min_achieved_fraction", min_achieved_fraction, min=0, max=1, min_open=True)
    missing = [c for c in ("offered_rps", "p99_ms", achieved_column) if c not in table.columns]
    if missing:
        raise ValueError(f"table is missing columns {missing}")
    errors = table["errors"] if "errors" in table.columns else 0
    met = (
        (errors == 0)
        & (table["p99_ms"] <= p99_limit_ms)
        & (table[achieved_column] >= min_achieved_fraction * table["offered_rps"])
    )
    rungs = pd.DataFrame({"rate_rps": table["offered_rps"], "met_slo": met})
    return float(knees(rungs)["knee_rps"].iloc[0])
