"""ONNX Runtime settings against latency: graph optimisation level, intra-op threads, oversubscription.

Oversubscription is what happens when several processes each bring their own thread pool to the same
few cores.

Two experiments, both measured for real:

* ``tuning_table``: every (graph optimisation level, intra-op thread count) pair timed side by side
  at each batch size, in interleaved rounds so that machine noise hits all settings alike;
* ``oversubscription_table``: ``n_processes`` worker processes, each with its own session and
  ``intra_op_num_threads`` threads, score single customers at the same time. When processes x
  threads exceeds the cores, threads that ONNX Runtime keeps spinning for the next parallel section
  take turns with the threads doing real work, and the per-request latency (p99 most of all) grows
  while throughput does not.

References
----------
ONNX Runtime documentation, "Thread management" (``intra_op_num_threads``; the default of 0 means
one thread per physical core) and "Graph optimizations" (disabled / basic / extended / all).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from course_lib.churn.export import make_session
from course_lib.core.bench import compare_latency, time_calls_ns, usable_cores
from course_lib.core.checks import InvalidArgumentError, integer, non_empty, one_of
from course_lib.core.percentiles import percentile

__all__ = ["GRAPH_OPTIMIZATION_LEVELS", "oversubscription_table", "tuning_table", "usable_cores"]

GRAPH_OPTIMIZATION_LEVELS: tuple[str, ...] = ("disabled", "basic", "extended", "all")


def _check_feeds_by_batch(feeds_by_batch: Mapping[int, Mapping[str, np.ndarray]]) -> None:
    non_empty("feeds_by_batch", feeds_by_batch)
    for batch, feeds in feeds_by_batch.items():
        rows = {len(v) for v in feeds.values()}
        if rows != {batch}:
            raise InvalidArgumentError(
                f"feeds for batch size {batch} hold {sorted(rows)} rows; they must hold exactly {batch}"
            )


def tuning_table(
    model: str | Path | bytes,
    feeds_by_batch: Mapping[int, Mapping[str, np.ndarray]],
    *,
    levels: Sequence[str] = GRAPH_OPTIMIZATION_LEVELS,
    intra_op_threads: Sequence[int] = (1, 2),
    n_calls: Mapping[int, int] | None = None,
    rounds: int = 3,
    warmup_calls: int = 5,
) -> pd.DataFrame:
    """Latency of one model under every (optimisation level, intra-op threads) pair, per batch size.

    Parameters
    ----------
    model : path to an ``.onnx`` file, or its serialized bytes.
    feeds_by_batch : mapping of batch size -> feeds with exactly that many rows
        E.g. ``{1: scorer.feeds(X[:1]), 1024: scorer.feeds(X[:1024])}``.
    levels : graph optimisation levels to try (see ``GRAPH_OPTIMIZATION_LEVELS``).
    intra_op_threads : intra-op thread counts to try, each >= 0 (0 = ONNX Runtime's default, one per
        physical core).
    n_calls : mapping of batch size -> timed calls per round, optional
        A batch size it does not name gets the harness's rule (:func:`course_lib.core.bench.calls_per_round`:
        about 1 s timed per setting, 20 to 1,000 calls per round).
    rounds, warmup_calls : as in ``course_lib.core.bench.compare_latency``.

    Returns
    -------
    DataFrame indexed by (``batch_size``, ``graph_optimization_level``, ``intra_op_num_threads``) with
    ``median_us``, ``p99_us``, ``us_per_item`` and ``speedup`` (against the first level with the first
    thread count, at the same batch size; all settings of one batch size were timed in one run).

    Raises
    ------
    ValueError
        Unknown level, thread count < 1, or feeds whose row count differs from their batch size.
    """
    _check_feeds_by_batch(feeds_by_batch)
    for i, level in enumerate(non_empty("levels", levels)):
        one_of(f"levels[{i}]", level, GRAPH_OPTIMIZATION_LEVELS)
    sessions = {
        (level, threads): make_session(model, graph_optimization_level=level, intra_op_num_threads=threads)
        for level in levels
        for threads in intra_op_threads
    }
    parts = []
    for batch, feeds in feeds_by_batch.items():
        calls = (n_calls or {}).get(batch)  # None: the harness's rule, course_lib.core.bench.calls_per_round
        candidates = {key: (lambda s=sess, f=dict(feeds): s.run(None, f)) for key, sess in sessions.items()}
        table = compare_latency(
            candidates, n_calls=calls, rounds=rounds, warmup_calls=warmup_calls, items_per_call=batch
        )
        table.index = pd.MultiIndex.from_tuples(
            [(batch, level, threads) for level, threads in table.index],
            names=["batch_size", "graph_optimization_level", "intra_op_num_threads"],
        )
        parts.append(table)
    return pd.concat(parts)


def _oversubscription_worker(model, feeds, threads, n_calls, warmup_calls, barrier, results) -> None:
    session = make_session(model, intra_op_num_threads=threads)
    time_calls_ns(lambda: session.run(None, feeds), 1, warmup_calls=warmup_calls)
    barrier.wait()
    start = time.perf_counter_ns()
    samples = time_calls_ns(lambda: session.run(None, feeds), n_calls)
    results.put((samples, time.perf_counter_ns() - start))


def _worker_context() -> mp.context.BaseContext:
    """A fork server that has imported this module once (fast, clean children), else ``spawn``."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        return ctx
    return mp.get_context("spawn")  # pragma: no cover - Windows


def oversubscription_table(
    model: str | Path | bytes,
    feeds: Mapping[str, np.ndarray],
    configs: Sequence[tuple[int, int]],
    *,
    n_calls: int = 2000,
    warmup_calls: int = 50,
    timeout_s: float = 120.0,
) -> pd.DataFrame:
    """Per-call latency when ``n_processes`` processes, each with ``threads`` intra-op threads, score at once.

    Each configuration starts its worker processes (from a fork server that imported this module
    once, or ``spawn`` where there is none), lets each build its own session and
    warm up, releases them together through a barrier, and has each time ``n_calls`` calls on
    ``feeds``. Samples of all workers are merged before percentiles are taken (percentiles are
    never averaged across workers).

    Parameters
    ----------
    model : path to an ``.onnx`` file, or its serialized bytes.
    feeds : the input of one call (e.g. one customer).
    configs : sequence of (n_processes, intra_op_num_threads); n_processes >= 1, threads >= 0 where 0
        is ONNX Runtime's default (one thread per physical core, in every process).
    n_calls, warmup_calls : timed and untimed calls per worker.
    timeout_s : give up on a configuration whose workers have not reported after this many seconds.

    Returns
    -------
    DataFrame indexed by (``n_processes``, ``intra_op_num_threads``) with ``threads_total`` (a
    thread count of 0 is counted as ``usable_cores()``, which is what ONNX Runtime starts on a machine
    whose logical cores are physical), ``threads_per_core`` (threads_total / usable cores), ``p50_us``, ``p99_us`` (nearest rank) and
    ``achieved_rps`` (all workers' calls divided by the slowest worker's wall time).

    Raises
    ------
    ValueError
        For an empty ``configs``, fewer than 1 process or a negative thread count.
    TimeoutError
        If a configuration's workers do not finish within ``timeout_s``; they are terminated.
    """
    for i, (n_proc, threads) in enumerate(non_empty("configs", configs)):
        integer(f"configs[{i}] n_processes", n_proc, min=1)
        integer(f"configs[{i}] intra_op_num_threads", threads, min=0)
    n_calls = integer("n_calls", n_calls, min=1)
    source = str(model) if isinstance(model, Path) else model
    ctx = _worker_context()
    cores = usable_cores()
    rows = {}
    for n_proc, threads in configs:
        barrier = ctx.Barrier(n_proc)
        results = ctx.Queue()
        workers = [
            ctx.Process(
                target=_oversubscription_worker,
                args=(source, dict(feeds), threads, n_calls, warmup_calls, barrier, results),
                daemon=True,
            )
            for _ in range(n_proc)
        ]
        for w in workers:
            w.start()
        collected = []
        deadline = time.monotonic() + timeout_s
        try:
            for _ in workers:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"workers for {(n_proc, threads)} did not finish within {timeout_s} s")
                try:
                    collected.append(results.get(timeout=remaining))
                except Exception as exc:  # queue.Empty
                    raise TimeoutError(
                        f"workers for {(n_proc, threads)} did not finish within {timeout_s} s"
                    ) from exc
        finally:
            for w in workers:
                w.join(timeout=5)
                if w.is_alive():
                    w.terminate()
                    w.join()
        us = np.concatenate([c[0] for c in collected]) / 1e3
        wall_s = max(c[1] for c in collected) / 1e9
        rows[(n_proc, threads)] = {
            "threads_total": n_proc * (threads or cores),
            "threads_per_core": n_proc * (threads or cores) / cores,
            "p50_us": percentile(us, 50),
            "p99_us": percentile(us, 99),
            "achieved_rps": len(us) / wall_s,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index = pd.MultiIndex.from_tuples(list(rows), names=["n_processes", "intra_op_num_threads"])
    return table
