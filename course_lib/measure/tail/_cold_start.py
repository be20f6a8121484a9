"""Cold starts: the first requests a fresh replica process serves, with and without a warm-up.

A new replica (a deploy, a restart, an autoscaler adding capacity) pays costs its steady state does
not: importing the stack, loading the model, creating the ONNX Runtime session (here lazily, on the
first request), first-call allocations and empty caches in every layer. A warm-up sends dummy
requests through the replica before its readiness probe says it can take traffic, so those costs
are paid before users arrive. ``cold_start_table`` starts one fresh process per variant (all at
once, to save time), waits until each is *ready*, then measures them one after another. The replica
is the production churn service (``course_lib.serving.replica``); its lazy variant builds the app on
the first request.

References
----------
Kubernetes documentation, "Configure Liveness, Readiness and Startup Probes".
NVIDIA Triton Inference Server documentation, "Model Warmup" (``model_warmup`` in the model config).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import numpy as np
import pandas as pd

from course_lib.core.checks import InvalidArgumentError, integer, non_empty
from course_lib.core.percentiles import percentile
from course_lib.core.waiting import wait_until
from course_lib.serving.replica import ReplicaConfig, ReplicaFiles, ReplicaProcess, start_replica
from course_lib.serving.service import raise_for_status


@dataclass(frozen=True)
class ColdStartVariant:
    """How a replica starts: warm-up requests before ready, and whether the model loads lazily."""

    warmup_requests: int = 0
    lazy_load: bool = True
    gc_freeze: bool = False


def first_requests_ms(replica: ReplicaProcess, customer_ids: Sequence[str], *, ready_timeout_s: float = 60.0):
    """Wait until ``replica`` is ready, then score ``customer_ids`` one at a time over one connection.

    The readiness polls use the same keep-alive connection as the requests, so the first request
    does not pay for the TCP connect: what it measures is the replica's own first-request cost.

    Returns
    -------
    ndarray of shape (n,): latency of each request, ms.

    Raises
    ------
    TimeoutError
        If the replica is not ready within ``ready_timeout_s``.
    course_lib.serving.service.HttpStatusError
        If a request is not answered with 2xx.
    """
    with httpx.Client(base_url=replica.url, timeout=30.0) as client:

        def ready() -> bool:
            try:
                return client.get("/readyz").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(
            ready, timeout_s=ready_timeout_s, interval_s=0.01, what=f"replica {replica.url} to be ready"
        )
        out = np.empty(len(customer_ids))
        for i, customer in enumerate(customer_ids):
            start = time.perf_counter()
            response = client.post("/score", json={"customer_id": customer})
            out[i] = 1000 * (time.perf_counter() - start)
            raise_for_status(response, where=f"request {i} to {replica.url}")
    return out


def cold_start_table(
    files: ReplicaFiles,
    variants: Mapping[str, ColdStartVariant],
    customer_ids: Sequence[str],
    *,
    n_first: int = 100,
    max_lifetime_s: float = 120.0,
) -> pd.DataFrame:
    """Start one fresh replica per variant and compare its first requests with its steady state.

    Parameters
    ----------
    files : ReplicaFiles
    variants : name -> ColdStartVariant
    customer_ids : ids scored in order by every replica; the first ``n_first`` are the cold phase,
        the rest (at least ``n_first`` more) the steady phase.
    n_first : int
    max_lifetime_s : float
        Lifetime bound of each replica process.

    Returns
    -------
    DataFrame indexed by variant: ``ready_s`` (process start to ready; the processes start together
    and share the cores, so this is an upper bound for one process alone), ``first_ms`` (request 1),
    ``first100_p99_ms`` and ``first100_max_ms`` (p99 and slowest of the first ``n_first``; the
    column names carry ``n_first``), ``steady_p50_ms``, ``steady_p99_ms`` and
    ``first_vs_steady_p50`` (first request / steady p50).

    Raises
    ------
    ValueError
        If there are fewer than ``2 * n_first`` ids, or no variant.
    """
    non_empty("variants", variants)
    n_first = integer("n_first", n_first, min=1)
    if len(customer_ids) < 2 * n_first:
        raise InvalidArgumentError(
            f"need at least 2 * n_first = {2 * n_first} customer ids, got {len(customer_ids)}"
        )

    replicas = _start_replicas(files, variants, max_lifetime_s)
    try:
        ready_s = _seconds_to_ready(replicas)
        rows = {
            name: _cold_start_row(first_requests_ms(replica, customer_ids), n_first, ready_s[name])
            for name, replica in replicas.items()
        }
    finally:
        for replica in replicas.values():
            replica.stop()
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "variant"
    return table


def _start_replicas(
    files: ReplicaFiles, variants: Mapping[str, ColdStartVariant], max_lifetime_s: float
) -> dict[str, ReplicaProcess]:
    """Start one fresh replica per variant, all at once (RuntimeError, the others stopped, if one fails)."""

    def launch(variant: ColdStartVariant) -> ReplicaProcess:
        config = ReplicaConfig(warmup_requests=variant.warmup_requests, gc_freeze=variant.gc_freeze)
        return start_replica(
            files.onnx_path,
            files.store_path,
            files.model_version,
            config=config,
            lazy_load=variant.lazy_load,
            max_lifetime_s=max_lifetime_s,
        )

    with ThreadPoolExecutor(len(variants)) as pool:
        futures = {name: pool.submit(launch, v) for name, v in variants.items()}
    replicas = {name: f.result() for name, f in futures.items() if f.exception() is None}
    for name, f in futures.items():
        if f.exception() is not None:
            for replica in replicas.values():
                replica.stop()
            raise RuntimeError(f"replica for variant {name!r} did not start") from f.exception()
    return replicas


def _seconds_to_ready(replicas: Mapping[str, ReplicaProcess]) -> dict[str, float]:
    """Poll every replica until all are ready; seconds from each one's process start to its first "ready"."""
    ready_s: dict[str, float] = {}

    def all_ready() -> bool:
        for name, replica in replicas.items():
            if name not in ready_s and replica.is_ready():
                ready_s[name] = time.perf_counter() - replica.started_at
        return len(ready_s) == len(replicas)

    wait_until(all_ready, timeout_s=120.0, interval_s=0.01, what="every replica to be ready")
    return ready_s


def _cold_start_row(latencies_ms: np.ndarray, n_first: int, ready_s: float) -> dict[str, float]:
    """One variant's row: its first ``n_first`` requests (the cold phase) against the rest (steady)."""
    first, steady = latencies_ms[:n_first], latencies_ms[n_first:]
    return {
        "ready_s": ready_s,
        "first_ms": float(first[0]),
        f"first{n_first}_p99_ms": percentile(first, 99),
        f"first{n_first}_max_ms": float(first.max()),
        "steady_p50_ms": percentile(steady, 50),
        "steady_p99_ms": percentile(steady, 99),
        "first_vs_steady_p50": float(first[0] / percentile(steady, 50)),
    }
