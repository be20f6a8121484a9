"""A real Prometheus server on 127.0.0.1, queried through its HTTP API and compared with the course's port.

Started with a generated scrape configuration, queried through its HTTP API, and compared with the
course's port of its arithmetic.

``prometheus_server`` (private ``_server``) starts and always stops the server; ``same_scrape_comparison``
(private ``_same_scrape``) puts its ``histogram_quantile`` of a ``rate`` beside the port's on the same
stored samples (Lesson 9).
"""

from course_lib.operate.prometheus_server._same_scrape import same_scrape_comparison
from course_lib.operate.prometheus_server._server import (
    SYSTEM_PATHS,
    PrometheusServer,
    PrometheusUnavailableError,
    find_prometheus,
    prometheus_server,
    prometheus_unavailable_reason,
    scrape_config,
)

__all__ = [
    "SYSTEM_PATHS",
    "PrometheusServer",
    "PrometheusUnavailableError",
    "find_prometheus",
    "prometheus_server",
    "prometheus_unavailable_reason",
    "same_scrape_comparison",
    "scrape_config",
]
