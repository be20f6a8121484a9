"""Child processes that never outlive their parent: free ports, exit-with-parent, stopping, log files.

One toolkit for every process the course starts (servers, replicas, Redis, Locust, load generators,
model-pool helpers):

* :func:`free_port` / :func:`reserve_port`: a free TCP port on 127.0.0.1 (``reserve_port`` keeps it
  bound with ``SO_REUSEPORT`` so nobody else takes it while several workers bind it);
* :func:`start_child` (parent side): starts a command in its own process group, stdin from
  ``/dev/null``, stdout and stderr to an anonymous log file (never a pipe nobody reads: a full pipe
  freezes the child; the file has no name, so nothing is left on disk whatever happens), and tells the
  child which process to outlive never (:data:`PARENT_PID_ENV`); :class:`ChildProcess` shows the end
  of its log (:meth:`ChildProcess.tail`) and stops it;
* :func:`exit_with_parent` (child side): Linux's ``PR_SET_PDEATHSIG`` (the kernel signals the child
  when the parent thread dies) where it is safe, plus a watchdog thread that polls ``os.getppid()``
  (an orphan is re-parented, so its parent pid changes) everywhere;
* :func:`stop_process`: SIGTERM to the whole process group, a bounded wait, then SIGKILL;
* the guard for a program that cannot run :func:`exit_with_parent` itself (``redis-server``, Locust,
  k6) is :mod:`course_lib.core.guard` (``guard_command(CMD)`` starts it).

References
----------
Linux ``prctl(2)`` (``PR_SET_PDEATHSIG``: "sent when the parent *thread* terminates", hence used only
for children started from the main thread), ``getppid(2)``, ``setpgid(2)``; ``socket(7)``
(``SO_REUSEPORT``). Python ``subprocess.Popen(process_group=0)`` (3.11).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from course_lib.core.checks import number

__all__ = [
    "LOOPBACK_HOST",
    "PARENT_DEATHSIG_ENV",
    "PARENT_PID_ENV",
    "ChildProcess",
    "child_env",
    "exit_with_parent",
    "free_port",
    "log_tail",
    "parent_to_watch",
    "pid_alive",
    "reserve_port",
    "set_pdeathsig",
    "start_child",
    "stop_process",
    "stop_processes",
]

#: The only address a course server binds.
LOOPBACK_HOST = "127.0.0.1"
#: The process a child must not outlive (set by :func:`child_env`, read by :func:`exit_with_parent`).
PARENT_PID_ENV = "COURSE_PARENT_PID"
#: "1" when the child was started from its parent's main thread, so ``PR_SET_PDEATHSIG`` is safe.
PARENT_DEATHSIG_ENV = "COURSE_PARENT_DEATHSIG"
_PR_SET_PDEATHSIG = 1
#: How often a child's watchdog looks at its parent pid, in seconds (a dead parent is noticed this fast).
PARENT_CHECK_S = 0.2


def free_port(host: str = LOOPBACK_HOST) -> int:
    """A TCP port that was free on ``host`` a moment ago (another program may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def reserve_port(host: str = LOOPBACK_HOST) -> socket.socket:
    """A socket bound to a free port with ``SO_REUSEPORT`` and not listening: the port stays ours.

    Processes of this user bind the same port with ``SO_REUSEPORT`` and listen; the kernel spreads
    connections over the listening ones only. Close it when the servers are gone.

    Raises
    ------
    OSError
        Where ``SO_REUSEPORT`` does not exist (Windows).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def set_pdeathsig(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent thread dies; False where impossible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie not yet reaped counts; so does another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: this one, ``OMP_NUM_THREADS`` 1 unless set, ``env``, and the parent.

    :data:`PARENT_PID_ENV` names this process; :data:`PARENT_DEATHSIG_ENV` is "1" only when called
    from the main thread (``PR_SET_PDEATHSIG`` fires when the *thread* that started the child ends,
    which for a worker thread can be long before this process does).
    """
    main = threading.current_thread() is threading.main_thread()
    return {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        **(env or {}),
        PARENT_PID_ENV: str(os.getpid()),
        PARENT_DEATHSIG_ENV: "1" if main else "0",
    }


def parent_to_watch(parent_pid: int | None = None) -> int:
    """The pid whose death should end this process: ``parent_pid``, else the one its starter named.

    Default: :data:`PARENT_PID_ENV` if set (``start_child`` sets it), else ``os.getppid()``. A
    variable naming a live process other than this one's parent was inherited from an ancestor and is
    ignored; one naming a dead process means the parent died before this process ran (it is returned,
    and ``os.getppid()`` differs from it at once).
    """
    named = int(os.environ.get(PARENT_PID_ENV) or 0)
    if parent_pid:
        return int(parent_pid)
    if named and named != os.getppid() and pid_alive(named):
        return os.getppid()  # the variable was inherited from an ancestor: not about us
    return named or os.getppid()


def exit_with_parent(
    parent_pid: int | None = None,
    *,
    on_exit: Callable[[], None] | None = None,
    check_s: float = PARENT_CHECK_S,
    deathsig: int = signal.SIGKILL,
    exit_code: int = 0,
    with_pid: int | None = None,
) -> int:
    """In a child process: end this process soon after its parent does. Returns the parent's pid.

    Parameters
    ----------
    parent_pid : int, optional
        The parent to outlive never; default :func:`parent_to_watch`'s choice.
    on_exit : callable, optional
        Run by the watchdog before it exits (a short cleanup: stop a child, remove a folder).
    check_s : float > 0
        Seconds between the watchdog's looks at ``os.getppid()``.
    deathsig : int
        Signal the kernel sends when the parent dies, if the parent started this process from its
        main thread (:data:`PARENT_DEATHSIG_ENV`); SIGKILL by default, SIGTERM for a process that
        must clean up (its handler then does).
    exit_code : int
        Code of the watchdog's exit.
    with_pid : int, optional
        A second process whose end ends this one too (a pool worker's job, where the pool's fork
        server is the worker's parent).

    Raises
    ------
    SystemExit
        At once, if the parent is already gone.
    """
    check_s = number("check_s", check_s, min=0, min_open=True)
    named = int(os.environ.get(PARENT_PID_ENV) or 0)
    parent = parent_to_watch(parent_pid)
    if named == parent == os.getppid() and os.environ.get(PARENT_DEATHSIG_ENV) == "1":
        set_pdeathsig(deathsig)
    if os.getppid() != parent:
        if on_exit is not None:
            on_exit()
        raise SystemExit(f"parent process {parent} is already gone")

    def watch() -> None:
        while os.getppid() == parent and (with_pid is None or pid_alive(with_pid)):
            time.sleep(check_s)
        try:
            if on_exit is not None:
                on_exit()
        finally:
            os._exit(exit_code)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
    return parent


def log_tail(log: IO[bytes], n_bytes: int = 2000) -> str:
    """The last ``n_bytes`` of a binary log file (the file position is moved), decoded leniently."""
    log.flush()
    log.seek(0, os.SEEK_END)
    size = log.tell()
    log.seek(max(0, size - n_bytes))
    return log.read().decode(errors="replace")


def _signal(proc: subprocess.Popen, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def _exited(proc: subprocess.Popen) -> bool:
    """True if ``proc`` has exited, without reaping it (a zombie leader keeps its group id reserved)."""
    if proc.returncode is not None:
        return True
    if not hasattr(os, "waitid"):
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped by someone else
        return True


def stop_processes(
    procs: Sequence[subprocess.Popen], timeout_s: float = 5.0, *, group: bool = True
) -> list[int]:
    """SIGTERM every process (its whole group if ``group``), wait up to ``timeout_s`` in all, then SIGKILL.

    Every process is reaped; the exit codes are returned in order. ``group`` assumes each leads its
    own process group (``start_child`` starts them so): members that outlive the leader are killed
    too, before the leader is reaped (so the group id cannot have been reused).
    """
    timeout_s = number("timeout_s", timeout_s, min=0)
    live = [p for p in procs if p.returncode is None]
    for proc in live:
        if not _exited(proc):
            _signal(proc, signal.SIGTERM, group)
    deadline = time.monotonic() + timeout_s
    for proc in live:
        while not _exited(proc) and time.monotonic() < deadline:
            time.sleep(0.01)
        if group or not _exited(proc):
            _signal(proc, signal.SIGKILL, group)  # the leader if it is stuck, and any straggler
        proc.wait()
    return [int(proc.returncode) for proc in procs]


def stop_process(proc: subprocess.Popen, timeout_s: float = 5.0, *, group: bool = True) -> int:
    """SIGTERM (to the process group if ``group``), wait up to ``timeout_s``, then SIGKILL; reap.

    Returns the exit code (negative: the signal that ended it).
    """
    return stop_processes([proc], timeout_s, group=group)[0]


@dataclass
class ChildProcess:
    """A child started by :func:`start_child`: its ``Popen``, its anonymous log file and a name."""

    popen: subprocess.Popen
    log: IO[bytes] | None
    name: str = "child"
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return int(self.popen.pid)

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n_bytes: int = 2000) -> str:
        """The end of the child's log ("" if it was closed or never kept)."""
        if self.log is None or self.log.closed:
            return ""
        return log_tail(self.log, n_bytes)

    def check_running(self) -> None:
        """Raise ``RuntimeError`` with the end of the log if the child has exited."""
        if self.popen.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with code {self.popen.returncode}; its log ends with:\n{self.tail()}"
            )

    def stop(self, timeout_s: float = 5.0) -> int:
        """Stop the child and its group (:func:`stop_process`) and close the log; the exit code."""
        try:
            return stop_process(self.popen, timeout_s, group=True)
        finally:
            self._stopped = True
            for stream in (self.popen.stdout, self.popen.stderr, self.log):
                if stream is not None:
                    stream.close()

    def __enter__(self) -> ChildProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_child(
    argv: Sequence[str],
    *,
    name: str = "",
    env: Mapping[str, str] | None = None,
    stdout: int | IO[bytes] | None = None,
    pass_fds: Sequence[int] = (),
    cwd: str | None = None,
) -> ChildProcess:
    """Start ``argv`` in its own process group, its output to an anonymous log file.

    Parameters
    ----------
    argv : command and arguments.
    name : str
        Used in error messages (default: the program's name).
    env : mapping, optional
        Extra environment (see :func:`child_env`; the child learns its parent's pid from it and should
        call :func:`exit_with_parent`, or be run under this module's guard).
    stdout : optional
        ``subprocess.PIPE`` for a child that reports on stdout (read it!); default: the log file.
    pass_fds : file descriptors the child inherits (e.g. a readiness pipe).
    cwd : working directory.

    Returns
    -------
    ChildProcess
    """
    log = tempfile.TemporaryFile(prefix="course-child-", suffix=".log")  # noqa: SIM115 - ChildProcess closes it
    try:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log if stdout is None else stdout,
            stderr=log,
            env=child_env(env),
            pass_fds=tuple(pass_fds),
            cwd=cwd,
            process_group=0,
        )
    except BaseException:
        log.close()
        raise
    return ChildProcess(popen, log, name or os.path.basename(str(argv[0])))
