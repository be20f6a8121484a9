"""One worker process per usable core, all accepting from one listening socket: the server's process tree.

``python -m course_lib.serving.production --port N [levers]`` runs :func:`main`. It binds 127.0.0.1:N
itself and then:

* with one worker, serves the app in this process (``course_lib.serving.server.serve_app``: header and
  body timeouts, a connection limit, a bounded graceful shutdown, a lifetime, exit with the parent);
* with more, becomes a supervisor: it starts that many worker processes, each of which inherits the
  listening socket (``pass_fds``) and serves the app on it with ``serve_app`` (the kernel hands each new
  connection to one of them, as with uvicorn's and gunicorn's workers). Every worker marks itself
  loaded in a folder of the supervisor's (``READY_DIR_ENV``); ``/healthz`` answers 200 only when all
  of them have, so a client that waits for readiness measures the whole server. The supervisor
  stops the workers (SIGTERM, then SIGKILL after the grace period) when it is told to stop, when its
  own parent dies (``PARENT_PID_ENV``, as every course server), and when any worker exits on its own,
  which it reports with the worker's exit code; the workers exit when the supervisor dies.

References
----------
uvicorn source, ``uvicorn/supervisors/multiprocess.py`` (one socket, many workers); gunicorn
documentation, "Design" (the pre-fork worker model). Python ``subprocess.Popen(pass_fds=...)``.
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
    LOOPBACK_HOST,
    PARENT_PID_ENV,
    READY_FD_ENV,
    ServerConfig,
    add_arguments,
    from_arguments,
    port_number,
    serve_app,
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
    parser.add_argument("--worker-fd", type=int, default=None, help=argparse.SUPPRESS)
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


def _serve(sock: socket.socket, args: argparse.Namespace, config: ProductionConfig) -> None:
    app = create_production_app(config, body_timeout_s=config.server.body_timeout_s)
    folder = os.environ.get(READY_DIR_ENV)
    if folder is not None:
        worker_ready_path(folder, os.getpid()).touch()
    serve_app(app, port=args.port, config=config.server, sock=sock)


def _supervise(sock: socket.socket, argv: Sequence[str], n_workers: int, server: ServerConfig) -> int:
    parent_pid = parent_to_watch()
    stopping = [False]

    def on_signal(signum: int, _frame: object) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with tempfile.TemporaryDirectory(prefix="course-production-") as ready_dir:
        # The workers must not see run_processes' readiness descriptor (it is not passed to them: the number
        # would name another file there); the supervisor says "ready" once every worker has loaded.
        env = {k: v for k, v in os.environ.items() if k != READY_FD_ENV}
        env |= {PARENT_PID_ENV: str(os.getpid()), READY_DIR_ENV: ready_dir}
        ready_fd = int(os.environ[READY_FD_ENV]) if os.environ.get(READY_FD_ENV) else None
        cmd = [sys.executable, "-m", "course_lib.serving.production", *argv, f"--worker-fd={sock.fileno()}"]
        workers = [subprocess.Popen(cmd, pass_fds=(sock.fileno(),), env=env) for _ in range(n_workers)]
        code = 0
        try:
            while not stopping[0]:
                if os.getppid() != parent_pid:
                    print(f"production supervisor: parent {parent_pid} is gone; stopping", file=sys.stderr)
                    break
                if ready_fd is not None and len(list(Path(ready_dir).iterdir())) >= n_workers:
                    os.write(ready_fd, f"{os.getpid()}\n".encode())
                    os.close(ready_fd)
                    ready_fd = None
                gone = [p for p in workers if p.poll() is not None]
                if gone:
                    code = gone[0].returncode
                    if code:
                        print(
                            f"production supervisor: worker {gone[0].pid} exited with {code}", file=sys.stderr
                        )
                    break
                time.sleep(server.parent_check_s)
        finally:
            stop_processes(workers, server.graceful_shutdown_s + 5.0, group=False)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the production churn app on 127.0.0.1 (see the module docstring); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, config = parse_arguments(argv)
    if args.worker_fd is not None:  # a worker of a supervisor: serve on the inherited socket
        _serve(socket.socket(fileno=args.worker_fd), args, config)
        return 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK_HOST, args.port))
    sock.listen(_BACKLOG)
    sock.set_inheritable(True)
    if config.n_workers == 1:
        _serve(sock, args, config)
        return 0
    return _supervise(sock, argv, config.n_workers, config.server)
