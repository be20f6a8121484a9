"""Layer 2, what answers a request: the service, profiling, features, servers, batching, caches, replicas.

The churn service and its stages, stage profiling, the feature store, the server runtime, online
(dynamic) batching, the prediction cache, replicas, hedging, fallbacks, the capstone's slow baseline, the
prototype server that load tests start from (Lesson 6), and the production service that assembles what
paid (Lesson 12).

Imports only from :mod:`course_lib.core` and :mod:`course_lib.churn`.
"""

__all__ = [
    "batching",
    "cache",
    "fallback",
    "feature_store",
    "hedging",
    "production",
    "profiling",
    "prototype",
    "replica",
    "server",
    "service",
    "slow_baseline",
]
