"""Server-side levers at the knee: several server configurations climbed side by side, and the record.

Lesson 6 asks whether uvicorn's C parser and loop (``httptools`` + ``uvloop``), a second worker process
or a faster JSON encoder (``orjson``) move the knee of the churn server. :func:`interleaved_knees`
climbs one ladder of offered rates with the configurations taking turns at every rung (A, B, C, A, B,
C, ...), so slow drift of a shared machine hits them alike, and drops each one after its first miss of
the SLO; the knees are then compared as ratios to the first (baseline) configuration, next to the
generator's own limit: a knee at or above that limit is the generator's, not the server's.

Starting four servers (each loads the model) does not fit a lesson's time budget, so
``benchmarks/server_levers.py`` runs the comparison and :func:`save_lever_record` writes it to JSON
with the machine it ran on; Lesson 6 shows the release's recorded run
(:data:`RECORDED_SERVER_LEVERS`) via :func:`load_lever_record` and says where it came from.

References
----------
uvicorn documentation, "Settings" (``--http``, ``--loop``, ``--workers``). orjson README.
Google SRE book, ch. 21 "Handling Overload".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from course_lib.churn.data import DATA_DIR
from course_lib.core.checks import non_empty, positive_number
from course_lib.measure.capacity_record import read_measurement, write_measurement
from course_lib.measure.knee import MAX_ERROR_RATE, find_knee, step_row
from course_lib.measure.loadgen import LoadResult

__all__ = [
    "LEVER_CONFIGS",
    "RECORDED_SERVER_LEVERS",
    "LeverRecord",
    "interleaved_knees",
    "knee_ratios",
    "load_lever_record",
    "save_lever_record",
]

#: The four configurations compared (keyword arguments of ``course_lib.measure.load_server.serve_churn``);
#: the first is the baseline, what Lessons 2 and 3 run.
LEVER_CONFIGS: dict[str, dict[str, object]] = {
    "h11 + asyncio, 1 worker, json (baseline)": {},
    "httptools + uvloop": {"http": "httptools", "loop": "uvloop"},
    "2 workers": {"workers": 2},
    "orjson answer": {"json_encoder": "orjson"},
}
RECORDED_SERVER_LEVERS = DATA_DIR / "measurements" / "server_levers.json"
_SCHEMA = "inference-workbook/server-levers/1"


def interleaved_knees(
    run_step: Callable[[str, float], LoadResult],
    names: Iterable[str],
    rates_rps: Iterable[float],
    *,
    p99_limit_ms: float,
    max_error_rate: float = MAX_ERROR_RATE,
    settle: Callable[[str], object] | None = None,
    on_row: Callable[[str, dict[str, float]], None] | None = None,
) -> dict[str, pd.DataFrame]:
    """Climb ``rates_rps`` with the configurations ``names`` taking turns at every rung.

    Parameters
    ----------
    run_step : callable (name, rate_rps) -> LoadResult
        One open-loop run of configuration ``name`` at ``rate_rps`` requests/s.
    names : configurations, in the order they take turns.
    rates_rps : offered rates (requests/s), climbed in ascending order.
    p99_limit_ms : float > 0
        The SLO's p99 limit; a configuration drops out after its first rung that misses the SLO
        (``course_lib.measure.knee.step_row``: p99 within the limit and error rate below ``max_error_rate``).
    settle : callable name -> anything, optional
        Run before every step (e.g. wait until that server is idle).
    on_row : callable (name, row), optional
        Called with every step's row (progress printing).

    Returns
    -------
    dict name -> step table (one ``step_row`` per rung that configuration ran).
    """
    limit = positive_number("p99_limit_ms", p99_limit_ms)
    order = non_empty("names", list(names))
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in order}
    alive = list(order)
    for rate in sorted(float(r) for r in rates_rps):
        for name in list(alive):
            if settle is not None:
                settle(name)
            row = step_row(run_step(name, rate), p99_limit_ms=limit, max_error_rate=max_error_rate)
            rows[name].append(row)
            if on_row is not None:
                on_row(name, row)
            if not row["met_slo"]:
                alive.remove(name)
        if not alive:
            break
    return {name: pd.DataFrame(r) for name, r in rows.items()}


def knee_ratios(tables: Mapping[str, pd.DataFrame], *, generator_limit_rps: float) -> pd.DataFrame:
    """Each configuration's knee, its ratio to the first (baseline) one, and whether the generator bound it.

    Returns
    -------
    DataFrame indexed by configuration with ``knee_rps``, ``knee_offered_rps``, ``first_miss_rps``
    (``course_lib.measure.knee.find_knee``), ``ratio_to_baseline`` (NaN if the baseline met the SLO at no rung)
    and ``generator_bound`` (knee >= the generator's limit, or a limit of 0: the knee may then be the
    generator's and the ratio says nothing about the server).
    """
    table = pd.DataFrame({name: find_knee(t) for name, t in tables.items()}).T
    table["knee_rps"] = table["knee_rps"].astype(float)
    base = float(table["knee_rps"].iloc[0])
    table["ratio_to_baseline"] = table["knee_rps"] / base if base > 0 else math.nan
    # With a limit of 0 the generator kept up at no rate tried: every knee of the run is suspect.
    table["generator_bound"] = (table["knee_rps"] >= generator_limit_rps) | (generator_limit_rps <= 0)
    return table[["knee_rps", "knee_offered_rps", "first_miss_rps", "ratio_to_baseline", "generator_bound"]]


@dataclass(frozen=True)
class LeverRecord:
    """A recorded lever comparison: ``knees`` (as :func:`knee_ratios`), the file's other fields in ``meta``
    (``generator_limit_rps``, ``p99_limit_ms``, ``ladder_rps``, ``measured_at``, ``cpu``, ``usable_cores``)."""

    knees: pd.DataFrame
    meta: dict
    path: Path

    @property
    def generator_limit_rps(self) -> float:
        return float(self.meta["generator_limit_rps"])

    @property
    def ladder_rps(self) -> list[float]:
        return [float(r) for r in self.meta["ladder_rps"]]

    def provenance(self) -> str:
        m = self.meta
        return (
            f"benchmarks/server_levers.py, {m['measured_at']} on {m['cpu']} ({m['usable_cores']} usable cores), "
            f"p99 limit {m['p99_limit_ms']:g} ms, ladder {self.ladder_rps} req/s, generator limit "
            f"{self.generator_limit_rps:,.0f} req/s; file {self.path.name}"
        )


def save_lever_record(
    knees: pd.DataFrame,
    path: str | Path = RECORDED_SERVER_LEVERS,
    *,
    generator_limit_rps: float,
    p99_limit_ms: float,
    ladder_rps: Iterable[float],
) -> Path:
    """Write a :func:`knee_ratios` table and its provenance (environment report) as JSON; return the path."""
    numbers = ("knee_rps", "knee_offered_rps", "first_miss_rps", "ratio_to_baseline")
    rows = [
        {
            "config": str(name),
            **{c: None if pd.isna(row[c]) else float(row[c]) for c in numbers},
            "generator_bound": bool(row["generator_bound"]),
        }
        for name, row in knees.iterrows()
    ]
    return write_measurement(
        path,
        _SCHEMA,
        generator_limit_rps=float(generator_limit_rps),
        p99_limit_ms=float(p99_limit_ms),
        ladder_rps=[float(r) for r in ladder_rps],
        knees=rows,
    )


def load_lever_record(path: str | Path = RECORDED_SERVER_LEVERS) -> LeverRecord:
    """Read a file written by :func:`save_lever_record`.

    Raises
    ------
    FileNotFoundError
        If there is no file (run ``python benchmarks/server_levers.py``).
    ValueError
        If the file is not a server-levers record.
    """
    file = Path(path)
    payload = read_measurement(
        file,
        _SCHEMA,
        what="a server-levers record",
        how_to_make="run python benchmarks/server_levers.py --out FILE",
    )
    knees = pd.DataFrame(payload["knees"]).set_index("config")
    knees["generator_bound"] = knees["generator_bound"].astype(bool)
    return LeverRecord(knees, {k: v for k, v in payload.items() if k != "knees"}, file)
