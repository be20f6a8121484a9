"""Many models on shared hardware: measured memory per model, pool sizing, start-up time, noisy neighbours.

* :func:`rss_per_model_mib` loads the same ONNX model ``n`` times as separate ONNX Runtime sessions in a
  fresh process and reads its resident memory (``psutil``) after each: the increments are what one more
  model costs a multi-model server, the first reading is the process's fixed cost.
* :func:`pool_plan` compares one replica pair per model with a shared pool sized for the models'
  combined peak (``course_lib.cost.replicas_needed``) that holds every model in each replica's memory.
* :func:`measure_startup_s` times a fresh replica process from spawn to "ready": interpreter and
  library import, session creation, and a warm-up of N calls.
* :func:`noisy_neighbour` times single-row scoring in this process while a batch-scoring process shares
  the cores, at normal priority with all threads, and niced with one thread (a priority and
  concurrency limit), switching the neighbours on and off with SIGCONT/SIGSTOP in interleaved rounds
  whose order rotates; every round gives each condition's p50 and p99 next to the same round's
  "alone", so the ratios get intervals over the rounds (:mod:`course_lib.core.intervals`).

Each helper process is started with this module's command line (``python -m course_lib.operate.model_pool``),
exits when its work or its ``--lifetime-s`` is done, and also within a fraction of a second of its
parent's death (``course_lib.core.process.exit_with_parent``); its stderr goes to an anonymous log.

References
----------
Source lesson 001, "Many models on shared hardware" (fifteen low-traffic models on one shared pool;
"live models before batch jobs").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

from course_lib.core.bench import round_order, time_calls_ns
from course_lib.core.checks import integer
from course_lib.core.intervals import ratio_interval
from course_lib.core.percentiles import percentile
from course_lib.core.process import child_env, exit_with_parent, start_child, stop_processes
from course_lib.core.waiting import wait_until
from course_lib.cost import replicas_needed

__all__ = ["measure_startup_s", "noisy_neighbour", "pool_plan", "rss_per_model_mib"]

_MIB = 2**20


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "course_lib.operate.model_pool", *args]


def _run_json(args: list[str], timeout_s: float) -> dict:
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=child_env(),
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[3:5])} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rss_per_model_mib(model_path: str | Path, n_models: int, *, timeout_s: float = 120.0) -> list[float]:
    """Resident memory (MiB) of a fresh process after loading 0, 1, ..., ``n_models`` sessions.

    Returns a list of ``n_models + 1`` readings; differences are the memory each model adds. Raises
    ``ValueError`` for ``n_models < 1`` and ``FileNotFoundError`` for a missing model file.
    """
    n_models = integer("n_models", n_models, min=1)
    if not Path(model_path).is_file():
        raise FileNotFoundError(f"ONNX model file not found: {model_path}")
    return _run_json(_command("memory", "--model", str(model_path), "--n", str(n_models)), timeout_s)[
        "rss_mib"
    ]


def measure_startup_s(model_path: str | Path, *, warmup_calls: int = 100, timeout_s: float = 120.0) -> dict:
    """Seconds from spawning a replica process to "ready", by phase.

    Returns ``{"spawn_to_ready_s", "interpreter_and_imports_s", "session_s", "data_s", "first_call_ms",
    "warmup_s"}``: ``spawn_to_ready_s`` is timed by this process around the whole child;
    ``session_s`` (one ONNX Runtime session), ``data_s`` (reading the request rows), the first call and
    ``warmup_calls`` more are timed inside the child; ``interpreter_and_imports_s`` is the rest (Python
    start-up and every import, numpy/pandas/onnxruntime/course_lib included). A lower bound for a real
    pod, which also waits for scheduling and an image pull.
    """
    warmup_calls = integer("warmup_calls", warmup_calls, min=0)
    start = time.perf_counter()
    out = _run_json(_command("startup", "--model", str(model_path), "--warmup", str(warmup_calls)), timeout_s)
    out["spawn_to_ready_s"] = time.perf_counter() - start
    timed_inside = out["session_s"] + out["data_s"] + out["first_call_ms"] / 1000 + out["warmup_s"]
    out["interpreter_and_imports_s"] = out["spawn_to_ready_s"] - timed_inside
    return out


def pool_plan(
    peak_rps: Sequence[float],
    *,
    rps_per_replica: float,
    model_memory_mib: float,
    base_memory_mib: float,
    replica_memory_mib: float,
    min_replicas_each: int = 2,
    min_replicas_pool: int = 2,
    headroom: float = 0.3,
) -> pd.DataFrame:
    """Replicas and memory for dedicated replica pairs vs one shared pool, at equal reliability.

    Each dedicated pair survives the loss of one replica (every model's peak fits one replica); the
    pool is sized to survive one lost replica too: at least ``ceil(total peak / rps_per_replica) + 1``.

    Parameters
    ----------
    peak_rps : sequence of float > 0
        Each model's peak traffic, requests per second.
    rps_per_replica : float
        What one replica serves, whichever model it runs (requests per second).
    model_memory_mib, base_memory_mib : float
        Measured memory per loaded model and the process's fixed cost (:func:`rss_per_model_mib`).
    replica_memory_mib : float
        Memory one replica may use; the pool needs ``base + n_models x model`` to fit.
    min_replicas_each, min_replicas_pool : int
        Reliability floors: a pair per model, and at least this many pool replicas.
    headroom : float
        Spare capacity fraction, as in :func:`course_lib.cost.replicas_needed`.

    Returns
    -------
    pandas.DataFrame
        Rows "dedicated" and "shared pool": replicas, memory per replica (MiB), whether it fits.
    """
    peaks = [float(p) for p in peak_rps]
    if not peaks:
        raise ValueError("peak_rps must list at least one model's peak")
    dedicated = sum(
        replicas_needed(p, rps_per_replica, headroom=headroom, min_replicas=min_replicas_each) for p in peaks
    )
    if max(peaks) > rps_per_replica:
        raise ValueError(
            f"each model's peak must fit one replica ({rps_per_replica} req/s), got {max(peaks)}"
        )
    n_plus_one = math.ceil(sum(peaks) / rps_per_replica) + 1
    pooled = max(
        replicas_needed(sum(peaks), rps_per_replica, headroom=headroom, min_replicas=min_replicas_pool),
        n_plus_one,
    )
    pool_memory = base_memory_mib + len(peaks) * model_memory_mib
    return pd.DataFrame(
        [
            ("dedicated", dedicated, base_memory_mib + model_memory_mib),
            ("shared pool", pooled, pool_memory),
        ],
        columns=["layout", "replicas", "memory_per_replica_mib"],
    ).assign(fits=lambda d: d["memory_per_replica_mib"] <= replica_memory_mib)


def noisy_neighbour(
    score_one: Callable[[], object],
    model_path: str | Path,
    *,
    calls_per_block: int = 2000,
    rounds: int = 6,
    batch_rows: int = 20_000,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """p50/p99 of ``score_one()`` alone and beside a batch job, with and without a priority limit.

    Two batch-job processes score ``batch_rows``-row batches in a loop: one at normal priority with
    as many threads as cores, one at ``nice 19`` with one thread. Both are paused (SIGSTOP) except
    during their own blocks; the three conditions run in ``rounds`` interleaved rounds, in an order
    rotated from round to round (:func:`course_lib.core.bench.round_order`), warm-up excluded.

    Parameters
    ----------
    score_one : zero-argument callable, one live request's work.
    model_path : the ONNX model the batch jobs score.
    calls_per_block : int
        Timed calls per condition per round; a per-round p99 needs at least 1,000
        (:func:`course_lib.core.percentiles.samples_needed`).
    rounds : int
        At least ``min_rounds(confidence)`` (6 for 0.95).
    batch_rows : rows per batch-job call.
    confidence : coverage of the ratios' intervals.

    Returns
    -------
    DataFrame, one row per condition: ``p50_us``, ``p99_us`` (nearest rank over all rounds),
    ``p99_vs_alone`` (median over rounds of the round's p99 over the same round's p99 alone) with
    ``p99_low`` and ``p99_high`` (its interval), and ``p50_vs_alone`` the same way for the median.
    ``.attrs["intervals"]`` maps (condition, "p50" or "p99") to its
    :class:`course_lib.core.intervals.RatioInterval` for wording the result.
    """
    jobs = {
        "beside a batch job (all cores, normal priority)": ("0", str(os.cpu_count() or 1)),
        "beside a batch job (nice 19, 1 thread)": ("19", "1"),
    }
    procs: dict[str, subprocess.Popen] = {}
    samples: dict[str, list[np.ndarray]] = {"alone": [], **{name: [] for name in jobs}}
    try:
        for name, (nice, threads) in jobs.items():
            args = ["batch-job", "--model", str(model_path), "--rows", str(batch_rows)]
            procs[name] = _start_batch_job([*args, "--threads", threads, "--nice", nice])
            # Paused at once: a running all-core job would starve the next one's start-up (at nice 19
            # on a busy 2-core machine it did not start within 120 s).
            procs[name].send_signal(signal.SIGSTOP)
        time_calls_ns(score_one, calls_per_block)  # warm-up, excluded
        for r in range(rounds):
            for name in round_order(list(samples), r):
                proc = procs.get(name)
                if proc is not None:
                    proc.send_signal(signal.SIGCONT)
                    time.sleep(0.05)  # let the neighbour reach its steady loop (not an ordering wait)
                samples[name].append(time_calls_ns(score_one, calls_per_block))
                if proc is not None:
                    proc.send_signal(signal.SIGSTOP)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGCONT)
        stop_processes(list(procs.values()), 30)
    rows, intervals = [], {}
    for name, blocks in samples.items():
        us = np.concatenate(blocks) / 1000.0
        row = {"condition": name, "p50_us": percentile(us, 50), "p99_us": percentile(us, 99)}
        for q in (50, 99):
            interval = ratio_interval(blocks, samples["alone"], q=q, confidence=confidence)
            intervals[(name, f"p{q}")] = interval
            row[f"p{q}_vs_alone"] = interval.ratio
            if q == 99:
                row["p99_low"], row["p99_high"] = interval.low, interval.high
        rows.append(row)
    table = pd.DataFrame(rows)[
        ["condition", "p50_us", "p99_us", "p99_vs_alone", "p99_low", "p99_high", "p50_vs_alone"]
    ]
    table.attrs["intervals"] = intervals
    return table


def _start_batch_job(args: list[str]) -> subprocess.Popen:
    child = start_child(_command(*args), name="batch job", stdout=subprocess.PIPE)
    proc = child.popen
    ready = threading.Event()

    def read_ready_line() -> None:
        assert proc.stdout is not None  # started with stdout=PIPE
        proc.stdout.readline()
        ready.set()

    threading.Thread(target=read_ready_line, daemon=True).start()
    wait_until(
        lambda: ready.is_set() or proc.poll() is not None, timeout_s=120, what="the batch job to start"
    )
    child.check_running()  # the end of its log if it exited early
    return proc


# ----------------------------------------------------------------------------- child process side


def _one_row_feeds(session: object, n: int) -> dict:
    from course_lib.churn.data import clean_telco, load_telco  # noqa: PLC0415 (subprocess entry point)
    from course_lib.churn.export import OnnxChurnScorer  # noqa: PLC0415 (subprocess entry point)
    from course_lib.churn.model import features  # noqa: PLC0415 (subprocess entry point)

    frame = features(clean_telco(load_telco()))
    rows = frame.sample(n=n, replace=n > len(frame), random_state=0)
    return OnnxChurnScorer(session).feeds(rows)


def _child(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m course_lib.operate.model_pool")
    parser.add_argument("mode", choices=["memory", "startup", "batch-job"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--lifetime-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    exit_with_parent()
    lifetime = threading.Timer(args.lifetime_s, os._exit, (0,))
    lifetime.daemon = True
    lifetime.start()
    from course_lib.churn.export import make_session  # noqa: PLC0415 (subprocess entry point)

    if args.mode == "memory":
        me = psutil.Process()
        readings = [me.memory_info().rss / _MIB]
        sessions = []
        for _ in range(args.n):
            sessions.append(make_session(args.model))
            readings.append(me.memory_info().rss / _MIB)
        print(json.dumps({"rss_mib": readings}))
    elif args.mode == "startup":
        t1 = time.perf_counter()
        session = make_session(args.model)
        t2 = time.perf_counter()
        feeds = _one_row_feeds(session, 1)
        t3 = time.perf_counter()
        session.run(None, feeds)
        t4 = time.perf_counter()
        for _ in range(args.warmup):
            session.run(None, feeds)
        t5 = time.perf_counter()
        out = {
            "session_s": t2 - t1,
            "data_s": t3 - t2,
            "first_call_ms": 1000 * (t4 - t3),
            "warmup_s": t5 - t4,
        }
        print(json.dumps(out))
    else:
        os.nice(args.nice)
        session = make_session(args.model, intra_op_num_threads=args.threads)
        feeds = _one_row_feeds(session, args.rows)
        print("ready", flush=True)
        while True:
            session.run(None, feeds)


if __name__ == "__main__":
    _child(sys.argv[1:])
    sys.exit(0)
