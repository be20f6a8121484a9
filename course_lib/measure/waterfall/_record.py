"""The service waterfall's record: written by ``benchmarks/service_waterfall.py``, read by Lessons 5, 6 and 12.

``save_waterfall`` writes a waterfall table (one row per step: knees per repeat, their median and range,
the ratio to the base with its interval and verdict, the in-process ceiling) with its provenance
(``course_lib.measure.capacity_record.write_measurement``) to ``data/measurements/service_waterfall.json``
(:data:`RECORDED_WATERFALL`); ``load_waterfall`` reads it back as a :class:`WaterfallRecord`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from course_lib.churn.data import DATA_DIR
from course_lib.core.affinity import pinned_text
from course_lib.measure.capacity_record import read_measurement, write_measurement

RECORDED_WATERFALL = DATA_DIR / "measurements" / "service_waterfall.json"
_SCHEMA = "inference-workbook/service-waterfall/1"


@dataclass(frozen=True)
class WaterfallRecord:
    """A recorded waterfall: ``configs`` (one row per step, as :func:`lever_table` plus ``server``,
    ``path``, ``handle_ms``, ``workers``, ``ceiling_rps``), the other fields in ``meta``, and ``path``."""

    configs: pd.DataFrame
    meta: dict
    path: Path

    @property
    def floor_rps(self) -> float:
        return float(self.meta["floor_rps"])

    @property
    def prototype_rps(self) -> float:
        return float(self.meta["prototype_rps"])

    @property
    def production_rps(self) -> float:
        return float(self.meta["production_rps"])

    def provenance(self) -> str:
        m = self.meta
        return (
            f"benchmarks/service_waterfall.py, {m['measured_at']} on {m['cpu']} ({m['usable_cores']} usable cores), "
            f"{m['repeats']} repeats, >= {m['min_requests']:,} requests per rung, p99 limit {m['p99_limit_ms']:g} ms, "
            f"generator {m['generator']}{pinned_text(m.get('pinned'))}; file {self.path.name}"
        )


def _plain(value: Any) -> Any:
    """A JSON-ready value: numpy scalars to Python, NaN and infinities to None (an open end)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(float(value)) else float(value)
    return value


def table_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """A table indexed by name as JSON-ready rows ``{"name": ..., column: value, ...}`` (NaN/inf -> None)."""
    return [
        {"name": str(name), **{str(k): _plain(v) for k, v in row.items()}} for name, row in table.iterrows()
    ]


def table_from_rows(rows: list[dict[str, Any]], numeric: tuple[str, ...]) -> pd.DataFrame:
    """:func:`table_rows` read back, indexed by name; the ``numeric`` columns as floats (None -> NaN)."""
    table = pd.DataFrame(rows).set_index("name") if rows else pd.DataFrame()
    for column in numeric:
        if column in table:
            table[column] = pd.to_numeric(table[column], errors="coerce")
    return table


def save_waterfall(
    configs: pd.DataFrame,
    path: str | Path = RECORDED_WATERFALL,
    *,
    floor_step: str,
    prototype_step: str,
    production_step: str,
    **fields: Any,
) -> Path:
    """Write a waterfall (``configs`` as in :class:`WaterfallRecord`) with its provenance as JSON.

    ``floor_rps``, ``prototype_rps`` and ``production_rps`` are the median knees of the named steps;
    ``fields`` (``generator``, ``p99_limit_ms``, ``repeats``, ``min_requests``, ``ladder_rps``, ...) are
    stored as given.
    """

    rows = table_rows(configs)
    median = configs["median_knee_rps"]
    return write_measurement(
        path,
        _SCHEMA,
        floor_rps=float(median[floor_step]),
        prototype_rps=float(median[prototype_step]),
        production_rps=float(median[production_step]),
        floor_step=floor_step,
        prototype_step=prototype_step,
        production_step=production_step,
        **{k: _plain(v) if not isinstance(v, (dict, str)) else v for k, v in fields.items()},
        configs=rows,
    )


def load_waterfall(path: str | Path = RECORDED_WATERFALL) -> WaterfallRecord:
    """Read a file written by :func:`save_waterfall`.

    Raises
    ------
    FileNotFoundError
        If there is no file (run ``python benchmarks/service_waterfall.py --out FILE``).
    ValueError
        If the file is not a service-waterfall record.
    """
    file = Path(path)
    payload = read_measurement(
        file,
        _SCHEMA,
        what="a service-waterfall record",
        how_to_make="run python benchmarks/service_waterfall.py --out FILE",
    )
    numeric = (
        "ratio_to_base",
        "ratio_low",
        "ratio_high",
        "ceiling_rps",
        "handle_ms",
        "median_first_fail_rps",
    )
    configs = table_from_rows(payload["configs"], numeric)  # an open end (stored as null) reads back as NaN
    return WaterfallRecord(configs, {k: v for k, v in payload.items() if k != "configs"}, file)
