"""The churn scoring pipeline with a prediction cache in front: a hit skips feature lookup and model.

``CachedChurnService`` wraps a Lesson 2 ``ChurnService`` (its public stages ``parse``, ``lookup``,
``forward``, ``format``) and a ``course_lib.prediction_cache.PredictionCache`` (in process or Redis).
A request is timed stage by stage, as in Lesson 2:

* hit:  ``parse`` -> ``cache_get`` -> ``format``
* miss: ``parse`` -> ``cache_get`` -> ``lookup`` -> ``forward`` -> ``cache_set`` -> ``format``

The cache key is ``(model_version, customer_id, feature_snapshot)``: a model with another version
never reads the old model's entries, and a refreshed feature store (another snapshot) never reads
scores computed from the old features. The answer is the Lesson 2 answer plus ``"cache": "hit"`` or
``"miss"``. It is a ``ChurnService`` (only ``handle_async`` differs), so ``handle``, ``timed_score``
and ``course_lib.service.create_app`` work with it unchanged.

``measure_dedup`` runs Lesson 3's batcher (``course_lib.batcher.DynamicBatcher`` with its
de-duplication key) under open-loop traffic, to compare de-duplication with caching on the same
requests.

References
----------
Source lesson 000, "Prediction caching with time-to-live" (key ``hash(customer_id, model_version)``).
Source lesson 004, "Caching and Request Deduplication".
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from course_lib.percentiles import percentile
from course_lib.prediction_cache import PredictionCache, PredictionKey
from course_lib.profiling import END_TO_END, LatencyBudget, RequestProfile
from course_lib.service import ChurnService, RequestError, ServiceResponse

__all__ = ["CACHED_STAGES", "CachedChurnService", "hit_miss_summary", "measure_dedup", "store_snapshot"]

#: Stages of a cached request, in order (a hit runs parse, cache_get and format only).
CACHED_STAGES: tuple[str, ...] = ("parse", "cache_get", "lookup", "forward", "cache_set", "format")

AsyncForward = Callable[[list[dict[str, object]]], Awaitable[Any]]


def store_snapshot(store: Any) -> str:
    """A feature-snapshot version for a ``FeatureStore``: its file name and modification time (ns).

    Rebuilding or refreshing the store's file changes it, so cached scores computed from the old
    features stop matching.
    """
    path = store.path
    return f"{path.name}@{path.stat().st_mtime_ns}"


def _with_cache_field(answer: bytes, outcome: str) -> bytes:
    """The service's JSON answer with ``"cache": outcome`` added (appended in place when it ends in ``}``)."""
    body = answer.rstrip()
    if body.endswith(b"}") and body != b"{}":
        return body[:-1] + b', "cache": "' + outcome.encode() + b'"}'
    return json.dumps({**json.loads(answer), "cache": outcome}).encode()


class CachedChurnService(ChurnService):
    """A ``ChurnService`` behind a prediction cache keyed by model version and feature snapshot.

    Parameters
    ----------
    service : course_lib.service.ChurnService
        The pipeline that scores a miss; its ``model_version`` is part of every key.
    cache : PredictionCache
        ``InProcessPredictionCache`` or ``RedisPredictionCache``.
    feature_snapshot : str
        Version of the features the service reads (``store_snapshot(store)``).
    key_model_version : bool
        True (always, in real code). False builds keys *without* the model version: only for the
        lesson's demonstration of the stale scores such a key serves after a model change.

    Raises
    ------
    TypeError
        If ``cache`` is not a ``PredictionCache`` or ``service`` is not a ``ChurnService``.

    Notes
    -----
    A subclass of ``ChurnService`` that overrides only ``handle_async``, so ``handle``,
    ``timed_score`` and ``create_app`` work unchanged; the stages run on the wrapped ``service``.
    ValueError
        If ``feature_snapshot`` is empty or contains ``"|"``.
    """

    def __init__(
        self,
        service: ChurnService,
        cache: PredictionCache,
        *,
        feature_snapshot: str,
        key_model_version: bool = True,
    ):
        if not isinstance(cache, PredictionCache):
            raise TypeError(f"cache must be a PredictionCache, got {type(cache).__name__}")
        if not isinstance(service, ChurnService):
            raise TypeError(f"service must be a ChurnService, got {type(service).__name__}")
        PredictionKey("v", "c", feature_snapshot)  # validates the snapshot string
        super().__init__(
            service.lookup_features,
            service.forward,
            model_version=service.model_version,
            lookup_mode=service.lookup_mode,
            runtime=service.runtime,
        )
        self.service = service
        self.cache = cache
        self.feature_snapshot = feature_snapshot
        self.key_model_version = bool(key_model_version)

    def key(self, customer_id: str) -> PredictionKey:
        """The cache key of one customer's score under the current model and snapshot."""
        version = self.model_version if self.key_model_version else "any-model"
        return PredictionKey(version, customer_id, self.feature_snapshot)

    async def handle_async(
        self, body: bytes, *, forward: AsyncForward | None = None, request_id: str = ""
    ) -> ServiceResponse:
        """Score one raw request body through the cache (overrides ``ChurnService.handle_async``).

        On a miss the model is ``forward`` when given (an async callable such as a batcher's
        submit), else the wrapped service's own forward stage.

        Returns
        -------
        ServiceResponse
            200 with the Lesson 2 answer plus ``"cache"``; the 4xx of the first stage that refused
            (never cached). The profile holds every stage that ran, in ms.
        """
        profile = RequestProfile(request_id)
        try:
            with profile.stage("parse"):
                request = self.service.parse(body)
            key = self.key(request.customer_id)
            with profile.stage("cache_get"):
                cached = self.cache.get(key)
            if cached is None:
                with profile.stage("lookup"):
                    record = self.service.lookup(request)
                with profile.stage("forward"):
                    scores = (
                        await forward([record]) if forward is not None else self.service.forward([record])
                    )
                    p = float(scores[0])
                with profile.stage("cache_set"):
                    self.cache.set(key, p)
            else:
                p = cached
            with profile.stage("format"):
                out = _with_cache_field(self.service.format(request, p), "miss" if cached is None else "hit")
        except RequestError as err:
            return ServiceResponse(err.status_code, err.body(), profile)
        return ServiceResponse(200, out, profile)

    def score(self, customer_id: str) -> dict[str, Any]:
        """Score one customer in process; the decoded answer (with ``"cache"``).

        Raises
        ------
        RequestError
            If the answer is not 200 (unknown customer, bad id).
        """
        answer = self.handle(json.dumps({"customer_id": customer_id}).encode(), request_id=customer_id)
        if answer.status_code == 200:
            return answer.json()
        raise RequestError(answer.status_code, "request_failed", answer.body.decode(errors="replace"))


def hit_miss_summary(budget: LatencyBudget, qs: Sequence[float] = (50, 99)) -> pd.DataFrame:
    """Per-stage latency percentiles of a cached run, hits and misses apart, in microseconds.

    A request is a hit when it has no ``lookup`` stage. Rows: the stages in request order (those
    present), then ``end_to_end``; columns ``"hit p50"``, ``"hit p99"``, ``"miss p50"``, ... (nearest
    rank); NaN where a stage never ran for that kind of request.

    Raises
    ------
    ValueError
        If the budget is empty.
    """
    frame = budget.to_frame()
    if frame.empty:
        raise ValueError("budget holds no requests")
    is_hit = frame["lookup"].isna() if "lookup" in frame else pd.Series(True, index=frame.index)
    stages = [c for c in frame.columns if c != "request_id"]
    table = {}
    for kind, mask in (("hit", is_hit), ("miss", ~is_hit)):
        for q in qs:
            table[f"{kind} p{q:g}"] = {
                stage: percentile(frame.loc[mask, stage].dropna(), q) * 1000.0
                if frame.loc[mask, stage].notna().any()
                else np.nan
                for stage in stages
            }
    out = pd.DataFrame(table)
    out.index.name = "stage (us)"
    return out.loc[[*(s for s in stages if s != END_TO_END), END_TO_END]]


async def measure_dedup(
    score_batch: Callable[[list[dict[str, object]]], Sequence[float]],
    records: Sequence[dict[str, object]],
    *,
    rate_rps: float,
    max_batch_size: int = 64,
    max_queue_delay_ms: float = 2.0,
    seed: int = 0,
    max_duration_s: float = 30.0,
) -> dict[str, Any]:
    """Send ``records`` (one request each, in order) at Poisson times through a de-duplicating batcher.

    Uses Lesson 3's ``DynamicBatcher`` with ``course_lib.batching_service.customer_key`` (equal
    feature values share one model row while they wait together in the queue) and the open-loop
    load generator ``course_lib.loadgen.run_open_loop``.

    Returns
    -------
    dict
        ``submitted``, ``completed``, ``deduplicated``, ``dedup_rate`` (deduplicated / submitted),
        ``batches``, ``items_scored``, ``errors`` (requests that failed), ``scheduled_s`` (the send
        times, seconds from the start, shape (n,)), ``p50_ms`` / ``p99_ms`` of the latency.

    Raises
    ------
    ValueError
        If ``records`` is empty or a batcher knob or the rate is out of range.
    """
    from course_lib.batcher import DynamicBatcher
    from course_lib.batching_service import customer_key
    from course_lib.loadgen import coroutine_target, run_open_loop
    from course_lib.percentiles import percentiles

    if len(records) == 0:
        raise ValueError("records must hold at least one request")
    async with DynamicBatcher(
        score_batch,
        max_batch_size=max_batch_size,
        max_queue_delay_ms=max_queue_delay_ms,
        max_queue_size=max(1024, 4 * max_batch_size),
        dedup_key=customer_key,
    ) as batcher:
        result = await run_open_loop(
            coroutine_target(batcher.submit, list(records)),
            rate_rps=rate_rps,
            n_requests=len(records),
            max_duration_s=max_duration_s,
            seed=seed,
        )
        stats = batcher.stats.as_dict()
    frame = result.requests
    ok = frame["latency_ms"].dropna().to_numpy()
    quantiles = percentiles(ok, (50, 99)) if len(ok) else {"p50": np.nan, "p99": np.nan}
    return {
        "submitted": stats["submitted"],
        "completed": stats["completed"],
        "deduplicated": stats["deduplicated"],
        "dedup_rate": stats["deduplicated"] / stats["submitted"] if stats["submitted"] else np.nan,
        "batches": stats["batches"],
        "items_scored": stats["items_scored"],
        "errors": int((~frame["ok"]).sum()),
        "scheduled_s": frame["scheduled_ms"].to_numpy() / 1000.0,
        "p50_ms": quantiles["p50"],
        "p99_ms": quantiles["p99"],
    }
