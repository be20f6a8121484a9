"""Load-generator processes: a light HTTP target, several generator processes merged, and their own limit.

A load generator is a program like any other: on a busy machine it falls behind its schedule, and
then the "latency" it reports is its own lateness. Three tools keep it honest:

* every process sends with ``course_lib.measure.targets.wire_target`` (the wire client of
  ``course_lib.measure.targets.wire_client``: httptools' C parser on asyncio protocols, a keep-alive
  connection pool warmed before the run, each request timed on the wire as k6 times it) under uvloop:
  several times cheaper per request than httpx, about a third of aiohttp's CPU per request
  (``benchmarks/client_cpu.py``);
* ``run_generators``: the same offered load split over ``n_processes`` generator processes (independent
  Poisson streams at rate / n add up to a Poisson stream at the full rate), started at one common
  instant, their per-request rows merged into one ``LoadResult`` (exact samples, never averaged
  percentiles), each process separate from the server under test;
* ``generator_limit``: the same generators against a null HTTP server (``serve_null``, an answer of
  two bytes and no work, on the course's server runtime with its C parser and loop), climbing rates
  until the send lag's p99 exceeds its bound, so every load test can print the highest rate its own
  generator keeps up with.

Every generator process exits within a fraction of a second of the process that started the pool
(``course_lib.core._process.exit_with_parent``), even if that one is killed.

References
----------
Gil Tene, "How NOT to measure latency" (coordinated omission, generator lag).
httptools and uvloop documentation; k6 documentation, "Built-in metrics" (``http_req_duration``).
Python ``concurrent.futures.ProcessPoolExecutor`` with the ``spawn`` start method.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd

from course_lib.core._process import exit_with_parent
from course_lib.core.checks import integer, number, positive_number
from course_lib.measure.loadgen import SEND_LAG_BOUND_MS, SPIN_WINDOW_S, LoadResult, run_open_loop
from course_lib.measure.targets import wire_target
from course_lib.serving.server import (
    DEFAULTS,
    add_arguments,
    from_arguments,
    run_processes,
    serve_app,
    to_argv,
)

__all__ = [
    "GeneratorPool",
    "generator_limit",
    "generator_limit_text",
    "merge_results",
    "run_generators",
    "serve_null",
]

_NULL_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"2")]
#: The null server: the C parser and loop, and a door wide enough never to refuse a generator's load.
NULL_SERVER = DEFAULTS.replace(http="httptools", loop="uvloop", max_in_flight=100_000, max_connections=4096)


def _warm_worker(parent_pid: int) -> None:
    """Worker initializer: leave with the parent; import what a run needs now, not inside the first timed run."""
    exit_with_parent(parent_pid)
    import httptools  # noqa: PLC0415, F401 (subprocess entry point)
    import uvloop  # noqa: PLC0415, F401 (subprocess entry point)


def _run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One generator process's run (executed in a worker process): wait for the common start, then send.

    If the process starts its schedule late (after ``start_at``), every request left that much later
    than intended: the lateness is added to each request's send lag and latency, never dropped.
    """
    import uvloop  # noqa: PLC0415 (subprocess entry point)

    async def main() -> tuple[LoadResult, float, float]:
        # A few keep-alive connections are opened first (no request sent: warm-up requests would keep
        # a slow server busy, and this process late, past the common start), so the run pays no handshakes.
        target = wire_target(
            spec["url"], spec["payloads"], fields=spec["fields"], open_connections=spec["warm_connections"],
            open_timeout_s=spec["request_timeout_s"],
        )  # fmt: skip
        async with target() as send:
            delay = spec["start_at"] - time.time() - spec["spin_s"]
            if delay > 0:
                await asyncio.sleep(delay)  # coarse timer, then the exact instant (as run_open_loop does)
            while time.time() < spec["start_at"]:
                await asyncio.sleep(0)
            late_ms = max(0.0, 1000.0 * (time.time() - spec["start_at"]))
            cpu_start_s = time.process_time()
            result = await run_open_loop(
                send,
                rate_rps=spec["rate_rps"],
                n_requests=spec["n_requests"],
                max_duration_s=spec["duration_s"],
                seed=spec["seed"],
                request_timeout_s=spec["request_timeout_s"],
                schedule_ms=spec["schedule_ms"],
                spin_s=spec["spin_s"],  # a process of its own: spinning costs CPU, not another's GIL
            )
        return result, late_ms, time.process_time() - cpu_start_s

    # A full garbage collection of a process that has imported pandas takes milliseconds: enough to
    # push a run's send lag over its bound. The run is bounded, so collect now and not during it.
    gc.collect()
    gc.disable()
    try:
        result, late_ms, cpu_s = uvloop.run(main())
    finally:
        gc.enable()
    req = result.requests
    frame = req.assign(lag_ms=req["lag_ms"] + late_ms, latency_ms=req["latency_ms"] + late_ms)
    return {"requests": frame, "wall_s": result.wall_s, "pid": os.getpid(), "late_ms": late_ms,
            "cpu_s": cpu_s, "spin_cpu_s": result.spin_cpu_s}  # fmt: skip


def merge_results(
    parts: Sequence[pd.DataFrame],
    *,
    rate_rps: float,
    planned: int,
    wall_s: float,
    client_cpu_s: float = math.nan,
    spin_cpu_s: float = math.nan,
) -> LoadResult:
    """Merge per-process request rows into one ``LoadResult``: every sample kept, ids renumbered.

    Rows are put in order of scheduled time and given fresh ``request_id`` 0..n-1; ``generator`` says
    which process sent each one. Percentiles of the result are those of all requests together, which
    an average of per-process percentiles is not (``course_lib.measure.histograms``).
    ``client_cpu_s`` and ``spin_cpu_s`` are the processes' CPU seconds during the run and in its spins
    before the sends (``LoadResult``), summed (NaN if not measured).
    """
    frames = [p.assign(generator=k) for k, p in enumerate(parts) if len(p)]
    if not frames:
        raise ValueError("no generator sent a request")
    merged = pd.concat(frames, ignore_index=True).sort_values("scheduled_ms", kind="stable")
    merged = merged.reset_index(drop=True).assign(request_id=lambda f: np.arange(len(f)))
    return LoadResult(
        requests=merged, rate_rps=float(rate_rps), planned=int(planned), wall_s=float(wall_s),
        client_cpu_s=float(client_cpu_s),
        spin_cpu_s=float(spin_cpu_s),
    )  # fmt: skip


class GeneratorPool:
    """``n_processes`` load-generator processes (spawned once, reused for every run), apart from the server.

    Use as a context manager; the processes exit when it closes or when this process dies (their
    task pipe closes). Each run is bounded by its duration plus twice its request timeout (one for
    opening its keep-alive connections, one for the last answer).

    Parameters
    ----------
    n_processes : int >= 1
    start_delay_s : float > 0
        The runs of all processes begin this long after the call, at one common wall-clock instant.
    """

    def __init__(self, n_processes: int = 2, *, start_delay_s: float = 0.3):
        self.n_processes = integer("n_processes", n_processes, min=1)
        self.start_delay_s = positive_number("start_delay_s", start_delay_s)
        ctx = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(
            max_workers=n_processes, mp_context=ctx, initializer=_warm_worker, initargs=(os.getpid(),)
        )
        # Start every worker now (imports included), not inside the first timed run.
        futures = [self._pool.submit(time.sleep, 0.2) for _ in range(n_processes)]
        for f in futures:
            f.result()

    def run(
        self,
        url: str,
        payloads: Sequence[Any],
        *,
        rate_rps: float,
        duration_s: float,
        seed: int = 0,
        request_timeout_s: float = 5.0,
        fields: Iterable[str] = (),
        schedule_ms: np.ndarray | None = None,
        n_processes: int | None = None,
        warm_connections: int = 8,
        spin_s: float = SPIN_WINDOW_S,
    ) -> LoadResult:
        """Offer ``rate_rps`` to ``url`` for ``duration_s`` from the processes together; merged result.

        Parameters
        ----------
        url, payloads, fields : as ``course_lib.measure.targets.wire_target``.
        rate_rps : float > 0
            Total offered rate; each of the k processes sends a Poisson stream at rate / k with its
            own seed (``seed * 1000 + process``).
        duration_s : float > 0
        schedule_ms : array, optional
            One explicit schedule (e.g. a spike) dealt round-robin to the processes instead.
        n_processes : int, optional
            Use only the first n processes (default all).
        warm_connections : int in 0..512
            Keep-alive connections each process opens before the common start, sending nothing on them
            (warm-up requests would keep a slow server, such as the prototype, busy and a process late past
            the start); at most ``request_timeout_s`` is spent on them, and the requests make the rest.
        spin_s : float in [0, 1), each process's spin before a send (``run_open_loop``; 0: no spin window).
        """
        k = self.n_processes if n_processes is None else n_processes
        if not 1 <= k <= self.n_processes:
            raise ValueError(f"n_processes must be in 1..{self.n_processes}, got {n_processes!r}")
        warm_connections = integer("warm_connections", warm_connections, min=0, max=512)  # wire_target's pool
        spin_s = number("spin_s", spin_s, min=0, max=1, max_open=True, unit="s")
        start_at = time.time() + self.start_delay_s  # one instant for every process
        n_requests = int(rate_rps * duration_s * 1.5) + 100
        specs: list[dict[str, Any]] = []
        for j in range(k):
            part = None if schedule_ms is None else np.asarray(schedule_ms, dtype=float)[j::k]
            shift_ms = 0.0 if part is None else float(part[0])  # this process's first intended send
            specs.append(
                {
                    "url": url,
                    "payloads": list(payloads),
                    "fields": tuple(fields),
                    "rate_rps": rate_rps / k,
                    "n_requests": n_requests if part is None else len(part),
                    "duration_s": duration_s,
                    "seed": seed * 1000 + j,
                    "request_timeout_s": request_timeout_s,
                    "schedule_ms": None if part is None else part - shift_ms,
                    "start_at": start_at + shift_ms / 1000.0,
                    "shift_ms": shift_ms,
                    "warm_connections": warm_connections,
                    "spin_s": spin_s,
                }
            )
        outs = list(self._pool.map(_run_one, specs))
        parts = [
            o["requests"].assign(scheduled_ms=o["requests"]["scheduled_ms"] + s["shift_ms"])
            for o, s in zip(outs, specs, strict=True)
        ]
        planned = sum(s["n_requests"] for s in specs)
        return merge_results(
            parts, rate_rps=rate_rps, planned=planned, wall_s=max(o["wall_s"] for o in outs),
            client_cpu_s=sum(o["cpu_s"] for o in outs),
            spin_cpu_s=sum(o["spin_cpu_s"] for o in outs),
        )  # fmt: skip

    def step_runner(
        self, url: str, payloads: Sequence[Any], **run_kwargs: Any
    ) -> Callable[[float], LoadResult]:
        """A one-argument ``rate -> LoadResult`` for ``course_lib.measure.knee.climb``: ``run`` at that rate (seed = rate)."""

        def step(rate_rps: float) -> LoadResult:
            return self.run(url, payloads, rate_rps=rate_rps, seed=int(rate_rps), **run_kwargs)

        return step

    def close(self) -> None:
        """Stop the worker processes."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> GeneratorPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def run_generators(
    url: str, payloads: Sequence[Any], *, n_processes: int = 2, **run_kwargs: Any
) -> LoadResult:
    """One run from a fresh ``GeneratorPool(n_processes)``; see ``GeneratorPool.run`` for the arguments."""
    with GeneratorPool(n_processes) as pool:
        return pool.run(url, payloads, **run_kwargs)


async def _null_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """ASGI app answering every HTTP request with 200 ``{}`` and doing nothing else."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": message["type"] + ".complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": _NULL_HEADERS})
    await send({"type": "http.response.body", "body": b"{}"})


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m course_lib.measure.generators --port P [ServerConfig flags]``: the null server."""
    parser = argparse.ArgumentParser(description="Null HTTP server on 127.0.0.1 (200 {} to everything)")
    parser.add_argument("--port", type=int, required=True)
    add_arguments(parser)
    args = parser.parse_args(argv)
    serve_app(_null_app, port=args.port, config=from_arguments(args))


@contextmanager
def serve_null(*, lifetime_s: float = 120.0) -> Iterator[str]:
    """A null HTTP server in a subprocess on 127.0.0.1 (answers 200 ``{}`` at once); yields its URL.

    It runs on the course's server runtime (``NULL_SERVER``: httptools + uvloop, every guard and
    limit of the other servers) and exits when the ``with`` block ends, after ``lifetime_s`` seconds,
    or when this process dies.

    Raises
    ------
    RuntimeError
        If it is not ready within 20 s (with the end of its log).
    """
    config = NULL_SERVER.replace(lifetime_s=lifetime_s)
    command = [sys.executable, "-m", "course_lib.measure.generators", *to_argv(config)]
    with run_processes({"null": command}, startup_timeout_s=20.0) as urls:
        yield urls["null"]


def generator_limit(
    pool: GeneratorPool,
    null_url: str,
    rates_rps: Iterable[float],
    *,
    duration_s: float = 1.0,
    lag_bound_ms: float = SEND_LAG_BOUND_MS,
    retries: int = 1,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[float, pd.DataFrame]:
    """Climb ``rates_rps`` against the null server until the generator's send-lag p99 exceeds the bound.

    A rate that misses is tried again (``retries`` times, next seed): one descheduling of a process on
    a busy laptop should not end the climb, but a rate that misses every try does.

    Returns
    -------
    (limit_rps, table)
        ``limit_rps``: the highest offered rate with a try whose send-lag p99 was within
        ``lag_bound_ms`` and whose every request succeeded, every lower rate having had one too (0.0 if
        none). ``table``: one ``LoadResult.summary()`` row per try (``attempt`` 1, 2, ...), stopping at
        the first rate whose every try missed.

    Raises
    ------
    ValueError
        For a negative ``retries``.
    """
    retries = integer("retries", retries, min=0)
    rows = []
    limit = 0.0
    for rate in sorted(float(r) for r in rates_rps):
        for attempt in range(1, retries + 2):
            seed = int(rate) + 7919 * (attempt - 1)
            result = pool.run(null_url, [{}], rate_rps=rate, duration_s=duration_s, seed=seed)
            row = {"attempt": attempt, **result.summary(lag_bound_ms=lag_bound_ms)}
            rows.append(row)
            if on_run is not None:
                on_run(row)
            if row["generator_ok"] and row["errors"] == 0:
                limit = rate
                break
        else:
            break
    return limit, pd.DataFrame(rows)


def generator_limit_text(limit_rps: float, lowest_rps: float, highest_rps: float | None = None) -> str:
    """``generator_limit``'s answer in words: the rate, or that no rate tried met the bound.

    Parameters
    ----------
    limit_rps : float >= 0
        The limit :func:`generator_limit` returned (0.0 when even its lowest rate missed).
    lowest_rps : float > 0
        The lowest rate that climb tried.
    highest_rps : float > 0, optional
        The highest rate it tried: a limit that reaches it is a lower bound, and the text says so.

    Raises
    ------
    InvalidArgumentError
        For a negative limit or a lowest or highest rate that is not a finite number > 0.

    Examples
    --------
    >>> generator_limit_text(2000.0, 250.0)
    '2,000 req/s'
    >>> generator_limit_text(4000.0, 250.0, 4000.0)
    '4,000 req/s (the highest rate tried: at least that)'
    >>> generator_limit_text(0.0, 250.0)
    'not measured: no rate tried met the bound (the lowest was 250 req/s)'
    """
    limit_rps = positive_number("limit_rps", limit_rps, allow_zero=True)
    lowest_rps = positive_number("lowest_rps", lowest_rps)
    top = highest_rps is not None and limit_rps >= positive_number("highest_rps", highest_rps)
    if limit_rps > 0:
        return f"{limit_rps:,.0f} req/s" + (" (the highest rate tried: at least that)" if top else "")
    return f"not measured: no rate tried met the bound (the lowest was {lowest_rps:,.0f} req/s)"


if __name__ == "__main__":
    main()
