"""The lessons' live experiments that drive a serving component with open-loop load and summarise it.

They sit here, above :mod:`course_lib.serving`, because they use the load generator
(:mod:`course_lib.measure.loadgen`); the components they drive do not know about load testing.

* ``run_hedged_load``: Lesson 7, hedged requests between two replicas, one run (repeated in rounds
  by :mod:`course_lib.measure.tail`);
* ``run_fallback_load``: Lesson 7, per-call timeouts with a flagged fallback;
* ``measure_dedup``: Lesson 8, request de-duplication in the batcher next to a cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from course_lib.core.checks import non_empty
from course_lib.core.percentiles import percentiles
from course_lib.measure.gc_pauses import gc_paused
from course_lib.measure.loadgen import run_open_loop
from course_lib.measure.targets import coroutine_target
from course_lib.serving.batching.batcher import DynamicBatcher
from course_lib.serving.batching.predict import customer_key
from course_lib.serving.fallback import FallbackScorer
from course_lib.serving.hedging import HedgeStats, HedgingClient

__all__ = ["measure_dedup", "run_fallback_load", "run_hedged_load"]


async def run_hedged_load(
    replica_urls: Sequence[str],
    customer_ids: Sequence[str],
    *,
    hedge_after_ms: float | None,
    n_requests: int,
    rate_rps: float,
    seed: int,
    id_prefix: str = "h",
    max_duration_s: float = 60.0,
    pause_gc: bool = True,
) -> tuple[pd.DataFrame, HedgeStats]:
    """Open-loop Poisson load (``course_lib.measure.loadgen.run_open_loop``) through a new ``HedgingClient``.

    Request ``i`` scores ``customer_ids[i % len]`` with request id ``f"{id_prefix}{i}"``, so two runs
    with the same prefix send the same requests (and a replica stalling by id stalls the same ones).
    With ``pause_gc`` (the default) this process's cyclic garbage collector is off during the run
    (``course_lib.measure.gc_pauses.gc_paused``): a full collection of a notebook kernel's heap would
    stop the client's event loop with every request in flight, and the hedges it then sends at once
    would measure the client, not the replicas.

    Returns
    -------
    (requests, stats)
        ``requests``: one row per request, in request order, with loadgen's columns (``latency_ms``
        from the scheduled send time, ``ok``, ``outcome``, ``error``; a request whose copies were all
        answered 429/503 is ``"shed"``, not ``"error"``) plus ``hedged``, ``winner`` and ``primary``
        (replica indexes) and ``x_request_id`` (the id sent); ``stats``: the client's ``HedgeStats``.
    """
    non_empty("customer_ids", customer_ids)
    async with HedgingClient(replica_urls, hedge_after_ms=hedge_after_ms) as client:

        async def send(i: int) -> dict[str, Any]:
            sent_id = f"{id_prefix}{i}"
            res = await client.score(customer_ids[i % len(customer_ids)], request_id=sent_id)
            return {
                "hedged": res.hedged,
                "winner": res.replica,
                "primary": res.primary,
                "x_request_id": sent_id,
            }

        with gc_paused() if pause_gc else contextlib.nullcontext():
            result = await run_open_loop(
                send, rate_rps=rate_rps, n_requests=n_requests, max_duration_s=max_duration_s, seed=seed
            )
    return result.requests.sort_values("request_id").reset_index(drop=True), client.stats


async def run_fallback_load(
    scorer: FallbackScorer,
    customer_ids: Sequence[str],
    *,
    rate_rps: float,
    seed: int,
    max_duration_s: float = 60.0,
) -> pd.DataFrame:
    """Score every customer once through ``scorer`` under open-loop Poisson load.

    Request ``i`` scores ``customer_ids[i]`` with call id ``str(i)`` (so the same calls stall in every
    run). Returns loadgen's request table (in request order) plus ``churn_probability`` and
    ``fallback``.
    """

    async def send(i: int) -> dict[str, Any]:
        return await scorer.score(customer_ids[i], call_id=str(i))

    result = await run_open_loop(
        send, rate_rps=rate_rps, n_requests=len(customer_ids), max_duration_s=max_duration_s, seed=seed
    )
    return result.requests.sort_values("request_id").reset_index(drop=True)


async def measure_dedup(
    score_batch: Callable[[list[dict[str, object]]], Sequence[float]],
    records: Sequence[dict[str, object]],
    *,
    rate_rps: float,
    max_batch_size: int = 64,
    max_queue_delay_ms: float = 2.0,
    seed: int = 0,
    max_duration_s: float = 30.0,
) -> dict[str, Any]:
    """Send ``records`` (one request each, in order) at Poisson times through a de-duplicating batcher.

    Uses Lesson 3's ``DynamicBatcher`` with ``course_lib.serving.batching.predict.customer_key`` (equal
    feature values share one model row while they wait together in the queue) and the open-loop
    load generator ``course_lib.measure.loadgen.run_open_loop``.

    Returns
    -------
    dict
        ``submitted``, ``completed``, ``deduplicated``, ``dedup_rate`` (deduplicated / submitted),
        ``batches``, ``items_scored``, ``errors`` (requests that failed), ``scheduled_s`` (the send
        times, seconds from the start, shape (n,)), ``p50_ms`` / ``p99_ms`` of the latency.

    Raises
    ------
    ValueError
        If ``records`` is empty or a batcher knob or the rate is out of range.
    """
    non_empty("records", records)
    async with DynamicBatcher(
        score_batch,
        max_batch_size=max_batch_size,
        max_queue_delay_ms=max_queue_delay_ms,
        max_queue_size=max(1024, 4 * max_batch_size),
        dedup_key=customer_key,
    ) as batcher:
        result = await run_open_loop(
            coroutine_target(batcher.submit, list(records)),
            rate_rps=rate_rps,
            n_requests=len(records),
            max_duration_s=max_duration_s,
            seed=seed,
        )
        stats = batcher.stats.as_dict()
    frame = result.requests
    ok = frame["latency_ms"].dropna().to_numpy()
    quantiles = percentiles(ok, (50, 99)) if len(ok) else {"p50": np.nan, "p99": np.nan}
    return {
        "submitted": stats["submitted"],
        "completed": stats["completed"],
        "deduplicated": stats["deduplicated"],
        "dedup_rate": stats["deduplicated"] / stats["submitted"] if stats["submitted"] else np.nan,
        "batches": stats["batches"],
        "items_scored": stats["items_scored"],
        "errors": int((~frame["ok"]).sum()),
        "scheduled_s": frame["scheduled_ms"].to_numpy() / 1000.0,
        "p50_ms": quantiles["p50"],
        "p99_ms": quantiles["p99"],
    }
