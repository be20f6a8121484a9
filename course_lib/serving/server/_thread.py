"""A course server in a daemon thread of this process, for a bounded time: ``serve_in_thread``.

``serve_in_thread(app)`` binds a free loopback port, starts uvicorn (the same ``uvicorn_config`` as a
server process: the door, the guarded protocol, every limit of ``ServerConfig``) in a daemon thread,
waits until it accepts connections, and always shuts it down on exit. A watchdog stops the server
after ``max_lifetime_s`` even if the ``with`` block never ends. Server *processes* are started by
:mod:`course_lib.serving.server._runners`.

Client and server share one Python process (and its GIL) here; in production they are separate
processes on separate machines, so the transport stage measured there is a lower bound.

References
----------
Nagle, J. (1984), RFC 896 "Congestion Control in IP/TCP Internetworks"; RFC 1122 section 4.2.3.2
(delayed ACK); Python ``asyncio`` source, ``base_events._set_nodelay``.
uvicorn documentation, "Settings" and programmatic use of ``uvicorn.Server``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from course_lib.core.checks import integer, positive_number
from course_lib.core.process import LOOPBACK_HOST
from course_lib.serving.server._config import DEFAULTS, ServerConfig
from course_lib.serving.server._listening import listening_socket
from course_lib.serving.server._serve import uvicorn_config


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
