"""uvicorn on 127.0.0.1 for a bounded time, in a thread or in subprocesses, hardened for abuse.

* ``_runners``: ``serve_in_thread`` and ``run_processes`` (free ports, readiness, always stopped);
* ``_process``: ``serve_app``, what runs inside a server subprocess (timeouts, connection limit,
  bounded shutdown, exit with the parent);
* ``_config``: ``ServerConfig``, every server and batcher default in one frozen record.
"""

from __future__ import annotations

from course_lib.serving.server._config import (
    DEFAULTS,
    ServerConfig,
    add_arguments,
    from_arguments,
    split_config,
    to_argv,
)
from course_lib.serving.server._process import (
    LOOPBACK_HOST,
    PARENT_PID_ENV,
    guarded_protocol,
    serve_app,
)
from course_lib.serving.server._runners import (
    READY_PATH,
    RunningServer,
    ServerURLs,
    run_processes,
    serve_in_thread,
)

__all__ = [
    "DEFAULTS",
    "LOOPBACK_HOST",
    "PARENT_PID_ENV",
    "READY_PATH",
    "RunningServer",
    "ServerConfig",
    "ServerURLs",
    "add_arguments",
    "from_arguments",
    "guarded_protocol",
    "run_processes",
    "serve_app",
    "serve_in_thread",
    "split_config",
    "to_argv",
]
