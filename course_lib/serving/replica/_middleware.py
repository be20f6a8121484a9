"""What a replica adds around the churn service app: a readiness probe, counters and seeded stalls.

One concept: :class:`ReplicaMiddleware`, an ASGI middleware. ``GET /readyz`` answers 503 until the
replica's warm-up is done, then 200; ``GET /stats`` returns its counters; on ``POST /score`` a
``slow_fraction`` of requests, chosen by :func:`is_slow` from a hash of ``(seed, x-request-id)`` so the
same requests stall in every run, wait ``slow_ms`` extra, and a stalled request whose client leaves is
abandoned and counted. The replica process that serves it is :mod:`course_lib.serving.replica._replica`, which
re-exports these names.

References
----------
Kubernetes documentation, "Configure Liveness, Readiness and Startup Probes". ASGI specification,
"HTTP & WebSocket" (``http.disconnect``). Dean, J. and Barroso, L. A. (2013), "The Tail at Scale",
CACM 56(2): 74-80.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReplicaConfig", "ReplicaMiddleware", "is_slow"]


@dataclass(frozen=True)
class ReplicaConfig:
    """What a replica injects and how it warms up (see the module docstring)."""

    slow_fraction: float = 0.0
    slow_ms: float = 50.0
    seed: int = 0
    warmup_requests: int = 0
    gc_freeze: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.slow_fraction <= 1.0:
            raise ValueError(f"slow_fraction must be in [0, 1], got {self.slow_fraction!r}")
        if not self.slow_ms >= 0:
            raise ValueError(f"slow_ms must be >= 0 ms, got {self.slow_ms!r}")
        if self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {self.warmup_requests!r}")


def is_slow(request_id: str, *, seed: int, slow_fraction: float) -> bool:
    """Whether request ``request_id`` stalls: a uniform number from blake2b(seed, id) < slow_fraction."""
    digest = hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < slow_fraction


@dataclass
class _State:
    ready: bool = False
    warmup_done: int = 0
    counters: dict[str, int] = field(
        default_factory=lambda: {"requests": 0, "slow_injected": 0, "abandoned": 0, "warmup_requests": 0}
    )


class ReplicaMiddleware:
    """ASGI middleware around the service app: ``/readyz``, ``/stats`` and seeded stalls on ``/score``."""

    def __init__(self, app: Any, config: ReplicaConfig):
        self.app = app
        self.config = config
        self.state = _State(ready=config.warmup_requests == 0)
        self._unlabelled = 0

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
            return await self._json(send, 200, {**self.state.counters, "ready": self.state.ready})
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
        cfg = self.config
        if cfg.slow_fraction > 0 and is_slow(request_id, seed=cfg.seed, slow_fraction=cfg.slow_fraction):
            self.state.counters["slow_injected"] += 1
            receive = await self._stall(receive)
            if receive is None:
                self.state.counters["abandoned"] += 1
                return None
        return await self.app(scope, receive, send)

    async def _stall(self, receive: Any) -> Any:
        """Read the body, wait ``slow_ms`` unless the client leaves; a replaying ``receive`` or None."""
        messages = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            messages.append(message)
            if not message.get("more_body"):
                break
        sleeper = asyncio.ensure_future(asyncio.sleep(self.config.slow_ms / 1000.0))
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
