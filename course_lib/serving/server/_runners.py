"""Run an ASGI app with uvicorn on 127.0.0.1 for a bounded time: in a thread, or in subprocesses.

Two runners, one for each need:

* ``serve_in_thread(app)``: a context manager that binds a free loopback port, starts uvicorn in a
  daemon thread, waits until it accepts connections, and always shuts it down on exit. A watchdog
  stops the server after ``max_lifetime_s`` even if the ``with`` block never ends.
* ``run_processes({name: argv})``: starts server *processes* (their own GIL, like real replicas) on
  free ports, appends ``--port=N`` to each command, waits until every one answers its readiness path
  (``GET /healthz``), yields their base URLs, and stops them (SIGTERM, then SIGKILL) when the block
  ends. Their stderr goes to a log file, never to a pipe nobody reads (a full pipe freezes a server).
  Inside the subprocess, ``serve_app(app, port=..., config=...)`` runs uvicorn hardened for abuse
  (:mod:`course_lib.serving.server._process`, re-exported here): header and body read timeouts, a connection
  limit that evicts idle connections first, a bounded graceful shutdown, a lifetime, and an exit when
  the parent process dies.

To serve your own app in processes: write a module whose ``main()`` parses ``--port`` plus
``course_lib.serving.server._config.add_arguments`` and calls ``serve_app(create_my_app(), port=args.port,
config=from_arguments(args))``; then ``run_processes({"a": [sys.executable, "-m", "my_module"]})``.

Client and server share one Python process (and its GIL) here; in production they are separate
processes on separate machines, so the transport stage measured here is a lower bound.

References
----------
Nagle, J. (1984), RFC 896 "Congestion Control in IP/TCP Internetworks"; RFC 1122 section 4.2.3.2
(delayed ACK); Python ``asyncio`` source, ``base_events._set_nodelay``.
uvicorn documentation, "Settings" and programmatic use of ``uvicorn.Server``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

import uvicorn

from course_lib.serving.server._config import DEFAULTS
from course_lib.serving.server._process import LOOPBACK_HOST, PARENT_PID_ENV, guarded_protocol, serve_app

__all__ = [
    "LOOPBACK_HOST",
    "PARENT_PID_ENV",
    "READY_PATH",
    "RunningServer",
    "ServerURLs",
    "guarded_protocol",
    "run_processes",
    "serve_app",
    "serve_in_thread",
]

#: Readiness path every course server answers with 200 once it can serve.
READY_PATH = "/healthz"


@dataclass
class RunningServer:
    """A live server: where it listens and how to stop it."""

    host: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8123``."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.thread.is_alive() and not self.server.should_exit

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit, wait up to ``timeout_s``, then force it.

        Raises
        ------
        RuntimeError
            If the thread is still alive after the forced exit.
        """
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise RuntimeError(f"uvicorn on {self.url} did not stop within {2 * timeout_s:g} s")


@contextmanager
def serve_in_thread(
    app: object,
    *,
    port: int = 0,
    max_lifetime_s: float = DEFAULTS.lifetime_s,
    startup_timeout_s: float = 20.0,
    log_level: str = "warning",
    tcp_nodelay: bool = True,
) -> Iterator[RunningServer]:
    """Serve ``app`` with uvicorn on 127.0.0.1 for the duration of the ``with`` block.

    Parameters
    ----------
    app : ASGI application (e.g. from ``course_lib.serving.service.create_app``).
    port : int
        0 (default) picks a free port; the chosen one is ``RunningServer.port``.
    max_lifetime_s : float
        Hard limit: a watchdog asks the server to exit after this many seconds.
    startup_timeout_s : float
        How long to wait for uvicorn to accept connections.
    log_level : str
        uvicorn's log level (access logging is off).
    tcp_nodelay : bool
        True (default): answers leave at once. False leaves Nagle's algorithm on for accepted
        connections, to demonstrate the classic ~40 ms stall: uvicorn writes the response head and
        body separately, Nagle holds the body until the first part is acknowledged, and the client
        delays that acknowledgement (Linux: at least 40 ms). asyncio switches Nagle off
        (``TCP_NODELAY``) only on connections accepted from a socket created with
        ``IPPROTO_TCP``, which is how the flag is implemented here.

    Yields
    ------
    RunningServer

    Raises
    ------
    ValueError
        For a port outside 0..65535 or a non-positive time limit.
    RuntimeError
        If uvicorn fails to start within ``startup_timeout_s``.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in 0..65535 (0 = any free port), got {port!r}")
    for name, value in (("max_lifetime_s", max_lifetime_s), ("startup_timeout_s", startup_timeout_s)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    proto = socket.IPPROTO_TCP if tcp_nodelay else 0  # see tcp_nodelay above
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK_HOST, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        host=LOOPBACK_HOST,
        port=bound_port,
        lifespan="off",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, round(DEFAULTS.graceful_shutdown_s)),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{bound_port}", daemon=True
    )
    handle = RunningServer(LOOPBACK_HOST, bound_port, server, thread)
    watchdog = threading.Timer(max_lifetime_s, lambda: setattr(server, "should_exit", True))
    watchdog.daemon = True
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {handle.url} within {startup_timeout_s:g} s")
            time.sleep(0.01)
        watchdog.start()
        yield handle
    finally:
        watchdog.cancel()
        try:
            handle.stop()
        finally:
            sock.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK_HOST, 0))
        return int(sock.getsockname()[1])


def _log_tail(log: IO[bytes], n_bytes: int = 2000) -> str:
    log.flush()
    log.seek(0, os.SEEK_END)
    size = log.tell()
    log.seek(max(0, size - n_bytes))
    return log.read().decode(errors="replace")


def _stop(proc: subprocess.Popen, timeout_s: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ServerURLs(dict):
    """name -> base URL, plus ``processes`` (name -> ``subprocess.Popen``) for tests and diagnostics."""

    processes: dict[Hashable, subprocess.Popen]


@contextmanager
def run_processes(
    commands: Mapping[Hashable, Sequence[str]],
    *,
    startup_timeout_s: float = 90.0,
    ready_path: str = READY_PATH,
    stop_timeout_s: float = DEFAULTS.graceful_shutdown_s + 5.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[ServerURLs]:
    """Start server processes on free 127.0.0.1 ports at once; yield their base URLs when all are ready.

    Parameters
    ----------
    commands : mapping name -> argv
        Each command is started with ``--port=<free port>`` appended; it must serve HTTP on
        127.0.0.1 at that port (e.g. via ``serve_app``) and answer ``ready_path`` with 200 when ready.
    startup_timeout_s : float
        How long to wait for every server to be ready.
    ready_path : str
        Readiness endpoint (default ``/healthz``).
    stop_timeout_s : float
        After SIGTERM, how long a server may take to exit before SIGKILL.
    env : mapping, optional
        Extra environment variables. ``OMP_NUM_THREADS`` defaults to 1 and ``COURSE_SERVER_PARENT_PID``
        is set to this process, so the servers exit if it dies.

    Yields
    ------
    ServerURLs
        A dict name -> base URL such as ``http://127.0.0.1:8123`` (its ``processes`` attribute holds
        the ``Popen`` objects). Every server is stopped when the block ends.

    Raises
    ------
    RuntimeError
        If a server exits or is not ready in time; the message holds the end of its log (stderr).
    """
    import httpx

    procs: dict[Hashable, subprocess.Popen] = {}
    logs: dict[Hashable, IO[bytes]] = {}
    urls = ServerURLs()
    urls.processes = procs
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        PARENT_PID_ENV: str(os.getpid()),
        **(env or {}),
    }
    try:
        for name, argv in commands.items():
            port = _free_port()
            # an anonymous file, closed in the finally below (a pipe nobody reads would freeze the server)
            logs[name] = tempfile.TemporaryFile(prefix="course-server-", suffix=".log")  # noqa: SIM115
            procs[name] = subprocess.Popen(
                [*argv, f"--port={port}"],
                stdin=subprocess.DEVNULL,
                stdout=logs[name],
                stderr=subprocess.STDOUT,
                env=full_env,
            )
            urls[name] = f"http://{LOOPBACK_HOST}:{port}"
        deadline = time.monotonic() + startup_timeout_s
        waiting = dict(urls.items())
        while waiting:
            for name, url in list(waiting.items()):
                proc = procs[name]
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"server {name!r} exited with code {proc.returncode}: {_log_tail(logs[name])}"
                    )
                try:
                    if httpx.get(url + ready_path, timeout=1.0).status_code == 200:
                        del waiting[name]
                except httpx.TransportError:
                    pass
            if waiting and time.monotonic() > deadline:
                tails = {n: _log_tail(logs[n], 500) for n in waiting}
                raise RuntimeError(
                    f"servers {list(waiting)} were not ready at {ready_path} within {startup_timeout_s:g} s; "
                    f"their logs end with: {tails}"
                )
            if waiting:
                time.sleep(0.1)
        yield urls
    finally:
        for proc in procs.values():
            _stop(proc, stop_timeout_s)
        for log in logs.values():
            log.close()
