"""One frozen dataclass for every default of the batched server: batcher knobs and HTTP limits.

``DynamicBatcher``, ``create_batched_app``, ``run_server``/``run_servers``, the command line
(``python -m course_lib.serving.batching.predict``) and the generic process runner in ``course_lib.serving.server._runners`` all
read their defaults from ``DEFAULTS`` below, so a default is written once. ``add_arguments`` builds the
command-line flags from the fields and ``to_argv`` writes them back, so the parent and the server
subprocess cannot disagree.

Where the defaults come from
----------------------------
* Batcher: Triton's dynamic batcher knobs (``max_batch_size``, ``max_queue_delay_microseconds``,
  ``preferred_batch_size``, ``max_queue_size``); the values are Lesson 3's working point.
* ``lifetime_s`` 300: a forgotten server in a notebook stops by itself after five minutes; a lesson
  runs for under 90 s.
* ``http`` / ``loop`` ``h11`` + ``asyncio``: uvicorn's pure-Python parser and loop (Lessons 2-12);
  ``httptools`` + ``uvloop`` are the C ones Lesson 6 compares. Both parsers get the same guards.
* ``header_timeout_s`` / ``body_timeout_s`` 10: a request whose headers or body take longer is
  abandoned (slowloris defence; the request body here is ~30 bytes). ``keep_alive_s`` 5 is uvicorn's
  default idle time between requests on one connection.
* ``max_connections`` 512: at most this many open connections; a new one beyond it evicts an idle
  connection (or is closed if every connection has a request in flight), so idle sockets can never
  exhaust the usual 1,024 open-file limit and lock everyone out. ``backlog`` 128 (Linux's classic
  ``somaxconn``): the listen queue, and the most connections asyncio accepts in one go before any
  of them is handled (uvicorn's 2,048 would open that many files at once and hit the limit).
  ``open_files_limit`` 0 leaves the process's limit as it is (raised if it is below
  ``files_needed`` = ``max_connections`` + 3 x ``backlog`` + 64: an eviction frees its file a
  loop pass later); a number sets it (tests lower it to show that the server stays reachable).
* ``max_in_flight`` 128: requests admitted at once per process; one more is answered 503 with
  ``Retry-After: retry_after_s`` (1 s) before any of its work starts. 128 requests of a millisecond
  each are a 128 ms queue: well inside Lesson 2's SLO, so a full door means overload, not a burst.
* ``max_queue_wait_s`` 0 (off): a new request is also refused 503 when the oldest request admitted
  and still in progress entered the door longer ago than this. ``max_in_flight`` is a count and
  assumes ~1 ms requests; an app that runs a 10 ms model call on its event loop (Lesson 6's
  prototype) queues 128 x 10 ms = 1.3 s behind a full door, longer than a client's timeout, so its
  clients time out instead of being refused. Measured (issue 28 probe, 4x overload, 2 s client
  timeout): 1,140 of 1,589 requests timed out and the p99 had not recovered 4 s after the spike;
  with this bound at 0.5 s no request timed out and the p99 recovered in under 1 s. Off by default:
  a server whose requests are meant to wait (a replica with injected stalls, a long batching delay)
  would refuse everything behind one slow request (the idea of CoDel's target sojourn time, RFC 8289).
* ``max_pipeline_depth`` 16: requests one connection may queue behind the one being answered
  (HTTP/1.1 pipelining); beyond that the server stops reading the connection, answers what it
  holds, answers the next one 429 ``pipeline_too_deep`` and closes it (RFC 9112 section 9.3.2: the
  client retries the rest).
* ``max_body_bytes`` 1 MiB: no course endpoint takes more (the churn body is ~30 bytes; the app
  refuses over 16 KiB itself); a larger body is refused 413 after at most ``max_drain_bytes`` 8 MiB
  have been read and thrown away, so the client can read its answer.
* ``max_error_body_bytes`` 4096: an error answer never echoes a large request back.
* ``graceful_shutdown_s`` 5: after SIGTERM, requests in flight get this long, then they are cancelled.
* ``parent_check_s`` 0.2: how often a server subprocess checks that its parent is still alive (a
  server is gone well within 2 s of its parent's death).

References
----------
NVIDIA Triton Inference Server documentation, "Dynamic Batcher". uvicorn documentation, "Settings"
(``timeout_keep_alive``, ``timeout_graceful_shutdown``; its ``limit_concurrency`` counts idle
keep-alive connections too, so admission is counted by the runtime's door instead). RFC 9112,
"HTTP/1.1", sections 3.2 (Host) and 9.3.2 (pipelining).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from course_lib.core.checks import InvalidArgumentError, integer, integers, number, one_of
from course_lib.core.vocabulary import EVENT_LOOPS, HTTP_PARSERS


@dataclass(frozen=True)
class ServerConfig:
    """Batcher knobs and HTTP server limits (see the module docstring for each default's source).

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        (a ``ValueError``) for a time limit that is not a finite number > 0 (``max_queue_wait_s``:
        >= 0, 0 meaning off), a count below 1, an
        unknown ``http`` or ``loop``, an ``open_files_limit`` too small for ``max_connections``, or
        ``max_drain_bytes`` below ``max_body_bytes`` (batcher knobs are checked by
        ``DynamicBatcher`` itself).
    """

    max_batch_size: int = 64
    max_queue_delay_ms: float = 2.0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 2048
    dedup: bool = True
    instances: int = 1
    run_in_thread: bool = True
    lifetime_s: float = 300.0
    http: str = "h11"
    loop: str = "asyncio"
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 512
    backlog: int = 128
    open_files_limit: int = 0
    max_in_flight: int = 128
    retry_after_s: int = 1
    max_queue_wait_s: float = 0.0
    max_pipeline_depth: int = 16
    max_body_bytes: int = 1_048_576
    max_drain_bytes: int = 8_388_608
    max_error_body_bytes: int = 4096
    graceful_shutdown_s: float = 5.0
    parent_check_s: float = 0.2

    def __post_init__(self) -> None:
        object.__setattr__(self, "preferred_batch_sizes", tuple(self.preferred_batch_sizes))
        for name in _SECONDS:
            number(name, getattr(self, name), min=0, min_open=True)
        for name in _COUNTS:
            integer(name, getattr(self, name), min=1)
        integer("open_files_limit", self.open_files_limit, min=0)
        number("max_queue_wait_s", self.max_queue_wait_s, min=0)
        self._check_batcher()
        one_of("http", self.http, HTTP_PARSERS)
        one_of("loop", self.loop, EVENT_LOOPS)
        if self.open_files_limit and self.open_files_limit < self.files_needed:
            raise InvalidArgumentError(
                f"open_files_limit must be 0 or >= max_connections + 3 x backlog + {_SPARE_FILES} "
                f"({self.files_needed}), got {self.open_files_limit!r}"
            )
        if self.max_drain_bytes < self.max_body_bytes:
            raise InvalidArgumentError(
                f"max_drain_bytes must be >= max_body_bytes ({self.max_body_bytes}), got {self.max_drain_bytes!r}"
            )

    def _check_batcher(self) -> None:
        """The batcher's knobs, checked here (as ``DynamicBatcher`` checks them) so that a bad value is refused
        where the config is built, not later inside every server process that reads it."""
        integer("max_batch_size", self.max_batch_size, min=1)
        number("max_queue_delay_ms", self.max_queue_delay_ms, min=0)
        integers(
            "preferred_batch_sizes",
            self.preferred_batch_sizes,
            min=1,
            max=self.max_batch_size,
            allow_empty=True,
        )
        integer("max_queue_size", self.max_queue_size, min=1)
        integer("instances", self.instances, min=1)

    @property
    def files_needed(self) -> int:
        """Open files a server may hold: its connections, up to three accept bursts still closing, spare."""
        return self.max_connections + 3 * self.backlog + _SPARE_FILES

    def batcher_kwargs(self) -> dict[str, Any]:
        """The ``DynamicBatcher`` keyword arguments (``dedup`` stays a bool; the app turns it into a key)."""
        return {
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_ms": self.max_queue_delay_ms,
            "preferred_batch_sizes": self.preferred_batch_sizes,
            "max_queue_size": self.max_queue_size,
            "instances": self.instances,
            "run_in_thread": self.run_in_thread,
        }

    def replace(self, **changes: Any) -> ServerConfig:
        """A copy with some fields changed (unknown names raise ``TypeError``)."""
        return dataclasses.replace(self, **changes)


_SECONDS = (
    "lifetime_s",
    "header_timeout_s",
    "body_timeout_s",
    "keep_alive_s",
    "graceful_shutdown_s",
    "parent_check_s",
)
_COUNTS = (
    "max_connections",
    "backlog",
    "max_in_flight",
    "retry_after_s",
    "max_pipeline_depth",
    "max_body_bytes",
    "max_drain_bytes",
    "max_error_body_bytes",
)
_CHOICES = {"http": HTTP_PARSERS, "loop": EVENT_LOOPS}
#: Open files a server needs beside its connections (modules, the model, logs, the event loop).
_SPARE_FILES = 64

#: The defaults, in one place.
DEFAULTS = ServerConfig()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def port_number(text: str) -> int:
    """``argparse`` type of a server's ``--port``: an integer in 1..65535, or a usage error that says so."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be an integer in 1..65535, got {text!r}")
    return port


def add_arguments(
    parser: argparse.ArgumentParser, defaults: ServerConfig = DEFAULTS
) -> argparse.ArgumentParser:
    """Add one flag per ``ServerConfig`` field (``--max-batch-size``, ``--dedup/--no-dedup``, ...).

    ``defaults`` gives each flag's default (e.g. the production service's ``PRODUCTION.server``, with
    httptools + uvloop, instead of ``DEFAULTS``).
    """
    for f in fields(ServerConfig):
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=default)
        elif isinstance(default, tuple):
            parser.add_argument(
                _flag(f.name),
                type=lambda text: tuple(int(x) for x in text.split(",") if x),
                default=default,
                help="comma-separated integers",
            )
        elif f.name in _CHOICES:
            parser.add_argument(_flag(f.name), choices=_CHOICES[f.name], default=default)
        else:
            parser.add_argument(_flag(f.name), type=type(default), default=default)
    return parser


def from_arguments(args: argparse.Namespace) -> ServerConfig:
    """The ``ServerConfig`` parsed by a parser built with ``add_arguments``."""
    return ServerConfig(**{f.name: getattr(args, f.name) for f in fields(ServerConfig)})


def to_argv(config: ServerConfig) -> list[str]:
    """Command-line flags that ``add_arguments`` + ``from_arguments`` turn back into ``config``."""
    argv: list[str] = []
    for f in fields(ServerConfig):
        value = getattr(config, f.name)
        if isinstance(value, bool):
            argv.append(_flag(f.name) if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, tuple):
            argv.append(f"{_flag(f.name)}={','.join(map(str, value))}")
        else:
            argv.append(
                f"{_flag(f.name)}={value!r}" if isinstance(value, float) else f"{_flag(f.name)}={value}"
            )
    return argv


def split_config(kwargs: dict[str, Any]) -> tuple[ServerConfig, dict[str, Any]]:
    """Separate ``ServerConfig`` fields from other keyword arguments: ``(config, rest)``."""
    names = {f.name for f in fields(ServerConfig)}
    config = ServerConfig(**{k: v for k, v in kwargs.items() if k in names})
    return config, {k: v for k, v in kwargs.items() if k not in names}
