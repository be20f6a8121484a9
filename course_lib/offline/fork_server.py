"""Where the batch job's worker processes come from: multiprocessing's fork server, started early.

One concept: a worker that starts in milliseconds. The fork server is a clean single-threaded process
that imports this package's chunk pipeline and XGBoost once (:mod:`course_lib.offline.worker_imports`:
about half a second on a 2-core laptop, since XGBoost's scikit-learn wrappers are left out; with them
it took 1.5 s, longer than the job's own start, so the first worker started late) and forks every
worker from there, so a worker starts safely whatever threads the job's process runs. Where there is no fork
server (Windows) workers are spawned. This module imports nothing heavy, so that
``python -m course_lib.offline`` can start the fork server before its own imports and model load,
and the two overlap.

References
----------
Python documentation, ``multiprocessing`` "Contexts and start methods" and
``multiprocessing.set_forkserver_preload``.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver

__all__ = ["PRELOAD", "warm_up_workers", "worker_context"]

#: What the fork server imports once for every worker it forks.
PRELOAD = ["course_lib.offline.worker_imports"]


def worker_context() -> multiprocessing.context.BaseContext:
    """The fork-server context with :data:`PRELOAD` (spawn where there is no fork server)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)  # takes effect when the server starts
        return context
    return multiprocessing.get_context("spawn")


def warm_up_workers() -> None:
    """Start the fork server now, so that the job's worker processes start in milliseconds later.

    It imports NumPy, pyarrow and XGBoost (a second or more) while this process does other work, and
    stays until this process exits. Does nothing where workers are spawned, or if it runs already.
    """
    if worker_context().get_start_method() == "forkserver":
        multiprocessing.forkserver.ensure_running()
