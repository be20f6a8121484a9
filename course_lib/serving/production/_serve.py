"""Starting the production service from Python: its command line, and one function that runs it.

``serve_production(config)`` starts ``python -m course_lib.serving.production`` with
``course_lib.serving.server.run_processes`` (a free port on 127.0.0.1, stderr to a log file shown on
failure, readiness on ``/healthz``, always stopped when the ``with`` block ends, and the server exits
by itself after its lifetime or when this process dies) and yields its URL and process id.
``production_command`` is that command, for starting several servers at once with ``run_processes``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from course_lib.serving.feature_store import build_feature_store
from course_lib.serving.production._config import PRODUCTION, ProductionConfig
from course_lib.serving.server import DEFAULTS, ServerConfig, run_processes, to_argv


@dataclass(frozen=True)
class ProductionServer:
    """A running production service: its base URL and the process id of its supervisor (or only worker)."""

    url: str
    pid: int


def production_command(config: ProductionConfig = PRODUCTION, server: ServerConfig = DEFAULTS) -> list[str]:
    """The argv (without ``--port``) that serves ``config`` with the server limits of ``server``.

    The batcher knobs come from ``config`` (they override the ones in ``server``). The feature store is
    built here once, if missing, rather than by every worker at start-up.
    """
    build_feature_store()
    server = server.replace(
        http=config.http,
        loop=config.loop,
        max_batch_size=config.max_batch_size,
        max_queue_delay_ms=config.max_queue_delay_ms,
        max_queue_size=config.max_queue_size,
    )
    # the parser, loop and batcher knobs travel as the server's flags (one flag each)
    shared = ("--max-batch-size", "--max-queue", "--http", "--loop")
    lever_argv = [a for a in config.to_argv() if not a.startswith(shared)]
    return [sys.executable, "-m", "course_lib.serving.production", *lever_argv, *to_argv(server)]


@contextmanager
def serve_production(
    config: ProductionConfig = PRODUCTION,
    *,
    server: ServerConfig = DEFAULTS,
    startup_timeout_s: float = 120.0,
) -> Iterator[ProductionServer]:
    """Run the production churn service for ``config`` on 127.0.0.1; yield its base URL.

    Parameters
    ----------
    config : ProductionConfig
        The levers (default: the production choice, one worker per usable core).
    server : course_lib.serving.server.ServerConfig
        Lifetime, timeouts and connection limit of every worker (``lifetime_s``: the server exits by
        itself after it).
    startup_timeout_s : float
        How long to wait until every worker has loaded the model and ``/healthz`` answers 200.

    Yields
    ------
    ProductionServer
        ``url`` (e.g. ``http://127.0.0.1:8123``) and ``pid`` (the process tree's root, e.g. to sample its
        memory).

    Raises
    ------
    RuntimeError
        If the server exits or is not ready in time (the message holds the end of its log).
    """
    with run_processes(
        {"production": production_command(config, server)}, startup_timeout_s=startup_timeout_s
    ) as urls:
        yield ProductionServer(urls["production"], urls.processes["production"].pid)
