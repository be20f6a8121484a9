"""Score a job's chunks on every usable core: this process plus ``workers - 1`` worker processes.

One concept: spreading chunks over processes. Python runs one thread of Python code at a time, so a
second core needs a second process. :func:`run_chunks` keeps a queue of chunk tasks; this process
takes the next one whenever it is free, and so does each worker process (a new chunk is handed to a
worker the moment it finishes one), so no core waits while chunks remain, and the job starts scoring
at once instead of waiting for the workers to start (importing NumPy, pyarrow and XGBoost takes a
worker about a second): the workers are started from a thread of their own while this process
scores its first chunk. Every process reads its own chunks from the store and writes its own parts
(:func:`course_lib.offline.chunk.score_chunk`); only the task and a small result cross between them.

Each worker process builds its scorer once and reuses it for all its chunks. Workers are forked from
multiprocessing's *fork server* (:mod:`course_lib.offline.fork_server`; :func:`warm_up_workers` starts
it ahead of time, and the first pool of a process waits for it otherwise). A worker ignores Ctrl-C
(this process stops the pool) and exits within a fraction of a second when this process dies, even by
SIGKILL.

References
----------
Python documentation, ``concurrent.futures.ProcessPoolExecutor`` (``mp_context``, ``initializer``,
``Future.add_done_callback``) and ``multiprocessing`` "Contexts and start methods".
"""

from __future__ import annotations

import collections
import math
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TypedDict

from course_lib.core.checks import integer
from course_lib.core.process import exit_with_parent
from course_lib.offline.chunk import ChunkResult, ChunkTask, score_chunk
from course_lib.offline.fork_server import warm_up_workers, worker_context

__all__ = ["PARENT_CHECK_S", "run_chunks", "warm_up_workers", "worker_pool"]

#: How often a worker process checks that the job's process is still alive, seconds.
PARENT_CHECK_S = 0.1


def _exit_with_job(job_pid: int) -> None:
    """Worker initializer: ignore Ctrl-C, and exit as soon as the job's process ``job_pid`` is gone.

    The worker's parent is the fork server (or the job itself when spawned): an orphan is re-parented
    (its parent pid changes), and the job's own pid vanishes once it is reaped.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(os.getppid(), with_pid=job_pid, check_s=PARENT_CHECK_S, exit_code=1)


def worker_pool(processes: int) -> ProcessPoolExecutor:
    """A pool of ``processes`` worker processes started as described above (close it with ``shutdown``)."""
    processes = integer("processes", processes, min=1)
    return ProcessPoolExecutor(
        processes, mp_context=worker_context(), initializer=_exit_with_job, initargs=(os.getpid(),)
    )


class PoolStats(TypedDict):
    """What ``run_chunks`` reports about its worker processes."""

    worker_processes: int
    first_worker_result_s: float


class _SharedQueue:
    """``run_chunks``' tasks shared by this process and the worker pool: who takes the next chunk, and
    the workers' results handed back to this thread (``on_result`` is only ever called here).

    ``outstanding`` counts the chunks handed to the pool whose result this thread has not collected; it
    is counted before the chunk is submitted, so :meth:`collect` waits for it. ``stop`` (set after an
    error) hands out no new chunk. ``first_s``: seconds from ``start`` to a worker's first finished chunk.
    """

    def __init__(
        self,
        todo: collections.deque[ChunkTask],
        pool: ProcessPoolExecutor,
        on_result: Callable[[ChunkResult], None],
        start: float,
    ) -> None:
        self.todo, self.pool, self.on_result, self.start = todo, pool, on_result, start
        self.lock = threading.Lock()
        self.done: queue.SimpleQueue[Future[ChunkResult]] = queue.SimpleQueue()
        self.outstanding = 0
        self.stop = False
        self.first_s = float("nan")

    def take(self, *, for_pool: bool) -> ChunkTask | None:
        with self.lock:
            if not self.todo or self.stop:
                return None
            self.outstanding += for_pool  # counted before it is submitted, so collect() waits for it
            return self.todo.popleft()

    def feed(self) -> None:  # runs at the start, then in the pool's thread as each worker finishes
        task = self.take(for_pool=True)
        if task is None:
            return
        try:
            future = self.pool.submit(score_chunk, task)
        except Exception as error:  # a broken pool, one shutting down after an error, a failed start
            future = Future()
            future.set_exception(error)  # counted as outstanding: collect() raises it
        future.add_done_callback(self.finished)

    def start_workers(self, n_workers: int) -> None:
        # The first submit starts the worker processes and waits for the fork server, which may still
        # be importing its modules; in a thread of its own, that wait overlaps this process's scoring.
        for _ in range(n_workers):
            self.feed()

    def finished(self, future: Future) -> None:  # in the pool's thread, the moment a worker's chunk ends
        ok = not future.cancelled() and future.exception() is None
        with self.lock:
            if ok and math.isnan(self.first_s):
                self.first_s = time.perf_counter() - self.start
        self.done.put(future)
        if ok:
            self.feed()

    def collect(self, block: bool) -> None:
        """Give the results that arrived (``block``: all outstanding) to ``on_result``; raise an error."""
        while self.outstanding:
            try:
                future = self.done.get(block=block)
            except queue.Empty:
                return
            with self.lock:
                self.outstanding -= 1
            error = future.exception()
            if error is not None:
                raise error
            self.on_result(future.result())


def run_chunks(
    tasks: Sequence[ChunkTask], *, workers: int, on_result: Callable[[ChunkResult], None]
) -> PoolStats:
    """Score every task, ``workers`` at a time (this process included); call ``on_result`` for each.

    Parameters
    ----------
    tasks : sequence of ChunkTask
        Chunks still to do, in the order to start them.
    workers : int >= 1
        Processes scoring at once: 1 scores everything in this process; ``k`` adds ``k - 1`` worker
        processes (never more than there are tasks to share).
    on_result : callable
        Called in this thread, once per finished chunk, in completion order.

    Returns
    -------
    dict
        ``worker_processes`` started, and ``first_worker_result_s``: seconds from the start until a
        worker process finished its first chunk (NaN without workers): one chunk's time plus the
        workers' start-up cost. Stamped when the worker's result arrives, not when this process,
        busy with a chunk of its own, gets round to it.

    Raises
    ------
    Exception
        The first error a chunk raised (in any process); no new chunk starts after it. A worker
        process that dies raises ``BrokenProcessPool``. Finished parts stay: the job resumes.
    """
    workers = integer("workers", workers, min=1)
    todo = collections.deque(tasks)
    extra = min(workers - 1, max(len(todo) - 1, 0))
    start = time.perf_counter()
    if extra == 0:
        while todo:
            on_result(score_chunk(todo.popleft()))
        return {"worker_processes": 0, "first_worker_result_s": float("nan")}
    shared = _SharedQueue(todo, worker_pool(extra), on_result, start)
    starter = threading.Thread(target=shared.start_workers, args=(extra,), name="start-workers", daemon=True)
    try:
        starter.start()
        while (task := shared.take(for_pool=False)) is not None:
            on_result(score_chunk(task))
            shared.collect(block=False)
        starter.join()  # every task it took is counted as outstanding before collect() waits for it
        shared.collect(block=True)
    except BaseException:
        with shared.lock:
            shared.stop = True
        if starter.is_alive():
            starter.join()
        # chunks in flight finish; their parts stay valid
        shared.pool.shutdown(wait=True, cancel_futures=True)
        raise
    shared.pool.shutdown(wait=True)
    return {"worker_processes": extra, "first_worker_result_s": shared.first_s}
