"""Batch scoring at the hardware's pace: the job end to end beside its model-only floor, on every usable core.

One run prints everything issue 29 asks to check (and, with ``--out``, records it, the release's record being
``data/measurements/batch_scoring.json``):

1. **runtime candidates**: ``choose_runtime`` times XGBoost ``inplace_predict``, ONNX Runtime and
   treelite + tl2cgen compiled trees (where a C compiler exists) model-only on one encoded chunk;
2. **floor and job, interleaved**: each repeat measures the model-only floor (the chosen runtime on
   pre-encoded chunks, the job's processes, :func:`course_lib.offline.floor.model_floor`) and then runs
   the job end to end on 1,000,000 customers (Parquet store read to Parquet parts written,
   ``python -m course_lib.offline`` in a fresh process) with every usable core, and the same with one
   process; rows/s per repeat, the stage split, the process's wall time and the peak memory of the job's
   process tree (sampled every 20 ms: resident and proportional set size);
3. **checks**: the parallel job's files equal the single-process job's byte for byte; a parallel job
   killed by SIGKILL leaves no worker behind and resumes to the same files;
4. **memory**: 10,000,000 customers with the peak memory of the process tree;
5. **verdicts** against the targets: 1M customers in under 4 s (>= 250,000 rows/s), end to end >= floor
   / 1.3 on the same cores, 10M customers under 1 GB (10^9 bytes) peak.

Run: ``python benchmarks/batch_scoring.py --out data/measurements/batch_scoring.json`` (full: about 5
minutes on a busy 2-core machine, of which the first build of the 10M store takes about a minute and
scoring it most of the rest) or ``--quick`` (200k customers and a 2M memory run, about 2 minutes). Like
the other benchmarks it writes a record only with ``--out``. Timings hold for this machine and its load
only (printed); rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

from course_lib.churn.data import DATA_DIR
from course_lib.churn.model import load_or_train_churn_model
from course_lib.core.env import env_report
from course_lib.core.waiting import wait_until
from course_lib.measure.capacity_record import write_measurement
from course_lib.offline.floor import model_floor
from course_lib.offline.job import (
    SOURCE000_ROWS_PER_S,
    build_parquet_store,
    choose_runtime,
    default_workers,
    same_output,
)
from course_lib.offline.rows import check_rows, encode_rows
from course_lib.offline.scorers import scorer_spec
from course_lib.offline.store import plan_chunks, read_chunk
from course_lib.offline.workers import warm_up_workers

RECORD = DATA_DIR / "measurements" / "batch_scoring.json"
SCHEMA = "inference-workbook/batch-scoring/1"
TARGET_1M_S, TARGET_ROWS_PER_S, FLOOR_FACTOR, TARGET_RSS_BYTES = 4.0, 250_000, 1.3, 10**9
AT = "2026-01-04T06:00:00+00:00"  # one scored_at for every run, so their files can be compared byte for byte
MIB = 2**20


class TreeMemory:
    """Peak resident (RSS) and proportional (PSS) memory of a process and its descendants, sampled.

    RSS every ``every_s`` (``/proc/<pid>/statm``, microseconds); PSS every ``pss_every``-th sample only:
    it reads ``/proc/<pid>/smaps_rollup``, about 1 ms per process, so sampling it at 50 Hz over the
    job's processes took a fifth of a core from the job it was timing.
    """

    def __init__(self, pid: int, every_s: float = 0.02, pss_every: int = 10):
        self.root, self.every_s, self.pss_every = psutil.Process(pid), every_s, pss_every
        self.peak_rss, self.peak_pss = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        sample = 0
        while not self._stop.is_set():
            rss = pss = 0
            with_pss = sample % self.pss_every == 0
            sample += 1
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    if with_pss:
                        info = p.memory_full_info()
                        rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
                    else:
                        rss += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            self.peak_rss = max(self.peak_rss, rss)
            if with_pss:
                self.peak_pss = max(self.peak_pss, pss)
            self._stop.wait(self.every_s)

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        return self.peak_rss / MIB, self.peak_pss / MIB


def job_command(store: Path, out: Path, runtime: str, workers: int, chunk_rows: int = 100_000) -> list[str]:
    return [sys.executable, "-m", "course_lib.offline", "--source", str(store), "--out", str(out),
            "--runtime", runtime, "--workers", str(workers), "--chunk-rows", str(chunk_rows), "--scored-at", AT,
            "--no-progress"]  # fmt: skip


def run_job(store: Path, out: Path, runtime: str, workers: int) -> dict:
    """The job in a fresh process; its JSON summary plus wall time and the tree's sampled peaks."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    job = subprocess.Popen(job_command(store, out, runtime, workers), stdout=subprocess.PIPE, text=True)
    memory = TreeMemory(job.pid)
    stdout, _ = job.communicate()
    wall_s = time.perf_counter() - start
    peak_rss, peak_pss = memory.stop()
    if job.returncode != 0:
        raise RuntimeError(f"the job exited with {job.returncode}")
    summary = json.loads(stdout.strip().splitlines()[-1])
    return {**summary, "process_wall_s": wall_s, "tree_peak_rss_mib": peak_rss, "tree_peak_pss_mib": peak_pss}


def kill_and_resume(store: Path, folder: Path, runtime: str, workers: int, chunk_rows: int) -> dict:
    """SIGKILL a running parallel job after 3 parts, check its workers exit, resume, compare with a whole run."""
    out, reference = folder / "killed", folder / "whole"
    for path in (out, reference):
        shutil.rmtree(path, ignore_errors=True)
    subprocess.run(
        job_command(store, reference, runtime, workers, chunk_rows), capture_output=True, check=True
    )
    # stderr too: after a SIGKILL, multiprocessing's resource tracker reports the job's semaphores it frees
    job = subprocess.Popen(job_command(store, out, runtime, workers, chunk_rows), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_until(
            lambda: len(list(out.glob("part-*.parquet"))) >= 3 or job.poll() is not None, timeout_s=300
        )
        family = psutil.Process(job.pid).children(recursive=True)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait()
    killed_running = job.returncode == -signal.SIGKILL
    parts_at_kill = len(list(out.glob("part-*.parquet")))

    def gone() -> bool:
        return not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    workers_exited = bool(wait_until(gone, timeout_s=30, what="the killed job's workers to exit"))
    parts_after_exit = len(list(out.glob("part-*.parquet")))  # a worker may finish its part before it notices
    command = job_command(store, out, runtime, workers, chunk_rows)
    summary = json.loads(
        subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    )
    return {"chunk_rows": chunk_rows, "killed_while_running": killed_running, "parts_at_kill": parts_at_kill,
            "parts_when_workers_exited": parts_after_exit,
            "of_parts": summary["chunks"], "workers_exited_after_kill": workers_exited,
            "chunks_resumed": summary["chunks_resumed"],
            "resumed_equals_uninterrupted": same_output(out, reference)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200k customers, 2 repeats, a 2M memory run")
    parser.add_argument("--customers", type=int, default=None, help="end-to-end size (default 1,000,000)")
    parser.add_argument("--memory-customers", type=int, default=None, help="memory run (default 10,000,000)")
    parser.add_argument("--repeats", type=int, default=None, help="floor + job repeats (default 3)")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: every usable core)")
    parser.add_argument("--runtime", default="auto", help="xgboost, onnxruntime, treelite or auto (fastest)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"write the record here (JSON; the release's is {RECORD.relative_to(DATA_DIR.parent)})",
    )
    args = parser.parse_args()
    customers = args.customers or (200_000 if args.quick else 1_000_000)
    memory_customers = args.memory_customers or (2_000_000 if args.quick else 10_000_000)
    repeats = args.repeats or (2 if args.quick else 3)
    workers = args.workers or default_workers()
    warm_up_workers()
    env = env_report()
    print(env)
    model = load_or_train_churn_model()
    store = build_parquet_store(customers, 0)
    sample = read_chunk(plan_chunks(store, 100_000), 0)
    best, candidates = choose_runtime(model, sample)
    runtime = best if args.runtime == "auto" else args.runtime
    print(
        f"\nruntime candidates, model only, one process, {sample.num_rows:,} encoded rows (choose_runtime):"
    )
    with pd.option_context("display.width", 160, "display.max_colwidth", 60):
        print(candidates[["median_us", "rows_per_s", "speedup", "max_abs_diff", "note"]].round(3))
    print(f"chosen: {runtime} ({'fastest' if runtime == best else 'asked for'}); job processes: {workers}")
    spec = scorer_spec(model, runtime)
    X = encode_rows(check_rows(sample), spec.encoding)
    scratch = Path(tempfile.mkdtemp(prefix="batch_scoring_"))
    rows, floors = [], []
    try:
        for r in range(repeats):  # floor and job interleaved, so drift on the machine hits both
            for procs in (workers, 1):
                floor = model_floor(spec, X, processes=procs, calls=5)
                floors.append({"repeat": r, "processes": procs, "rows_per_s": floor.rows_per_s})
                job = run_job(store, scratch / f"w{procs}", runtime, procs)
                rows.append({"repeat": r, "processes": procs, **{k: job[k] for k in (
                    "seconds", "rows_per_s", "process_wall_s", "peak_rss_mib", "tree_peak_rss_mib",
                    "tree_peak_pss_mib", "first_worker_result_s")}, "stage_s": job["stage_s"],
                    "floor_rows_per_s": floor.rows_per_s})  # fmt: skip
                print(f"repeat {r} processes {procs}: floor {floor.rows_per_s:>9,.0f} rows/s | job {job['seconds']:5.2f} s "
                      f"{job['rows_per_s']:>9,.0f} rows/s (process wall {job['process_wall_s']:.1f} s), "
                      f"floor/job {floor.rows_per_s / job['rows_per_s']:.2f}")  # fmt: skip
        same = same_output(scratch / f"w{workers}", scratch / "w1")
        resume = kill_and_resume(store, scratch, runtime, workers, chunk_rows=max(1_000, customers // 20))
        memory_store = build_parquet_store(memory_customers, 0)
        memory = run_job(memory_store, scratch / "memory", runtime, workers)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    runs = pd.DataFrame(rows)
    report(runs, same, resume, memory, customers, memory_customers, workers, runtime, env)
    if args.out is not None:
        path = write_measurement(
            args.out, SCHEMA, command="python benchmarks/batch_scoring.py" + (" --quick" if args.quick else "") + f" --out {args.out}",
            load_average_1m=env.load_average_1m, load_average_1m_at_end=os.getloadavg()[0], runtime=runtime, processes=workers, threads_per_process=1,
            customers=customers, memory_customers=memory_customers, chunk_rows=100_000, repeats=repeats,
            candidates=candidates.reset_index().replace({np.nan: None}).to_dict(orient="records"),
            runs=runs.to_dict(orient="records"),
            floor_rows_per_s=float(runs[runs.processes == workers]["floor_rows_per_s"].median()),
            checks={"parallel_equals_single_process": same, **resume},
            memory_run={k: memory[k] for k in ("rows_read", "seconds", "rows_per_s", "peak_rss_mib",
                        "peak_rss_mib_by_process", "tree_peak_rss_mib", "tree_peak_pss_mib", "workers")},
        )  # fmt: skip
        print(f"\nwrote {path}")


def report(runs, same, resume, memory, customers, memory_customers, workers, runtime, env) -> None:
    print(f"\n=== verdicts ({runtime}, {workers} processes, load average {env.load_average_1m:.2f}) ===")
    par = runs[runs.processes == workers]
    median_s, median_rps = par["seconds"].median(), par["rows_per_s"].median()
    ratio = (par["floor_rows_per_s"] / par["rows_per_s"]).median()
    scale = customers / 1_000_000
    print(f"{customers:,} customers end to end: median {median_s:.2f} s = {median_rps:,.0f} rows/s "
          f"(repeats {', '.join(f'{v:,.0f}' for v in par['rows_per_s'])}; "
          f"{median_rps / SOURCE000_ROWS_PER_S:,.0f}x source 000's {SOURCE000_ROWS_PER_S:,.0f} rows/s)")  # fmt: skip
    print(f"  1M in under {TARGET_1M_S:g} s (>= {TARGET_ROWS_PER_S:,} rows/s): "
          f"{'met' if median_rps >= TARGET_ROWS_PER_S else 'NOT met'}"
          + ("" if scale == 1 else f" (measured on {customers:,}, not 1,000,000)"))  # fmt: skip
    print(
        f"  floor / end to end = {ratio:.2f} (median of the repeats), target <= {FLOOR_FACTOR}: "
        f"{'met' if ratio <= FLOOR_FACTOR else 'NOT met'}"
    )
    stage = pd.DataFrame(list(par["stage_s"])).sum()
    print(
        "  where the processes' time went: "
        + ", ".join(f"{k} {v / stage.sum():.0%}" for k, v in stage.items())
    )
    one = runs[runs.processes == 1]
    print(
        f"  one process: median {one['rows_per_s'].median():,.0f} rows/s, floor/job "
        f"{(one['floor_rows_per_s'] / one['rows_per_s']).median():.2f}; "
        f"{workers} processes / one: {median_rps / one['rows_per_s'].median():.2f}x"
    )
    print(
        f"  job process tree peak: RSS {par['tree_peak_rss_mib'].max():,.0f} MiB, PSS {par['tree_peak_pss_mib'].max():,.0f} MiB"
    )
    print(f"parallel files == single-process files, byte for byte: {same}")
    print(
        f"SIGKILL with {resume['parts_at_kill']} of {resume['of_parts']} parts written (job still running: "
        f"{resume['killed_while_running']}); its workers exited: {resume['workers_exited_after_kill']} (by then "
        f"{resume['parts_when_workers_exited']} parts); the rerun resumed {resume['chunks_resumed']} parts; files "
        f"equal an uninterrupted run's: {resume['resumed_equals_uninterrupted']}"
    )
    peak_bytes = max(memory["tree_peak_rss_mib"], memory["peak_rss_mib"]) * MIB
    print(f"{memory_customers:,} customers: {memory['seconds']:.1f} s = {memory['rows_per_s']:,.0f} rows/s, "
          f"peak RSS of the process tree {memory['tree_peak_rss_mib']:,.0f} MiB (PSS {memory['tree_peak_pss_mib']:,.0f} MiB; "
          f"per-process peaks {memory['peak_rss_mib_by_process']}): under 1 GB "
          f"{'met' if peak_bytes < TARGET_RSS_BYTES else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
