"""Test helper: replica processes of the churn service started, readied and stopped together."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def running_replicas(files, configs, *, max_lifetime_s: float = 300):
    """Start one replica process per ``ReplicaConfig`` (None: no stalls), wait until all are ready, stop them."""
    # imported here, as conftest's fixtures do, so that collecting the tests loads no model stack
    from course_lib.core.waiting import wait_until
    from course_lib.serving.replica import ReplicaConfig, start_replica

    replicas = []
    try:
        for config in configs:
            replicas.append(
                start_replica(
                    files.onnx_path,
                    files.store_path,
                    files.model_version,
                    config=config or ReplicaConfig(),
                    max_lifetime_s=max_lifetime_s,
                )
            )
        wait_until(lambda: all(r.is_ready() for r in replicas), timeout_s=60, what="every replica ready")
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()
