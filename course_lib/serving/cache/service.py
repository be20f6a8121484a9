"""The churn scoring pipeline with a prediction cache in front: a hit skips feature lookup and model.

``CachedChurnService`` wraps a Lesson 2 ``ChurnService`` (its public stages ``parse``, ``lookup``,
``forward``, ``format``) and a ``course_lib.serving.cache.stores.PredictionCache`` (in process or Redis).
A request is timed stage by stage, as in Lesson 2:

* hit:  ``parse`` -> ``cache_get`` -> ``format``
* miss: ``parse`` -> ``cache_get`` -> ``lookup`` -> ``forward`` -> ``cache_set`` -> ``format``

The cache fails open: a cache call that raises (Redis stalled past its timeout, dead, out of memory)
never fails the request. The request is scored by the model as if there were no cache and answered
with ``"cache": "bypass"``; a circuit breaker (``pybreaker``: open after ``breaker_fail_max``
failures in a row, one trial call after ``breaker_reset_s``) skips the cache entirely while it is
open, so a stalled Redis costs at most a few timeouts, not one per request. ``health()`` (the app's
``/healthz``) reports ``"degraded"`` while the breaker is not closed, and ``cache_counters`` counts
failures and bypassed requests. The stored features of a miss pass ``ChurnService.check_features``
before the model (422 for values outside the schema, never a 500).

The cache key is ``(model_version, customer_id, feature_snapshot)``: a model with another version
never reads the old model's entries. The snapshot is read again for every request (``StoreSnapshot``,
from ``store_snapshot(store)``): once the store's file is rewritten or replaced, requests use the
new snapshot's keys and never read scores computed from the old features (see ``StoreSnapshot`` for
exactly when a change is seen). The answer is the Lesson 2 answer plus ``"cache": "hit"`` or
``"miss"``. It is a ``ChurnService`` (only ``handle_async`` differs), so ``handle``, ``timed_score``
and ``course_lib.serving.service.create_app`` work with it unchanged.

``measure_dedup`` runs Lesson 3's batcher (``course_lib.serving.batching.batcher.DynamicBatcher`` with its
de-duplication key) under open-loop traffic, to compare de-duplication with caching on the same
requests.

References
----------
Source lesson 000, "Prediction caching with time-to-live" (key ``hash(customer_id, model_version)``).
Source lesson 004, "Caching and Request Deduplication". Nygard, M. (2018), "Release It!", 2nd ed.,
"Circuit Breaker"; pybreaker documentation.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pybreaker

from course_lib.core.checks import callable_, instance_of, integer, number, positive_number
from course_lib.core.percentiles import percentile
from course_lib.serving.cache.stores import PredictionCache, PredictionKey
from course_lib.serving.profiling import END_TO_END, LatencyBudget, RequestProfile
from course_lib.serving.service import AsyncForward, ChurnService, RequestError, ServiceResponse

__all__ = [
    "CACHED_STAGES",
    "CacheCounters",
    "CachedChurnService",
    "StoreSnapshot",
    "hit_miss_summary",
    "store_snapshot",
]

#: Stages of a cached request, in order (a hit runs parse, cache_get and format only).
CACHED_STAGES: tuple[str, ...] = ("parse", "cache_get", "lookup", "forward", "cache_set", "format")


class StoreSnapshot:
    """The feature-snapshot version of a store file, re-read at request time: ``snapshot() -> str``.

    The version is ``"<file name>@<inode>.<size>.<mtime_ns>"`` of the file at ``path``. Rewriting
    the file in place (it changes size or modification time) or replacing it (``os.replace``: a new
    inode) changes the version, so keys built with it after the change never match entries stored
    before it.

    Parameters
    ----------
    path : str or Path
        The store's file (``FeatureStore.path``).
    check_interval_ms : float >= 0
        0 (default): ``os.stat`` the file on every call (about a microsecond). Above 0: at most once
        per interval, so for up to ``check_interval_ms`` after a change the old version is still
        returned (and old entries can still be read).
    timer : callable () -> float
        Clock in seconds for the interval (default ``time.monotonic``).

    Raises
    ------
    ValueError
        If ``check_interval_ms`` is negative or not a number.
    FileNotFoundError
        If the file does not exist (now, or at a later check).

    Notes
    -----
    What holds, exactly: a request whose snapshot is read after the change (and after the interval)
    uses the new version. Two changes are told apart only if they differ in inode, size or
    modification time; the file system stamps times at its own resolution (often a few
    milliseconds), so two same-size in-place rewrites within one tick look alike. The version
    describes the file at ``path``; a reader that keeps an older file open (a
    ``course_lib.serving.feature_store._lookup.FeatureStore`` keeps reading the file it opened when
    that file is replaced) must be reopened with it, or its old features are cached under the new
    version.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        check_interval_ms: float = 0.0,
        timer: Callable[[], float] = time.monotonic,
    ):
        # An infinite interval is allowed: the version is read once and never again.
        check_interval_ms = number("check_interval_ms", check_interval_ms, min=0, finite=False)
        self.path = Path(path)
        self.check_interval_s = check_interval_ms / 1000.0
        self._timer = timer
        self._lock = threading.Lock()
        self._checked_at = timer()
        self._version = self._read()

    def _read(self) -> str:
        st = os.stat(self.path)
        return f"{self.path.name}@{st.st_ino}.{st.st_size}.{st.st_mtime_ns}"

    def __call__(self) -> str:
        """The current version (re-read if ``check_interval_ms`` has passed since the last read)."""
        if self.check_interval_s == 0:
            return self._read()
        with self._lock:
            now = self._timer()
            if now - self._checked_at >= self.check_interval_s:
                self._version, self._checked_at = self._read(), now
            return self._version

    def __str__(self) -> str:
        return self()

    def __repr__(self) -> str:
        return f"StoreSnapshot({str(self.path)!r}, check_interval_ms={self.check_interval_s * 1000:g})"


def store_snapshot(store: Any, *, check_interval_ms: float = 0.0) -> StoreSnapshot:
    """The feature-snapshot version of a ``FeatureStore`` (its ``.path``), followed at request time.

    Returns a ``StoreSnapshot``: call it for the current version string. Pass it to
    ``CachedChurnService(feature_snapshot=...)`` so every request keys by the snapshot of that moment.
    """
    return StoreSnapshot(store.path, check_interval_ms=check_interval_ms)


@dataclass
class CacheCounters:
    """How the cache served: calls that failed, requests answered without it, breaker openings."""

    errors: int = 0
    bypassed: int = 0
    breaker_opened: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Opened(pybreaker.CircuitBreakerListener):
    def __init__(self, counters: CacheCounters):
        self.counters = counters

    def state_change(self, cb: Any, old_state: Any, new_state: Any) -> None:
        if new_state is not None and new_state.name == pybreaker.STATE_OPEN:
            self.counters.breaker_opened += 1


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
    service : course_lib.serving.service.ChurnService
        The pipeline that scores a miss; its ``model_version`` is part of every key.
    cache : PredictionCache
        ``InProcessPredictionCache`` or ``RedisPredictionCache``.
    feature_snapshot : StoreSnapshot, callable () -> str, or str
        Version of the features the service reads, asked once per request: ``store_snapshot(store)``
        follows the store's file. A plain ``str`` is a fixed version: only for features that never
        change while this object serves.
    key_model_version : bool
        True (always, in real code). False builds keys *without* the model version: only for the
        lesson's demonstration of the stale scores such a key serves after a model change.
    breaker_fail_max : int >= 1
        Cache failures in a row that open the circuit breaker (default 3).
    breaker_reset_s : float > 0
        How long the breaker stays open before one trial call (default 1 s).

    Raises
    ------
    TypeError
        If ``cache`` is not a ``PredictionCache``, ``service`` is not a ``ChurnService`` or
        ``feature_snapshot`` is neither a str nor callable.
    ValueError
        If ``feature_snapshot`` is (or returns) an empty string or one containing ``"|"``.

    Notes
    -----
    A subclass of ``ChurnService`` that overrides only ``handle_async``, so ``handle``,
    ``timed_score`` and ``create_app`` work unchanged; the stages run on the wrapped ``service``.
    One request reads the snapshot once and uses that key for both its ``get`` and its ``set``.
    """

    def __init__(
        self,
        service: ChurnService,
        cache: PredictionCache,
        *,
        feature_snapshot: StoreSnapshot | Callable[[], str] | str,
        key_model_version: bool = True,
        breaker_fail_max: int = 3,
        breaker_reset_s: float = 1.0,
    ):
        instance_of("cache", cache, PredictionCache)
        instance_of("service", service, ChurnService)
        if isinstance(feature_snapshot, str):
            fixed = feature_snapshot
            self._snapshot: Callable[[], str] = lambda: fixed
        else:  # a StoreSnapshot (store_snapshot(store)) or another callable returning the version
            self._snapshot = callable_("feature_snapshot", feature_snapshot)
        PredictionKey("v", "c", self._snapshot())  # validates the snapshot string
        super().__init__(
            service.lookup_features,
            service.forward,
            model_version=service.model_version,
            lookup_mode=service.lookup_mode,
            runtime=service.runtime,
        )
        self.service = service
        self.cache = cache
        self.key_model_version = bool(key_model_version)
        self.cache_counters = CacheCounters()
        self._last_call_failed = False
        self.breaker = pybreaker.CircuitBreaker(
            fail_max=integer("breaker_fail_max", breaker_fail_max, min=1),
            reset_timeout=positive_number("breaker_reset_s", breaker_reset_s),
            listeners=[_Opened(self.cache_counters)],
            name="prediction-cache",
        )

    def health(self) -> dict[str, Any]:
        """``{"status": "ok" | "degraded", "cache": {...}}``: degraded while the cache's breaker is not
        closed or its last call failed (a Redis that fails fast, e.g. out of memory, never opens it)."""
        state = self.breaker.current_state
        cache: dict[str, Any] = {"breaker": state, **self.cache_counters.as_dict()}
        if hasattr(self.cache, "rejected"):  # values written by someone else (no valid HMAC)
            cache["rejected"] = self.cache.rejected
        ok = state == pybreaker.STATE_CLOSED and not self._last_call_failed
        return {"status": "ok" if ok else "degraded", "cache": cache}

    def _cache_call(self, call: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        """``(worked, result)`` of one cache call through the breaker; a failure is counted, never raised."""
        try:
            result = self.breaker.call(call, *args)
        except pybreaker.CircuitBreakerError as exc:  # open (the call was skipped) or just tripped
            self._last_call_failed = self._last_call_failed or exc.__context__ is not None
            self.cache_counters.errors += exc.__context__ is not None
            return False, None
        except Exception:  # a failing cache must not fail the request (fail open)
            self.cache_counters.errors += 1
            self._last_call_failed = True
            return False, None
        self._last_call_failed = False
        return True, result

    @property
    def feature_snapshot(self) -> str:
        """The feature-snapshot version now (read again on every access)."""
        return self._snapshot()

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
            200 with the Lesson 2 answer plus ``"cache"``: ``"hit"``, ``"miss"``, or ``"bypass"``
            when the cache failed or its breaker is open (scored by the model); the 4xx of the first
            stage that refused (never cached; 422 for stored features outside the schema). The
            profile holds every stage that ran, in ms.
        """
        profile = RequestProfile(request_id)
        try:
            with profile.stage("parse"):
                request = self.service.parse(body)
            key = self.key(request.customer_id)
            with profile.stage("cache_get"):
                worked, cached = self._cache_call(self.cache.get, key)
            if cached is None:
                with profile.stage("lookup"):
                    record = self.service.lookup(request)
                with profile.stage("forward"):
                    self.service.check_features(record)
                    scores = (
                        await forward([record]) if forward is not None else self.service.forward([record])
                    )
                    p = float(scores[0])
                if worked:
                    with profile.stage("cache_set"):
                        worked, _ = self._cache_call(self.cache.set, key, p)
            else:
                p = cached
            outcome = "hit" if cached is not None else "miss" if worked else "bypass"
            self.cache_counters.bypassed += outcome == "bypass"
            with profile.stage("format"):
                out = _with_cache_field(self.service.format(request, p), outcome)
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
