"""Replica processes: readiness after warm-up, seeded stalls, bounded lifetime, exit with the parent."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import httpx
import pytest

from course_lib.core.waiting import wait_until
from course_lib.serving.replica import ReplicaConfig, is_slow, start_replica


def test_stall_choice_is_seeded_and_has_the_asked_fraction():
    ids = [str(i) for i in range(20_000)]
    picks = [is_slow(i, seed=3, slow_fraction=0.02) for i in ids]
    assert picks == [is_slow(i, seed=3, slow_fraction=0.02) for i in ids]
    assert picks != [is_slow(i, seed=4, slow_fraction=0.02) for i in ids]
    assert abs(sum(picks) / len(ids) - 0.02) < 0.004  # binomial sd is 0.001
    assert not any(is_slow(i, seed=3, slow_fraction=0.0) for i in ids)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slow_fraction": 1.5}, "slow_fraction"),
        ({"slow_ms": -1}, "slow_ms"),
        ({"warmup_requests": -1}, "warmup"),
    ],
)
def test_bad_replica_config_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReplicaConfig(**kwargs)


def test_replica_is_not_ready_before_its_warm_up_finished(replica_files):
    n = 300
    replica = start_replica(
        replica_files.onnx_path,
        replica_files.store_path,
        replica_files.model_version,
        config=ReplicaConfig(warmup_requests=n),
        max_lifetime_s=120,
    )
    seen = []
    try:
        with httpx.Client(base_url=replica.url, timeout=10.0) as client:

            def poll():
                try:
                    response = client.get("/readyz")
                except httpx.TransportError:
                    return False
                stats = client.get("/stats").json()
                seen.append((response.status_code, response.json()["warmup_done"], stats["warmup_requests"]))
                return response.status_code == 200

            wait_until(poll, timeout_s=90, interval_s=0.002, what="readiness")
            assert client.get("/healthz").status_code == 200
    finally:
        replica.stop()
    assert seen[0][0] == 503, "the first readiness probe came after the warm-up: raise n"
    for status, done, served in seen:
        if status == 200:  # ready only once every warm-up request was served
            assert done == n and served == n
        else:  # not ready while it runs, nor in the instant after its last request (or its GC freeze)
            assert done <= n
    assert seen[-1][0] == 200 and any(done < n for _, done, _ in seen)


def test_replica_stops_by_itself_after_its_lifetime(replica_files):
    replica = start_replica(
        replica_files.onnx_path, replica_files.store_path, replica_files.model_version, max_lifetime_s=2
    )
    try:
        wait_until(lambda: replica.process.poll() is not None, timeout_s=60, what="the replica to exit")
        assert "lifetime of 2 s is over" in replica.log_tail()
    finally:
        replica.stop()


def test_replica_exits_when_its_parent_dies(replica_files, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, time
        from course_lib.serving.replica import start_replica
        r = start_replica({str(replica_files.onnx_path)!r}, {str(replica_files.store_path)!r},
                          {replica_files.model_version!r}, max_lifetime_s=120)
        print(r.process.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        child_pid = int(parent.stdout.readline().decode())
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()

    def gone():
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return True
        # a zombie is gone too (its parent died, init reaps it)
        with open(f"/proc/{child_pid}/stat") as fh:
            return fh.read().split(") ")[1].startswith("Z")

    wait_until(gone, timeout_s=30, what=f"replica {child_pid} to exit after its parent was killed")


def test_start_replica_refuses_missing_files(tmp_path, replica_files):
    with pytest.raises(FileNotFoundError, match="onnx_path"):
        start_replica(tmp_path / "nope.onnx", replica_files.store_path, "v")


def test_replica_serves_the_production_app_and_its_stalls_change_at_run_time(replica_files, ids):
    replica = start_replica(
        replica_files.onnx_path, replica_files.store_path, replica_files.model_version, max_lifetime_s=120
    )
    try:
        wait_until(replica.is_ready, timeout_s=60, what="the replica to be ready")
        stats = replica.stats()
        # the production levers with one worker, and the replica's own counters beside them
        assert stats["workers"] == 1 and stats["config"].startswith("onnxruntime, forward auto, orjson")
        assert "httptools + uvloop" in stats["config"] and stats["forward"] in ("loop", "thread")
        assert stats["faults"] == {"slow_fraction": 0.0, "slow_ms": 50.0, "seed": 0}
        assert replica.set_faults(slow_fraction=1.0, slow_ms=0.0, seed=5) == {
            "slow_fraction": 1.0,
            "slow_ms": 0.0,
            "seed": 5,
        }
        answer = httpx.post(
            replica.url + "/score", json={"customer_id": ids[0]}, headers={"x-request-id": "a"}
        )
        assert answer.status_code == 200 and answer.json()["customer_id"] == ids[0]
        assert replica.stats()["slow_injected"] == stats["slow_injected"] + 1  # every request stalls now
        with pytest.raises(ValueError, match="slow_fraction must be a finite number >= 0 and <= 1, got 2"):
            replica.set_faults(slow_fraction=2)
        with pytest.raises(ValueError, match=r"faults must be among .* got \['warmup_requests'\]"):
            replica.set_faults(warmup_requests=3)
        refused = httpx.put(replica.url + "/faults", content=b"[1, 2]")
        assert refused.status_code == 422 and "JSON object" in refused.json()["error"]
        assert replica.stats()["faults"]["slow_fraction"] == 1.0  # a refused change changes nothing
    finally:
        replica.stop()


def test_a_lazy_replica_builds_its_app_on_the_first_request(replica_files, ids):
    replica = start_replica(
        replica_files.onnx_path,
        replica_files.store_path,
        replica_files.model_version,
        lazy_load=True,
        max_lifetime_s=120,
    )
    try:
        wait_until(replica.is_ready, timeout_s=60, what="the replica to be ready")
        assert httpx.get(replica.url + "/healthz").json() == {"status": "ok", "loaded": False}
        assert "forward" not in replica.stats()  # the app's own /stats is not there before it is built
        answer = httpx.post(replica.url + "/score", json={"customer_id": ids[1]})
        assert answer.status_code == 200
        assert replica.stats()["forward"] in ("loop", "thread")
        assert httpx.get(replica.url + "/healthz").json()["status"] == "ok"
    finally:
        replica.stop()
