"""What a load test reads off a server besides its answers: its memory, and whether it is idle again.

``sample_rss`` samples the resident memory of server processes (and their children) while a block
runs; ``wait_idle`` waits until a server has worked off its backlog, the settle step between two
rungs of a rate ladder. Both work on any course server: the prototype
(``course_lib.serving.prototype.serve_churn``), the production service or a replica.

References
----------
psutil documentation, ``Process.memory_info`` (``rss``) and ``Process.children(recursive=True)``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

import httpx
import psutil

from course_lib.core.waiting import wait_until

__all__ = ["sample_rss", "wait_idle"]


@contextmanager
def sample_rss(pid: int | Sequence[int], *, interval_s: float = 0.05) -> Iterator[list[int]]:
    """Sample the resident memory (bytes) of process ``pid`` (or several) and their children while the
    block runs.

    Yields the list the samples are appended to (one sum over the process trees per ``interval_s``);
    sampling stops when the block ends.
    """
    roots = [psutil.Process(p) for p in ([pid] if isinstance(pid, int) else pid)]
    samples: list[int] = []
    stop = threading.Event()

    def tree_rss() -> int:
        total = 0
        for proc in [*roots, *(c for r in roots for c in r.children(recursive=True))]:
            with suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def loop() -> None:
        while not stop.is_set():
            samples.append(tree_rss())
            stop.wait(interval_s)

    samples.append(tree_rss())
    thread = threading.Thread(target=loop, name="rss-sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(5)
        samples.append(tree_rss())


def wait_idle(url: str, *, quick_ms: float = 20.0, timeout_s: float = 30.0, strict: bool = True) -> float:
    """Wait until the server has worked off any backlog: ``GET /healthz`` answers within ``quick_ms``.

    ``/healthz`` runs on the same event loop as the scoring routes, so while a backlog of earlier
    requests is being served it waits behind them. Returns the last round trip in ms.

    Parameters
    ----------
    url : base URL of the server.
    quick_ms : float > 0
        A round trip this short means the server is idle.
    timeout_s : float > 0
        How long to keep checking.
    strict : bool
        True: raise if the server is still slow after ``timeout_s``. False: return the last round
        trip anyway (a machine busy with other programs may never answer quickly; the next
        measurement then shows it).

    Raises
    ------
    TimeoutError
        If ``strict`` and the server is still busy after ``timeout_s``.
    """
    last = [float("inf")]

    def quick() -> bool:
        start = time.perf_counter()
        try:
            httpx.get(url + "/healthz", timeout=timeout_s)
        except httpx.TransportError:
            return False
        last[0] = 1000.0 * (time.perf_counter() - start)
        return last[0] <= quick_ms

    try:
        wait_until(
            quick, timeout_s=timeout_s, interval_s=0.05, what=f"{url} to answer /healthz in {quick_ms:g} ms"
        )
    except TimeoutError:
        if strict:
            raise
    return last[0]
