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

References
----------
FastAPI documentation, "Lifespan Events"; Starlette documentation, "Middleware". prometheus_client
documentation ("Instrumenting", multiprocess caveats). W3C, "Server Timing".
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.middleware import Middleware

from course_lib.serving.batching.batcher import BatcherClosedError, DynamicBatcher, QueueFullError
from course_lib.serving.batching.predict import customer_key
from course_lib.serving.feature_store import DEFAULT_N_CUSTOMERS, customer_id
from course_lib.serving.production._config import OFF_LOOP_ABOVE_MS, PRODUCTION, ProductionConfig
from course_lib.serving.production._service import ProductionService, build_service, forward_cost_ms
from course_lib.serving.server import DEFAULTS, door_counters
from course_lib.serving.service import (
    AppCounters,
    ClientGoneError,
    DeadlineExceededError,
    Record,
    RequestError,
    ServiceResponse,
    cancel_on_disconnect,
    check_still_wanted,
    read_json_body,
    refuse,
)

#: The constant answer of ``POST /null``.
NULL_ANSWER = b'{"ok":true}'
#: Folder where each worker marks itself loaded (set by the supervisor); unset: ready once loaded.
READY_DIR_ENV = "COURSE_PRODUCTION_READY_DIR"
_log = logging.getLogger("course_lib.serving.production")
_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def worker_ready_path(folder: str | Path, pid: int) -> Path:
    """The file a worker process creates in ``folder`` once its app is built (model loaded)."""
    return Path(folder) / f"worker-{pid}.ready"


def _all_loaded(folder: str | None, n_workers: int) -> bool:
    return folder is None or len(list(Path(folder).glob("worker-*.ready"))) >= n_workers


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
        "batcher"), ``app.state.forward_cost_ms`` the median call measured at build time.
    """
    service = build_service(config) if service is None else service
    probe = service.lookup_features(customer_id(1, DEFAULT_N_CUSTOMERS))
    try:  # forward_cost_ms checks the record first: one outside the schema is never scored, not even timed
        cost_ms = forward_cost_ms(service, probe) if probe is not None else float("nan")
    except RequestError:
        cost_ms = float("nan")
    mode = config.forward
    if mode == "auto":
        mode = "loop" if cost_ms <= OFF_LOOP_ABOVE_MS else "thread"
    batcher: DynamicBatcher[Record, float] = DynamicBatcher(
        service.forward,
        max_batch_size=config.server.max_batch_size,
        max_queue_delay_ms=config.server.max_queue_delay_ms,
        max_queue_size=config.server.max_queue_size,
        dedup_key=customer_key,
        run_in_thread=True,
    )
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
    ready_dir, n_workers = os.environ.get(READY_DIR_ENV), config.n_workers

    @asynccontextmanager
    async def lifespan(app_: FastAPI):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop(drain=False)
            executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="churn scoring (production)",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
        middleware=list(middleware),
    )
    app.router.redirect_slashes = False  # a redirect would be built from the client's Host header
    app.state.service, app.state.config, app.state.batcher = service, config, batcher
    app.state.forward_mode, app.state.forward_cost_ms = mode, cost_ms
    app.state.counters = counters = AppCounters()
    registry = CollectorRegistry()
    requests_total = Counter(
        "churn_requests",
        "Requests answered, by endpoint and status",
        ["endpoint", "status"],
        registry=registry,
    )
    latency = Histogram(
        "churn_request_duration_seconds",
        "Time from the request's headers to its answer in this worker",
        ["endpoint"],
        buckets=_LATENCY_BUCKETS_S,
        registry=registry,
    )
    ready = [False]

    async def in_thread(records: list[dict[str, object]]) -> Any:
        check_still_wanted()
        return await asyncio.get_running_loop().run_in_executor(executor, service.forward, records)

    async def batched(records: list[dict[str, object]]) -> list[Any]:
        check_still_wanted()
        await batcher.start()  # idempotent; a server run without lifespan events starts it here
        return [(await batcher.submit(records[0])).value]

    async def through_batcher(body: bytes) -> tuple[ServiceResponse, dict[str, str]]:
        served: list[Any] = []

        async def forward(records: list[dict[str, object]]) -> list[Any]:
            check_still_wanted()
            await batcher.start()
            result = await batcher.submit(records[0])
            served.append(result)
            return [result.value]

        out = await service.handle_async(body, forward=forward)
        extra = {}
        if served:
            extra = {
                "x-batch-size": str(served[0].batch_size),
                "x-queue-wait-ms": f"{served[0].queue_wait_ms:.3f}",
            }
        return out, extra

    def answer(out: ServiceResponse, extra: dict[str, str] | None = None) -> Response:
        headers = out.headers if not extra else {**out.headers, **extra}
        return Response(out.body, status_code=out.status_code, headers=headers)

    async def run(
        request: Request,
        endpoint: str,
        work: Callable[[bytes], Awaitable[Response] | Response],
        *,
        cancellable: bool,
    ) -> Response:
        start = time.perf_counter()
        try:
            body = await read_json_body(request, body_timeout_s=body_timeout_s)
            if cancellable:
                response = await cancel_on_disconnect(request, work(body))  # type: ignore[arg-type]
            else:
                response = work(body)  # type: ignore[assignment]
        except ClientGoneError:
            counters.client_disconnects += 1
            response = Response(status_code=499)  # never delivered: the client is gone
        except DeadlineExceededError:
            counters.deadline_expired += 1
            response = refuse(
                RequestError(504, "deadline_exceeded", "the request's deadline passed before it was scored")
            )
        except RequestError as err:
            if err.status_code == 408:
                counters.body_timeouts += 1
            response = refuse(err, {"connection": "close"} if err.status_code in (408, 413, 415) else None)
        except (QueueFullError, BatcherClosedError) as exc:
            why = (
                "the batcher's queue is full" if isinstance(exc, QueueFullError) else "the server is stopping"
            )
            response = refuse(RequestError(503, "unavailable", why), {"retry-after": "1"})
        except Exception:  # a failing stage must not take the server down
            counters.internal_errors += 1
            _log.exception("unexpected error while answering %s", endpoint)
            response = refuse(
                RequestError(
                    500, "internal_error", "the service failed to answer; the error is in the server log"
                )
            )
        requests_total.labels(endpoint, str(response.status_code)).inc()
        latency.labels(endpoint).observe(time.perf_counter() - start)
        return response

    if mode == "loop":

        def score_work(body: bytes) -> Response:
            check_still_wanted()  # the whole request runs inline: the last chance to drop it
            return answer(service.handle(body))

    else:
        forward = in_thread if mode == "thread" else batched

        async def score_work(body: bytes) -> Response:  # type: ignore[misc]
            return answer(await service.handle_async(body, forward=forward))

    async def predict_work(body: bytes) -> Response:
        return answer(*(await through_batcher(body)))

    def null_work(body: bytes) -> Response:
        return Response(NULL_ANSWER, media_type="application/json")

    @app.post("/score")
    async def score(request: Request) -> Response:
        return await run(request, "/score", score_work, cancellable=mode != "loop")

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        return await run(request, "/predict", predict_work, cancellable=True)

    @app.post("/null")
    async def null(request: Request) -> Response:
        return await run(request, "/null", null_work, cancellable=False)

    @app.get("/healthz")
    async def healthz() -> Response:
        ready[0] = ready[0] or _all_loaded(ready_dir, n_workers)
        body = {
            "status": "ok" if ready[0] else "starting",
            "model_version": service.model_version,
            "worker_pid": os.getpid(),
        }
        return Response(
            orjson.dumps(body), status_code=200 if ready[0] else 503, media_type="application/json"
        )

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {
            **counters.as_dict(),
            "worker_pid": os.getpid(),
            "workers": n_workers,
            "forward": mode,
            "forward_cost_ms": cost_ms,
            "config": config.describe(),
            "batcher": batcher.stats.as_dict(),
            "outcomes": None if (outcomes := door_counters()) is None else outcomes.as_dict(),
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
