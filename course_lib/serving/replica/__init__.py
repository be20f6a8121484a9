"""A replica of the production churn service in its own process, with injectable stalls, for Lesson 7.

* ``_replica``: ``prepare_replica_files``, ``start_replica``, the process entry point
  (``python -m course_lib.serving.replica``), ``REPLICA_SERVER`` (its default runtime limits);
* ``_middleware``: ``ReplicaMiddleware``, ``ReplicaConfig`` and ``ReplicaState`` (the seeded stall
  schedule, changed at run time through ``PUT /faults``).
"""

from __future__ import annotations

from course_lib.serving.replica._middleware import (
    FAULT_FIELDS,
    ReplicaConfig,
    ReplicaMiddleware,
    ReplicaState,
    is_slow,
)
from course_lib.serving.replica._replica import (
    REPLICA_SERVER,
    ReplicaFiles,
    ReplicaProcess,
    main,
    prepare_replica_files,
    start_replica,
)

__all__ = [
    "FAULT_FIELDS",
    "REPLICA_SERVER",
    "ReplicaConfig",
    "ReplicaFiles",
    "ReplicaMiddleware",
    "ReplicaProcess",
    "ReplicaState",
    "is_slow",
    "main",
    "prepare_replica_files",
    "start_replica",
]
