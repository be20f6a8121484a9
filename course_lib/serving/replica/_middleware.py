"""What a replica adds around the churn service app: a readiness probe, counters and seeded stalls.

One concept: :class:`ReplicaMiddleware`, an ASGI middleware. ``GET /readyz`` answers 503 until the
replica's warm-up is done, then 200; ``GET /stats`` returns the app's own ``/stats`` with the replica's
counters and its stall settings added; on ``POST /score`` a ``slow_fraction`` of requests, chosen by
:func:`is_slow` from a hash of ``(seed, x-request-id)`` so the same requests stall in every run, wait
``slow_ms`` extra, and a stalled request whose client leaves is abandoned and counted.
``PUT /faults`` with a JSON body such as ``{"slow_fraction": 0.06, "slow_ms": 40}`` changes the stall
settings of a running replica (a fault-injection endpoint, as fault-injection proxies such as
Toxiproxy offer), so one experiment can measure a replica without stalls first and size the stall
from that measurement; a bad value is answered 422 with the reason. The replica process that serves
it is :mod:`course_lib.serving.replica._replica`, which re-exports these names.

A stall is an ``asyncio.sleep`` on the replica's event loop: the replica keeps answering other
requests while one is stalled (a slow disk or a remote call, not a busy CPU), so a stall delays only
the request it hits.

References
----------
Kubernetes documentation, "Configure Liveness, Readiness and Startup Probes". ASGI specification,
"HTTP & WebSocket" (``http.disconnect``). Dean, J. and Barroso, L. A. (2013), "The Tail at Scale",
CACM 56(2): 74-80. Shopify, Toxiproxy README (faults changed at run time through an HTTP API).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from course_lib.core.checks import InvalidArgumentError, integer, number

#: The ``ReplicaConfig`` fields ``PUT /faults`` may change.
FAULT_FIELDS: tuple[str, ...] = ("slow_fraction", "slow_ms", "seed")
_MAX_FAULTS_BODY_BYTES = 4096


@dataclass(frozen=True)
class ReplicaConfig:
    """What a replica injects and how it warms up (see the module docstring).

    Parameters
    ----------
    slow_fraction : float in [0, 1]
        Share of ``POST /score`` requests that stall.
    slow_ms : float >= 0
        Extra wait of a stalled request, ms.
    seed : int
        Seed of the stall choice (:func:`is_slow`).
    warmup_requests : int >= 0
        Requests the replica sends to itself before ``/readyz`` says ready.
    gc_freeze : bool
        ``gc.freeze()`` after the warm-up.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For a value outside its range.
    """

    slow_fraction: float = 0.0
    slow_ms: float = 50.0
    seed: int = 0
    warmup_requests: int = 0
    gc_freeze: bool = False

    def __post_init__(self) -> None:
        number("slow_fraction", self.slow_fraction, min=0, max=1)
        number("slow_ms", self.slow_ms, min=0)
        integer("seed", self.seed)
        integer("warmup_requests", self.warmup_requests, min=0)


def is_slow(request_id: str, *, seed: int, slow_fraction: float) -> bool:
    """Whether request ``request_id`` stalls: a uniform number from blake2b(seed, id) < slow_fraction."""
    digest = hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < slow_fraction


@dataclass
class ReplicaState:
    """What a replica's middleware shares with its process: the settings now, readiness, counters."""

    config: ReplicaConfig = field(default_factory=ReplicaConfig)
    ready: bool = False
    warmup_done: int = 0
    counters: dict[str, int] = field(
        default_factory=lambda: {"requests": 0, "slow_injected": 0, "abandoned": 0, "warmup_requests": 0}
    )

    def faults(self) -> dict[str, float]:
        """The stall settings now (``FAULT_FIELDS``)."""
        return {name: getattr(self.config, name) for name in FAULT_FIELDS}


class ReplicaMiddleware:
    """ASGI middleware around the service app: ``/readyz``, ``/stats``, ``/faults`` and seeded stalls.

    Parameters
    ----------
    app : ASGI application
    config : ReplicaConfig, optional
        The settings at start (ignored when ``state`` is given).
    state : ReplicaState, optional
        Shared with the process that runs the warm-up (default: a new one, ready at once when
        ``config.warmup_requests`` is 0).
    """

    def __init__(self, app: Any, config: ReplicaConfig | None = None, *, state: ReplicaState | None = None):
        self.app = app
        if state is None:
            config = config if config is not None else ReplicaConfig()
            state = ReplicaState(config=config, ready=config.warmup_requests == 0)
        self.state = state
        self._unlabelled = 0

    @property
    def config(self) -> ReplicaConfig:
        """The settings now (``PUT /faults`` replaces them)."""
        return self.state.config

    async def _json(self, send: Any, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        if path == "/readyz" and method == "GET":
            status = 200 if self.state.ready else 503
            return await self._json(
                send, status, {"ready": self.state.ready, "warmup_done": self.state.warmup_done}
            )
        if path == "/stats" and method == "GET":
            inner = await self._inner_stats(scope, receive)
            own = {**self.state.counters, "ready": self.state.ready, "faults": self.state.faults()}
            return await self._json(send, 200, {**inner, **own})
        if path == "/faults" and method == "PUT":
            return await self._set_faults(receive, send)
        if path != "/score" or method != "POST":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", []))
        if b"x-warmup" in headers:
            self.state.counters["warmup_requests"] += 1
            return await self.app(scope, receive, send)
        self.state.counters["requests"] += 1
        request_id = headers.get(b"x-request-id", b"").decode(errors="replace")
        if not request_id:
            self._unlabelled += 1
            request_id = f"unlabelled-{self._unlabelled}"
        cfg = self.state.config
        if cfg.slow_fraction > 0 and is_slow(request_id, seed=cfg.seed, slow_fraction=cfg.slow_fraction):
            self.state.counters["slow_injected"] += 1
            receive = await self._stall(receive, cfg.slow_ms)
            if receive is None:
                self.state.counters["abandoned"] += 1
                return None
        return await self.app(scope, receive, send)

    async def _inner_stats(self, scope: dict[str, Any], receive: Any) -> dict[str, Any]:
        """The app's own ``GET /stats`` answer as a dict ({} if it has none, or is not loaded yet)."""
        if not getattr(self.app, "loaded", True):
            return {}
        status, chunks = [0], []

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, capture)
        try:
            answer = json.loads(b"".join(chunks)) if status[0] == 200 else {}
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    async def _set_faults(self, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > _MAX_FAULTS_BODY_BYTES:
                return await self._json(send, 413, {"error": f"body over {_MAX_FAULTS_BODY_BYTES} bytes"})
            if not message.get("more_body"):
                break
        try:
            changes = json.loads(body)
            if not isinstance(changes, dict):
                raise InvalidArgumentError(f"the body must be a JSON object, got {changes!r}")
            unknown = sorted(set(changes) - set(FAULT_FIELDS))
            if unknown:
                raise InvalidArgumentError(f"unknown fields {unknown}: allowed are {list(FAULT_FIELDS)}")
            self.state.config = dataclasses.replace(self.state.config, **changes)
        except (ValueError, TypeError) as exc:  # bad JSON, unknown fields, a value out of range
            return await self._json(send, 422, {"error": str(exc)})
        return await self._json(send, 200, self.state.faults())

    async def _stall(self, receive: Any, slow_ms: float) -> Any:
        """Read the body, wait ``slow_ms`` unless the client leaves; a replaying ``receive`` or None."""
        messages = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            messages.append(message)
            if not message.get("more_body"):
                break
        sleeper = asyncio.ensure_future(asyncio.sleep(slow_ms / 1000.0))
        watcher = asyncio.ensure_future(receive())  # completes with http.disconnect if the client leaves
        try:
            done, _ = await asyncio.wait({sleeper, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, watcher):
                task.cancel()
        if watcher in done and (
            watcher.exception() is not None or watcher.result()["type"] == "http.disconnect"
        ):
            return None  # the client left (or its connection broke) during the stall
        replay = iter(messages)

        async def replay_receive() -> dict[str, Any]:
            try:
                return next(replay)
            except StopIteration:
                return await receive()

        return replay_receive
