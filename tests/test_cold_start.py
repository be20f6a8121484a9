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
