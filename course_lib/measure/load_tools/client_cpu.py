"""What a load tool costs the machine it shares with the server: CPU per request, k6 beside the course generator.

On a 2-core laptop the load generator and the service run on the same cores, so every microsecond of
CPU the generator spends on a request is a microsecond the server's workers do not get. Two tools at
the same offered rate therefore find different knees when one of them is costlier: the knee then
measures service *plus* tool. This module measures each tool's cost the same way, open loop at a
given rate against the course's null server (``course_lib.measure.generators.serve_null``), so that
the tools' cost, not the service's, is what differs.

* The course generator: the generator processes' own CPU time during the run
  (``LoadResult.client_cpu_s``, ``time.process_time`` around the sending), per request sent, and the
  part of it spent in the last stretch before each send (``LoadResult.spin_cpu_s``: the 2 ms spin of
  ``SPIN_WINDOW_S``, which yields to other processes with ``os.sched_yield``; on an idle null server
  it runs flat out, beside a busy server it gives way, so the CPU without it is the lower bound).
* k6: a separate program, so its CPU is read from ``getrusage(RUSAGE_CHILDREN)`` (children that have
  exited and been waited for, their own children included). k6's start-up (compiling the script,
  starting ``pre_allocated_vus`` virtual users) and the guard process around it cost the same in a
  run of ``duration_s`` and one of ``2 * duration_s``, so the difference of the two runs' CPU over the
  difference of their requests is k6's cost per request while it sends (a slope, as in
  ``course_lib.bench``'s fixed-cost / per-item split).

``save_client_cpu`` / ``load_client_cpu`` keep the table in ``data/measurements/client_cpu.json``
(written by ``benchmarks/client_cpu.py --out``), which Lesson 6 reads beside the two tools' knees on
the production service.

References
----------
getrusage(2) (``RUSAGE_CHILDREN``); k6 documentation, "Constant arrival rate" (``preAllocatedVUs``).
"""

from __future__ import annotations

import math
import resource
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from course_lib.churn.data import DATA_DIR
from course_lib.core.checks import integer, non_empty, number, one_of, positive_number
from course_lib.measure.capacity_record import read_rows_measurement, write_measurement
from course_lib.measure.generators import GeneratorPool
from course_lib.measure.load_tools.k6 import run_k6

__all__ = [
    "LOAD_TOOLS",
    "RECORDED_CLIENT_CPU",
    "ClientCpuRecord",
    "client_cpu_table",
    "generator_cpu_s_per_request",
    "k6_cpu_s_per_request",
    "load_client_cpu",
    "save_client_cpu",
]

RECORDED_CLIENT_CPU = DATA_DIR / "measurements" / "client_cpu.json"
_SCHEMA = "inference-workbook/client-cpu/1"
LOAD_TOOLS = ("course generator", "k6")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(usage.ru_utime + usage.ru_stime)


def k6_cpu_s_per_request(
    url: str,
    *,
    rate_rps: float,
    duration_s: float,
    ids: Sequence[str],
    pre_allocated_vus: int = 200,
    max_vus: int = 400,
) -> float:
    """k6's CPU seconds per request while it offers ``rate_rps`` to ``url`` (start-up excluded).

    Runs k6 for ``duration_s`` and then for ``2 * duration_s`` (``run_k6``) and returns
    (CPU of the second - CPU of the first) / (requests of the second - requests of the first), CPU from
    ``getrusage(RUSAGE_CHILDREN)``. Call it where no other child process of this one exits meanwhile
    (its CPU would be counted as k6's). ``pre_allocated_vus`` and ``max_vus`` as ``tool_comparison``
    uses them (k6's start-up cost depends on them, and cancels out).

    Raises
    ------
    InvalidArgumentError
        For a non-positive rate or duration (``run_k6`` checks the rest).
    RuntimeError
        If k6 fails, or the longer run sent no more requests, or spent no more CPU, than the shorter
        (start-up noise larger than the run: use a longer ``duration_s``).
    """
    rate = positive_number("rate_rps", rate_rps)
    duration = positive_number("duration_s", duration_s)
    counts, cpu = [], []
    for seconds in (duration, 2 * duration):
        before = _children_cpu_s()
        result = run_k6(url, rate_rps=rate, duration_s=seconds, ids=ids,
                        pre_allocated_vus=pre_allocated_vus, max_vus=max_vus)  # fmt: skip
        cpu.append(_children_cpu_s() - before)
        counts.append(result.requests)
    extra = counts[1] - counts[0]
    if extra <= 0 or cpu[1] <= cpu[0]:
        raise RuntimeError(
            f"k6 sent {counts[1]} requests in {2 * duration:g} s for {cpu[1]:.3f} CPU s and {counts[0]} in "
            f"{duration:g} s for {cpu[0]:.3f} CPU s: no cost per request to read (run longer)"
        )
    return (cpu[1] - cpu[0]) / extra


def generator_cpu_s_per_request(
    pool: GeneratorPool, url: str, payloads: Sequence[Any], *, rate_rps: float, duration_s: float
) -> tuple[float, float]:
    """The course generator's CPU seconds per request sent while ``pool`` offers ``rate_rps`` to ``url``.

    Returns ``(cpu, spin)``: its processes' CPU during the run (``LoadResult.client_cpu_s``, summed over
    processes) over the requests sent, and the part spent before the sends (``LoadResult.spin_cpu_s``).
    Raises as ``GeneratorPool.run``.
    """
    result = pool.run(url, payloads, rate_rps=rate_rps, duration_s=duration_s, seed=int(rate_rps))
    n = len(result.requests)
    return result.client_cpu_s / n, result.spin_cpu_s / n


def client_cpu_table(
    pool: GeneratorPool,
    url: str,
    ids: Sequence[str],
    rates_rps: Sequence[float],
    *,
    duration_s: float = 3.0,
    repeats: int = 3,
    pre_allocated_vus: int = 200,
    max_vus: int = 400,
) -> pd.DataFrame:
    """Both tools' CPU per request at each rate, taking turns, ``repeats`` times.

    ``pre_allocated_vus`` and ``max_vus`` are k6's (default: as ``tool_comparison`` runs it).

    Returns
    -------
    DataFrame with ``tool`` (one of ``LOAD_TOOLS``), ``rate_rps``, ``repeat``, ``cpu_us_per_request``,
    ``spin_us_per_request`` (the course generator's CPU before its sends; NaN for k6, whose runtime's
    own idle spinning cannot be told apart) and ``cores`` (= CPU per request x rate: the share of the
    machine's cores the tool takes at that rate).

    Raises
    ------
    InvalidArgumentError
        For ``repeats`` < 1, no rates or ids, a rate that is not > 0 or a duration below 1 s (k6's
        shortest run). RuntimeError as :func:`k6_cpu_s_per_request`.
    """
    integer("repeats", repeats, min=1)
    number("duration_s", duration_s, min=1, unit="s (k6's shortest run is 1 s)")
    non_empty("ids", ids)
    for rate in non_empty("rates_rps", rates_rps):
        positive_number("rates_rps", rate)
    payloads = [{"customer_id": c} for c in ids]
    rows = []
    for repeat in range(repeats):
        for rate in rates_rps:
            for tool in LOAD_TOOLS:
                if tool == "k6":
                    cpu_s = k6_cpu_s_per_request(url, rate_rps=rate, duration_s=duration_s, ids=ids,
                                                 pre_allocated_vus=pre_allocated_vus, max_vus=max_vus)  # fmt: skip
                    spin_s = math.nan
                else:
                    cpu_s, spin_s = generator_cpu_s_per_request(
                        pool, url, payloads, rate_rps=rate, duration_s=duration_s
                    )
                rows.append({"tool": tool, "rate_rps": float(rate), "repeat": repeat,
                             "cpu_us_per_request": 1e6 * cpu_s, "spin_us_per_request": 1e6 * spin_s,
                             "cores": cpu_s * float(rate)})  # fmt: skip
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class ClientCpuRecord:
    """A recorded ``client_cpu_table`` (``rows``) with its provenance (``meta``) and ``path``."""

    rows: pd.DataFrame
    meta: dict
    path: Path

    def median_us(
        self, tool: str, rate_rps: float | None = None, *, column: str = "cpu_us_per_request"
    ) -> float:
        """Median CPU per request (us) of ``tool``, at ``rate_rps`` or over every rate.

        ``column``: ``"cpu_us_per_request"`` (all of it) or ``"spin_us_per_request"`` (the course
        generator's before its sends; NaN for k6).

        Raises
        ------
        ValueError
            If the record has no row for that tool (and rate).
        """
        one_of("column", column, ["cpu_us_per_request", "spin_us_per_request"])
        rows = self.rows[self.rows["tool"] == tool]
        if rate_rps is not None:
            rows = rows[rows["rate_rps"] == float(rate_rps)]
        if rows.empty:
            raise ValueError(f"no row for tool {tool!r} at rate {rate_rps!r} in {self.path.name}; "
                             f"tools {sorted(map(str, self.rows['tool'].unique()))}, rates {sorted(map(float, self.rows['rate_rps'].unique()))}")  # fmt: skip
        return float(rows[column].median())

    def provenance(self) -> str:
        """Where, when and how the record was made, and its file name."""
        m = self.meta
        return (f"benchmarks/client_cpu.py, {m['measured_at']} on {m['cpu']} ({m['usable_cores']} usable cores), "
                f"{m['repeats']} repeats of {m['duration_s']:g} s per rate; file {self.path.name}")  # fmt: skip


def save_client_cpu(table: pd.DataFrame, path: str | Path = RECORDED_CLIENT_CPU, **fields: Any) -> Path:
    """Write ``client_cpu_table``'s result with its provenance (``write_measurement``); returns the path."""
    return write_measurement(path, _SCHEMA, rows=table.to_dict(orient="records"), **fields)


def load_client_cpu(path: str | Path = RECORDED_CLIENT_CPU) -> ClientCpuRecord:
    """Read a file written by :func:`save_client_cpu`.

    Raises
    ------
    FileNotFoundError
        If there is no file. ValueError if it is another kind of record or its rows lack a column.
    """
    file = Path(path)
    rows, payload = read_rows_measurement(
        file, _SCHEMA, what="client CPU record",
        how_to_make="run python benchmarks/client_cpu.py --out data/measurements/client_cpu.json",
        columns={"tool", "rate_rps", "repeat", "cpu_us_per_request", "spin_us_per_request", "cores"},
    )  # fmt: skip
    return ClientCpuRecord(rows=rows, meta=payload, path=file)
