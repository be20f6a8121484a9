"""Why k6 and the course generator read different p50s below the knee: the generator with and without its spin.

Both tools time a request on the wire, from its write to its answer's last byte, yet below the knee the
course generator's p50 comes out lower than k6's. The generator's processes spin (yield to their event
loop, ``SPIN_WINDOW_S``) for the last 2 ms before each send, so each is on a CPU, awake, when its answer
arrives; k6's goroutines sleep between iterations, and waking an idle virtual CPU can take longer than
the answer. :func:`spin_comparison` runs :func:`tool_comparison` with the spin and without it
(``spin_s=0``: no spin window; the generator sleeps on its loop's timer until the send and yields to the
loop only for what remains when the timer wakes it early), the two settings taking turns, ``repeats``
times, and the tool that goes first alternating from repeat to repeat; :func:`spin_table` reads each setting's median p50 ratio (course generator /
k6) at each rate. ``benchmarks/tool_wire_p50.py`` records it in ``data/measurements/tool_wire_p50.json``,
which Lesson 6 reads.

References
----------
k6 documentation, "Built-in metrics" (``http_req_duration``). Gil Tene, "How NOT to measure latency".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from course_lib.churn.data import DATA_DIR
from course_lib.core.affinity import pinned_text
from course_lib.core.checks import distinct, integer, non_empty, number, positive_number
from course_lib.measure.capacity_record import read_rows_measurement, write_measurement
from course_lib.measure.generators import GeneratorPool
from course_lib.measure.loadgen import MIN_REQUESTS_P99, SPIN_WINDOW_S
from course_lib.measure.waterfall._tools import AGREEMENT_TOLERANCE, TOOLS, tool_agreement, tool_comparison

RECORDED_TOOL_WIRE_P50 = DATA_DIR / "measurements" / "tool_wire_p50.json"
_SCHEMA = "inference-workbook/tool-wire-p50/1"


def spin_comparison(
    pool: GeneratorPool,
    url: str,
    ids: Sequence[str],
    rates_rps: Sequence[float],
    *,
    p99_limit_ms: float,
    repeats: int = 3,
    spins_s: Sequence[float] = (SPIN_WINDOW_S, 0.0),
    min_requests: int = MIN_REQUESTS_P99,
    settle: Callable[[], object] | None = None,
) -> pd.DataFrame:
    """:func:`tool_comparison` at ``rates_rps`` with each of ``spins_s``, taking turns, ``repeats`` times.

    In repeat r the settings run in ``spins_s`` order shifted by r, each one climb (no retry: the rates are
    meant to lie below the knee), with the tool that goes first alternating by repeat (``order_shift``).
    Returns the rows of every climb with ``spin_s`` and ``repeat`` set.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For ``repeats`` < 1, no spin setting, one repeated or outside [0, 1) (``tool_comparison`` checks
        the rest).
    """
    n_repeats = integer("repeats", repeats, min=1)
    spins = distinct(
        "spins_s",
        [number("spins_s", s, min=0, max=1, max_open=True, unit="s") for s in non_empty("spins_s", spins_s)],
    )
    parts = []
    for repeat in range(n_repeats):
        shift = repeat % len(spins)
        for spin in spins[shift:] + spins[:shift]:
            rows = tool_comparison(pool, url, ids, rates_rps, p99_limit_ms=p99_limit_ms, min_requests=min_requests,
                                   repeats=1, retries=0, settle=settle, spin_s=spin, order_shift=repeat)  # fmt: skip
            parts.append(rows.assign(repeat=repeat, spin_s=spin))
    return pd.concat(parts, ignore_index=True)


def spin_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per spin setting and rate: the median over repeats of the wire p50s and of their ratio.

    Returns a DataFrame indexed by ``spin_s`` and ``rate_rps`` with ``generator_p50_ms``, ``k6_p50_ms``
    (medians of the runs that met the SLO) and ``ratio`` (``tool_agreement``'s course generator / k6,
    the median of the per-repeat ratios), ``ratio_low`` and ``ratio_high`` (their range), ``pairs``
    (repeats in which both tools met that rate).

    A setting or rate where the two tools never both met the SLO in one repeat has no row.

    Raises
    ------
    ValueError
        If ``rows`` lacks one of ``tool``, ``repeat``, ``rate_rps``, ``met``, ``p50_wire_ms`` and ``spin_s``.
    """
    missing = {"tool", "repeat", "rate_rps", "met", "p50_wire_ms", "spin_s"} - set(rows.columns)
    if missing:
        raise ValueError(f"rows lacks columns {sorted(missing)}: pass spin_comparison's table")
    out = []
    for _, part in rows.groupby("spin_s"):
        met = part[part["met"].astype(bool)]
        p50 = met.groupby(["tool", "rate_rps"])["p50_wire_ms"].median()
        pairs = met.pivot_table(
            index=["repeat", "rate_rps"], columns="tool", values="p50_wire_ms", aggfunc="first"
        )
        pairs = pairs.dropna() if set(TOOLS) <= set(pairs.columns) else pairs.iloc[0:0]
        ratio = pairs["course generator"] / pairs["k6"] if len(pairs) else pd.Series(dtype=float)
        agreed = tool_agreement(part)["p50_ratios"]
        for rate, median in agreed.items():
            per_repeat = ratio.xs(rate, level="rate_rps")
            out.append({"spin_s": float(part["spin_s"].iloc[0]), "rate_rps": rate, "generator_p50_ms": p50.get(("course generator", rate)),
                        "k6_p50_ms": p50.get(("k6", rate)), "ratio": median, "ratio_low": float(per_repeat.min()),
                        "ratio_high": float(per_repeat.max()), "pairs": len(per_repeat)})  # fmt: skip
    columns = [
        "spin_s",
        "rate_rps",
        "generator_p50_ms",
        "k6_p50_ms",
        "ratio",
        "ratio_low",
        "ratio_high",
        "pairs",
    ]
    return pd.DataFrame(out, columns=columns).set_index(["spin_s", "rate_rps"])


@dataclass(frozen=True)
class ToolWireP50Record:
    """A recorded :func:`spin_comparison` (``rows``) with its provenance (``meta``) and ``path``."""

    rows: pd.DataFrame
    meta: dict
    path: Path

    def table(self) -> pd.DataFrame:
        """:func:`spin_table` of the rows."""
        return spin_table(self.rows)

    def provenance(self) -> str:
        """Where, when and how the record was made, and its file name."""
        m = self.meta
        return (f"benchmarks/tool_wire_p50.py, {m['measured_at']} on {m['cpu']} ({m['usable_cores']} usable cores), "
                f"{m['repeats']} repeats, >= {m['min_requests']:,} requests per run, on {m['server']}"
                f"{pinned_text(m.get('pinned'))}; "
                f"file {self.path.name}")  # fmt: skip


def save_tool_wire_p50(rows: pd.DataFrame, path: str | Path = RECORDED_TOOL_WIRE_P50, **fields: Any) -> Path:
    """Write :func:`spin_comparison`'s rows with their provenance (``write_measurement``); returns the path."""
    return write_measurement(path, _SCHEMA, rows=rows.to_dict(orient="records"), **fields)


def load_tool_wire_p50(path: str | Path = RECORDED_TOOL_WIRE_P50) -> ToolWireP50Record:
    """Read a file written by :func:`save_tool_wire_p50`.

    Raises
    ------
    FileNotFoundError
        If there is no file. ValueError if it is another kind of record or its rows lack a column.
    """
    file = Path(path)
    rows, payload = read_rows_measurement(
        file, _SCHEMA, what="tool wire-p50 record",
        how_to_make="run python benchmarks/tool_wire_p50.py --out data/measurements/tool_wire_p50.json",
        columns={"tool", "repeat", "rate_rps", "met", "p50_wire_ms", "spin_s"},
    )  # fmt: skip
    return ToolWireP50Record(rows=rows, meta=payload, path=file)


def spin_verdict(table: pd.DataFrame, *, tolerance: float = AGREEMENT_TOLERANCE) -> str:
    """What :func:`spin_table`'s ``table`` shows, worded for every outcome (Lesson 6 prints it).

    Compares the setting without a spin (``spin_s`` 0) with the largest one, at the rates both have: the
    median ratios without the spin and how many lie within ``tolerance`` of 1, at how many rates every
    repeat lies above (or below) 1, at how many rates the two settings' ratio ranges do not overlap, and by
    how much the generator's own p50 moved. A table without both settings, or without a rate common to
    them, says so.

    >>> t = pd.DataFrame({"spin_s": [0.0, 0.002], "rate_rps": [500.0] * 2, "generator_p50_ms": [1.3, 0.7],
    ...                   "k6_p50_ms": [1.0, 1.0], "ratio": [1.3, 0.7], "ratio_low": [1.25, 0.65],
    ...                   "ratio_high": [1.35, 0.75], "pairs": [3, 3]}).set_index(["spin_s", "rate_rps"])
    >>> print(spin_verdict(t)[:127])
    Without the spin, the generator / k6 median ratios are 1.30 (0 of 1 within 20% of 1); every repeat lies above 1 at 1 of 1 rates
    """
    tol = positive_number("tolerance", tolerance)
    settings = sorted(set(table.index.get_level_values("spin_s"))) if len(table) else []
    if len(settings) < 2 or settings[0] != 0:
        return (f"The record holds rates both tools met for spin settings {settings} s only: comparing the spin "
                "needs 0 and another.")  # fmt: skip
    resting, spinning = table.xs(0.0), table.xs(settings[-1])
    both = resting.index.intersection(spinning.index)
    if not len(both):
        return "No rate was met by both tools in both settings: this record cannot compare the spin."
    resting, spinning = resting.loc[both], spinning.loc[both]
    within = int(((resting["ratio"] - 1).abs() <= tol).sum())
    above = int((resting["ratio_low"] > 1).sum())
    below = int((resting["ratio_high"] < 1).sum())
    apart = int(
        (
            (spinning["ratio_high"] < resting["ratio_low"]) | (spinning["ratio_low"] > resting["ratio_high"])
        ).sum()
    )
    moved_ms = float((resting["generator_p50_ms"] - spinning["generator_p50_ms"]).abs().max())
    share = moved_ms / float(spinning["generator_p50_ms"].median())
    medians = ", ".join(f"{r:.2f}" for r in resting["ratio"])
    return (
        f"Without the spin, the generator / k6 median ratios are {medians} ({within} of {len(both)} within {tol:.0%} "
        f"of 1); every repeat lies above 1 at {above} of {len(both)} rates and below 1 at {below}. " + (
            f"At {apart} of {len(both)} rates the two settings' ranges do not overlap, and the generator's own p50 "
            f"moved by up to {moved_ms:.2f} ms ({share:.0%} of its median p50 with the spin): how a client waits "
            "for its answer is inside the p50 it reports." if apart
            else "The two settings' ranges overlap at every rate: this record does not show the spin to matter."
        )
    )  # fmt: skip
