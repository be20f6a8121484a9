"""Layer 5, running the service in production: rollouts, drift, metrics, alert rules, HPA manifests, pools.

Canary and shadow rollouts, drift, the monitored service and its Prometheus metrics,
``histogram_quantile``, a real Prometheus server, alert rules and ``promtool``, HPA manifests, a model pool.

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
    "prometheus_server",
    "promtool",
]
