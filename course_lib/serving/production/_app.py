"""The production churn app: ``/score``, ``/predict``, ``/null``, ``/healthz``, ``/stats``, ``/metrics``.

``create_production_app(config)`` serves ``build_service(config)``'s stages (strict JSON, the request
schema, the feature check and a ``Server-Timing`` header on every answer, as Lesson 2's app) with the
model call where ``config.forward`` puts it:

* ``"loop"``: called on the event loop; the whole request runs without a suspension point, so there is
  nothing for a disconnecting client to cancel (the answer is ready before the loop could notice);
* ``"thread"``: in one worker thread (``loop.run_in_executor``), the loop free for other requests;
* ``"batcher"``: through a ``DynamicBatcher`` (Lesson 3);
* ``"auto"``: ``"loop"`` if the median call costs at most ``OFF_LOOP_ABOVE_MS``, else ``"thread"`` (also when
  the probe customer is unknown or its stored record is outside the schema: nothing unchecked is scored)
  (timed when the app is built; ``/stats`` reports the cost and the choice).

In the last two a client that disconnects cancels its request (``GET /stats``: ``client_disconnects``).
Right before every model call the app checks that the request is still wanted
(``course_lib.serving.service.check_still_wanted``): a request whose client has gone, or whose
``x-request-timeout-ms`` deadline has passed (504, ``deadline_expired``), is never scored.
Trailing-slash redirects are off (a redirect would be built from the client's ``Host`` header), and
``GET /stats`` carries the runtime door's ``outcomes`` (what the clients saw).
``POST /predict`` always goes through the batcher (``x-batch-size`` and ``x-queue-wait-ms`` headers say
how it was served); a full queue answers 503 + ``Retry-After``. ``POST /null`` reads and checks the body
like ``/score`` and answers a constant ``{"ok": true}``: the same stack and handler with no service
work, the floor a load test compares the service with. ``GET /metrics`` is the Prometheus exposition
of this worker process (each worker counts its own requests; a scrape reaches one of them).
``GET /healthz`` answers 503 until every worker of the server has loaded the model (see
``course_lib.serving.production._workers``), then 200 with the model version and this worker's pid.

``middleware`` wraps the app in Starlette middleware (e.g. a replica's seeded stalls, Lesson 7).

Over its core, ``course_lib.serving.production.core.create_core_app`` (``/score`` and ``/healthz`` on one
``ChurnService``, the model call on the event loop; the same scores and refusals on the same requests,
``tests/test_production_core.py``), this app adds what a service under real traffic needs:

* **where the model call runs** (``forward``, timed at build time): a costly call off the event loop, so
  one slow call does not stall every other request;
* **cancellation and deadlines**: a request whose client left or whose ``x-request-timeout-ms`` passed
  is never scored (504), so abandoned work does not queue ahead of live requests;
* **batching and admission control**: ``/predict`` through a bounded ``DynamicBatcher`` (identical
  customers share a row), 503 + ``Retry-After`` when its queue is full, instead of an unbounded queue;
* **observability**: ``/stats`` (counters, the door's outcomes, the batcher), ``/metrics``
  (Prometheus), ``Server-Timing`` on every answer;
* **the floor**: ``/null``, the same stack with no service work, for the load test;
* **readiness across workers**: ``/healthz`` answers 503 until every worker has loaded the model, so a
  load test never starts on a half-started server; no trailing-slash redirects built from ``Host``.

References
----------
FastAPI documentation, "Lifespan Events"; Starlette documentation, "Middleware". prometheus_client
documentation ("Instrumenting", multiprocess caveats). W3C, "Server Timing".
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.middleware import Middleware

from course_lib.core.vocabulary import LATENCY_BUCKETS_S
from course_lib.serving.batching.batcher import BatchedResult, DynamicBatcher
from course_lib.serving.batching.predict import batched_forward, customer_key, run_batcher_with
from course_lib.serving.feature_store import DEFAULT_N_CUSTOMERS, customer_id
from course_lib.serving.production._config import OFF_LOOP_ABOVE_MS, PRODUCTION, ProductionConfig
from course_lib.serving.production._service import ProductionService, build_service, forward_cost_ms
from course_lib.serving.server import DEFAULTS, door_counters
from course_lib.serving.service import (
    AppCounters,
    Record,
    RequestError,
    ServiceResponse,
    Work,
    answer_request,
    check_still_wanted,
)

#: The constant answer of ``POST /null``.
NULL_ANSWER = b'{"ok":true}'
#: Folder where each worker marks itself loaded (set by the supervisor); unset: ready once loaded.
READY_DIR_ENV = "COURSE_PRODUCTION_READY_DIR"


def worker_ready_path(folder: str | Path, pid: int) -> Path:
    """The file a worker process creates in ``folder`` once its app is built (model loaded)."""
    return Path(folder) / f"worker-{pid}.ready"


def _all_loaded(folder: str | None, n_workers: int) -> bool:
    return folder is None or len(list(Path(folder).glob("worker-*.ready"))) >= n_workers


class _Metrics:
    """This worker's Prometheus metrics, in a registry of their own: requests by endpoint and status,
    and the time from the request's headers to its answer (``LATENCY_BUCKETS_S``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "churn_requests",
            "Requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "churn_request_duration_seconds",
            "Time from the request's headers to its answer in this worker",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )

    def observe(self, endpoint: str, status_code: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status_code)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def exposition(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


def _forward_mode(config: ProductionConfig, service: ProductionService) -> tuple[str, float]:
    """Where ``/score``'s model call runs, and the median call cost (ms) that ``"auto"`` decided on.

    The cost is NaN when the probe customer is unknown or its stored record is outside the schema
    (``forward_cost_ms`` checks the record first: nothing unchecked is scored, not even timed); NaN is
    never at most ``OFF_LOOP_ABOVE_MS``, so ``"auto"`` then chooses ``"thread"``.
    """
    probe = service.lookup_features(customer_id(1, DEFAULT_N_CUSTOMERS))
    try:
        cost_ms = forward_cost_ms(service, probe) if probe is not None else float("nan")
    except RequestError:
        cost_ms = float("nan")
    if config.forward != "auto":
        return config.forward, cost_ms
    return ("loop" if cost_ms <= OFF_LOOP_ABOVE_MS else "thread"), cost_ms


def _batcher(config: ProductionConfig, service: ProductionService) -> DynamicBatcher[Record, float]:
    """``/predict``'s batcher (and ``/score``'s with ``forward="batcher"``); identical customers waiting
    together share one model row."""
    return DynamicBatcher(
        service.forward,
        max_batch_size=config.server.max_batch_size,
        max_queue_delay_ms=config.server.max_queue_delay_ms,
        max_queue_size=config.server.max_queue_size,
        dedup_key=customer_key,
        run_in_thread=True,
    )


def _answer(out: ServiceResponse, extra: dict[str, str] | None = None) -> Response:
    headers = out.headers if not extra else {**out.headers, **extra}
    return Response(out.body, status_code=out.status_code, headers=headers)


def _score_work(
    service: ProductionService, mode: str, batcher: DynamicBatcher, executor: ThreadPoolExecutor
) -> Work:
    """``/score``'s work for ``mode``: the model call inline ("loop"), in the worker thread
    ("thread") or through the batcher ("batcher"); each checks the request is still wanted first."""
    if mode == "loop":

        async def inline(body: bytes) -> Response:  # no suspension point: runs to its end at once
            check_still_wanted()  # the whole request runs inline: the last chance to drop it
            return _answer(service.handle(body))

        return inline

    async def in_thread(records: list[Record]) -> Any:
        check_still_wanted()
        return await asyncio.get_running_loop().run_in_executor(executor, service.forward, records)

    forward = in_thread if mode == "thread" else batched_forward(batcher)

    async def off_loop(body: bytes) -> Response:
        return _answer(await service.handle_async(body, forward=forward))

    return off_loop


def _predict_work(service: ProductionService, batcher: DynamicBatcher) -> Work:
    """``/predict``'s work: through the batcher, with ``x-batch-size`` and ``x-queue-wait-ms`` headers."""

    async def predict(body: bytes) -> Response:
        served: list[BatchedResult] = []
        out = await service.handle_async(body, forward=batched_forward(batcher, served))
        if not served:
            return _answer(out)
        batch = {
            "x-batch-size": str(served[0].batch_size),
            "x-queue-wait-ms": f"{served[0].queue_wait_ms:.3f}",
        }
        return _answer(out, batch)

    return predict


async def _null_work(body: bytes) -> Response:
    """``/null``'s work: none (the floor a load test compares the service with)."""
    return Response(NULL_ANSWER, media_type="application/json")


def _add_scoring_routes(app: FastAPI, mode: str, *, body_timeout_s: float) -> None:
    """``POST /score``, ``/predict`` and ``/null``: each reads the body, does its work and answers
    (``answer_request``: one answer for every failure), counted and timed in ``app.state.metrics``."""
    state = app.state
    score_work = _score_work(state.service, mode, state.batcher, state.executor)
    predict_work = _predict_work(state.service, state.batcher)

    async def run(request: Request, endpoint: str, work: Work, *, cancellable: bool) -> Response:
        start = time.perf_counter()
        response = await answer_request(
            request, work, state.counters, body_timeout_s=body_timeout_s, cancellable=cancellable
        )
        state.metrics.observe(endpoint, response.status_code, time.perf_counter() - start)
        return response

    @app.post("/score")
    async def score(request: Request) -> Response:
        return await run(request, "/score", score_work, cancellable=mode != "loop")

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        return await run(request, "/predict", predict_work, cancellable=True)

    @app.post("/null")
    async def null(request: Request) -> Response:
        return await run(request, "/null", _null_work, cancellable=False)


def _add_status_routes(app: FastAPI) -> None:
    """``GET /healthz`` (503 until every worker has loaded the model), ``/stats`` and ``/metrics``."""
    state = app.state
    ready_dir, n_workers = os.environ.get(READY_DIR_ENV), state.config.n_workers
    ready = [False]

    @app.get("/healthz")
    async def healthz() -> Response:
        ready[0] = ready[0] or _all_loaded(ready_dir, n_workers)
        body = {
            "status": "ok" if ready[0] else "starting",
            "model_version": state.service.model_version,
            "worker_pid": os.getpid(),
        }
        return Response(
            orjson.dumps(body), status_code=200 if ready[0] else 503, media_type="application/json"
        )

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {
            **state.counters.as_dict(),
            "worker_pid": os.getpid(),
            "workers": n_workers,
            "forward": state.forward_mode,
            "forward_cost_ms": state.forward_cost_ms,
            "config": state.config.describe(),
            "batcher": state.batcher.stats.as_dict(),
            "outcomes": None if (outcomes := door_counters()) is None else outcomes.as_dict(),
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return state.metrics.exposition()


def create_production_app(
    config: ProductionConfig = PRODUCTION,
    *,
    service: ProductionService | None = None,
    middleware: Sequence[Middleware] = (),
    body_timeout_s: float = DEFAULTS.body_timeout_s,
) -> FastAPI:
    """The churn service app for ``config`` (see the module docstring for every route).

    Parameters
    ----------
    config : ProductionConfig
    service : ProductionService, optional
        Default ``build_service(config)`` (loads the model and opens the feature store).
    middleware : sequence of starlette.middleware.Middleware
        Wrapped around the app, outermost first.
    body_timeout_s : float > 0
        Longest wait for a request body (408 after it).

    Returns
    -------
    fastapi.FastAPI
        ``app.state.forward_mode`` is where ``/score``'s model call runs ("loop", "thread" or
        "batcher"), ``app.state.forward_cost_ms`` the median call measured at build time;
        ``app.state`` also holds the ``service``, ``config``, ``batcher``, ``counters`` and ``metrics``.
    """
    service = build_service(config) if service is None else service
    mode, cost_ms = _forward_mode(config, service)
    app = FastAPI(
        title="churn scoring (production)",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        middleware=list(middleware),
    )
    app.router.redirect_slashes = False  # a redirect would be built from the client's Host header
    state = app.state
    state.service, state.config, state.batcher = service, config, _batcher(config, service)
    state.forward_mode, state.forward_cost_ms = mode, cost_ms
    state.counters, state.metrics = AppCounters(), _Metrics()
    state.executor = executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
    run_batcher_with(app, state.batcher, on_stop=lambda: executor.shutdown(wait=False, cancel_futures=True))
    _add_scoring_routes(app, mode, body_timeout_s=body_timeout_s)
    _add_status_routes(app)
    return app
