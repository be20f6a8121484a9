"""Server processes on 127.0.0.1 for a bounded time: the one start-up and readiness path.

Every course server runs on the one runtime of :mod:`course_lib.serving.server._serve` (the same
``uvicorn_config``: the door, the guarded protocol, every limit of ``ServerConfig``), in a thread of
this process (``serve_in_thread``, :mod:`course_lib.serving.server._thread`) or in processes started
here:

* ``run_processes({name: argv})`` (a ``with`` block) and ``start_server(argv)`` (a handle the caller
  stops: a replica, say) start server *processes* (their own GIL, like real replicas). Their output
  goes to anonymous log files (never a pipe nobody reads: a full pipe freezes a server; no file is
  left behind), whose end is quoted when a server fails. ``workers=k`` starts each command k times
  on one port, all accepting from one listening socket bound here and inherited
  (:mod:`course_lib.serving.server._listening` says why that and not ``SO_REUSEPORT``).

Start-up and readiness, the one path every server process takes (the production service, its
replicas, the prototype, the batched and test servers):

1. the parent picks a free 127.0.0.1 port and appends ``--port=N`` to the command (the workers of one
   port get the socket already bound on it); it also passes a pipe's write end, named in
   ``COURSE_SERVER_READY_FD``, and its own pid in ``COURSE_PARENT_PID``;
2. the server (``serve_app``) binds the port (or takes the inherited socket), starts uvicorn, and once
   uvicorn listens writes its pid and a newline to the pipe (the production supervisor writes it for its
   workers once every one has loaded the model);
3. the parent waits for every line and for ``GET /healthz`` (``READY_PATH``: the server's own
   readiness endpoint) answering 200, with a timeout; a process that exits first fails the start
   with the end of its log. A command that is not ``serve_app`` (a peer framework, say) needs only
   the 200 when it is its port's one process.

Inside each subprocess ``serve_app(app, port=..., config=...)`` runs the hardened uvicorn, with a
lifetime and an exit when its parent dies. To serve your own app in processes: write a module whose
``main()`` parses ``--port`` plus ``course_lib.serving.server.add_arguments`` and calls
``serve_app(create_my_app(), port=args.port, config=from_arguments(args))``; then
``run_processes({"a": [sys.executable, "-m", "my_module"]})``.

References
----------
Linux ``pipe(7)``; Kubernetes documentation, "Configure Liveness, Readiness and Startup Probes" (a
server says itself when it can serve); uvicorn documentation, programmatic use of ``uvicorn.Server``.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from course_lib.core.checks import integer, positive_number
from course_lib.core.process import LOOPBACK_HOST, ChildProcess, free_port, start_child, stop_processes
from course_lib.serving.server._config import DEFAULTS
from course_lib.serving.server._listening import inherit_env, shared_listening_socket
from course_lib.serving.server._serve import READY_FD_ENV

#: Readiness path every course server answers with 200 once it can serve.
READY_PATH = "/healthz"

K = TypeVar("K", bound=Hashable)


class ServerURLs(dict):
    """name -> base URL, plus ``processes`` (name -> the first worker's ``subprocess.Popen``) and
    ``workers`` (name -> every worker's ``course_lib.core.process.ChildProcess``)."""

    processes: dict[Hashable, subprocess.Popen]
    workers: dict[Hashable, list[ChildProcess]]


@dataclass
class ServerProcess:
    """A server process started by :func:`start_server` and ready: its base URL and its process."""

    url: str
    child: ChildProcess

    @property
    def process(self) -> subprocess.Popen:
        """The server's ``subprocess.Popen``."""
        return self.child.popen

    def stop(self, timeout_s: float = DEFAULTS.graceful_shutdown_s + 5.0) -> int:
        """SIGTERM its process group, wait up to ``timeout_s``, then SIGKILL; close its log; the exit code."""
        return self.child.stop(timeout_s)


@dataclass(eq=False)
class _Starting:
    """A server process being started: the URL it will answer on, and the read end of its readiness pipe."""

    name: Hashable
    url: str
    child: ChildProcess
    ready_fd: int | None

    def close_pipe(self) -> None:
        if self.ready_fd is not None:
            os.close(self.ready_fd)
            self.ready_fd = None


def _launch(
    name: Hashable,
    argv: Sequence[str],
    port: int,
    *,
    label: str,
    env: Mapping[str, str],
    shared: socket.socket | None,
) -> _Starting:
    """Start ``argv --port=port`` with a readiness pipe (and the shared listening socket, if any)."""
    read_fd, write_fd = os.pipe()
    extra = {**env, READY_FD_ENV: str(write_fd)}
    fds = [write_fd]
    if shared is not None:
        extra |= inherit_env(shared)
        fds.append(shared.fileno())
    try:
        child = start_child([*argv, f"--port={port}"], name=label, env=extra, pass_fds=fds)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return _Starting(name, f"http://{LOOPBACK_HOST}:{port}", child, read_fd)


def _start_command(
    name: Hashable, argv: Sequence[str], workers: int, env: Mapping[str, str], into: list[_Starting]
) -> None:
    """Start ``workers`` processes of ``argv`` on one port, appending each to ``into`` as it starts.

    One worker binds a free port itself; several inherit one listening socket bound here
    (:mod:`course_lib.serving.server._listening`), closed here once they all hold it.
    """
    label = f"server {name!r}"
    if workers == 1:
        into.append(_launch(name, argv, free_port(), label=label, env=env, shared=None))
        return
    with shared_listening_socket() as shared:
        port = shared.getsockname()[1]
        for k in range(workers):
            into.append(_launch(name, argv, port, label=f"{label} worker {k}", env=env, shared=shared))


def _stop(starting: Sequence[_Starting], timeout_s: float) -> None:
    for s in starting:
        s.close_pipe()
    stop_processes([s.child.popen for s in starting], timeout_s)
    for s in starting:
        s.child.stop(0)  # reaped already: closes the log


def _answers(url: str) -> bool:
    # httpx is the parent side's (about 30 ms of start-up a server process never pays)
    import httpx  # noqa: PLC0415 (heavy optional dependency)

    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def _read_ready(fd: int) -> bool:
    """True once the server behind ``fd`` wrote its readiness line (non-blocking)."""
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable) and bool(os.read(fd, 64))


def _wait_ready(starting: Sequence[_Starting], timeout_s: float, ready_path: str) -> None:
    """Wait until every process wrote its readiness line and every URL answers ``ready_path`` with 200.

    A URL served by one process only needs the 200 (a command that does not run ``serve_app`` may never
    write its line); the workers of one port must each write theirs, since any one of them may answer.
    """
    deadline = time.monotonic() + timeout_s
    per_url = Counter(s.url for s in starting)
    lines = [s for s in starting if s.ready_fd is not None]
    urls = {s.url: s for s in starting}
    while lines or urls:
        for s in list(lines):
            s.child.check_running()
            if _read_ready(s.ready_fd):  # type: ignore[arg-type]  # lines holds open pipes only
                s.close_pipe()
                lines.remove(s)
        for url, s in list(urls.items()):
            if _answers(url + ready_path):
                del urls[url]
                if per_url[url] == 1 and s in lines:
                    lines.remove(s)
        if not (lines or urls):
            return
        if time.monotonic() > deadline:
            late = {str(s.name): s.child.tail(500) for s in [*lines, *urls.values()]}
            raise RuntimeError(
                f"servers {sorted(late)} were not ready at {ready_path} within {timeout_s:g} s; "
                f"their logs end with: {late}"
            )
        time.sleep(0.05)


def start_server(
    argv: Sequence[str],
    *,
    name: str = "server",
    env: Mapping[str, str] | None = None,
    startup_timeout_s: float = 90.0,
    ready_path: str = READY_PATH,
) -> ServerProcess:
    """Start one server process on a free 127.0.0.1 port and return once it is ready; the caller stops it.

    The start-up and readiness path of :func:`run_processes` (see the module docstring), for a server
    that outlives a ``with`` block (a replica handle, say).

    Parameters
    ----------
    argv : sequence of str
        Started with ``--port=<free port>`` appended (see :func:`run_processes`).
    name : str
        Used in error messages.
    env : mapping, optional
        Extra environment variables (``COURSE_PARENT_PID`` names this process).
    startup_timeout_s : float > 0
        How long to wait for its readiness line and ``ready_path`` answering 200.
    ready_path : str
        Readiness endpoint (default ``/healthz``).

    Returns
    -------
    ServerProcess
        Stop it with ``ServerProcess.stop``.

    Raises
    ------
    ValueError
        For a non-positive ``startup_timeout_s``.
    RuntimeError
        If the server exits or is not ready in time (the message holds the end of its log); it is
        stopped first.
    """
    positive_number("startup_timeout_s", startup_timeout_s)
    starting = [_launch(name, argv, free_port(), label=name, env=dict(env or {}), shared=None)]
    try:
        _wait_ready(starting, startup_timeout_s, ready_path)
    except BaseException:
        _stop(starting, 1.0)
        raise
    return ServerProcess(starting[0].url, starting[0].child)


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
        Processes per command, sharing its port: each inherits one listening socket bound here (each
        must run ``serve_app``, which serves on it and reports its readiness). Each loads its own
        copy of the app.

    Yields
    ------
    ServerURLs
        A dict name -> base URL such as ``http://127.0.0.1:8123`` (its ``processes`` and ``workers``
        attributes hold the processes). Every server is stopped when the block ends.

    Raises
    ------
    ValueError
        For ``workers`` below 1 or a non-positive ``startup_timeout_s``.
    RuntimeError
        If a server exits or is not ready in time; the message holds the end of its log.
    """
    workers = integer("workers", workers, min=1)
    positive_number("startup_timeout_s", startup_timeout_s)
    starting: list[_Starting] = []
    try:
        for name, argv in commands.items():
            _start_command(name, argv, workers, dict(env or {}), starting)
        _wait_ready(starting, startup_timeout_s, ready_path)
        yield _urls(starting)
    finally:
        _stop(starting, stop_timeout_s)


def _urls(starting: Sequence[_Starting]) -> ServerURLs:
    urls = ServerURLs()
    urls.processes, urls.workers = {}, {}
    for s in starting:
        urls.setdefault(s.name, s.url)
        urls.workers.setdefault(s.name, []).append(s.child)
        urls.processes.setdefault(s.name, s.child.popen)
    return urls
