"""The production FastAPI app under granian (a Rust HTTP server) instead of uvicorn.

Run (from the repository root, in .venv-peers): ``granian --interface asgi --host 127.0.0.1 --port N
--workers 2 --loop uvloop --factory benchmarks.peers.granian_app:create``.

References
----------
granian README ("ASGI", ``--factory``, ``--workers``).
"""

from __future__ import annotations

from course_lib.serving.production import ProductionConfig, create_production_app


def create():
    """The app granian serves: the production app, one worker's worth (granian forks the workers)."""
    return create_production_app(ProductionConfig(workers=1))
