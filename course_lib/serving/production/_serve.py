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
from course_lib.serving.server import run_processes


@dataclass(frozen=True)
class ProductionServer:
    """A running production service: its base URL and the process id of its supervisor (or only worker)."""

    url: str
    pid: int


def production_command(config: ProductionConfig = PRODUCTION) -> list[str]:
    """The argv (without ``--port``) that serves ``config``, its ``server`` limits included.

    The feature store is built here once, if missing, rather than by every worker at start-up.
    """
    build_feature_store()
    return [sys.executable, "-m", "course_lib.serving.production", *config.to_argv()]


@contextmanager
def serve_production(
    config: ProductionConfig = PRODUCTION,
    *,
    startup_timeout_s: float = 120.0,
) -> Iterator[ProductionServer]:
    """Run the production churn service for ``config`` on 127.0.0.1; yield its base URL.

    Parameters
    ----------
    config : ProductionConfig
        The levers (default: the production choice, one worker per usable core), and in
        ``config.server`` the lifetime, timeouts and limits of every worker (``lifetime_s``: the
        server exits by itself after it; e.g. ``PRODUCTION.with_server(lifetime_s=60)``).
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
        {"production": production_command(config)}, startup_timeout_s=startup_timeout_s
    ) as urls:
        yield ProductionServer(urls["production"], urls.processes["production"].pid)
