"""One way to run an ASGI app with uvicorn, hardened: the settings, and the server process's own life.

:func:`uvicorn_config` is the only place a course server's ``uvicorn.Config`` is built, for a thread
(``course_lib.serving.server._runners.serve_in_thread``) and for a process (:func:`serve_app`) alike:

* the app behind the :class:`~course_lib.serving.server._door.Door` (Host and encoding checks, body
  limits in size and time, admission control with 503 + ``Retry-After``, deadlines, clients that left,
  capped error bodies, outcome counters);
* uvicorn's parser (``config.http``: h11 or httptools) with the guards of
  :func:`~course_lib.serving.server._protocols.guarded_protocol` (header timeout, a connection limit
  that evicts idle connections, a bounded pipeline, a header size limit), no WebSocket upgrades,
  no ``Server`` header, ``timeout_keep_alive`` and a bounded graceful shutdown.

:func:`serve_app` is what a server subprocess runs: those settings plus an open-file limit that fits
the connection limit, a lifetime, an exit within ``parent_check_s`` of its parent's death
(``course_lib.core.process.exit_with_parent``), the listening socket its starter bound when several
workers share a port (:mod:`course_lib.serving.server._listening`), and a readiness line for the
parent. Its stderr is a log file the parent reads on failure (never a
pipe: an unread pipe fills and freezes the server).

References
----------
uvicorn documentation, "Settings" (``timeout_keep_alive``, ``timeout_graceful_shutdown``,
``h11_max_incomplete_event_size``) and programmatic use of ``uvicorn.Server``; Linux
``getrlimit(2)`` (``RLIMIT_NOFILE``).
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any, Literal

import uvicorn

from course_lib.core.process import LOOPBACK_HOST, exit_with_parent
from course_lib.serving.server._config import DEFAULTS, ServerConfig
from course_lib.serving.server._door import Door
from course_lib.serving.server._listening import inherited_socket, listening_socket
from course_lib.serving.server._protocols import guarded_protocol
from course_lib.serving.server._refusals import MAX_HEADER_BYTES

#: File descriptor a server writes "<pid>\n" to once it accepts connections (set by ``run_processes``).
READY_FD_ENV = "COURSE_SERVER_READY_FD"
_log = logging.getLogger(__name__)


def uvicorn_config(
    app: Any,
    config: ServerConfig = DEFAULTS,
    *,
    log_level: str = "warning",
    lifespan: Literal["auto", "on", "off"] = "auto",
) -> uvicorn.Config:
    """The ``uvicorn.Config`` of every course server: ``app`` behind a ``Door``, the guarded protocol.

    Parameters
    ----------
    app : ASGI application
    config : ServerConfig
        Every limit (see ``course_lib.serving.server._config``).
    log_level : str
        uvicorn's log level (access logging is off).
    lifespan : {"auto", "on", "off"}
        ASGI lifespan events ("auto": sent if the app takes them, e.g. a batcher's start and stop).

    Returns
    -------
    uvicorn.Config
        Without a host or port: serve it on a socket from :func:`listening_socket`.
    """
    return uvicorn.Config(
        Door(app, config),
        host=LOOPBACK_HOST,
        log_level=log_level,
        access_log=False,
        http=guarded_protocol(config),
        loop=config.loop,
        ws="none",
        lifespan=lifespan,
        server_header=False,
        proxy_headers=False,  # a loopback client could otherwise claim any address in X-Forwarded-For
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        backlog=config.backlog,
        timeout_keep_alive=max(1, round(config.keep_alive_s)),
        timeout_graceful_shutdown=max(1, round(config.graceful_shutdown_s)),
    )


def _set_open_file_limit(config: ServerConfig) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if config.open_files_limit:
        target = config.open_files_limit
    elif soft != resource.RLIM_INFINITY and soft < config.files_needed:
        target = config.files_needed
    else:
        return
    if hard != resource.RLIM_INFINITY:
        target = min(target, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class _Server(uvicorn.Server):
    """uvicorn's server, writing the readiness line (and starting ``on_started``) once it listens."""

    ready_fd: int | None = None
    on_started: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.started:
            return
        if self.on_started is not None:
            threading.Thread(target=self.on_started, name="on-started", daemon=True).start()
        if self.ready_fd is not None:
            os.write(self.ready_fd, f"{os.getpid()}\n".encode())
            os.close(self.ready_fd)
            self.ready_fd = None


def _exit_soon(reason: str, grace_s: float) -> None:
    """Ask uvicorn to stop (SIGTERM: graceful, bounded), and exit hard if it is not gone in time."""
    _log.warning("stopping: %s", reason)
    hard = threading.Timer(grace_s, lambda: os._exit(3))
    hard.daemon = True
    hard.start()
    os.kill(os.getpid(), signal.SIGTERM)


def serve_app(
    app: Any,
    *,
    port: int,
    config: ServerConfig = DEFAULTS,
    sock: socket.socket | None = None,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` on 127.0.0.1:``port`` in this process until SIGTERM, the lifetime, or the parent's death.

    For the ``main()`` of a server subprocess started by ``run_processes``. Blocks.

    Parameters
    ----------
    app : ASGI application (e.g. ``course_lib.serving.service.create_app(...)``).
    port : int
        Port on 127.0.0.1.
    config : ServerConfig
        Every limit of :func:`uvicorn_config`, plus ``lifetime_s`` (the process exits after it),
        ``graceful_shutdown_s`` (after SIGTERM, requests in flight get this long; the process is
        killed ``graceful_shutdown_s + 5`` s after the stop began at the latest), ``parent_check_s``
        and ``open_files_limit``.
    sock : socket, optional
        An already bound socket (``listening_socket``) instead of ``port``. Default: the listening
        socket this process inherited (a worker of several on one port, see
        :mod:`course_lib.serving.server._listening`), else ``port`` bound here.
    on_started : callable, optional
        Run in a daemon thread once the server accepts connections (a warm-up, say).

    Raises
    ------
    SystemExit
        If the parent process is already gone.

    Notes
    -----
    The parent is the process named by ``COURSE_PARENT_PID`` (``run_processes`` sets it), else this
    process's parent at start. On Linux the kernel kills the server when the parent's starting thread
    dies (if that was its main thread), and a watchdog thread notices a changed ``os.getppid()``
    within ``parent_check_s`` everywhere: the server is gone at once, with nothing to clean up (its
    log is the parent's anonymous file).
    """
    exit_with_parent(check_s=config.parent_check_s, exit_code=4)
    _set_open_file_limit(config)
    grace_s = config.graceful_shutdown_s + 5.0
    lifetime = threading.Timer(
        config.lifetime_s, _exit_soon, args=(f"lifetime of {config.lifetime_s:g} s is over", grace_s)
    )
    lifetime.daemon = True
    lifetime.start()
    if sock is None:
        sock = inherited_socket() or listening_socket(port)
    server = _Server(uvicorn_config(app, config))
    ready_fd = os.environ.get(READY_FD_ENV)
    server.ready_fd = int(ready_fd) if ready_fd else None
    server.on_started = on_started
    server.run(sockets=[sock])
