"""Inside a server subprocess: uvicorn on 127.0.0.1 hardened against abusive clients, with a bounded life.

One concept: what a course server process does to stay up and to go away. :func:`serve_app` runs an
ASGI app with :func:`guarded_protocol` (a header read timeout against slowloris, a connection limit
that evicts idle connections first), a bounded graceful shutdown, a lifetime, and an exit when its
parent process dies. The parent side, starting such processes on free ports and waiting until they
are ready, is ``course_lib.serving.server._runners.run_processes`` (which also re-exports these names).

References
----------
uvicorn documentation, "Settings" (``timeout_keep_alive``, ``timeout_graceful_shutdown``) and
programmatic use of ``uvicorn.Server``; the h11 protocol class ``uvicorn.protocols.http.h11_impl``.
Linux re-parents an orphan process, so its ``os.getppid()`` changes when the parent dies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import socket
import threading
import time

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from course_lib.serving.server._config import DEFAULTS, ServerConfig

__all__ = ["HTTP_PARSERS", "LOOPBACK_HOST", "PARENT_PID_ENV", "guarded_protocol", "serve_app"]

#: The only address a course server binds.
LOOPBACK_HOST = "127.0.0.1"
#: Environment variable through which ``run_processes`` tells a server which process to outlive never.
PARENT_PID_ENV = "COURSE_SERVER_PARENT_PID"
#: uvicorn's HTTP/1.1 parsers ``serve_app`` can guard: pure-Python ``h11`` and C ``httptools``.
HTTP_PARSERS: tuple[str, ...] = ("h11", "httptools")
_log = logging.getLogger(__name__)


def _protocol_base(http: str) -> type:
    if http == "h11":
        return H11Protocol
    if http == "httptools":
        return HttpToolsProtocol
    raise ValueError(f"http must be one of {HTTP_PARSERS}, got {http!r}")


def guarded_protocol(config: ServerConfig = DEFAULTS, *, http: str = "h11") -> type[H11Protocol]:
    """uvicorn's h11 (or httptools) protocol with a header read timeout and a connection limit.

    ``http`` picks the parser (``HTTP_PARSERS``); both uvicorn protocol classes keep the same
    ``cycle``, ``connections`` and callbacks, so the guard below is the same for both.

    * A connection must deliver a request's complete headers within ``config.header_timeout_s`` of
      connecting (or of the previous answer); otherwise it is closed (slowloris defence: uvicorn alone
      waits forever for headers).
    * At most ``config.max_connections`` connections stay open: a new connection beyond that closes
      the longest-open *idle* one (no request in flight, e.g. a slowloris or an idle keep-alive
      socket); if every connection is busy, the new one is closed. So idle sockets cannot use up the
      open-file limit and lock out everyone else.
    """
    header_timeout_s, max_connections = config.header_timeout_s, config.max_connections

    base = _protocol_base(http)

    class GuardedProtocol(base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _opened_at: float = 0.0

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self._idle() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._opened_at = self.loop.time()
            self._arm()
            if len(self.connections) > max_connections:
                idle = [c for c in self.connections if c is not self and c._idle()]
                victim = min(idle, key=lambda c: c._opened_at) if idle else self
                victim.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._idle():
                self._disarm()  # headers complete: the app's body timeout takes over

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    GuardedProtocol.__name__ = GuardedProtocol.__qualname__ = f"Guarded{base.__name__}"
    return GuardedProtocol


def _raise_open_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _exit_soon(reason: str, grace_s: float) -> None:
    """Ask uvicorn to stop (SIGTERM: graceful, bounded), and exit hard if it is not gone in time."""
    _log.warning("stopping: %s", reason)
    hard = threading.Timer(grace_s, lambda: os._exit(3))
    hard.daemon = True
    hard.start()
    os.kill(os.getpid(), signal.SIGTERM)


def _watch_parent(parent_pid: int, every_s: float, grace_s: float) -> None:
    while True:
        time.sleep(every_s)
        if os.getppid() != parent_pid:
            _exit_soon(f"parent process {parent_pid} is gone", grace_s)
            return


def serve_app(
    app: object,
    *,
    port: int,
    config: ServerConfig = DEFAULTS,
    http: str = "h11",
    loop: str = "asyncio",
    sock: socket.socket | None = None,
) -> None:
    """Serve ``app`` on 127.0.0.1:``port`` in this process until SIGTERM, the lifetime, or the parent's death.

    For the ``main()`` of a server subprocess started by ``run_processes``. Blocks.

    Parameters
    ----------
    app : ASGI application (e.g. ``course_lib.serving.service._app.create_app(...)``).
    port : int
        Port on 127.0.0.1.
    config : ServerConfig
        ``lifetime_s`` (the process exits after it), ``header_timeout_s`` and ``max_connections``
        (see ``guarded_protocol``), ``keep_alive_s``, ``graceful_shutdown_s`` (after SIGTERM,
        requests in flight get this long; the process is killed ``graceful_shutdown_s + 5`` s after the
        stop began at the latest), ``parent_check_s``.
    http : {"h11", "httptools"}
        uvicorn's HTTP parser, guarded either way (``guarded_protocol``).
    loop : {"asyncio", "uvloop"}
        uvicorn's event loop.
    sock : socket.socket, optional
        A listening TCP socket on 127.0.0.1 to serve instead of binding ``port`` (several worker
        processes accepting from one socket inherited from their supervisor, as uvicorn's and
        gunicorn's workers do); ``port`` is then only the label in messages.

    Notes
    -----
    The parent is the process named by the ``COURSE_SERVER_PARENT_PID`` environment variable
    (``run_processes`` sets it), else this process's parent at start. Linux re-parents an orphan, so
    a changed ``os.getppid()`` means the parent died (a killed notebook kernel, say).
    """
    if loop not in ("asyncio", "uvloop"):
        raise ValueError(f"loop must be 'asyncio' or 'uvloop', got {loop!r}")
    protocol = guarded_protocol(config, http=http)
    grace_s = config.graceful_shutdown_s + 5.0
    _raise_open_file_limit(config.max_connections + 256)
    parent_pid = int(os.environ.get(PARENT_PID_ENV, os.getppid()))
    if os.getppid() != parent_pid:
        raise RuntimeError(f"parent process {parent_pid} is already gone; not starting")
    threading.Thread(
        target=_watch_parent,
        args=(parent_pid, config.parent_check_s, grace_s),
        name="parent-watch",
        daemon=True,
    ).start()
    lifetime = threading.Timer(
        config.lifetime_s, _exit_soon, args=(f"lifetime of {config.lifetime_s:g} s is over", grace_s)
    )
    lifetime.daemon = True
    lifetime.start()
    server_config = uvicorn.Config(
        app,
        host=LOOPBACK_HOST,
        port=port,
        log_level="warning",
        access_log=False,
        http=protocol,
        loop=loop,
        timeout_keep_alive=max(1, round(config.keep_alive_s)),
        timeout_graceful_shutdown=max(1, round(config.graceful_shutdown_s)),
    )
    uvicorn.Server(server_config).run(sockets=None if sock is None else [sock])
