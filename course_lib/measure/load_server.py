"""The churn server under load test, in its own process, with the server-side levers exposed.

The app is the Lesson 3 one (``course_lib.serving.batching.predict.create_batched_app``: Lesson 2's ``POST /score``
plus the batched ``POST /predict``, which sheds with 503 + ``Retry-After`` when its queue is full). This
module runs it with the knobs a load test compares at the knee:

* ``http`` / ``loop``: uvicorn's HTTP parser and event loop, ``h11`` + ``asyncio`` (pure Python, what
  Lessons 2 and 3 use) or ``httptools`` + ``uvloop`` (C);
* ``workers``: uvicorn worker processes sharing the port (each loads its own model);
* ``json_encoder``: the ``/score`` answer built with the standard ``json`` module or with ``orjson``.

``serve_churn`` starts it in a subprocess on 127.0.0.1 and yields its URL and process id (to read its
memory). Every server process exits when the ``with`` block ends, after ``lifetime_s``, or as soon as
the process that started it dies.

References
----------
uvicorn documentation, "Settings" (``--http``, ``--loop``, ``--workers``, ``--factory``). orjson README.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from course_lib.serving.service import ChurnService, ScoreRequest

__all__ = [
    "HTTP_IMPLEMENTATIONS",
    "JSON_ENCODERS",
    "LOOPS",
    "OrjsonChurnService",
    "ServerHandle",
    "sample_rss",
    "serve_churn",
    "wait_idle",
]

HTTP_IMPLEMENTATIONS: tuple[str, ...] = ("h11", "httptools")
LOOPS: tuple[str, ...] = ("asyncio", "uvloop")
JSON_ENCODERS: tuple[str, ...] = ("json", "orjson")
_CONFIG_ENV = "COURSE_LOAD_SERVER_CONFIG"


class OrjsonChurnService(ChurnService):
    """``ChurnService`` whose format stage encodes the answer with ``orjson`` (same keys, same rounding)."""

    def format(self, request: ScoreRequest, churn_probability: float) -> bytes:
        import orjson

        return orjson.dumps(self.answer(request, churn_probability))  # one encode, same fields


def _build_app(config: dict[str, Any]):
    from course_lib.serving.batching.predict import churn_service, create_batched_app

    service = churn_service("xgboost", lookup_mode="cached")
    if config["json_encoder"] == "orjson":
        service = OrjsonChurnService(
            service.lookup_features,
            service.forward,
            model_version=service.model_version,
            lookup_mode=service.lookup_mode,
            runtime=service.runtime,
        )
    return create_batched_app(
        service, max_queue_size=config["max_queue_size"], max_batch_size=config["max_batch_size"]
    )


def _exit_with_parent(parent_pid: int, lifetime_s: float, graceful: bool) -> None:
    """Daemon thread: leave when the parent is gone or the lifetime is over."""

    def watch() -> None:
        deadline = time.monotonic() + lifetime_s
        while time.monotonic() < deadline and os.getppid() == parent_pid:
            time.sleep(0.25)
        if graceful:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def app_from_env():
    """uvicorn factory for worker processes: the app described by the environment (see ``main``)."""
    config = json.loads(os.environ[_CONFIG_ENV])
    if config["workers"] > 1:  # a worker of uvicorn's supervisor: leave if the supervisor dies
        _exit_with_parent(os.getppid(), config["lifetime_s"] + 30, graceful=False)
    return _build_app(config)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``python -m course_lib.measure.load_server --port P [--http ..] [--loop ..] [--workers N] ...``."""
    import uvicorn

    parser = argparse.ArgumentParser(description="Churn server for load tests, on 127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--http", choices=HTTP_IMPLEMENTATIONS, default="h11")
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json-encoder", choices=JSON_ENCODERS, default="json")
    parser.add_argument("--max-queue-size", type=int, default=256)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--lifetime-s", type=float, default=300.0)
    parser.add_argument("--parent-pid", type=int, default=os.getppid())
    args = parser.parse_args(argv)
    config = {
        k: getattr(args, k)
        for k in ("workers", "json_encoder", "max_queue_size", "max_batch_size", "lifetime_s")
    }
    os.environ[_CONFIG_ENV] = json.dumps(config)
    _exit_with_parent(args.parent_pid, args.lifetime_s, graceful=True)
    common = dict(
        host="127.0.0.1",
        port=args.port,
        http=args.http,
        loop=args.loop,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
    )
    if args.workers > 1:
        uvicorn.run(
            "course_lib.measure.load_server:app_from_env", factory=True, workers=args.workers, **common
        )
    else:
        uvicorn.run(_build_app(config), **common)


@dataclass(frozen=True)
class ServerHandle:
    """A running load-test server: base URL and the process id of its (supervisor) process."""

    url: str
    pid: int


@contextmanager
def serve_churn(
    *,
    http: str = "h11",
    loop: str = "asyncio",
    workers: int = 1,
    json_encoder: str = "json",
    max_queue_size: int = 256,
    max_batch_size: int = 64,
    lifetime_s: float = 300.0,
    startup_timeout_s: float = 120.0,
) -> Iterator[ServerHandle]:
    """Run the Lesson 3 churn server in a subprocess on 127.0.0.1 with the given levers.

    Parameters
    ----------
    http : {"h11", "httptools"}
    loop : {"asyncio", "uvloop"}
    workers : int >= 1
        uvicorn worker processes.
    json_encoder : {"json", "orjson"}
        Encoder of the ``/score`` answer.
    max_queue_size, max_batch_size : int
        The ``/predict`` batcher's bounded queue (full queue: 503 + ``Retry-After``) and batch limit.
    lifetime_s : float > 0
        The server exits by itself after this long.
    startup_timeout_s : float > 0
        How long to wait for ``/healthz`` (each worker loads the model).

    Yields
    ------
    ServerHandle

    Raises
    ------
    ValueError
        For a lever outside the allowed values.
    RuntimeError
        If the server exits or does not answer ``/healthz`` in time (with the end of its stderr).
    """
    import httpx

    from course_lib.core.waiting import wait_until

    for name, value, allowed in (
        ("http", http, HTTP_IMPLEMENTATIONS),
        ("loop", loop, LOOPS),
        ("json_encoder", json_encoder, JSON_ENCODERS),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not lifetime_s > 0:
        raise ValueError(f"lifetime_s must be > 0 seconds, got {lifetime_s!r}")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable, "-m", "course_lib.measure.load_server", f"--port={port}", f"--http={http}", f"--loop={loop}",
        f"--workers={workers}", f"--json-encoder={json_encoder}", f"--max-queue-size={max_queue_size}",
        f"--max-batch-size={max_batch_size}", f"--lifetime-s={lifetime_s}", f"--parent-pid={os.getpid()}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            return httpx.get(url + "/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, timeout_s=startup_timeout_s, interval_s=0.1, what=f"the churn server on {url}")
        yield ServerHandle(url, proc.pid)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stderr.close()


@contextmanager
def sample_rss(pid: int, *, interval_s: float = 0.05) -> Iterator[list[int]]:
    """Sample the resident memory (bytes) of process ``pid`` and its children while the block runs.

    Yields the list the samples are appended to (one sum over the process tree per ``interval_s``);
    sampling stops when the block ends.
    """
    import psutil

    root = psutil.Process(pid)
    samples: list[int] = []
    stop = threading.Event()

    def tree_rss() -> int:
        total = 0
        for proc in [root, *root.children(recursive=True)]:
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
    import httpx

    from course_lib.core.waiting import wait_until

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


if __name__ == "__main__":
    main()
