"""Dynamic batching in the Lesson 2 churn server: ``POST /predict`` through a ``DynamicBatcher``.

``create_batched_app`` takes the Lesson 2 app (``course_lib.serving.service.create_app``: ``POST /score`` one
model call per request, ``GET /healthz``) and adds ``POST /predict``. Its request body is the same
(``{"customer_id": "SC-0000042"}``) and it runs the same stages (parse, feature lookup, forward,
format, each timed into ``Server-Timing``), except that the forward stage submits the customer's
features to a dynamic batcher, which scores many concurrent requests in one model call. The answer
is the Lesson 2 answer plus how the request was served: ``queue_wait_ms``, ``service_ms`` (the
model call for the whole batch), ``batch_size``, ``batch_requests``, ``deduplicated`` and ``trigger``.
The forward stage is ``batched_forward`` (the production service's batcher uses it too), and
``run_batcher_with`` runs the batcher while the app runs.
A full queue answers 503 with ``Retry-After`` before the model sees the request (parse and lookup
take microseconds; ``course_lib.serving.service.error_answer`` maps every failure); the server keeps
serving. In front of it, the server runtime's door bounds the requests in flight
(``max_in_flight``) and drops requests whose client left or whose deadline passed.

``run_server`` (one) and ``run_servers`` (several, started together) run such servers in
subprocesses on 127.0.0.1 (``course_lib.serving.server._runners.run_processes``: bounded lifetime,
read timeouts, a connection limit, exit with the parent), so a load generator in the calling process
does not share their GIL; ``python -m course_lib.serving.batching.predict`` does the same from a
shell. Every default lives in ``course_lib.serving.server._config.DEFAULTS``.

A client that disconnects while its request waits in the batcher's queue cancels it, and so does the
request's deadline (the runtime's ``x-request-timeout-ms`` header): its queue slot is freed at once
and it never reaches the model (``stats.cancelled_by_caller``; the client gets 504 at the deadline).

References
----------
NVIDIA Triton Inference Server documentation, "Dynamic Batcher". FastAPI documentation, "Lifespan
Events". Source lesson 004 ("Serving Models at Scale"): a FastAPI batching server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from course_lib.churn.data import FEATURE_COLUMNS
from course_lib.core.checks import one_of
from course_lib.core.vocabulary import SERVING_RUNTIMES
from course_lib.serving.batching.batcher import BatchedResult, DynamicBatcher
from course_lib.serving.feature_store import DEFAULT_N_CUSTOMERS, DEFAULT_SEED, build_feature_store
from course_lib.serving.server import (
    DEFAULTS,
    ServerURLs,
    add_arguments,
    from_arguments,
    port_number,
    run_processes,
    serve_app,
    split_config,
    to_argv,
)
from course_lib.serving.service import (
    AsyncForward,
    ChurnService,
    Record,
    Runtime,
    check_still_wanted,
    churn_service,
    create_app,
)

__all__ = [
    "batched_forward",
    "create_batched_app",
    "customer_key",
    "run_batcher_with",
    "run_server",
    "run_servers",
]


def customer_key(record: Mapping[str, Any]) -> Hashable:
    """De-duplication key: the 19 feature values in column order (equal keys share one model row)."""
    return tuple(record[name] for name in FEATURE_COLUMNS)


def batched_forward(
    batcher: DynamicBatcher[Record, Any], served: list[BatchedResult] | None = None
) -> AsyncForward:
    """The forward stage that scores the request's one record through ``batcher``.

    Right before the record joins the queue it checks that the request is still wanted
    (``check_still_wanted``); it starts the batcher if nothing has yet (``start`` is idempotent; a
    server run without lifespan events needs it).

    Parameters
    ----------
    batcher : DynamicBatcher
        Scores batches of records (its score function: records -> probabilities).
    served : list, optional
        Each ``BatchedResult`` is appended to it (how the request was batched, for the answer).

    Returns
    -------
    async callable, records -> [probability]
        For ``ChurnService.handle_async(body, forward=...)``. It raises what ``submit`` raises
        (``QueueFullError``, ``BatcherClosedError``, ``BatchScoringError``; ``error_answer`` maps
        them) and ``ClientGoneError`` / ``DeadlineExceededError`` from the check.
    """

    async def forward(records: list[Record]) -> list[Any]:
        check_still_wanted()  # the client has not left and the deadline has not passed
        await batcher.start()
        result = await batcher.submit(records[0])
        if served is not None:
            served.append(result)
        return [result.value]

    return forward


def _with_batch_fields(answer: bytes, result: BatchedResult) -> bytes:
    """The Lesson 2 answer plus how the request was batched (``/predict``'s fields)."""
    fields = json.loads(answer)
    fields.update(
        queue_wait_ms=round(result.queue_wait_ms, 4),
        service_ms=round(result.service_ms, 4),
        batch_size=result.batch_size,
        batch_requests=result.batch_requests,
        deduplicated=result.deduplicated,
        trigger=result.trigger,
    )
    return json.dumps(fields).encode()


def create_batched_app(
    service: ChurnService,
    *,
    max_batch_size: int = DEFAULTS.max_batch_size,
    max_queue_delay_ms: float = DEFAULTS.max_queue_delay_ms,
    preferred_batch_sizes: Sequence[int] = DEFAULTS.preferred_batch_sizes,
    max_queue_size: int = DEFAULTS.max_queue_size,
    dedup: bool = DEFAULTS.dedup,
    instances: int = DEFAULTS.instances,
    run_in_thread: bool = DEFAULTS.run_in_thread,
    body_timeout_s: float = DEFAULTS.body_timeout_s,
) -> FastAPI:
    """The Lesson 2 app plus ``POST /predict``, whose model-forward stage goes through a dynamic batcher.

    Parameters
    ----------
    service : course_lib.serving.service.ChurnService
        Its ``forward`` (records -> probabilities) is the batcher's batch score function.
    max_batch_size, max_queue_delay_ms, preferred_batch_sizes, max_queue_size, instances, run_in_thread
        Knobs of ``course_lib.serving.batching.batcher.DynamicBatcher`` (defaults:
        ``course_lib.serving.server._config.DEFAULTS``).
        ``max_batch_size=1`` turns batching off: one model call per request, through the same queue.
    dedup : bool
        Score identical customers waiting in the queue together once.
    body_timeout_s : float
        Longest wait for a request body (408 after it).

    Returns
    -------
    FastAPI app with the Lesson 2 routes (``POST /score``, ``GET /healthz``, ``GET /stats``) and
    ``POST /predict``: 200 with the Lesson 2 answer plus ``queue_wait_ms``, ``service_ms``,
    ``batch_size``, ``batch_requests``, ``deduplicated``, ``trigger``; the Lesson 2 4xx for a bad
    body, unknown customer or features outside the schema (400, 404, 408, 413, 415, 422); 503 +
    ``Retry-After: 1`` when the queue is full or the server is stopping; 500 with a short reason if
    the model call failed (the error itself goes to the server log). A client that disconnects
    cancels its request (freed from the queue, counted in ``stats.cancelled_by_caller`` and in
    ``GET /stats``'s ``client_disconnects``). ``GET /batcher`` reports the knobs and the counters.

    Raises
    ------
    ValueError
        A batcher knob out of range (raised here, before serving starts).
    """
    batcher: DynamicBatcher[Record, Any] = DynamicBatcher(
        service.forward,
        max_batch_size=max_batch_size,
        max_queue_delay_ms=max_queue_delay_ms,
        preferred_batch_sizes=preferred_batch_sizes,
        max_queue_size=max_queue_size,
        dedup_key=customer_key if dedup else None,
        instances=instances,
        run_in_thread=run_in_thread,
    )
    app = create_app(service, body_timeout_s=body_timeout_s)
    app.state.batcher = batcher
    run_batcher_with(app, batcher)
    _add_batched_routes(app, service, batcher, dedup=dedup)
    return app


def run_batcher_with(
    app: FastAPI, batcher: DynamicBatcher, *, on_stop: Callable[[], None] | None = None
) -> None:
    """Run ``batcher`` while ``app`` runs: started after the app's own start-up, stopped before its
    shut-down (queued requests are refused with ``BatcherClosedError``, then ``on_stop()`` runs).

    Wraps ``app.router.lifespan_context``; a server run without lifespan events starts the batcher on
    the first request instead (``batched_forward``).
    """
    inner_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: FastAPI) -> AsyncIterator[Any]:
        async with inner_lifespan(app_) as state:
            await batcher.start()
            try:
                yield state
            finally:
                await batcher.stop(drain=False)
                if on_stop is not None:
                    on_stop()

    app.router.lifespan_context = lifespan


def _add_batched_routes(app: FastAPI, service: ChurnService, batcher: DynamicBatcher, *, dedup: bool) -> None:
    """``POST /predict`` (through ``batcher``, sharing the app's request runner) and ``GET /batcher``."""
    knobs = {
        "max_batch_size": batcher.max_batch_size,
        "max_queue_delay_ms": batcher.max_queue_delay_ms,
        "preferred_batch_sizes": list(batcher.preferred_batch_sizes),
        "max_queue_size": batcher.max_queue_size,
        "dedup": dedup,
        "instances": batcher.instances,
        "run_in_thread": batcher.run_in_thread,
    }

    async def predict_body(body: bytes) -> Response:
        served: list[BatchedResult] = []
        out = await service.handle_async(body, forward=batched_forward(batcher, served))
        if out.status_code != 200 or not served:
            return Response(out.body, status_code=out.status_code, headers=out.headers)
        return Response(_with_batch_fields(out.body, served[0]), status_code=200, headers=out.headers)

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        return await app.state.handle(request, run=predict_body)

    @app.get("/batcher")
    async def batcher_state() -> dict[str, Any]:
        return {**knobs, "queue_len": batcher.queue_len, "stats": batcher.stats.as_dict()}


def _server_command(
    runtime: Runtime = "xgboost",
    *,
    lookup_mode: str = "cached",
    n_customers: int = DEFAULT_N_CUSTOMERS,
    seed: int = DEFAULT_SEED,
    store_folder: str | Path | None = None,
    **config: Any,
) -> list[str]:
    one_of("runtime", runtime, SERVING_RUNTIMES)
    server_config, unknown = split_config(config)
    if unknown:
        raise TypeError(f"unknown server options {sorted(unknown)}")
    store = build_feature_store(n_customers, seed, folder=store_folder)  # once, here, not in every server
    return [
        sys.executable,
        "-m",
        "course_lib.serving.batching.predict",
        f"--runtime={runtime}",
        f"--lookup={lookup_mode}",
        f"--n-customers={n_customers}",
        f"--seed={seed}",
        f"--store-folder={store.path.parent}",
        *to_argv(server_config),
    ]


@contextlib.contextmanager
def run_servers(
    configs: Mapping[Hashable, Mapping[str, Any]], *, startup_timeout_s: float = 90.0
) -> Iterator[ServerURLs]:
    """Start several batched churn servers in subprocesses on 127.0.0.1 at once; yield their base URLs.

    Parameters
    ----------
    configs : mapping name -> keyword arguments
        Each server's ``runtime``, ``lookup_mode``, ``n_customers``, ``seed``, ``store_folder`` and any
        field of ``course_lib.serving.server._config.ServerConfig`` (``max_batch_size``, ``lifetime_s``, ...;
        unset ones take ``DEFAULTS``). A server exits by itself after ``lifetime_s``, and when this
        process dies.
    startup_timeout_s : float
        How long to wait for every server to answer ``/healthz``.

    Yields
    ------
    dict name -> base URL such as ``http://127.0.0.1:8123``. Every server is stopped (SIGTERM, then
    SIGKILL) when the ``with`` block ends.

    Raises
    ------
    RuntimeError
        If a server exits or does not answer ``/healthz`` in time; the message holds the end of its log.
    ValueError
        For an unknown runtime or an out-of-range limit (before anything starts).
    TypeError
        For an unknown option.
    """
    commands = {name: _server_command(**kwargs) for name, kwargs in configs.items()}
    with run_processes(commands, startup_timeout_s=startup_timeout_s) as urls:
        yield urls


@contextlib.contextmanager
def run_server(
    runtime: Runtime = "xgboost", *, startup_timeout_s: float = 90.0, **kwargs: Any
) -> Iterator[str]:
    """Start one batched churn server in a subprocess on 127.0.0.1 and yield its base URL.

    Same as ``run_servers({"server": {"runtime": runtime, **kwargs}})``; see there.
    """
    with run_servers({"server": {"runtime": runtime, **kwargs}}, startup_timeout_s=startup_timeout_s) as urls:
        yield urls["server"]


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: serve the batched churn app on 127.0.0.1 (``--port``) for a bounded time."""
    parser = argparse.ArgumentParser(description="Churn scoring with dynamic batching on 127.0.0.1")
    parser.add_argument("--runtime", choices=SERVING_RUNTIMES, default="xgboost")
    parser.add_argument("--port", type=port_number, default=8000)
    parser.add_argument("--lookup", default="cached", help="indexed, unindexed or cached")
    parser.add_argument("--n-customers", type=int, default=DEFAULT_N_CUSTOMERS)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--store-folder", default=None)
    add_arguments(parser)
    args = parser.parse_args(argv)
    config = from_arguments(args)
    service = churn_service(
        args.runtime,
        lookup_mode=args.lookup,
        n_customers=args.n_customers,
        seed=args.seed,
        store_folder=args.store_folder,
    )
    app = create_batched_app(
        service,
        **config.batcher_kwargs(),
        dedup=config.dedup,
        body_timeout_s=config.body_timeout_s,
    )
    serve_app(app, port=args.port, config=config)


if __name__ == "__main__":
    main()
