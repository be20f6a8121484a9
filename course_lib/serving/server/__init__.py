"""The one server runtime: uvicorn on 127.0.0.1, hardened, in a thread or in subprocesses, for a bounded time.

* ``_runners``: ``run_processes`` and ``start_server`` (free ports, workers sharing a port, readiness,
  always stopped): the one start-up and readiness path of every server process (documented there);
* ``_thread``: ``serve_in_thread``, a server in a daemon thread of this process;
* ``_listening``: ``listening_socket`` and the one way k workers share a port
  (``shared_listening_socket``, inherited by every worker; why not ``SO_REUSEPORT``);
* ``_serve``: ``uvicorn_config`` (the settings every server gets) and ``serve_app`` (what runs inside a
  server subprocess: open-file limit, lifetime, exit with the parent, the inherited socket,
  readiness line);
* ``_protocols``: ``guarded_protocol``, uvicorn's h11 or httptools protocol with a header timeout, a
  header size limit, a connection limit that evicts idle connections and a bounded pipeline;
* ``_refusals``: what a refused request is told (``MAX_HEADER_BYTES`` and how a head is counted, the
  JSON error body through ASGI or written raw for a request the parser refused);
* ``_door``: ``Door``, the ASGI middleware in front of every app (Host and encoding checks, body
  limits, admission control with 503 + ``Retry-After``, deadlines, clients that left, outcome counters);
* ``_request``: what an app may ask about its request (``client_gone``, ``request_deadline``,
  ``body_refusal``) and the door's ``DoorCounters`` (``door_counters``);
* ``_config``: ``ServerConfig``, every server and batcher default in one frozen record.
"""

from __future__ import annotations

from course_lib.core.process import PARENT_PID_ENV
from course_lib.serving.server._config import (
    DEFAULTS,
    EVENT_LOOPS,
    HTTP_PARSERS,
    ServerConfig,
    add_arguments,
    from_arguments,
    port_number,
    split_config,
    to_argv,
)
from course_lib.serving.server._door import DEADLINE_HEADER, PROBE_PATHS, Door
from course_lib.serving.server._listening import (
    LISTEN_FD_ENV,
    inherit_env,
    inherited_socket,
    listening_socket,
    shared_listening_socket,
)
from course_lib.serving.server._protocols import CONNECTION_EXTENSION, guarded_protocol
from course_lib.serving.server._refusals import MAX_HEADER_BYTES
from course_lib.serving.server._request import (
    DoorCounters,
    Refusal,
    body_refusal,
    client_gone,
    door_counters,
    request_deadline,
)
from course_lib.serving.server._runners import (
    READY_PATH,
    ServerProcess,
    ServerURLs,
    run_processes,
    start_server,
)
from course_lib.serving.server._serve import (
    LOOPBACK_HOST,
    READY_FD_ENV,
    serve_app,
    uvicorn_config,
)
from course_lib.serving.server._thread import RunningServer, serve_in_thread

__all__ = [
    "CONNECTION_EXTENSION",
    "DEADLINE_HEADER",
    "DEFAULTS",
    "EVENT_LOOPS",
    "HTTP_PARSERS",
    "LISTEN_FD_ENV",
    "LOOPBACK_HOST",
    "MAX_HEADER_BYTES",
    "PARENT_PID_ENV",
    "PROBE_PATHS",
    "READY_FD_ENV",
    "READY_PATH",
    "Door",
    "DoorCounters",
    "Refusal",
    "RunningServer",
    "ServerConfig",
    "ServerProcess",
    "ServerURLs",
    "add_arguments",
    "body_refusal",
    "client_gone",
    "door_counters",
    "from_arguments",
    "guarded_protocol",
    "inherit_env",
    "inherited_socket",
    "listening_socket",
    "port_number",
    "request_deadline",
    "run_processes",
    "serve_app",
    "serve_in_thread",
    "shared_listening_socket",
    "split_config",
    "start_server",
    "to_argv",
    "uvicorn_config",
]
