"""Cold start table from fresh replica processes (timings are printed by the lesson, not asserted)."""

from __future__ import annotations

import pytest

from course_lib.measure.tail import ColdStartVariant, cold_start_table


def test_cold_start_table_measures_each_variant_in_a_fresh_process(replica_files, ids):
    variants = {"cold": ColdStartVariant(0, lazy_load=True), "warm": ColdStartVariant(20, lazy_load=False)}
    table = cold_start_table(replica_files, variants, ids[:40], n_first=20)
    assert list(table.index) == ["cold", "warm"]
    assert (
        (
            table[
                ["ready_s", "first_ms", "first20_p99_ms", "first20_max_ms", "steady_p50_ms", "steady_p99_ms"]
            ]
            > 0
        )
        .all()
        .all()
    )


def test_cold_start_table_needs_enough_ids(replica_files, ids):
    with pytest.raises(ValueError, match="at least 2 \\* n_first"):
        cold_start_table(replica_files, {"x": ColdStartVariant()}, ids[:10], n_first=20)


def test_a_replica_that_does_not_start_stops_the_others(monkeypatch, tmp_path):
    from course_lib.measure.tail import _cold_start
    from course_lib.serving.replica import ReplicaFiles

    stopped: list[int] = []

    class FakeReplica:
        def __init__(self, warmup_requests: int) -> None:
            self.warmup_requests = warmup_requests

        def stop(self) -> None:
            stopped.append(self.warmup_requests)

    def fake_start(*_args, config, **_kwargs):
        if config.warmup_requests == 1:
            raise OSError("no such program")
        return FakeReplica(config.warmup_requests)

    monkeypatch.setattr(_cold_start, "start_replica", fake_start)
    files = ReplicaFiles(tmp_path / "m.onnx", tmp_path / "store", "v1")
    variants = {"ok": ColdStartVariant(0), "broken": ColdStartVariant(1), "ok too": ColdStartVariant(2)}
    with pytest.raises(RuntimeError, match="'broken' did not start"):
        cold_start_table(files, variants, [str(i) for i in range(4)], n_first=2)
    assert sorted(stopped) == [0, 2]
