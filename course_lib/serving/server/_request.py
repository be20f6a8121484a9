"""What an app may ask about the request it is answering, and what the door counted.

One concept: the state the runtime's door (:mod:`course_lib.serving.server._door`) keeps for each
request, in a context variable, so the app reads it without plumbing: :func:`client_gone` (has the
client closed its connection? the kernel is asked, so an end of stream that arrived while the event
loop was busy counts), :func:`request_deadline` (from ``x-request-timeout-ms``), :func:`body_refusal`
(why the door cut the body), and :func:`door_counters`, the :class:`DoorCounters` of what the server's
clients saw. Outside a door (an ASGI test client) they answer "connected", "no deadline", None.

References
----------
Python documentation, ``contextvars`` (each asyncio task runs in a copy of its creator's context).
"""

from __future__ import annotations

import contextvars
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from typing import Any

from course_lib.core.vocabulary import LATENCY_BUCKETS_S
from course_lib.serving.server._config import DEFAULTS

_CURRENT: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar("course_request", default=None)


@dataclass
class DoorCounters:
    """What the clients of one server process saw, request by request (see the module docstring)."""

    requests: int = 0
    ok: int = 0
    shed: int = 0
    expired: int = 0
    client_errors: int = 0
    server_errors: int = 0
    abandoned: int = 0
    shed_at_door: int = 0
    abandoned_at_door: int = 0
    in_flight: int = 0
    max_in_flight: int = DEFAULTS.max_in_flight
    ok_latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    ok_latency_sum_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain values (``ok_latency_buckets``: counts per bucket, the last one above 5 s)."""
        return asdict(self)

    def _observe_ok(self, seconds: float) -> None:
        self.ok_latency_buckets[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.ok_latency_sum_s += seconds


@dataclass(frozen=True)
class Refusal:
    """A request refused by the door: status, short machine-readable kind, reason."""

    status: int
    error: str
    message: str


@dataclass
class _Exchange:
    """One request as the door follows it."""

    door: Any  # the Door
    connection: Any
    deadline: float | None
    body_deadline: float
    body_bytes: int = 0
    body_done: bool = False
    refusal: Refusal | None = None
    status: int | None = None
    replace_body: bool = False
    complete: bool = False
    gone_at_answer: bool = False
    admitted: bool = False  # between the door's admission and the app's return
    client_deadline: float | None = None  # the client's own, when the door's queue-wait bound replaced it
    extensions: dict[str, Any] = field(default_factory=dict)  # the request scope's, shared with the protocol


def request_deadline() -> float | None:
    """The current request's deadline on the event loop's clock (``loop.time()``), or None."""
    exchange = _CURRENT.get()
    return None if exchange is None else exchange.deadline


def client_gone() -> bool:
    """True if the client of the current request has closed its connection (False outside a door)."""
    exchange = _CURRENT.get()
    return bool(exchange and exchange.connection is not None and exchange.connection.client_gone())


def body_refusal() -> Refusal | None:
    """Why the door cut the current request's body (413 too large, 408 too slow), or None."""
    exchange = _CURRENT.get()
    return None if exchange is None else exchange.refusal


def door_counters() -> DoorCounters | None:
    """The counters of the door the current request came through, or None (no door: a test client)."""
    exchange = _CURRENT.get()
    return None if exchange is None else exchange.door.counters
