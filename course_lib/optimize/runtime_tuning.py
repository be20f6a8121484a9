"""ONNX Runtime settings against latency: graph optimisation level, intra-op threads, oversubscription.

Oversubscription is what happens when several processes each bring their own thread pool to the same
few cores.

Two experiments, both measured for real:

* ``tuning_table``: every (graph optimisation level, intra-op thread count) pair timed side by side
  at each batch size, in interleaved rounds so that machine noise hits all settings alike;
  ``tuning_ratio`` gives the interval for any two settings from those rounds, and
  ``optimized_op_counts`` shows what each optimisation level actually did to the graph (deterministic);
* ``oversubscription_table``: ``n_processes`` worker processes, each with its own session and
  ``intra_op_num_threads`` threads, score single customers at the same time. When processes x
  threads exceeds the cores, threads that ONNX Runtime keeps spinning for the next parallel section
  take turns with the threads doing real work, and the per-request latency (p99 most of all) grows
  while throughput does not. With ``repeats`` the configurations take turns (rotated order) and
  ``oversubscription_ratio`` gives an interval over the paired repeats.

References
----------
ONNX Runtime documentation, "Thread management" (``intra_op_num_threads``; the default of 0 means
one thread per physical core) and "Graph optimizations" (disabled / basic / extended / all).
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import tempfile
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd

from course_lib.churn.export import make_session
from course_lib.core.bench import compare_latency_by_batch, round_order, time_calls_ns, usable_cores
from course_lib.core.checks import InvalidArgumentError, integer, non_empty, one_of
from course_lib.core.intervals import RatioInterval, ratio_interval, ratio_interval_from_values
from course_lib.core.percentiles import percentile

__all__ = [
    "GRAPH_OPTIMIZATION_LEVELS",
    "optimized_op_counts",
    "oversubscription_ratio",
    "oversubscription_table",
    "tuning_ratio",
    "tuning_table",
    "usable_cores",
]

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
    rounds: int = 6,
    warmup_calls: int = 5,
    confidence: float | None = None,
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
    n_calls, rounds, warmup_calls, confidence : as in :func:`course_lib.core.bench.compare_latency_by_batch`
        (each setting is a candidate).

    Returns
    -------
    DataFrame indexed by (``batch_size``, ``graph_optimization_level``, ``intra_op_num_threads``) with
    ``median_us``, ``p99_us``, ``us_per_item`` and ``speedup`` (against the first level with the first
    thread count, at the same batch size; all settings of one batch size were timed in one run).
    ``.attrs["rounds_ns"]`` maps each index tuple to its per-round call times, for :func:`tuning_ratio`.

    Raises
    ------
    ValueError
        Unknown level, thread count < 1, or feeds whose row count differs from their batch size.
    """
    _check_feeds_by_batch(feeds_by_batch)
    rounds_ns: dict[Hashable, np.ndarray] = {}
    for i, level in enumerate(non_empty("levels", levels)):
        one_of(f"levels[{i}]", level, GRAPH_OPTIMIZATION_LEVELS)
    sessions = {
        (level, threads): make_session(model, graph_optimization_level=level, intra_op_num_threads=threads)
        for level in levels
        for threads in intra_op_threads
    }

    def candidates_at(batch: int) -> dict[tuple[str, int], Callable[..., object]]:
        feeds = feeds_by_batch[batch]
        return {key: (lambda s=sess, f=dict(feeds): s.run(None, f)) for key, sess in sessions.items()}

    tables = compare_latency_by_batch(
        candidates_at,
        feeds_by_batch,
        n_calls=n_calls,
        rounds=rounds,
        warmup_calls=warmup_calls,
        confidence=confidence,
    )
    parts = []
    for batch, table in tables.items():
        rounds_ns.update({(batch, *key): ns for key, ns in table.attrs["rounds_ns"].items()})
        table.attrs = {}
        table.index = pd.MultiIndex.from_tuples(
            [(batch, level, threads) for level, threads in table.index],
            names=["batch_size", "graph_optimization_level", "intra_op_num_threads"],
        )
        parts.append(table)
    out = pd.concat(parts)
    out.attrs["rounds_ns"] = rounds_ns
    return out


def tuning_ratio(
    table: pd.DataFrame,
    candidate: tuple[int, str, int],
    baseline: tuple[int, str, int],
    *,
    confidence: float = 0.95,
) -> RatioInterval:
    """Median time of ``candidate`` over ``baseline`` (two index tuples of one batch size), round by round.

    Parameters
    ----------
    table : a :func:`tuning_table` result (it keeps the rounds in ``.attrs["rounds_ns"]``).
    candidate, baseline : (batch_size, graph_optimization_level, intra_op_num_threads), same batch size.
    confidence : as in :func:`course_lib.core.intervals.ratio_interval` (6 rounds for 0.95).

    Returns
    -------
    RatioInterval, below 1 when the candidate took less time.

    Raises
    ------
    KeyError
        For a setting the table does not hold.
    ValueError
        For two batch sizes (timed in different runs, so not paired) or too few rounds.
    """
    if candidate[0] != baseline[0]:
        raise ValueError(
            f"compare settings of one batch size (timed together), got {candidate} and {baseline}"
        )
    rounds_ns = table.attrs.get("rounds_ns", {})
    return ratio_interval(
        rounds_ns[tuple(candidate)], rounds_ns[tuple(baseline)], q=50, confidence=confidence
    )


def optimized_op_counts(
    model: str | Path | bytes, levels: Sequence[str] = GRAPH_OPTIMIZATION_LEVELS
) -> pd.DataFrame:
    """The operators of the graph ONNX Runtime actually runs at each optimisation level (no timing).

    Each level's session writes its optimised graph (``SessionOptions.optimized_model_filepath``) to a
    temporary file, which is read back and counted; a level that fuses or removes nodes shows it here,
    whatever the load on the machine.

    Returns
    -------
    DataFrame indexed by level, one column per operator type (counts) and ``nodes`` (their total).

    Raises
    ------
    ValueError
        For an unknown level.
    """
    codes = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    bad = [lv for lv in levels if lv not in codes]
    if bad or not levels:
        raise ValueError(f"levels must be a non-empty subset of {list(codes)}, got {list(levels)}")
    source = model if isinstance(model, bytes) else Path(model).read_bytes()
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for level in levels:
            options = ort.SessionOptions()
            options.graph_optimization_level = codes[level]
            options.optimized_model_filepath = str(Path(folder) / f"{level}.onnx")
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            options.log_severity_level = 3  # "all" warns that its saved graph is machine-specific
            ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
            graph = onnx.load(options.optimized_model_filepath).graph
            rows[level] = dict(collections.Counter(node.op_type for node in graph.node))
    table = pd.DataFrame.from_dict(rows, orient="index").fillna(0).astype(int)
    table = table[sorted(table.columns)]
    table["nodes"] = table.sum(axis=1)
    return table.rename_axis("graph_optimization_level")


def _oversubscription_worker(model, feeds, threads, n_calls, warmup_calls, barrier, results) -> None:
    session = make_session(model, intra_op_num_threads=threads)
    time_calls_ns(lambda: session.run(None, feeds), 1, warmup_calls=warmup_calls)
    barrier.wait()
    start = time.perf_counter_ns()
    samples = time_calls_ns(lambda: session.run(None, feeds), n_calls)
    results.put((samples, time.perf_counter_ns() - start))


def _worker_context() -> mp.context.ForkServerContext | mp.context.SpawnContext:
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
    repeats: int = 1,
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
    repeats : int >= 1
        Rounds; each runs every configuration once, in an order rotated from round to round
        (:func:`course_lib.core.bench.round_order`), so a slow moment of the machine falls on all of them.

    Returns
    -------
    DataFrame indexed by (``n_processes``, ``intra_op_num_threads``) with ``threads_total`` (a thread count of
    0 is counted as ``usable_cores()``, which is what ONNX Runtime starts on a machine whose logical cores are
    physical), ``threads_per_core`` (threads_total / usable cores), ``p50_us``, ``p99_us`` (nearest rank) and
    ``achieved_rps`` (all workers' calls divided by the slowest worker's wall time); with ``repeats`` > 1 the
    percentiles are over all repeats' samples merged and ``achieved_rps`` is the median over repeats.
    ``.attrs["repeats"]`` maps each configuration to its per-repeat ``p50_us``, ``p99_us`` and
    ``achieved_rps`` (lists in round order), for :func:`oversubscription_ratio`.

    Raises
    ------
    ValueError
        For an empty ``configs``, fewer than 1 process or a negative thread count.
    TimeoutError
        If a configuration's workers do not finish within ``timeout_s``; they are terminated.
    """
    keys = _check_configs(configs)
    n_calls = integer("n_calls", n_calls, min=1)
    repeats = integer("repeats", repeats, min=1)
    source = str(model) if isinstance(model, Path) else model
    ctx = _worker_context()
    per_repeat: dict[tuple[int, int], list[dict[str, float]]] = {k: [] for k in keys}
    merged: dict[tuple[int, int], list[np.ndarray]] = {k: [] for k in keys}
    for r in range(repeats):
        for n_proc, threads in round_order(keys, r):
            us, rps = _run_config(ctx, source, feeds, n_proc, threads, n_calls, warmup_calls, timeout_s)
            merged[(n_proc, threads)].append(us)
            per_repeat[(n_proc, threads)].append(
                {"p50_us": percentile(us, 50), "p99_us": percentile(us, 99), "achieved_rps": rps}
            )
    return _oversubscription_rows(keys, merged, per_repeat)


def _check_configs(configs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (n_processes, intra_op_num_threads) pairs, each checked: at least 1 process, threads >= 0."""
    for i, (n_proc, threads) in enumerate(non_empty("configs", configs)):
        integer(f"configs[{i}] n_processes", n_proc, min=1)
        integer(f"configs[{i}] intra_op_num_threads", threads, min=0)
    return [(n_proc, threads) for n_proc, threads in configs]


def _oversubscription_rows(
    keys: Sequence[tuple[int, int]],
    merged: Mapping[tuple[int, int], list[np.ndarray]],
    per_repeat: Mapping[tuple[int, int], list[dict[str, float]]],
) -> pd.DataFrame:
    """The table of :func:`oversubscription_table`: percentiles over the merged samples, median rate."""
    cores = usable_cores()
    rows = {}
    for n_proc, threads in keys:
        us = np.concatenate(merged[(n_proc, threads)])
        rows[(n_proc, threads)] = {
            "threads_total": n_proc * (threads or cores),
            "threads_per_core": n_proc * (threads or cores) / cores,
            "p50_us": percentile(us, 50),
            "p99_us": percentile(us, 99),
            "achieved_rps": float(np.median([rep["achieved_rps"] for rep in per_repeat[(n_proc, threads)]])),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index = pd.MultiIndex.from_tuples(list(rows), names=["n_processes", "intra_op_num_threads"])
    table.attrs["repeats"] = {
        k: {m: [rep[m] for rep in reps] for m in ("p50_us", "p99_us", "achieved_rps")}
        for k, reps in per_repeat.items()
    }
    return table


def oversubscription_ratio(
    table: pd.DataFrame,
    candidate: tuple[int, int],
    baseline: tuple[int, int],
    *,
    metric: str = "achieved_rps",
    confidence: float = 0.95,
) -> RatioInterval:
    """``metric`` of ``candidate`` over ``baseline`` (two configurations), per repeat, with its interval.

    Parameters
    ----------
    table : an :func:`oversubscription_table` result with ``repeats >= min_rounds(confidence)``.
    candidate, baseline : (n_processes, intra_op_num_threads) configurations in the table.
    metric : {"achieved_rps", "p50_us", "p99_us"}
    confidence : float in (0, 1)

    Raises
    ------
    KeyError
        For a configuration or metric the table does not hold.
    ValueError
        For too few repeats.
    """
    reps = table.attrs["repeats"]
    cand, base = reps[tuple(candidate)][metric], reps[tuple(baseline)][metric]
    return ratio_interval_from_values(np.asarray(cand) / np.asarray(base), confidence)


def _run_config(
    ctx: mp.context.ForkServerContext | mp.context.SpawnContext,
    source: object,
    feeds: Mapping[str, np.ndarray],
    n_proc: int,
    threads: int,
    n_calls: int,
    warmup_calls: int,
    timeout_s: float,
) -> tuple[np.ndarray, float]:
    """One configuration once: the merged per-call times (us) of its workers and their achieved rate."""
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
    return us, len(us) / wall_s
