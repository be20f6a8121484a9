"""Run an ASGI app with uvicorn on 127.0.0.1 for a bounded time: in a thread, or in subprocesses.

The two places a course server is started, both on the one runtime of :mod:`course_lib.serving.server._serve`
(the same ``uvicorn_config``: the door, the guarded protocol, every limit of ``ServerConfig``):

* ``serve_in_thread(app)``: a context manager that binds a free loopback port, starts uvicorn in a
  daemon thread, waits until it accepts connections, and always shuts it down on exit. A watchdog
  stops the server after ``max_lifetime_s`` even if the ``with`` block never ends.
* ``run_processes({name: argv})``: starts server *processes* (their own GIL, like real replicas) on
  free ports, appends ``--port=N`` to each command, waits until every one is ready (its readiness
  line, and ``GET /healthz`` answering 200), yields their base URLs, and stops them (SIGTERM to each
  process group, then SIGKILL) when the block ends. ``workers=k`` starts each command k times on one
  port (``SO_REUSEPORT``: the kernel spreads connections over them). Their output goes to anonymous
  log files (never a pipe nobody reads: a full pipe freezes a server; no file is left behind),
  whose end is quoted when a server fails. Inside each subprocess ``serve_app(app, port=...,
  config=...)`` runs the hardened uvicorn, with a lifetime and an exit when its parent dies.

To serve your own app in processes: write a module whose ``main()`` parses ``--port`` plus
``course_lib.serving.server._config.add_arguments`` and calls ``serve_app(create_my_app(), port=args.port,
config=from_arguments(args))``; then ``run_processes({"a": [sys.executable, "-m", "my_module"]})``.

Client and server share one Python process (and its GIL) with ``serve_in_thread``; in production they
are separate processes on separate machines, so the transport stage measured there is a lower bound.

References
----------
Nagle, J. (1984), RFC 896 "Congestion Control in IP/TCP Internetworks"; RFC 1122 section 4.2.3.2
(delayed ACK); Python ``asyncio`` source, ``base_events._set_nodelay``.
uvicorn documentation, "Settings" and programmatic use of ``uvicorn.Server``.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import uvicorn

from course_lib.core.checks import integer, positive_number
from course_lib.core.process import (
    LOOPBACK_HOST,
    ChildProcess,
    free_port,
    reserve_port,
    start_child,
    stop_processes,
)
from course_lib.serving.server._config import DEFAULTS, ServerConfig
from course_lib.serving.server._serve import (
    READY_FD_ENV,
    REUSE_PORT_ENV,
    listening_socket,
    uvicorn_config,
)

#: Readiness path every course server answers with 200 once it can serve.
READY_PATH = "/healthz"

K = TypeVar("K", bound=Hashable)


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
    config: ServerConfig = DEFAULTS,
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
        How long to wait for uvicorn to accept connections (and the app's startup to finish).
    log_level : str
        uvicorn's log level (access logging is off).
    tcp_nodelay : bool
        True (default): answers leave at once. False leaves Nagle's algorithm on for accepted
        connections, to demonstrate the classic ~40 ms stall: uvicorn writes the response head and
        body separately, Nagle holds the body until the first part is acknowledged, and the client
        delays that acknowledgement (Linux: at least 40 ms). asyncio switches Nagle off
        (``TCP_NODELAY``) only on connections accepted from a socket created with
        ``IPPROTO_TCP``, which is how the flag is implemented here.
    config : ServerConfig
        The runtime's limits (parser, timeouts, connection and in-flight limits; see
        ``course_lib.serving.server._serve.uvicorn_config``); ``lifetime_s`` is ``max_lifetime_s``.

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
    integer("port", port, min=0, max=65535)
    positive_number("max_lifetime_s", max_lifetime_s)
    positive_number("startup_timeout_s", startup_timeout_s)
    sock = listening_socket(port, tcp_nodelay=tcp_nodelay)
    bound_port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, config, log_level=log_level))
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


class ServerURLs(dict):
    """name -> base URL, plus ``processes`` (name -> the first worker's ``subprocess.Popen``) and
    ``workers`` (name -> every worker's ``course_lib.core.process.ChildProcess``)."""

    processes: dict[Hashable, subprocess.Popen]
    workers: dict[Hashable, list[ChildProcess]]


def _read_ready(fd: int) -> bool:
    """True once the server behind ``fd`` wrote its readiness line (non-blocking)."""
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable) and bool(os.read(fd, 64))


@contextmanager
def run_processes(
    commands: Mapping[K, Sequence[str]],
    *,
    startup_timeout_s: float = 90.0,
    ready_path: str = READY_PATH,
    stop_timeout_s: float = DEFAULTS.graceful_shutdown_s + 5.0,
    env: Mapping[str, str] | None = None,
    workers: int = 1,
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
        After SIGTERM, how long the servers may take to exit before SIGKILL (all together).
    env : mapping, optional
        Extra environment variables. ``OMP_NUM_THREADS`` defaults to 1 and ``COURSE_PARENT_PID``
        is set to this process, so the servers exit if it dies.
    workers : int >= 1
        Processes per command, sharing its port (``SO_REUSEPORT``; each must run ``serve_app``,
        which binds that way and reports its readiness). Each loads its own copy of the app.

    Yields
    ------
    ServerURLs
        A dict name -> base URL such as ``http://127.0.0.1:8123`` (its ``processes`` and ``workers``
        attributes hold the processes). Every server is stopped when the block ends.

    Raises
    ------
    RuntimeError
        If a server exits or is not ready in time; the message holds the end of its log.
    """
    workers = integer("workers", workers, min=1)
    positive_number("startup_timeout_s", startup_timeout_s)
    urls = ServerURLs()
    urls.processes, urls.workers = {}, {}
    children: list[ChildProcess] = []
    pending: dict[int, tuple[Hashable, ChildProcess]] = {}  # readiness pipe -> server
    reservations = []
    try:
        for name, argv in commands.items():
            extra = dict(env or {})
            if workers > 1:
                reservations.append(reserve_port())
                port = reservations[-1].getsockname()[1]
                extra[REUSE_PORT_ENV] = "1"
            else:
                port = free_port()
            urls[name] = f"http://{LOOPBACK_HOST}:{port}"
            urls.workers[name] = []
            for k in range(workers):
                read_fd, write_fd = os.pipe()
                try:
                    child = start_child(
                        [*argv, f"--port={port}"],
                        name=f"server {name!r}" + (f" worker {k}" if workers > 1 else ""),
                        env={**extra, READY_FD_ENV: str(write_fd)},
                        pass_fds=(write_fd,),
                    )
                except BaseException:
                    os.close(read_fd)
                    raise
                finally:
                    os.close(write_fd)
                children.append(child)
                urls.workers[name].append(child)
                pending[read_fd] = (name, child)
            urls.processes[name] = urls.workers[name][0].popen
        _wait_ready(urls, pending, workers, startup_timeout_s, ready_path)
        yield urls
    finally:
        for fd in pending:
            os.close(fd)
        stop_processes([c.popen for c in children], stop_timeout_s)
        for child in children:
            child.stop(0)  # reaped already: closes the log
        for sock in reservations:
            sock.close()


def _wait_ready(
    urls: ServerURLs,
    pending: dict[int, tuple[Hashable, ChildProcess]],
    workers: int,
    timeout_s: float,
    ready_path: str,
) -> None:
    """Wait until every process wrote its readiness line (or, one worker per port, answers
    ``ready_path``) and every port answers ``ready_path`` with 200."""
    # httpx is the parent side's (about 30 ms of start-up a server process never pays)
    import httpx  # noqa: PLC0415 (heavy optional dependency)

    deadline = time.monotonic() + timeout_s
    waiting_fds = dict(pending)
    waiting_urls = dict(urls.items())
    while waiting_fds or waiting_urls:
        for fd, (_name, child) in list(waiting_fds.items()):
            child.check_running()
            if _read_ready(fd):
                del waiting_fds[fd]
        for name, url in list(waiting_urls.items()):
            try:
                ok = httpx.get(url + ready_path, timeout=1.0).status_code == 200
            except httpx.TransportError:
                ok = False
            if ok:
                del waiting_urls[name]
                if workers == 1:  # a command that is not serve_app may never write its line
                    for fd in [f for f, (n, _) in waiting_fds.items() if n == name]:
                        del waiting_fds[fd]
        if (waiting_fds or waiting_urls) and time.monotonic() > deadline:
            late = {name: child.tail(500) for name, child in waiting_fds.values()}
            late.update({name: urls.workers[name][0].tail(500) for name in waiting_urls})
            raise RuntimeError(
                f"servers {sorted(map(str, late))} were not ready at {ready_path} within {timeout_s:g} s; "
                f"their logs end with: {late}"
            )
        if waiting_fds or waiting_urls:
            time.sleep(0.05)
