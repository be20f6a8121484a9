"""A churn replica in its own process, with injectable stalls, for Lesson 7's hedging and timeouts.

* ``_replica``: ``prepare_replica_files``, ``start_replica``, the process entry point
  (``python -m course_lib.serving.replica``);
* ``_middleware``: ``ReplicaMiddleware`` and ``ReplicaConfig`` (the seeded stall schedule).
"""

from __future__ import annotations

from course_lib.serving.replica._middleware import (
    ReplicaConfig,
    ReplicaMiddleware,
    is_slow,
)
from course_lib.serving.replica._replica import (
    ReplicaFiles,
    ReplicaProcess,
    main,
    prepare_replica_files,
    start_replica,
)

__all__ = [
    "ReplicaConfig",
    "ReplicaFiles",
    "ReplicaMiddleware",
    "ReplicaProcess",
    "is_slow",
    "main",
    "prepare_replica_files",
    "start_replica",
]
