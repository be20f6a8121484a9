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
* ``header_timeout_s`` / ``body_timeout_s`` 10: a request whose headers or body take longer is
  abandoned (slowloris defence; the request body here is ~30 bytes). ``keep_alive_s`` 5 is uvicorn's
  default idle time between requests on one connection.
* ``max_connections`` 512: at most this many open connections; a new one beyond it evicts an idle
  connection (or is closed if every connection has a request in flight), so idle sockets can never
  exhaust the usual 1,024 open-file limit and lock everyone out.
* ``graceful_shutdown_s`` 5: after SIGTERM, requests in flight get this long, then they are cancelled.
* ``parent_check_s`` 0.5: how often a server subprocess checks that its parent is still alive.

References
----------
NVIDIA Triton Inference Server documentation, "Dynamic Batcher". uvicorn documentation, "Settings"
(``timeout_keep_alive``, ``timeout_graceful_shutdown``, ``limit_concurrency``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["DEFAULTS", "ServerConfig", "add_arguments", "from_arguments", "split_config", "to_argv"]


@dataclass(frozen=True)
class ServerConfig:
    """Batcher knobs and HTTP server limits (see the module docstring for each default's source).

    Raises
    ------
    ValueError
        For a time limit that is not a finite number > 0, or a count below 1 (batcher knobs are
        checked by ``DynamicBatcher`` itself).
    """

    max_batch_size: int = 64
    max_queue_delay_ms: float = 2.0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 2048
    dedup: bool = True
    instances: int = 1
    run_in_thread: bool = True
    lifetime_s: float = 300.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 512
    graceful_shutdown_s: float = 5.0
    parent_check_s: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "preferred_batch_sizes", tuple(self.preferred_batch_sizes))
        for name in (
            "lifetime_s",
            "header_timeout_s",
            "body_timeout_s",
            "keep_alive_s",
            "graceful_shutdown_s",
            "parent_check_s",
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if (
            isinstance(self.max_connections, bool)
            or not isinstance(self.max_connections, int)
            or self.max_connections < 1
        ):
            raise ValueError(f"max_connections must be an integer >= 1, got {self.max_connections!r}")

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


#: The defaults, in one place.
DEFAULTS = ServerConfig()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one flag per ``ServerConfig`` field (``--max-batch-size``, ``--dedup/--no-dedup``, ...)."""
    for f in fields(ServerConfig):
        default = getattr(DEFAULTS, f.name)
        if isinstance(default, bool):
            parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=default)
        elif isinstance(default, tuple):
            parser.add_argument(
                _flag(f.name),
                type=lambda text: tuple(int(x) for x in text.split(",") if x),
                default=default,
                help="comma-separated integers",
            )
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
