"""One worker process per usable core, all accepting from one listening socket: the server's process tree.

``python -m course_lib.serving.production --port N [levers]`` runs :func:`main`:

* with one worker, it serves the app in this process on 127.0.0.1:N
  (``course_lib.serving.server.serve_app``: header and body timeouts, a connection limit, a bounded
  graceful shutdown, a lifetime, exit with the parent);
* with more, it becomes a supervisor: it binds 127.0.0.1:N once and starts that many worker
  processes, each of which inherits the listening socket and serves the app on it with
  ``serve_app``: the course's one way to run k workers on one port
  (``course_lib.serving.server._listening``, which says why it is more robust than
  ``SO_REUSEPORT``; ``run_processes(workers=k)`` does the same). Every worker marks itself
  loaded in a folder of the supervisor's (``READY_DIR_ENV``); ``/healthz`` answers 200 only when all
  of them have, so a client that waits for readiness measures the whole server. The supervisor
  stops the workers (SIGTERM, then SIGKILL after the grace period) when it is told to stop, when its
  own parent dies (``PARENT_PID_ENV``, as every course server), and when any worker exits on its own,
  which it reports with the worker's exit code; the workers exit when the supervisor dies.

References
----------
uvicorn source, ``uvicorn/supervisors/multiprocess.py`` (one socket, many workers); gunicorn
documentation, "Design" (the pre-fork worker model).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from course_lib.core.process import parent_to_watch, stop_processes
from course_lib.core.vocabulary import ANSWER_ENCODERS, SERVING_RUNTIMES
from course_lib.serving.production._app import READY_DIR_ENV, create_production_app, worker_ready_path
from course_lib.serving.production._config import FORWARD_MODES, PRODUCTION, ProductionConfig
from course_lib.serving.server import (
    PARENT_PID_ENV,
    READY_FD_ENV,
    ServerConfig,
    add_arguments,
    from_arguments,
    inherit_env,
    inherited_socket,
    port_number,
    serve_app,
    shared_listening_socket,
)

_BACKLOG = 2048


def parse_arguments(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, ProductionConfig]:
    """The command line: ``--port``, one flag per ``ProductionConfig`` lever, the ``ServerConfig`` flags.

    Every default is ``PRODUCTION``'s (its ``server`` flags default to ``PRODUCTION.server``), so
    ``parse_arguments(["--port=N", *config.to_argv()])`` gives back ``config``.
    """
    parser = argparse.ArgumentParser(description="The production churn service on 127.0.0.1")
    parser.add_argument("--port", type=port_number, required=True)
    parser.add_argument("--runtime", choices=SERVING_RUNTIMES, default=PRODUCTION.runtime)
    parser.add_argument("--forward", choices=FORWARD_MODES, default=PRODUCTION.forward)
    parser.add_argument("--encoder", choices=ANSWER_ENCODERS, default=PRODUCTION.encoder)
    parser.add_argument(
        "--workers", type=int, default=PRODUCTION.workers, help="default: one per usable core"
    )
    add_arguments(parser, PRODUCTION.server)  # lifetime, timeouts, limits, parser + loop, batcher knobs
    args = parser.parse_args(argv)
    config = ProductionConfig(
        runtime=args.runtime,
        forward=args.forward,
        encoder=args.encoder,
        workers=args.workers,
        server=from_arguments(args),
    )
    return args, config


def _serve(sock: socket.socket | None, args: argparse.Namespace, config: ProductionConfig) -> None:
    """Serve the app in this process: on ``sock`` (inherited from the supervisor), else on ``--port``."""
    app = create_production_app(config, body_timeout_s=config.server.body_timeout_s)
    folder = os.environ.get(READY_DIR_ENV)
    if folder is not None:
        worker_ready_path(folder, os.getpid()).touch()
    serve_app(app, port=args.port, config=config.server, sock=sock)


def _start_workers(argv: Sequence[str], n_workers: int, port: int, ready_dir: str) -> list[subprocess.Popen]:
    """Start ``n_workers`` copies of this command, all serving on one listening socket bound here.

    The workers must not see ``run_processes``' readiness descriptor (it is not passed to them: the
    number would name another file there); the supervisor says "ready" once every worker has loaded.
    Their output goes where the supervisor's goes (its log).
    """
    env = {k: v for k, v in os.environ.items() if k != READY_FD_ENV}
    env |= {PARENT_PID_ENV: str(os.getpid()), READY_DIR_ENV: ready_dir}
    cmd = [sys.executable, "-m", "course_lib.serving.production", *argv]
    with shared_listening_socket(port, backlog=_BACKLOG) as sock:  # the workers hold it once started
        worker_env = env | inherit_env(sock)
        return [subprocess.Popen(cmd, pass_fds=(sock.fileno(),), env=worker_env) for _ in range(n_workers)]


def _supervise(workers: list[subprocess.Popen], ready_dir: str, server: ServerConfig) -> int:
    """Watch the workers until told to stop, the parent dies or a worker exits; stop them; the exit code."""
    parent_pid = parent_to_watch()
    stopping = [False]

    def on_signal(signum: int, _frame: object) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ready_fd = int(os.environ[READY_FD_ENV]) if os.environ.get(READY_FD_ENV) else None
    code = 0
    try:
        while not stopping[0]:
            if os.getppid() != parent_pid:
                print(f"production supervisor: parent {parent_pid} is gone; stopping", file=sys.stderr)
                break
            if ready_fd is not None and len(list(Path(ready_dir).iterdir())) >= len(workers):
                os.write(ready_fd, f"{os.getpid()}\n".encode())
                os.close(ready_fd)
                ready_fd = None
            gone = [p for p in workers if p.poll() is not None]
            if gone:
                code = gone[0].returncode
                if code:
                    print(f"production supervisor: worker {gone[0].pid} exited with {code}", file=sys.stderr)
                break
            time.sleep(server.parent_check_s)
    finally:
        stop_processes(workers, server.graceful_shutdown_s + 5.0, group=False)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the production churn app on 127.0.0.1 (see the module docstring); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, config = parse_arguments(argv)
    inherited = inherited_socket()
    if inherited is not None or config.n_workers == 1:  # a worker of a shared port, or the only one
        _serve(inherited, args, config)
        return 0
    with tempfile.TemporaryDirectory(prefix="course-production-") as ready_dir:
        workers = _start_workers(argv, config.n_workers, args.port, ready_dir)
        return _supervise(workers, ready_dir, config.server)
