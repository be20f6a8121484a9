"""The prototype churn server that load tests start from, in its own process, with its levers exposed.

The app is the Lesson 3 one (``course_lib.serving.batching.predict.create_batched_app``: Lesson 2's
``POST /score`` plus the batched ``POST /predict``, which sheds with 503 + ``Retry-After`` when its
queue is full), the server that Lesson 6 load-tests and that the production service
(``course_lib.serving.production``) replaces. This module runs it with the knobs a load test
compares at the knee:

* ``http`` / ``loop``: uvicorn's HTTP parser and event loop, ``h11`` + ``asyncio`` (pure Python, what
  Lessons 2 and 3 use) or ``httptools`` + ``uvloop`` (C);
* ``workers``: server processes sharing the port (one inherited listening socket; each loads its own model);
* ``json_encoder``: the ``/score`` answer built with the standard ``json`` module or with ``orjson``
  (``course_lib.serving.service.encode_answer``).

``serve_churn`` starts it on the course's one server runtime (``course_lib.serving.server.run_processes``
and ``serve_app``: the same limits, door and hygiene as every other server) on 127.0.0.1 and yields
its URL and process ids (to read their memory with ``course_lib.measure.server_probes.sample_rss``).
Every server process exits when the ``with`` block ends, after ``lifetime_s``, or as soon as the
process that started it dies.

References
----------
uvicorn documentation, "Settings" (``--http``, ``--loop``). Linux ``socket(7)`` (``SO_REUSEPORT``).
orjson README.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from course_lib.core.checks import integer, one_of, positive_number
from course_lib.core.vocabulary import ANSWER_ENCODERS, EVENT_LOOPS, HTTP_PARSERS
from course_lib.serving.server import (
    DEFAULTS,
    ServerConfig,
    add_arguments,
    from_arguments,
    port_number,
    run_processes,
    serve_app,
    to_argv,
)

__all__ = [
    "PROTOTYPE_SERVER",
    "ServerHandle",
    "serve_churn",
]

#: The runtime's limits for the prototype: ``DEFAULTS`` plus a 0.5 s queue-wait bound. Its /score runs
#: the native model (~10 ms) on the event loop, so the door's count of 128 alone is a queue longer
#: than a client's 2 s timeout (issue 28 probe, 4x overload: 679 of 1,589 requests timed out, p99
#: back after 2.3 s; with the bound none timed out and the p99 was back after 0.6 s). 0.5 s is 5x
#: Lesson 6's 100 ms p99 SLO, so the bound only acts where the SLO is already lost.
PROTOTYPE_SERVER = DEFAULTS.replace(max_queue_wait_s=0.5)
#: This module, as ``python -m`` runs it in each server process.
_ENTRY = "course_lib.serving.prototype"


def _build_app(config: ServerConfig, json_encoder: str):
    # serving.batching.predict loads the model stack: only the server process needs it
    from course_lib.serving.batching.predict import create_batched_app  # noqa: PLC0415 (subprocess entry point)
    from course_lib.serving.service import churn_service  # noqa: PLC0415 (subprocess entry point)

    service = churn_service("xgboost", lookup_mode="cached", encoder=json_encoder)
    return create_batched_app(
        service,
        max_queue_size=config.max_queue_size,
        max_batch_size=config.max_batch_size,
        body_timeout_s=config.body_timeout_s,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``python -m course_lib.serving.prototype --port P [--json-encoder ..]`` and any
    ``ServerConfig`` flag."""
    parser = argparse.ArgumentParser(description="Churn server for load tests, on 127.0.0.1")
    parser.add_argument("--port", type=port_number, required=True)
    parser.add_argument("--json-encoder", choices=ANSWER_ENCODERS, default="json")
    add_arguments(parser)
    args = parser.parse_args(argv)
    config = from_arguments(args)
    serve_app(_build_app(config, args.json_encoder), port=args.port, config=config)


@dataclass(frozen=True)
class ServerHandle:
    """A running load-test server: base URL, the first worker's process id and every worker's."""

    url: str
    pid: int
    pids: tuple[int, ...] = ()


@contextmanager
def serve_churn(
    *,
    http: str = "h11",
    loop: str = "asyncio",
    workers: int = 1,
    json_encoder: str = "json",
    max_queue_size: int = 256,
    max_batch_size: int = 64,
    lifetime_s: float = 300.0,
    startup_timeout_s: float = 120.0,
    config: ServerConfig = PROTOTYPE_SERVER,
) -> Iterator[ServerHandle]:
    """Run the Lesson 3 churn server in a subprocess on 127.0.0.1 with the given levers.

    Parameters
    ----------
    http : {"h11", "httptools"}
    loop : {"asyncio", "uvloop"}
    workers : int >= 1
        Server processes sharing the port.
    json_encoder : {"json", "orjson"}
        Encoder of the ``/score`` answer.
    max_queue_size, max_batch_size : int
        The ``/predict`` batcher's bounded queue (full queue: 503 + ``Retry-After``) and batch limit.
    lifetime_s : float > 0
        The server exits by itself after this long.
    startup_timeout_s : float > 0
        How long to wait for every worker to be ready (each loads the model).
    config : ServerConfig
        Every other limit of the runtime (timeouts, connection and in-flight limits); the arguments
        above replace its fields of the same name. Default ``PROTOTYPE_SERVER``: the door refuses
        the 129th request in flight (before ``/predict``'s batcher queue, ``max_queue_size``, is
        full) and any request that has waited 0.5 s for its model call (``max_queue_wait_s``).

    Yields
    ------
    ServerHandle

    Raises
    ------
    ValueError
        For a lever outside the allowed values.
    RuntimeError
        If a server exits or does not answer ``/healthz`` in time (with the end of its log).
    """
    one_of("http", http, HTTP_PARSERS)
    one_of("loop", loop, EVENT_LOOPS)
    one_of("json_encoder", json_encoder, ANSWER_ENCODERS)
    integer("workers", workers, min=1)
    positive_number("lifetime_s", lifetime_s)
    config = config.replace(
        http=http,
        loop=loop,
        max_queue_size=max_queue_size,
        max_batch_size=max_batch_size,
        lifetime_s=lifetime_s,
    )
    cmd = [sys.executable, "-m", _ENTRY, f"--json-encoder={json_encoder}"]
    with run_processes(
        {"churn": [*cmd, *to_argv(config)]}, startup_timeout_s=startup_timeout_s, workers=workers
    ) as urls:
        pids = tuple(child.pid for child in urls.workers["churn"])
        yield ServerHandle(urls["churn"], pids[0], pids)


if __name__ == "__main__":
    main()
