"""The process guard: run a command that cannot watch its parent itself, and stop it when the parent dies.

``redis-server``, Locust and k6 cannot call :func:`course_lib.core.process.exit_with_parent`, so the
course starts them under this guard (``start_child(guard_command([...]))``)::

    python -m course_lib.core.guard [--parent-pid P] [--remove DIR] [--group] -- CMD ...

The guard runs ``CMD`` (which the kernel kills if the guard is killed: ``PR_SET_PDEATHSIG``), and when
``P`` dies (default: :data:`~course_lib.core.process.PARENT_PID_ENV`, else its parent) or it is told
to stop (SIGTERM, SIGINT, SIGHUP), it stops ``CMD`` and removes each ``DIR``. With ``--group`` the
command runs in a session of its own and the guard stops that whole process group, for a server that
forks workers of its own (the serving peers). Its exit code is ``CMD``'s, or 128 + the signal that
stopped it.

References
----------
Linux ``prctl(2)`` (``PR_SET_PDEATHSIG``); Python documentation, ``signal`` ("Python signal handlers
are always executed in the main Python thread").
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from course_lib.core.checks import positive_number
from course_lib.core.process import exit_with_parent, set_pdeathsig, stop_process

__all__ = ["guard_command"]

_GUARD_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def guard_command(
    command: Sequence[str],
    *,
    remove: Sequence[str] = (),
    group: bool = False,
    stop_timeout_s: float | None = None,
) -> list[str]:
    """The argv that runs ``command`` under the guard (this Python, ``-m course_lib.core.guard``).

    Parameters
    ----------
    command : the program and its arguments.
    remove : folders the guard removes once the command has stopped.
    group : bool
        Run the command in a process group of its own and stop the whole group (``--group``).
    stop_timeout_s : float, optional
        Seconds the command gets after SIGTERM before SIGKILL (the guard's default: 2).

    Examples
    --------
    >>> guard_command(["sleep", "60"], remove=["/tmp/x"])[1:]
    ['-m', 'course_lib.core.guard', '--remove', '/tmp/x', '--', 'sleep', '60']
    """
    options = [arg for folder in remove for arg in ("--remove", str(folder))]
    if group:
        options.append("--group")
    if stop_timeout_s is not None:
        options += ["--stop-timeout-s", f"{positive_number('stop_timeout_s', stop_timeout_s):g}"]
    return [sys.executable, "-m", "course_lib.core.guard", *options, "--", *map(str, command)]


class _GuardStopError(Exception):
    """A stop signal reached the guard."""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.core.guard``: run a command and stop it when the parent dies."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.core.guard", description=main.__doc__)
    parser.add_argument("--parent-pid", type=int, default=0, help="default: $COURSE_PARENT_PID")
    parser.add_argument("--remove", action="append", default=[], help="folder removed at the end")
    parser.add_argument("--stop-timeout-s", type=float, default=2.0)
    parser.add_argument("--group", action="store_true", help="stop the command's whole process group")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is required after --")
    lock, done = threading.Lock(), list[bool]()
    child: subprocess.Popen[bytes] | None = None

    def finish() -> None:
        """Stop the command and remove the folders, once (the main thread or the watchdog)."""
        if threading.current_thread() is threading.main_thread():
            for sig in _GUARD_SIGNALS:  # nothing may interrupt the cleanup now
                signal.signal(sig, signal.SIG_IGN)
        with lock:
            if not done:
                if child is not None:
                    stop_process(child, args.stop_timeout_s, group=args.group)
                for folder in args.remove:
                    shutil.rmtree(folder, ignore_errors=True)
                done.append(True)

    def on_signal(signum: int, _frame: object) -> None:
        raise _GuardStopError(signum)  # out of child.wait() (never wait again inside a signal handler)

    # The handlers come first, so a stop signal is handled however early it arrives (the exec'd command
    # starts with default handlers again). The child is started before any thread exists here (fork with
    # threads can deadlock); the kernel kills it if this guard is killed (SIGKILL leaves no time).
    for sig in _GUARD_SIGNALS:
        signal.signal(sig, on_signal)
    try:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            start_new_session=args.group,
            preexec_fn=lambda: set_pdeathsig(signal.SIGKILL),
        )
        exit_with_parent(args.parent_pid or None, on_exit=finish, deathsig=signal.SIGTERM, exit_code=1)
        code = child.wait()
    except _GuardStopError as stop:
        finish()
        return 128 + int(stop.args[0])
    finish()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
