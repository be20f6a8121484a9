"""The churn service with several model versions, a canary router, shadow scoring and Prometheus metrics.

``VersionedChurnService`` keeps one ``course_lib.serving.service.ChurnService`` pipeline per model version
(same feature lookup, different model), routes every request with a router (``canary.HashRouter``),
and answers with the version that actually scored it (``model_version`` in the JSON body). With a
``shadow`` version set, every answered request is also queued for the shadow model; a background
thread scores the queue in batches *after* the answer has left, so the shadow never sits on the
response path, and its outputs are kept for offline comparison (``shadow_log``). A full shadow
queue drops the shadow work (never the answer) and counts the drop.

``ServiceMetrics`` holds the ``prometheus_client`` metrics in their own registry:
``churn_requests_total{version,status}``, ``churn_request_latency_seconds{version}`` (buckets for the
20 ms p95 SLO), ``churn_requests_in_flight``, ``churn_batch_size{path}``, ``churn_score{version}``
(the prediction distribution), ``churn_shadow_requests_total{version,outcome}`` and
``churn_feature_cache_requests_total{result}`` (read from the ``CachedFeatureStore`` counters).
``create_monitored_app`` serves ``POST /score``, ``GET /metrics`` and ``GET /healthz``.

The service's own metrics count the requests it scored, timed from the handler's start. What the
clients saw is counted by the server runtime's door in front of the app, and ``/metrics`` exports it
too: ``churn_http_requests_total{outcome}`` (ok, shed, expired, client_errors, server_errors,
abandoned: an answer whose client had already gone is never counted as served) and
``churn_http_request_duration_seconds`` (the ``ok`` answers, from the door to the last byte written,
so time waiting behind other requests in the server is in it). A client that leaves before its
request is scored (an aborted upload, a timeout) is never scored and never logged as an error.

References
----------
prometheus_client documentation ("Instrumenting", "Custom Collectors", ``generate_latest``).
Prometheus documentation, "Metric and label naming" and "Histograms and summaries".
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily

from course_lib.core.checks import integer, non_empty
from course_lib.core.waiting import wait_until
from course_lib.operate.http_metrics import DoorCollector
from course_lib.operate.prom_quantile import SLO_BUCKETS_S
from course_lib.serving.server import DoorCounters, door_counters
from course_lib.serving.service import (
    AppCounters,
    ChurnService,
    Forward,
    RequestError,
    ServiceResponse,
    answer_request,
    check_still_wanted,
)

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "SCORE_BUCKETS",
    "ServiceMetrics",
    "ShadowScorer",
    "VersionedChurnService",
    "create_monitored_app",
]

BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
SCORE_BUCKETS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(1, 11))


class _CacheCollector:
    """Exports a ``CachedFeatureStore``'s hit and miss counts as one counter with a ``result`` label."""

    def __init__(self, cache: Any):
        self.cache = cache

    def collect(self) -> Any:
        family = CounterMetricFamily(
            "churn_feature_cache_requests",
            "Feature lookups answered by the cache (hit) or the store (miss)",
            labels=["result"],
        )
        family.add_metric(["hit"], float(self.cache.hits))
        family.add_metric(["miss"], float(self.cache.misses))
        yield family


class ServiceMetrics:
    """The service's Prometheus metrics, in a registry of their own.

    Parameters
    ----------
    latency_buckets_s : increasing bucket bounds in seconds (default ``SLO_BUCKETS_S``).
    cache : CachedFeatureStore, optional
        Its ``hits`` / ``misses`` become ``churn_feature_cache_requests_total{result}``.
    """

    def __init__(self, *, latency_buckets_s: tuple[float, ...] = SLO_BUCKETS_S, cache: Any = None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("churn_requests", "Answered requests", ["version", "status"], registry=r)
        self.latency = Histogram(
            "churn_request_latency_seconds",
            "Time to answer /score",
            ["version"],
            buckets=latency_buckets_s,
            registry=r,
        )
        self.in_flight = Gauge("churn_requests_in_flight", "Requests being handled now", registry=r)
        self.batch_size = Histogram(
            "churn_batch_size", "Customers per model call", ["path"], buckets=BATCH_SIZE_BUCKETS, registry=r
        )
        self.scores = Histogram(
            "churn_score", "Churn probability answered", ["version"], buckets=SCORE_BUCKETS, registry=r
        )
        self.shadow = Counter(
            "churn_shadow_requests", "Shadow work by outcome", ["version", "outcome"], registry=r
        )
        if cache is not None:
            r.register(_CacheCollector(cache))

        self._door: DoorCounters | None = None

    def watch_door(self, counters: DoorCounters | None) -> None:
        """Export the server door's ``counters`` too (once; ``GET /metrics`` calls it)."""
        if counters is not None and self._door is None:
            self._door = counters
            self.registry.register(DoorCollector(counters))

    def exposition(self) -> bytes:
        """The metrics page in the Prometheus text format (what ``GET /metrics`` returns)."""
        return generate_latest(self.registry)


class ShadowScorer:
    """Scores queued requests with a shadow model on a background thread, in batches, off the response path.

    Parameters
    ----------
    version : str
        Name of the shadow model. forward : records -> probabilities (shape (n,)).
    lookup : customer_id -> features (the service's lookup).
    max_queue : int
        Queue bound; beyond it a request's shadow work is dropped and counted (``dropped``).
    max_batch : int
        Most customers per shadow model call.
    flush_interval_s : float
        The worker wakes at least this often, or as soon as ``max_batch`` items wait.
    max_lifetime_s : float
        The thread exits by itself after this long (a forgotten scorer does not run forever).
    """

    def __init__(
        self,
        version: str,
        forward: Forward,
        lookup: Callable[[str], dict[str, object] | None],
        *,
        metrics: ServiceMetrics | None = None,
        max_queue: int = 4096,
        max_batch: int = 256,
        flush_interval_s: float = 0.25,
        max_lifetime_s: float = 600.0,
        log_size: int = 200_000,
    ):
        max_queue = integer("max_queue", max_queue, min=1)
        max_batch = integer("max_batch", max_batch, min=1)
        self.version, self.forward, self.lookup, self.metrics = version, forward, lookup, metrics
        self.max_batch, self.flush_interval_s = max_batch, flush_interval_s
        self._queue: queue.Queue[tuple[str, str, bytes]] = queue.Queue(maxsize=max_queue)
        self._wake, self._stop = threading.Event(), threading.Event()
        self.log: deque[dict[str, object]] = deque(maxlen=log_size)
        self.dropped = self.failed = 0
        self.busy_s = 0.0  # wall time the worker spent scoring (its cost in capacity, not in latency)
        self._pending = 0  # submitted and not yet scored (or failed)
        self._lock = threading.Lock()
        self._deadline = time.monotonic() + max_lifetime_s
        self._thread = threading.Thread(target=self._run, name=f"shadow-{version}", daemon=True)
        self._thread.start()

    def submit(self, customer_id: str, primary_version: str, primary_answer: bytes) -> bool:
        """Queue one answered request (its JSON answer, decoded later by the worker, off the response
        path) for shadow scoring; False (and counted as dropped) if the queue is full."""
        try:
            with self._lock:
                self._queue.put_nowait((customer_id, primary_version, primary_answer))
                self._pending += 1
        except queue.Full:
            self.dropped += 1
            if self.metrics:
                self.metrics.shadow.labels(self.version, "dropped").inc()
            return False
        if self._queue.qsize() >= self.max_batch:
            self._wake.set()
        return True

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        while True:
            items: list[tuple[str, str, bytes]] = []
            while len(items) < self.max_batch:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if not items:
                return
            started = time.perf_counter()
            try:  # an unknown customer's None record makes forward raise: counted as failed below
                scores = self.forward(cast(list[dict[str, object]], [self.lookup(c) for c, _, _ in items]))
            except Exception:  # a failing shadow model must never affect the service
                self.failed += len(items)
                if self.metrics:
                    self.metrics.shadow.labels(self.version, "failed").inc(len(items))
                with self._lock:
                    self._pending -= len(items)
                continue
            for (cid, primary, p), s in zip(items, scores, strict=True):
                self.log.append(
                    {
                        "customer_id": cid,
                        "primary_version": primary,
                        "primary_score": float(json.loads(p)["churn_probability"]),
                        "shadow_score": float(s),
                    }
                )
            if self.metrics:
                self.metrics.shadow.labels(self.version, "scored").inc(len(items))
                self.metrics.batch_size.labels("shadow").observe(len(items))
            self.busy_s += time.perf_counter() - started
            with self._lock:
                self._pending -= len(items)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until everything queued so far is scored (for the offline comparison).

        Raises
        ------
        TimeoutError
            If the queue is not empty after ``timeout_s``.
        """
        self._wake.set()
        wait_until(lambda: self._pending == 0, timeout_s=timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Wake the worker to score what is queued, then stop it; anything it could not take is counted
        as dropped."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self.dropped += self._queue.qsize()


class VersionedChurnService:
    """Several model versions behind one router, with optional metrics and shadow scoring.

    Parameters
    ----------
    lookup : customer_id -> feature dict or None (``feature_store.make_lookup``).
    forwards : mapping of version name -> forward (``service.onnx_forward(scorer)``).
    router : object with ``version_for(customer_id) -> version`` (``canary.HashRouter``).
    metrics : ServiceMetrics, optional
        None serves without instrumentation (for measuring what instrumentation costs).
    shadow : ShadowScorer, optional

    Raises
    ------
    ValueError
        If ``forwards`` is empty.
    """

    def __init__(
        self,
        lookup: Callable[[str], dict[str, object] | None],
        forwards: Mapping[str, Forward],
        router: Any,
        *,
        metrics: ServiceMetrics | None = None,
        shadow: ShadowScorer | None = None,
        lookup_mode: str = "",
    ):
        non_empty("forwards", forwards)
        self.metrics, self.router, self.shadow = metrics, router, shadow
        self.services = {
            v: ChurnService(
                lookup, self._counted(f), model_version=v, lookup_mode=lookup_mode, runtime="onnx"
            )
            for v, f in forwards.items()
        }
        self._front = next(iter(self.services.values()))

    def _counted(self, forward: Forward) -> Forward:
        if self.metrics is None:
            return forward
        observe = self.metrics.batch_size.labels("primary").observe

        def counted(records: list[dict[str, object]]) -> np.ndarray:
            observe(len(records))
            return forward(records)

        return counted

    def handle(self, body: bytes) -> tuple[str, ServiceResponse]:
        """Route, score and instrument one raw request body.

        Returns
        -------
        (version, ServiceResponse)
            ``version`` is the model that answered, or ``"none"`` when the request was refused
            before routing (bad JSON or schema); the body is parsed once to route and once by that
            version's pipeline (microseconds).
        """
        m = self.metrics
        version, result = "none", ServiceResponse(500, b"")
        start = time.perf_counter()
        if m:
            m.in_flight.inc()
        try:
            try:
                customer_id = self._front.parse(body).customer_id
                version = self.router.version_for(customer_id)
                result = self.services[version].handle(body)
            except RequestError as err:
                version, result = "none", ServiceResponse(err.status_code, err.body())
            if result.status_code == 200:
                if m:
                    m.scores.labels(version).observe(json.loads(result.body)["churn_probability"])
                if self.shadow is not None and version != self.shadow.version:
                    self.shadow.submit(customer_id, version, result.body)
            return version, result
        finally:
            if m:
                m.in_flight.dec()
                m.requests.labels(version, str(result.status_code)).inc()
                m.latency.labels(version).observe(time.perf_counter() - start)


def create_monitored_app(service: VersionedChurnService) -> FastAPI:
    """FastAPI app: ``POST /score`` (routed, instrumented), ``GET /metrics``, ``GET /healthz``.

    Bad requests get the 4xx of ``course_lib.serving.service`` (they are counted with ``version="none"``);
    every other failure is answered as in every course app (``course_lib.serving.service.error_answer``:
    an unexpected exception is a 500 whose exception goes to the server log, and the server keeps
    serving; ``app.state.counters`` counts it). A client gone before its request is scored is never
    scored (499, counted by the door as abandoned). No redirects (``/score/`` is a 404).
    """
    app = FastAPI(title="churn scoring (versions + metrics)", docs_url=None, redoc_url=None, openapi_url=None)
    app.router.redirect_slashes = False  # a redirect would be built from the client's Host header

    app.state.counters = counters = AppCounters()

    async def score_body(body: bytes) -> Response:  # no suspension point: runs inline, to its end
        check_still_wanted()
        _, result = service.handle(body)
        return Response(result.body, status_code=result.status_code, headers=result.headers)

    @app.post("/score")
    async def score(request: Request) -> Response:
        return await answer_request(request, score_body, counters, cancellable=False)

    @app.get("/metrics")
    async def metrics() -> Response:
        if service.metrics is None:
            return Response(b"metrics are off for this service\n", status_code=404, media_type="text/plain")
        service.metrics.watch_door(door_counters())
        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {
            "status": "ok",
            "versions": sorted(service.services),
            "canary_percent": getattr(service.router, "percent", None),
        }

    return app
