"""Lesson 3's measured HTTP capacity, written to a file so that Lesson 5 reads it instead of a typed number.

Lesson 3 load-tests four churn servers over HTTP (native XGBoost and ONNX Runtime, each with one call
per request and with dynamic batching) and finds the highest rate each sustains within a p99 limit.
:func:`save_http_capacity` writes that table, the limit, the rate ladder and the run's provenance
(time, CPU, usable cores) to JSON; :func:`load_http_capacity` reads it back. Each run of Lesson 3
writes ``build/lesson3/http_capacity.json`` (:data:`LESSON3_RECORD`); the release's recorded run is
``data/measurements/http_capacity.json`` (:data:`RECORDED_HTTP_CAPACITY`), the same run as Lesson 3's
committed outputs, which Lesson 5 names beside the service waterfall. :func:`write_measurement` and
:func:`read_measurement` are the record format itself (schema + provenance + fields), shared with the
other recorded benchmarks (``course_lib.measure.waterfall``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pandas as pd

from course_lib.churn.data import DATA_DIR
from course_lib.core.env import env_report
from course_lib.core.files import atomic_write_text

__all__ = [
    "LESSON3_RECORD",
    "RECORDED_HTTP_CAPACITY",
    "HttpCapacityRecord",
    "load_http_capacity",
    "read_measurement",
    "save_http_capacity",
    "write_measurement",
]

LESSON3_RECORD = DATA_DIR.parent / "build" / "lesson3" / "http_capacity.json"
RECORDED_HTTP_CAPACITY = DATA_DIR / "measurements" / "http_capacity.json"
_SCHEMA = "inference-workbook/http-capacity/1"
_COLUMNS = ("sustained_rps", "first_failed_rps", "p99_ms")


@dataclass(frozen=True)
class HttpCapacityRecord:
    """Sustained requests/s per (runtime, target) server within ``p99_limit_ms``, with provenance."""

    capacity: pd.DataFrame  # index (runtime, target); columns sustained_rps, first_failed_rps, p99_ms
    p99_limit_ms: float
    ladder_rps: list[float]
    measured_at: str
    cpu: str
    usable_cores: int
    path: Path

    def lowest_sustained(self) -> tuple[tuple[str, str], float]:
        """The server that sustained the least, and its rate: a conservative end-to-end capacity."""
        sustained = self.capacity["sustained_rps"]
        return cast(tuple[str, str], sustained.idxmin()), float(sustained.min())  # index (runtime, target)

    def provenance(self) -> str:
        return (
            f"Lesson 3's HTTP load test, {self.measured_at} on {self.cpu} "
            f"({self.usable_cores} usable cores), "
            f"p99 limit {self.p99_limit_ms:g} ms, ladder {self.ladder_rps} req/s; file {self.path.name}"
        )


def save_http_capacity(
    capacity: pd.DataFrame, path: str | Path = LESSON3_RECORD, *, p99_limit_ms: float, ladder_rps: list[float]
) -> Path:
    """Write a ``capacity_table`` concatenated over runtimes (index (runtime, target)) as JSON.

    Raises
    ------
    ValueError
        If the index is not two levels (runtime, target) or a needed column is missing.
    """
    if capacity.index.nlevels != 2:
        raise ValueError(
            "capacity must be indexed by (runtime, target): pd.concat({runtime: table}) of capacity tables"
        )
    missing = [c for c in _COLUMNS if c not in capacity.columns]
    if missing:
        raise ValueError(f"capacity lacks the columns {missing}")
    rows = []
    for key, row in capacity.iterrows():
        runtime, target = cast(tuple[str, str], key)  # the two index levels, checked above
        rows.append(
            {
                "runtime": runtime,
                "target": target,
                **{c: (None if math.isnan(float(row[c])) else float(row[c])) for c in _COLUMNS},
            }
        )
    return write_measurement(
        path,
        _SCHEMA,
        p99_limit_ms=float(p99_limit_ms),
        ladder_rps=[float(r) for r in ladder_rps],
        capacity=rows,
    )


def write_measurement(path: str | Path, schema: str, **fields: object) -> Path:
    """Write a measurement record as JSON: ``schema``, when and on what it was measured, then ``fields``.

    The provenance (``measured_at``, ``cpu``, ``usable_cores``) comes from ``course_lib.core.env.env_report``
    at the time of writing. Returns the path (its folder is created if needed).
    """
    env = env_report()
    payload = {
        "schema": schema,
        "measured_at": env.timestamp_utc,
        "cpu": env.cpu,
        "usable_cores": env.usable_cores,
        **fields,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(payload, indent=1) + "\n")
    return out


def read_measurement(path: str | Path, schema: str, *, what: str, how_to_make: str) -> dict:
    """Read a record written by :func:`write_measurement` and check its ``schema``.

    Raises
    ------
    FileNotFoundError
        If there is no file (the message says ``how_to_make`` one).
    ValueError
        If the file holds another kind of record (``what`` names the expected kind).
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no {what} at {file}; {how_to_make}")
    payload = json.loads(file.read_text(encoding="utf-8"))
    if payload.get("schema") != schema:
        raise ValueError(f"{file} is not {what} (schema {payload.get('schema')!r}, expected {schema!r})")
    return payload


def load_http_capacity(path: str | Path = RECORDED_HTTP_CAPACITY) -> HttpCapacityRecord:
    """Read a file written by :func:`save_http_capacity`.

    Raises
    ------
    FileNotFoundError
        If there is no file (run Lesson 3, or use the recorded one).
    ValueError
        If the file is not an HTTP capacity record.
    """
    file = Path(path)
    payload = read_measurement(
        file,
        _SCHEMA,
        what="an HTTP capacity record",
        how_to_make=f"run Lesson 3 (it writes {LESSON3_RECORD})",
    )
    table = pd.DataFrame(payload["capacity"]).set_index(["runtime", "target"]).astype(float)
    return HttpCapacityRecord(
        table,
        payload["p99_limit_ms"],
        payload["ladder_rps"],
        payload["measured_at"],
        payload["cpu"],
        payload["usable_cores"],
        file,
    )


def read_rows_measurement(
    path: str | Path, schema: str, *, what: str, how_to_make: str, columns: set[str]
) -> tuple[pd.DataFrame, dict]:
    """A record whose ``rows`` are a table: ``(rows, the other fields)``, ``read_measurement`` checked.

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`read_measurement`; ValueError also if the rows lack one of ``columns``.
    """
    payload = read_measurement(path, schema, what=what, how_to_make=how_to_make)
    rows = pd.DataFrame(payload.pop("rows", []))
    missing = columns - set(rows.columns)
    if missing:
        raise ValueError(f"{path} holds no {what} rows with columns {sorted(missing)}")
    return rows, payload
