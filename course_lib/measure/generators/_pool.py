"""Generator processes: ``GeneratorPool`` runs one open-loop load from several processes and merges them.

Why several processes, how they exit with their parent, and the sources: the package docstring
(``course_lib.measure.generators``).
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import pandas as pd

from course_lib.core.checks import integer, number, positive_number
from course_lib.core.process import exit_with_parent
from course_lib.measure.loadgen import SPIN_WINDOW_S, LoadResult, run_open_loop, wait_until
from course_lib.measure.targets import wire_target


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
            await wait_until(
                spec["start_at"], spin_s=spec["spin_s"], clock=time.time
            )  # as run_open_loop does
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
        """A one-argument ``rate -> LoadResult`` for ``course_lib.measure.ladder.climb``: ``run`` at that rate (seed = rate)."""

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
