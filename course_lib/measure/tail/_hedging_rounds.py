"""Hedged requests measured so the effect resolves: settings take turns in rounds; how busy each process was.

Lesson 7 compares hedge settings (no hedging, a hedge after the replica's own p95, ...) on two real
replicas. One run per setting says little on a shared machine: its p99 moves with whatever else ran
meanwhile. :func:`run_hedging_rounds` runs every setting once per round, on the same seeded traffic
within a round (same arrival times, same request ids, so the same requests stall), rotating the order
from round to round; :meth:`HedgingRounds.ratio` gives each setting's percentile over the baseline's,
round by round, with the distribution-free interval of :mod:`course_lib.core.intervals`, so a lesson
says "helps" or "hurts" only where the interval excludes 1. :func:`busy_fractions` says how close each
process (the client and every replica, each one event loop) came to its own limit during a run: the
lesson checks that its rate sits well below every process's knee.

References
----------
Dean, J. and Barroso, L. A. (2013), "The Tail at Scale", Communications of the ACM 56(2): 74-80,
section "Hedged requests". psutil documentation, ``Process.cpu_times``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import psutil

from course_lib.core.bench import Order, round_order
from course_lib.core.checks import InvalidArgumentError, integer, non_empty, positive_number
from course_lib.core.intervals import RatioInterval, ratio_interval_from_values
from course_lib.core.percentiles import percentile
from course_lib.measure.experiments import run_hedged_load
from course_lib.serving.hedging import HedgeStats, hedging_summary


@dataclass(frozen=True)
class HedgingRounds:
    """Hedge settings measured in interleaved rounds (:func:`run_hedging_rounds`).

    Attributes
    ----------
    hedge_after_ms : dict of setting -> float or None
        Each setting's hedge delay (None: no hedging); the first setting is the baseline.
    requests : dict of setting -> list of DataFrame
        One ``run_hedged_load`` table per round.
    stats : dict of setting -> list of HedgeStats
        The client's counters per round.
    orders : list of list of str
        The order the settings ran in, round by round.
    """

    hedge_after_ms: dict[str, float | None]
    requests: dict[str, list[pd.DataFrame]]
    stats: dict[str, list[HedgeStats]]
    orders: list[list[str]]

    @property
    def settings(self) -> list[str]:
        """The settings, baseline first."""
        return list(self.hedge_after_ms)

    @property
    def baseline(self) -> str:
        """The setting every ratio divides by."""
        return self.settings[0]

    @property
    def rounds(self) -> int:
        """Rounds run."""
        return len(self.orders)

    def percentile_rounds(self, setting: str, q: float) -> np.ndarray:
        """The q-th percentile (nearest rank, ms) of the answered requests of each round, shape (rounds,)."""
        return np.array(
            [percentile(t.loc[t["ok"], "latency_ms"].to_numpy(), q) for t in self.requests[setting]]
        )

    def ratio(self, setting: str, q: float = 99, *, confidence: float = 0.95) -> RatioInterval:
        """``setting``'s q-th percentile over the baseline's in the same round, with the median's interval.

        Below 1: the setting's percentile was lower (hedging helped it). Needs
        ``course_lib.core.intervals.min_rounds(confidence)`` rounds.
        """
        return ratio_interval_from_values(
            self.percentile_rounds(setting, q) / self.percentile_rounds(self.baseline, q), confidence
        )

    def summary(self) -> pd.DataFrame:
        """Per setting: the median over rounds of ``hedging_summary`` (p50 to p99.9, extra requests, ...).

        ``errors`` and ``shed`` are totals over the rounds; ``requests`` the requests sent in all.
        """
        rows = {}
        for name in self.settings:
            per_round = pd.DataFrame(
                [hedging_summary(t, st) for t, st in zip(self.requests[name], self.stats[name], strict=True)]
            )
            row = per_round.median().to_dict()
            row["errors"], row["shed"] = int(per_round["errors"].sum()), int(per_round["shed"].sum())
            row["requests"] = int(sum(len(t) for t in self.requests[name]))
            row["hedge_after_ms"] = (
                math.nan if self.hedge_after_ms[name] is None else self.hedge_after_ms[name]
            )
            rows[name] = row
        table = pd.DataFrame.from_dict(rows, orient="index")
        table.index.name = "setting"
        return table


async def run_hedging_rounds(
    replica_urls: Sequence[str],
    customer_ids: Sequence[str],
    *,
    settings: Mapping[str, float | None],
    rounds: int,
    n_requests: int,
    rate_rps: float,
    seed: int,
    order: Order = "rotate",
    max_duration_s: float = 60.0,
) -> HedgingRounds:
    """Every hedge setting once per round, in rotated order, on the same seeded traffic within a round.

    Round ``r`` runs :func:`run_hedged_load` for each setting with seed ``seed + r`` and request ids
    ``f"r{r}-{i}"``: within a round every setting sees the same arrival times and the same request ids
    (so a replica stalling by id stalls the same requests: a paired comparison), and the rounds are
    independent draws. The order of the settings rotates from round to round
    (``course_lib.core.bench.round_order``), so none always runs first.

    Parameters
    ----------
    replica_urls : sequence of str
        At least 2 distinct replicas.
    customer_ids : sequence of str
    settings : mapping of name -> hedge delay in ms (None: no hedging)
        The first is the baseline of every ratio.
    rounds : int >= 1
        6 for a 95 % interval (``course_lib.core.intervals.min_rounds``).
    n_requests : int >= 1
        Requests per setting and round (1,000 for a p99: ``samples_needed(99)``).
    rate_rps : float > 0
        Offered Poisson rate of each run.
    seed : int
    order : {"rotate", "fixed"}
    max_duration_s : float > 0
        Bound on each run's schedule.

    Returns
    -------
    HedgingRounds

    Raises
    ------
    ValueError
        For no settings, a count below 1, or a rate that is not a number > 0.
    """
    non_empty("settings", settings)
    rounds = integer("rounds", rounds, min=1)
    n_requests = integer("n_requests", n_requests, min=1)
    rate_rps = positive_number("rate_rps", rate_rps)
    names = list(settings)
    requests: dict[str, list[pd.DataFrame]] = {name: [] for name in names}
    stats: dict[str, list[HedgeStats]] = {name: [] for name in names}
    orders = []
    for r in range(rounds):
        orders.append(round_order(names, r, order))
        for name in orders[-1]:
            table, counters = await run_hedged_load(
                replica_urls,
                customer_ids,
                hedge_after_ms=settings[name],
                n_requests=n_requests,
                rate_rps=rate_rps,
                seed=seed + r,
                id_prefix=f"r{r}-",
                max_duration_s=max_duration_s,
            )
            requests[name].append(table)
            stats[name].append(counters)
    return HedgingRounds(dict(settings), requests, stats, orders)


@contextmanager
def busy_fractions(pids: Mapping[str, int], *, others: bool = False) -> Iterator[dict[str, float]]:
    """How busy each process was during the ``with`` block: its CPU seconds over the wall seconds.

    The dict yielded is filled in when the block ends. 1.0 means one core's worth of work: a process
    that runs its requests on one event loop (a replica, the asyncio client) is then at its own limit,
    its knee; well below it, requests rarely queue inside it. CPU time counts the process's threads
    (``psutil.Process.cpu_times``), not the time it waited for a core on a busy machine.

    With ``others``, the dict also holds ``"others"``: the cores' worth of CPU that every other process
    on the machine used meanwhile (the machine's busy CPU time, ``psutil.cpu_times``, minus that of the
    processes named), in the same unit. On a 2-core machine, ``others`` near 2 means the experiment's
    processes waited for a core, whatever their own fractions say.

    Parameters
    ----------
    pids : mapping of name -> process id (``os.getpid()`` for this process)
    others : bool
        Also measure the rest of the machine (key ``"others"``, which must not be a name in ``pids``).

    Raises
    ------
    psutil.NoSuchProcess
        If a process is gone at the start.
    course_lib.core.checks.InvalidArgumentError
        If ``others`` is set and ``pids`` names a process ``"others"``.
    """
    if others and "others" in pids:
        raise InvalidArgumentError("pids must not name a process 'others' when others=True")
    processes = {name: psutil.Process(pid) for name, pid in pids.items()}

    def machine_busy_s() -> float:
        times = psutil.cpu_times()
        return float(
            times.user
            + times.system
            + getattr(times, "nice", 0.0)
            + getattr(times, "irq", 0.0)
            + getattr(times, "softirq", 0.0)
            + getattr(times, "steal", 0.0)
        )

    def cpu_s(proc: Any) -> float:
        times = proc.cpu_times()
        return float(times.user + times.system)

    start = {name: cpu_s(proc) for name, proc in processes.items()}
    machine_start = machine_busy_s() if others else 0.0
    wall_start = time.perf_counter()
    out: dict[str, float] = {}
    yield out
    wall_s = time.perf_counter() - wall_start
    for name, proc in processes.items():
        try:
            out[name] = (cpu_s(proc) - start[name]) / wall_s
        except psutil.NoSuchProcess:  # it exited during the block: nothing left to read
            out[name] = math.nan
    if others:
        ours = sum(value for value in out.values() if not math.isnan(value))
        out["others"] = max(0.0, (machine_busy_s() - machine_start) / wall_s - ours)
