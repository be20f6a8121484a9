"""Layer 5, running the service in production: canary and shadow rollouts, drift, the monitored service and
its Prometheus metrics, ``histogram_quantile``, alert rules and ``promtool``, HPA manifests, a model
pool.

Imports only from the layers below.
"""

__all__ = [
    "alerting",
    "canary",
    "canary_day",
    "drift",
    "hpa_manifest",
    "http_metrics",
    "model_pool",
    "monitored_service",
    "prom_quantile",
    "promtool",
]
