"""A course server's listening socket: bound by the server itself, or bound once and inherited by k workers.

:func:`listening_socket` binds 127.0.0.1:port for one server (in a thread or a process). Several
worker processes on one port share one socket: the one way a course server runs k workers on one
port, whoever starts them (``run_processes(workers=k)`` for any ``serve_app`` command, the
production service's supervisor in ``python -m course_lib.serving.production --workers K``):

* the starter binds 127.0.0.1:port and listens (:func:`shared_listening_socket`), then starts each
  worker with the socket's descriptor inherited (``subprocess.Popen(pass_fds=...)``) and named in
  :data:`LISTEN_FD_ENV` (:func:`inherit_env`);
* each worker's ``serve_app`` finds it (:func:`inherited_socket`) and accepts from it instead of
  binding, as uvicorn's and gunicorn's pre-fork workers do.

Why one inherited socket rather than ``SO_REUSEPORT`` (each worker binding the port itself, which the
course did before): with one socket there is one accept queue, and a new connection waits for
whichever worker calls ``accept`` first, i.e. a free one. With ``SO_REUSEPORT`` the kernel gives each
worker its own queue and hashes every new connection onto one of them, busy or not: a worker stalled
by a slow request (or a long garbage collection) keeps receiving its share, which waits behind it
while the others idle, and the connections still queued on a worker that exits are reset. The port is
also only as private as the user: any process of the same user that sets ``SO_REUSEPORT`` (a server
left over from an earlier run, say) joins the group and silently takes a share of the connections;
an inherited socket cannot be joined. The price is an uneven spread when the workers are idle (the
kernel wakes one waiting worker per connection, not in turn), which does not matter under load, when
the spread matters.

References
----------
Linux ``socket(7)`` (``SO_REUSEPORT``), ``accept(2)``; uvicorn source,
``uvicorn/supervisors/multiprocess.py`` (one socket, many workers); gunicorn documentation, "Design"
(the pre-fork worker model); Python ``subprocess.Popen(pass_fds=...)``.
"""

from __future__ import annotations

import os
import socket

from course_lib.core.checks import integer
from course_lib.core.process import LOOPBACK_HOST
from course_lib.serving.server._config import DEFAULTS

#: The descriptor of the listening socket a worker inherited from its starter (set by :func:`inherit_env`).
LISTEN_FD_ENV = "COURSE_SERVER_LISTEN_FD"


def listening_socket(port: int = 0, *, tcp_nodelay: bool = True) -> socket.socket:
    """A TCP socket bound to 127.0.0.1:``port`` (0: any free port), for ``uvicorn.Server.run(sockets=...)``.

    ``tcp_nodelay`` False leaves Nagle's algorithm on for accepted connections: asyncio switches it
    off (``TCP_NODELAY``) only on connections accepted from a socket created with ``IPPROTO_TCP``.

    Raises
    ------
    OSError
        If the port is taken.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP if tcp_nodelay else 0)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK_HOST, port))
    except BaseException:
        sock.close()
        raise
    return sock


def shared_listening_socket(port: int = 0, *, backlog: int = DEFAULTS.backlog) -> socket.socket:
    """A socket bound to 127.0.0.1:``port`` (0: any free port), listening, that child processes may inherit.

    Parameters
    ----------
    port : int in 0..65535
    backlog : int >= 1
        The listen queue until the workers listen on it with their own ``ServerConfig.backlog``.

    Raises
    ------
    ValueError
        For a port outside 0..65535 or a backlog below 1.
    OSError
        If the port is taken.
    """
    integer("port", port, min=0, max=65535)
    integer("backlog", backlog, min=1)
    sock = listening_socket(port)
    try:
        sock.listen(backlog)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def inherit_env(sock: socket.socket) -> dict[str, str]:
    """The environment that tells a worker to serve on ``sock`` (pass ``sock.fileno()`` in ``pass_fds``)."""
    return {LISTEN_FD_ENV: str(sock.fileno())}


def inherited_socket() -> socket.socket | None:
    """The listening socket this process inherited (:data:`LISTEN_FD_ENV`), or None if it must bind its own.

    The variable is removed from this process's environment, so a process it starts does not claim the
    socket too.
    """
    fd = os.environ.pop(LISTEN_FD_ENV, "")
    return socket.socket(fileno=int(fd)) if fd else None
