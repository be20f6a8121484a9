"""Running the service waterfall: the servers, their in-process ceilings, the interleaved knees, k6 beside.

``WATERFALL`` lists the steps from the prototype (Lesson 6's server, ``course_lib.measure.load_server``)
to the production service (``course_lib.serving.production``), one lever each, plus the null endpoint
of the production stack as the floor. :func:`run_waterfall` starts every server they need at once
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
from typing import Any, TypedDict

import httpx
import numpy as np
import pandas as pd

from course_lib.core.affinity import CoreSplit, pinned, sides
from course_lib.core.checks import integer, positive_number
from course_lib.measure.generators import GeneratorPool, generator_limit, serve_null
from course_lib.measure.ladder import SloRule, climb, geometric_ladder, knees, start_rungs, step_row
from course_lib.measure.load_server import serve_churn, wait_idle
from course_lib.measure.loadgen import MIN_REQUESTS_P99, rung_duration_s
from course_lib.measure.waterfall._climb import WaterfallStep, lever_table
from course_lib.measure.waterfall._tools import tool_comparison
from course_lib.serving.feature_store import FeatureStore
from course_lib.serving.production import PRODUCTION, ProductionConfig, production_command
from course_lib.serving.profiling import parse_server_timing
from course_lib.serving.server import DEFAULTS, run_processes

PROTOTYPE_STEP, PRODUCTION_STEP, FLOOR_STEP = "prototype", "production", "null endpoint (floor)"


class _Common(TypedDict):
    forward: str
    workers: int


_C: _Common = {"forward": "loop", "workers": 1}
#: The servers the steps run on: ``None`` is the prototype (``serve_churn``), else a production config.
SERVERS: dict[str, ProductionConfig | None] = {
    "prototype": None,
    "native-thread": ProductionConfig(
        runtime="xgboost", forward="thread", encoder="json", http="h11", loop="asyncio", workers=1
    ),
    "onnx": ProductionConfig(encoder="json", http="h11", loop="asyncio", **_C),
    "onnx-thread": ProductionConfig(forward="thread", encoder="json", http="h11", loop="asyncio", workers=1),
    "onnx-c": ProductionConfig(encoder="json", **_C),
    "onnx-c-orjson": ProductionConfig(**_C),
    "production": PRODUCTION,
}
#: Prototype to production, one lever at a time, and the floor.
WATERFALL: tuple[WaterfallStep, ...] = (
    WaterfallStep(
        PROTOTYPE_STEP, "prototype", "/score", None,
        "Lesson 6's server: native model on the event loop, h11 + asyncio, json, one process",
    ),
    WaterfallStep(
        "native, forward in a thread", "native-thread", "/score", PROTOTYPE_STEP,
        "the native model call moved off the event loop into a worker thread",
    ),
    WaterfallStep(
        "native, dynamic batching", "native-thread", "/predict", "native, forward in a thread",
        "concurrent requests share one native call (batches of up to 64, 2 ms delay)",
    ),
    WaterfallStep(
        "ONNX Runtime", "onnx", "/score", PROTOTYPE_STEP,
        "ONNX Runtime forward, on the event loop (the production app, same stack)",
    ),
    WaterfallStep(
        "ONNX, forward in a thread", "onnx-thread", "/score", "ONNX Runtime",
        "the ONNX call moved off the event loop into a worker thread",
    ),
    WaterfallStep(
        "+ httptools + uvloop", "onnx-c", "/score", "ONNX Runtime", "uvicorn's C parser and event loop",
    ),
    WaterfallStep(
        "+ one orjson encode", "onnx-c-orjson", "/score", "+ httptools + uvloop",
        "the answer encoded once with orjson instead of json",
    ),
    WaterfallStep(
        PRODUCTION_STEP, "production", "/score", "+ one orjson encode", "one worker process per usable core",
    ),
    WaterfallStep(
        "production, dynamic batching", "production", "/predict", PRODUCTION_STEP,
        "ONNX calls through the dynamic batcher",
    ),
    WaterfallStep(
        FLOOR_STEP, "production", "/null", PRODUCTION_STEP,
        "constant JSON on the same stack and workers: no service work (the floor)",
    ),
)  # fmt: skip


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
    by_name = {s.name: s for s in steps}
    needed = {s.server for s in steps}
    ids = FeatureStore.open().sample_ids(2048, seed=2024)
    payloads = [{"customer_id": c} for c in ids]
    server_cfg = DEFAULTS.replace(lifetime_s=lifetime_s)
    server_cores, tool_cores = sides(pin)
    with contextlib.ExitStack() as stack:
        with pinned(tool_cores):  # the generator processes inherit the tools' cores
            pool = stack.enter_context(GeneratorPool(n_generators))
        with contextlib.ExitStack() as null_server:
            with pinned(server_cores):
                null_url = null_server.enter_context(serve_null(lifetime_s=120))
            gen_limit, _ = generator_limit(pool, null_url, generator_rates_rps, duration_s=1.0)
        # every server inherits the server's cores (and counts its workers on them)
        with pinned(server_cores):
            commands, workers, described = {}, {}, {}
            for k in needed:
                cfg = servers[k]
                workers[k] = 1 if cfg is None else cfg.n_workers
                described[k] = (
                    "prototype: course_lib.measure.load_server.serve_churn" if cfg is None else cfg.describe()
                )
                if cfg is not None:
                    commands[k] = production_command(cfg, server_cfg)
            urls: dict[str, str] = dict(stack.enter_context(run_processes(commands, startup_timeout_s=300)))
            if "prototype" in needed:
                urls["prototype"] = stack.enter_context(
                    serve_churn(lifetime_s=lifetime_s, startup_timeout_s=300)
                ).url
        stack.enter_context(pinned(tool_cores))  # this process, and k6 started from it, on the tools' cores
        stats = {k: httpx.get(urls[k] + "/stats", timeout=10).json() for k in commands}
        ceilings = {}
        for step in steps:
            target = urls[step.server] + step.path
            pool.run(target, payloads, rate_rps=50, duration_s=0.5)  # warm-up, not recorded
            ceilings[step.name] = in_process_ceiling(target, payloads, workers=workers[step.server])

        def settle(name: str) -> None:
            wait_idle(urls[by_name[name].server], quick_ms=limit, timeout_s=10, strict=False)

        def run_step(name: str, rate: float, *, n_min: int = min_requests, floor_s: float = min_duration_s):
            s = by_name[name]
            duration = rung_duration_s(rate, min_requests=n_min, min_duration_s=floor_s)
            return pool.run(
                urls[s.server] + s.path, payloads, rate_rps=rate, duration_s=duration, seed=int(rate * 7)
            )

        names = list(by_name)
        if start_rps is None:
            coarse = ladder[::4]
            prescan = climb(
                lambda n, r: run_step(n, r, n_min=200, floor_s=0.5), names, coarse,
                rule=SloRule(limit, min_requests=150), retries=0, settle=settle,
            )  # fmt: skip
            start_rps = _start_rungs(prescan, ladder, start_back)
        runs = pd.concat(
            [
                climb(
                    run_step,
                    names,
                    ladder,
                    start_rps=start_rps,
                    rule=SloRule(limit, min_requests=min_requests),
                    repeat=r,
                    settle=settle,
                    on_row=on_row,
                    step_down=step_down,
                )
                for r in range(n_repeats)
            ],
            ignore_index=True,
        )
        found = knees(runs)
        same_rate = pd.DataFrame()
        if same_rate_rps is not None:
            rows = []
            for name in same_rate_steps or names:
                settle(name)
                row = step_row(run_step(name, float(same_rate_rps)), p99_limit_ms=limit)
                keep = ("rate_rps", "sent", "p50_ms", "p99_ms", "error_rate", "lag_p99_ms")
                rows.append({"step": name, **{k: row[k] for k in keep}})
            same_rate = pd.DataFrame(rows).set_index("step")
        tools = pd.DataFrame()
        if k6_step is not None:
            s = by_name[k6_step]
            rungs = ladder[max(0, bisect.bisect_left(ladder, start_rps[k6_step]) - 3) :]
            show = None if on_row is None else (lambda row: on_row({**row, "target": f"{k6_step} ({row['tool']})", "met_slo": row["met"]}))  # fmt: skip
            tools = tool_comparison(pool, urls[s.server] + s.path, ids, rungs, p99_limit_ms=limit,
                                    min_requests=min_requests, repeats=n_repeats, settle=lambda: settle(k6_step),
                                    on_row=show)  # fmt: skip
    table = lever_table(steps, found)
    for name, c in ceilings.items():
        table.loc[name, ["handle_ms", "ceiling_rps"]] = [c["handle_ms"], c["ceiling_rps"]]
        table.loc[name, "workers"] = workers[by_name[name].server]
        table.loc[name, "server"] = by_name[name].server
        table.loc[name, "path"] = by_name[name].path
    settings = {
        "p99_limit_ms": limit, "repeats": n_repeats, "min_requests": int(min_requests), "ladder_rps": ladder,
        "start_rps": dict(start_rps), "generator_limit_rps": gen_limit, "generator_lowest_rps": float(min(generator_rates_rps)),
        "generator_highest_rps": float(max(generator_rates_rps)), "n_generators": n_generators,
        "servers": described,  # with the worker counts of the cores the servers ran on
        "pinned": None if pin is None else pin.describe(),
    }  # fmt: skip
    stages = {name: c["stages_ms"] for name, c in ceilings.items()}
    return WaterfallRun(table, runs, found, gen_limit, settings, tools, stats, stages, same_rate)
