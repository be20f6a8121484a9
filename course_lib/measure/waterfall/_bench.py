"""Running the service waterfall: the servers, their in-process ceilings, the interleaved knees, k6 beside.

``WATERFALL`` (``course_lib.measure.waterfall._steps``) lists the steps from the prototype to the production
service, one lever each, plus the floor. :func:`run_waterfall` starts every server they need at once
(each on 127.0.0.1, bounded lifetime, stopped when it returns), measures the generator's own limit on
a null server, warms every step up, reads each step's **in-process ceiling** from its ``Server-Timing``
header (1000 / median server work per request in ms x worker processes: what the stages alone would
allow), then climbs the ladder ``repeats`` times (``course_lib.measure.ladder.climb``)
and, if asked, runs k6 beside the course generator at the same rates on one step
(:func:`tool_comparison`). ``benchmarks/service_waterfall.py`` and Lesson 12's short run call it.

References
----------
W3C, "Server Timing". Gil Tene, "How NOT to measure latency". k6 documentation, "Constant arrival rate".
"""

from __future__ import annotations

import bisect
import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pandas as pd

from course_lib.core.affinity import CoreSplit, pinned, sides
from course_lib.core.checks import integer, positive_number
from course_lib.measure.generators import GeneratorPool, generator_limit, serve_null
from course_lib.measure.ladder import SloRule, climb, geometric_ladder, knees, start_rungs, step_row
from course_lib.measure.loadgen import MIN_REQUESTS_P99, rung_duration_s
from course_lib.measure.server_probes import wait_idle
from course_lib.measure.waterfall._steps import SERVERS, WATERFALL, WaterfallStep, lever_table
from course_lib.measure.waterfall._tools import tool_comparison
from course_lib.serving.feature_store import FeatureStore
from course_lib.serving.production import ProductionConfig, production_command
from course_lib.serving.profiling import parse_server_timing
from course_lib.serving.prototype import serve_churn
from course_lib.serving.server import run_processes


def in_process_ceiling(
    url: str, payloads: Sequence[Any], *, workers: int, n_requests: int = 150
) -> dict[str, Any]:
    """Median server work per request from ``Server-Timing`` (one request at a time) and the rate it allows.

    Returns
    -------
    dict with ``handle_ms`` (median of the stages' sum; 0 where the answer has no ``Server-Timing``),
    ``ceiling_rps`` = 1000 / handle_ms x ``workers`` (NaN for no work) and ``stages_ms`` (each stage's
    median). The first ``n_requests`` payloads are sent twice and only the second pass is kept: the
    first fills the feature cache, as the traffic of a load test does long before its knee.
    """
    n = integer("n_requests", n_requests, min=1)
    profiles = []
    with httpx.Client(timeout=10.0) as client:
        for i in range(2 * n):
            response = client.post(url, json=payloads[i % min(n, len(payloads))])
            response.raise_for_status()
            header = response.headers.get("server-timing")
            profiles.append(parse_server_timing(header) if header else {})
    kept = pd.DataFrame(profiles[n:]).fillna(0.0)
    handle_ms = float(np.median(kept.sum(axis=1))) if len(kept.columns) else 0.0
    return {
        "handle_ms": handle_ms,
        "ceiling_rps": 1000.0 * workers / handle_ms if handle_ms > 0 else math.nan,
        "stages_ms": {name: float(kept[name].median()) for name in kept.columns},
    }


@dataclass
class WaterfallRun:
    """Everything one :func:`run_waterfall` measured: ``table`` (:func:`lever_table` + ceilings),
    ``runs`` (every rung), ``knees`` (per repeat and step), ``generator_limit_rps``, ``tools`` (k6 beside
    the course generator, empty if not run), ``server_stats`` (``/stats`` of the production servers),
    ``stages_ms`` (step -> each stage's median, from ``Server-Timing``) and ``same_rate`` (every step at
    one offered rate, if asked: ``sent``, ``p50_ms``, ``p99_ms``, ``error_rate``)."""

    table: pd.DataFrame
    runs: pd.DataFrame
    knees: pd.DataFrame
    generator_limit_rps: float
    settings: dict[str, Any]
    tools: pd.DataFrame = field(default_factory=pd.DataFrame)
    server_stats: dict[str, Any] = field(default_factory=dict)
    stages_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    same_rate: pd.DataFrame = field(default_factory=pd.DataFrame)


def _start_rungs(prescan: pd.DataFrame, ladder: Sequence[float], back: int) -> dict[str, float]:
    found = knees(prescan)
    return start_rungs(dict(zip(found["target"], found["knee_rps"], strict=True)), ladder, back=back)


def run_waterfall(
    steps: Sequence[WaterfallStep] = WATERFALL,
    *,
    repeats: int = 3,
    min_requests: int = MIN_REQUESTS_P99,
    min_duration_s: float = 1.0,
    p99_limit_ms: float = 100.0,
    ladder_rps: Sequence[float] | None = None,
    start_rps: Mapping[str, float] | None = None,
    start_back: int = 3,
    step_down: bool = False,
    n_generators: int = 2,
    k6_step: str | None = None,
    same_rate_rps: float | None = None,
    same_rate_steps: Sequence[str] | None = None,
    generator_rates_rps: Sequence[float] = (500, 1000, 2000, 4000, 6000, 8000),
    servers: Mapping[str, ProductionConfig | None] = SERVERS,
    lifetime_s: float = 3600.0,
    pin: CoreSplit | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> WaterfallRun:
    """Start the servers ``steps`` need, measure ceilings and knees, and return a :class:`WaterfallRun`.

    Parameters
    ----------
    steps : the waterfall's steps (default all of ``WATERFALL``); every ``base`` should be among them.
    repeats : int >= 1
        Whole climbs, each in a rotated order.
    min_requests : int >= 1
        Requests per rung (``MIN_REQUESTS_P99`` resolves a p99; fewer give a coarser, faster run).
    p99_limit_ms : float > 0
        The SLO (errors < 0.1 % too).
    ladder_rps : rates to climb; default ``geometric_ladder(20, 12_000)``.
    start_rps : step -> first rung; default from a short pre-scan (a coarse climb of 200-request rungs),
        ``start_back`` rungs below the knee it found.
    step_down : a step whose start rung misses tries the rungs below it (``course_lib.measure.ladder.climb``); for
        starts taken from a record of another machine or from the short pre-scan (the benchmark sets it:
        without it such a step's knee is 0).
    k6_step : a step to also measure with k6 beside the course generator (:func:`tool_comparison`).
    same_rate_rps : after the climbs, run every step once at this offered rate (``min_requests``
        requests) for a like-for-like p99; ``same_rate_steps`` limits that to some steps.
    generator_rates_rps : the rates of the generator's own limit (``generator_limit`` on a null server,
        each try at least 1 s and 1,000 requests, whatever ``min_requests`` a rung holds).
    lifetime_s : every server exits by itself after this long.
    pin : a :class:`course_lib.core.affinity.CoreSplit`: the servers (the null server of the generator's
        limit too) start on its ``server`` cores, and count their workers there; the generator processes,
        this process and k6 run on its ``tools`` cores (``settings["pinned"]`` records it). Default
        None: every process may run on every core, as in the lessons.
    """
    n_repeats = integer("repeats", repeats, min=1)
    limit = positive_number("p99_limit_ms", p99_limit_ms)
    ladder = list(ladder_rps) if ladder_rps is not None else geometric_ladder(20, 12_000)
    ids = FeatureStore.open().sample_ids(2048, seed=2024)
    with contextlib.ExitStack() as stack:
        pool, gen_limit, started = _start(
            stack, {s.server for s in steps}, servers, lifetime_s=lifetime_s, pin=pin, n_generators=n_generators,
            generator_rates_rps=generator_rates_rps,
        )  # fmt: skip
        payloads = [{"customer_id": c} for c in ids]
        by_name = {s.name: s for s in steps}
        bench = _Bench(pool, started.urls, ids, payloads, by_name, limit, min_requests, min_duration_s)
        stats = {k: httpx.get(started.urls[k] + "/stats", timeout=10).json() for k in started.commands}
        ceilings = {step.name: bench.ceiling(step, started.workers[step.server]) for step in steps}
        if start_rps is None:
            start_rps = bench.prescan_starts(ladder, start_back)
        runs = bench.climbs(ladder, start_rps, repeats=n_repeats, step_down=step_down, on_row=on_row)
        found = knees(runs)
        same_rate = bench.same_rate(same_rate_rps, same_rate_steps)
        tools = bench.tools(k6_step, ladder, start_rps, repeats=n_repeats, on_row=on_row)
    table = _waterfall_table(steps, found, ceilings, started.workers)
    settings = {
        "p99_limit_ms": limit, "repeats": n_repeats, "min_requests": int(min_requests), "ladder_rps": ladder,
        "start_rps": dict(start_rps), **_generator_settings(gen_limit, generator_rates_rps, n_generators),
        "servers": started.described,  # with the worker counts of the cores the servers ran on
        "pinned": None if pin is None else pin.describe(),
    }  # fmt: skip
    stages = {name: c["stages_ms"] for name, c in ceilings.items()}
    return WaterfallRun(table, runs, found, gen_limit, settings, tools, stats, stages, same_rate)


def _generator_settings(limit_rps: float, rates_rps: Sequence[float], n_generators: int) -> dict[str, Any]:
    """The generator's part of a run's settings: its limit on a null server, the rates it tried, its processes."""
    return {
        "generator_limit_rps": limit_rps,
        "generator_lowest_rps": float(min(rates_rps)),
        "generator_highest_rps": float(max(rates_rps)),
        "n_generators": n_generators,
    }


def _start(
    stack: contextlib.ExitStack,
    needed: set[str],
    servers: Mapping[str, ProductionConfig | None],
    *,
    lifetime_s: float,
    pin: CoreSplit | None,
    n_generators: int,
    generator_rates_rps: Sequence[float],
) -> tuple[GeneratorPool, float, _Started]:
    """Start the generator processes, measure their limit on a null server, then start the servers.

    The generators (and, after this, this process and k6) run on ``pin``'s tools cores, the servers on its
    server cores; returns the pool, the generator's limit (requests/s) and the started servers.
    """
    server_cores, tool_cores = sides(pin)
    with pinned(tool_cores):  # the generator processes inherit the tools' cores
        pool = stack.enter_context(GeneratorPool(n_generators))
    with contextlib.ExitStack() as null_server:
        with pinned(server_cores):
            null_url = null_server.enter_context(serve_null(lifetime_s=120))
        gen_limit, _ = generator_limit(pool, null_url, generator_rates_rps, duration_s=1.0)
    with pinned(server_cores):  # every server inherits the server's cores and counts its workers on them
        started = _start_servers(stack, needed, servers, lifetime_s)
    stack.enter_context(pinned(tool_cores))  # this process, and k6 started from it, on the tools' cores
    return pool, gen_limit, started


@dataclass(frozen=True)
class _Started:
    """The servers running for a waterfall: ``urls``, ``workers`` and ``described`` by server key, and the
    ``commands`` of the production ones (the prototype has none)."""

    urls: dict[str, str]
    workers: dict[str, int]
    described: dict[str, str]
    commands: dict[str, list[str]]


def _start_servers(
    stack: contextlib.ExitStack,
    needed: set[str],
    servers: Mapping[str, ProductionConfig | None],
    lifetime_s: float,
) -> _Started:
    """Start every server ``needed`` (the production configs at once, the prototype beside them) on ``stack``."""
    commands, workers, described = {}, {}, {}
    for k in needed:
        cfg = servers[k]
        workers[k] = 1 if cfg is None else cfg.n_workers
        described[k] = (
            "prototype: course_lib.serving.prototype.serve_churn" if cfg is None else cfg.describe()
        )
        if cfg is not None:
            commands[k] = production_command(cfg.with_server(lifetime_s=lifetime_s))
    urls: dict[str, str] = dict(stack.enter_context(run_processes(commands, startup_timeout_s=300)))
    if "prototype" in needed:
        urls["prototype"] = stack.enter_context(serve_churn(lifetime_s=lifetime_s, startup_timeout_s=300)).url
    return _Started(urls, workers, described, commands)


@dataclass(frozen=True)
class _Bench:
    """The generator and the running servers of one waterfall: how each step is run, settled and climbed."""

    pool: GeneratorPool
    urls: dict[str, str]
    ids: list[str]
    payloads: list[dict[str, str]]
    by_name: dict[str, WaterfallStep]
    limit_ms: float
    min_requests: int
    min_duration_s: float

    def url(self, name: str) -> str:
        step = self.by_name[name]
        return self.urls[step.server] + step.path

    def settle(self, name: str) -> None:
        """Wait until the step's server has no backlog (or 10 s)."""
        wait_idle(self.urls[self.by_name[name].server], quick_ms=self.limit_ms, timeout_s=10, strict=False)

    def run_step(
        self, name: str, rate: float, *, n_min: int | None = None, floor_s: float | None = None
    ) -> Any:
        """One open-loop run of a step at a rate, long enough for ``n_min`` requests (default ``min_requests``)."""
        duration = rung_duration_s(
            rate,
            min_requests=self.min_requests if n_min is None else n_min,
            min_duration_s=self.min_duration_s if floor_s is None else floor_s,
        )
        return self.pool.run(
            self.url(name), self.payloads, rate_rps=rate, duration_s=duration, seed=int(rate * 7)
        )

    def ceiling(self, step: WaterfallStep, workers: int) -> dict[str, Any]:
        """Warm the step up (not recorded) and read its in-process ceiling."""
        self.pool.run(self.url(step.name), self.payloads, rate_rps=50, duration_s=0.5)
        return in_process_ceiling(self.url(step.name), self.payloads, workers=workers)

    def prescan_starts(self, ladder: Sequence[float], back: int) -> dict[str, float]:
        """A coarse climb of 200-request rungs (every fourth rung), and each step's start ``back`` rungs below it."""
        prescan = climb(
            lambda n, r: self.run_step(n, r, n_min=200, floor_s=0.5), list(self.by_name), list(ladder)[::4],
            rule=SloRule(self.limit_ms, min_requests=150), retries=0, settle=self.settle,
        )  # fmt: skip
        return _start_rungs(prescan, ladder, back)

    def climbs(
        self,
        ladder: Sequence[float],
        start_rps: Mapping[str, float],
        *,
        repeats: int,
        step_down: bool,
        on_row: Callable[[dict[str, Any]], None] | None,
    ) -> pd.DataFrame:
        """``repeats`` climbs of every step, taking turns (``course_lib.measure.ladder.climb``), one after the other."""
        rule = SloRule(self.limit_ms, min_requests=self.min_requests)
        return pd.concat(
            [
                climb(self.run_step, list(self.by_name), ladder, start_rps=start_rps, rule=rule, repeat=r,
                      settle=self.settle, on_row=on_row, step_down=step_down)
                for r in range(repeats)
            ],
            ignore_index=True,
        )  # fmt: skip

    def same_rate(self, rate_rps: float | None, names: Sequence[str] | None) -> pd.DataFrame:
        """Every step (or ``names``) once at one offered rate: ``sent``, ``p50_ms``, ``p99_ms``, ``error_rate``
        (empty for no rate)."""
        if rate_rps is None:
            return pd.DataFrame()
        rows = []
        for name in names or list(self.by_name):
            self.settle(name)
            row = step_row(self.run_step(name, float(rate_rps)), p99_limit_ms=self.limit_ms)
            keep = ("rate_rps", "sent", "p50_ms", "p99_ms", "error_rate", "lag_p99_ms")
            rows.append({"step": name, **{k: row[k] for k in keep}})
        return pd.DataFrame(rows).set_index("step")

    def tools(
        self,
        name: str | None,
        ladder: Sequence[float],
        start_rps: Mapping[str, float],
        *,
        repeats: int,
        on_row: Callable[[dict[str, Any]], None] | None,
    ) -> pd.DataFrame:
        """k6 beside the course generator on one step, from three rungs below its start (:func:`tool_comparison`;
        empty for no step)."""
        if name is None:
            return pd.DataFrame()
        rungs = list(ladder)[max(0, bisect.bisect_left(ladder, start_rps[name]) - 3) :]

        def show(row: dict[str, Any]) -> None:
            if on_row is not None:
                on_row({**row, "target": f"{name} ({row['target']})"})

        return tool_comparison(self.pool, self.url(name), self.ids, rungs, p99_limit_ms=self.limit_ms,
                               min_requests=self.min_requests, repeats=repeats, settle=lambda: self.settle(name),
                               on_row=None if on_row is None else show)  # fmt: skip


def _waterfall_table(
    steps: Sequence[WaterfallStep],
    found: pd.DataFrame,
    ceilings: Mapping[str, Mapping[str, Any]],
    workers: Mapping[str, int],
) -> pd.DataFrame:
    """:func:`lever_table` with each step's ceiling, workers, server and path."""
    by_name = {s.name: s for s in steps}
    table = lever_table(steps, found)
    for name, c in ceilings.items():
        table.loc[name, ["handle_ms", "ceiling_rps"]] = [c["handle_ms"], c["ceiling_rps"]]
        table.loc[name, "workers"] = workers[by_name[name].server]
        table.loc[name, "server"] = by_name[name].server
        table.loc[name, "path"] = by_name[name].path
    return table
