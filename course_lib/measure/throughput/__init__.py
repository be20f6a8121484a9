"""Model throughput at a p99 limit: batch latency per runtime and batch size, the recorded CPU measurement.

* ``_measure``: ``measure_batch_latency``, ``rps_at_p99_limit``, ``ThroughputRecord`` and the record's
  schema (``data/measurements/cpu_throughput.json``);
* ``_candidates``: ``churn_candidates``, the runtimes Lesson 5 and the benchmark compare.
"""

from __future__ import annotations

from course_lib.core.bench import (
    p99_median_of_rounds_us,
)
from course_lib.measure.throughput._candidates import (
    churn_candidates,
)
from course_lib.measure.throughput._measure import (
    MEASUREMENTS_DIR,
    SCHEMA,
    Candidate,
    ThroughputRecord,
    load_measurement,
    measure_batch_latency,
    onnx_node_placement,
    rps_at_p99_limit,
)

__all__ = [
    "MEASUREMENTS_DIR",
    "SCHEMA",
    "Candidate",
    "ThroughputRecord",
    "churn_candidates",
    "load_measurement",
    "measure_batch_latency",
    "onnx_node_placement",
    "p99_median_of_rounds_us",
    "rps_at_p99_limit",
]
