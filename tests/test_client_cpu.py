"""Each load tool's CPU per request (course_lib.measure.load_tools.client_cpu): measured on real k6 and the
real course generator against the null server, the record's round trip, and bad arguments."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from course_lib.core.checks import InvalidArgumentError
from course_lib.measure.generators import GeneratorPool, merge_results, serve_null
from course_lib.measure.load_tools import (
    LOAD_TOOLS,
    RECORDED_CLIENT_CPU,
    client_cpu_table,
    generator_cpu_s_per_request,
    k6_cpu_s_per_request,
    load_client_cpu,
    save_client_cpu,
)

IDS = ["SC-0000001", "SC-0000002"]


def test_merge_results_carries_the_processes_cpu():
    part = pd.DataFrame({"scheduled_ms": [0.0, 1.0], "ok": [True, True]})
    assert merge_results([part], rate_rps=1.0, planned=2, wall_s=1.0, client_cpu_s=0.25).client_cpu_s == 0.25
    assert math.isnan(merge_results([part], rate_rps=1.0, planned=2, wall_s=1.0).client_cpu_s)


def test_the_generator_reports_its_cpu_and_its_spin_on_the_null_server():
    with serve_null(lifetime_s=120) as url, GeneratorPool(1) as pool:
        cpu_s, spin_s = generator_cpu_s_per_request(
            pool, url + "/score", [{}], rate_rps=400.0, duration_s=1.0
        )
    assert 0 < spin_s < cpu_s < 0.01  # some CPU per request, under 10 ms; the spin is part of it


def test_k6_cpu_by_the_difference_of_two_runs():
    """Start-up cancels; what is left is k6's cost per request while sending (under 10 ms on any laptop)."""
    with serve_null(lifetime_s=120) as url:
        cpu_s = k6_cpu_s_per_request(
            url + "/score", rate_rps=500.0, duration_s=2.0, ids=IDS, pre_allocated_vus=10, max_vus=50
        )
    assert math.isfinite(cpu_s) and 0 < cpu_s < 0.01


def test_bad_arguments_are_named():
    for bad, name in (({"rate_rps": 0}, "rate_rps"), ({"duration_s": -1}, "duration_s")):
        with pytest.raises(InvalidArgumentError, match=name):
            k6_cpu_s_per_request(
                "http://127.0.0.1:9/score", **{"rate_rps": 10, "duration_s": 1.0, "ids": IDS, **bad}
            )
    cases = [
        ({"repeats": 0}, "repeats"),
        ({"duration_s": 0.5}, "duration_s"),
        ({"rates_rps": [-5.0]}, "rates_rps"),
        ({"rates_rps": []}, "rates_rps"),
        ({"ids": []}, "ids"),
    ]
    for bad, name in cases:
        kwargs = {"ids": IDS, "rates_rps": [10.0], **bad}
        with pytest.raises(InvalidArgumentError, match=name):
            client_cpu_table(None, "http://127.0.0.1:9/score", **kwargs)  # type: ignore[arg-type]


def test_record_round_trip_and_lookup(tmp_path):
    columns = ["tool", "rate_rps", "repeat", "cpu_us_per_request", "spin_us_per_request", "cores"]
    rows = [
        ("course generator", 500.0, 0, 100.0, 60.0, 0.05),
        ("k6", 500.0, 0, 300.0, math.nan, 0.15),
        ("course generator", 500.0, 1, 120.0, 70.0, 0.06),
        ("k6", 500.0, 1, 340.0, math.nan, 0.17),
    ]
    table = pd.DataFrame(rows, columns=columns)
    path = save_client_cpu(table, tmp_path / "cpu.json", repeats=2, duration_s=3.0)
    record = load_client_cpu(path)
    assert record.median_us("k6") == 320.0 and record.median_us("course generator", 500.0) == 110.0
    assert record.median_us("course generator", column="spin_us_per_request") == 65.0
    assert "2 repeats of 3 s" in record.provenance()
    with pytest.raises(ValueError, match="no row for tool 'locust'"):
        record.median_us("locust")
    with pytest.raises(InvalidArgumentError, match="column"):
        record.median_us("k6", column="cores")
    broken = save_client_cpu(table.drop(columns="spin_us_per_request"), tmp_path / "old.json")
    with pytest.raises(ValueError, match="spin_us_per_request"):
        load_client_cpu(broken)
    with pytest.raises(FileNotFoundError, match=r"benchmarks/client_cpu\.py"):
        load_client_cpu(tmp_path / "missing.json")


def test_the_committed_record_has_both_tools_at_every_rate():
    record = load_client_cpu(RECORDED_CLIENT_CPU)
    rates = record.meta["rates_rps"]
    for tool in LOAD_TOOLS:
        for rate in rates:
            assert record.median_us(tool, rate) > 0
    assert (record.rows.loc[record.rows["tool"] == "course generator", "spin_us_per_request"] >= 0).all()
