"""Why k6 and the course generator read different p50s below the knee: the generator with and without its spin.

Both tools time a request on the wire, from its write to its answer's last byte, yet below the knee the
course generator's p50 comes out lower than k6's. The generator's processes spin (yield to their event
loop, ``SPIN_WINDOW_S``) for the last 2 ms before each send, so each is on a CPU, awake, when its answer
arrives; k6's goroutines sleep between iterations, and waking an idle virtual CPU can take longer than
the answer. :func:`spin_comparison` runs :func:`tool_comparison` with the spin and without it
(``spin_s=0``: the generator then sleeps on its loop's timer alone, like k6), the two settings taking
turns, ``repeats`` times; :func:`spin_table` reads each setting's median p50 ratio (course generator /
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
from course_lib.core.checks import integer, non_empty, number
from course_lib.measure.capacity_record import read_rows_measurement, write_measurement
from course_lib.measure.generators import GeneratorPool
from course_lib.measure.loadgen import SPIN_WINDOW_S
from course_lib.measure.waterfall._climb import MIN_REQUESTS_P99
from course_lib.measure.waterfall._tools import tool_agreement, tool_comparison

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
    meant to lie below the knee). Returns the rows of every climb with ``spin_s`` and ``repeat`` set.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For ``repeats`` < 1, no spin setting or a negative one (``tool_comparison`` checks the rest).
    """
    n_repeats = integer("repeats", repeats, min=1)
    spins = [number("spins_s", s, min=0, unit="s") for s in non_empty("spins_s", spins_s)]
    parts = []
    for repeat in range(n_repeats):
        shift = repeat % len(spins)
        for spin in spins[shift:] + spins[:shift]:
            rows = tool_comparison(pool, url, ids, rates_rps, p99_limit_ms=p99_limit_ms, min_requests=min_requests,
                                   repeats=1, retries=0, settle=settle, spin_s=spin)  # fmt: skip
            parts.append(rows.assign(repeat=repeat, spin_s=spin))
    return pd.concat(parts, ignore_index=True)


def spin_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per spin setting and rate: the median over repeats of the wire p50s and of their ratio.

    Returns a DataFrame indexed by ``spin_s`` and ``rate_rps`` with ``generator_p50_ms``, ``k6_p50_ms``
    (medians of the runs that met the SLO) and ``ratio`` (``tool_agreement``'s course generator / k6,
    the median of the per-repeat ratios), ``ratio_low`` and ``ratio_high`` (their range), ``pairs``
    (repeats in which both tools met that rate).

    Raises
    ------
    ValueError
        If ``rows`` lacks ``spin_s`` (or a column ``tool_agreement`` needs).
    """
    if "spin_s" not in rows.columns:
        raise ValueError("rows has no spin_s column: pass spin_comparison's table")
    out = []
    for _, part in rows.groupby("spin_s"):
        met = part[part["met"].astype(bool)]
        p50 = met.groupby(["tool", "rate_rps"])["p50_wire_ms"].median()
        pairs = met.pivot_table(
            index=["repeat", "rate_rps"], columns="tool", values="p50_wire_ms", aggfunc="first"
        )
        pairs = pairs.dropna()
        ratio = pairs["course generator"] / pairs["k6"] if len(pairs) else pd.Series(dtype=float)
        agreed = tool_agreement(part)["p50_ratios"]
        for rate, median in agreed.items():
            per_repeat = ratio.xs(rate, level="rate_rps")
            out.append({"spin_s": float(part["spin_s"].iloc[0]), "rate_rps": rate, "generator_p50_ms": p50.get(("course generator", rate)),
                        "k6_p50_ms": p50.get(("k6", rate)), "ratio": median, "ratio_low": float(per_repeat.min()),
                        "ratio_high": float(per_repeat.max()), "pairs": len(per_repeat)})  # fmt: skip
    return pd.DataFrame(out).set_index(["spin_s", "rate_rps"])


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
                f"{m['repeats']} repeats, >= {m['min_requests']:,} requests per run, on {m['server']}; "
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
