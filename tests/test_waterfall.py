"""The service waterfall: lever intervals, the record, k6's summary,
and a smoke run of the benchmark's code against real servers (production and its null endpoint)."""

from __future__ import annotations

import math
import os

import pandas as pd
import pytest

from course_lib.core.checks import InvalidArgumentError
from course_lib.measure.load_tools import K6Result, parse_k6_summary
from course_lib.measure.waterfall import (
    WaterfallStep,
    lever_table,
    load_waterfall,
    save_waterfall,
    tool_agreement,
)


def knee_frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["repeat", "target", "knee_rps", "first_fail_rps", "generator_bound"])


STEPS = [
    WaterfallStep("proto", "p", "/score", None, "the start"),
    WaterfallStep("fast", "f", "/score", "proto", "a big lever"),
    WaterfallStep("same", "s", "/score", "fast", "a lever within one rung"),
]


def test_lever_table_interval_over_repeats():
    table = lever_table(
        STEPS,
        knee_frame(
            [
                (0, "proto", 50, 70, False),
                (1, "proto", 70, 100, False),
                (2, "proto", 50, 70, False),
                (0, "fast", 800, 1000, False),
                (1, "fast", 1000, 1200, False),
                (2, "fast", 800, 1000, False),
                (0, "same", 1000, 1200, False),
                (1, "same", 800, 1000, False),
                (2, "same", 800, 1000, False),
            ]
        ),
    )
    fast = table.loc["fast"]
    assert fast["knee_rps"] == [800, 1000, 800] and fast["median_knee_rps"] == 800
    assert fast["ratio_to_base"] == 800 / 50
    assert fast["ratio_low"] == pytest.approx(min(800 / 70, 1000 / 100, 800 / 70))
    assert fast["ratio_high"] == pytest.approx(max(1000 / 50, 1200 / 70, 1000 / 50))
    assert fast["verdict"] == "gain"
    assert table.loc["same", "verdict"] == "not resolved"
    assert table.loc["proto", "verdict"] == "" and math.isnan(table.loc["proto", "ratio_low"])


def test_an_open_end_stays_open_and_a_base_without_a_knee_gives_no_lower_bound():
    table = lever_table(
        STEPS[:2],
        knee_frame([(0, "proto", 0, 25, False), (0, "fast", 800, math.nan, False)]),
    )
    fast = table.loc["fast"]
    assert fast["ratio_low"] == 800 / 25 and math.isinf(fast["ratio_high"]) and fast["verdict"] == "gain"
    assert math.isnan(fast["ratio_to_base"])


def test_the_recorded_waterfall_and_peers_read_back():
    from course_lib.measure.waterfall import FLOOR_STEP, PRODUCTION_STEP, PROTOTYPE_STEP, load_peers

    record = load_waterfall()
    assert {PROTOTYPE_STEP, PRODUCTION_STEP, FLOOR_STEP} <= set(record.configs.index)
    assert record.prototype_rps == record.configs.loc[PROTOTYPE_STEP, "median_knee_rps"] >= 0
    assert set(record.configs["verdict"]) <= {"", "gain", "loss", "not resolved"}
    peers = load_peers()
    assert peers.meta["production"] in peers.configs.index and "bentoml" in peers.versions


def test_record_round_trip(tmp_path):
    table = lever_table(
        STEPS[:2], knee_frame([(0, "proto", 50, 70, False), (0, "fast", 800, math.nan, False)])
    ).assign(handle_ms=[9.0, 0.1], ceiling_rps=[111.0, 20000.0], workers=[1, 2])
    path = save_waterfall(
        table,
        tmp_path / "w.json",
        floor_step="fast",
        prototype_step="proto",
        production_step="fast",
        generator="fake",
        repeats=1,
        min_requests=1000,
        p99_limit_ms=100.0,
    )
    record = load_waterfall(path)
    assert record.prototype_rps == 50 and record.floor_rps == 800 and record.production_rps == 800
    assert record.configs.loc["fast", "knee_rps"] == [800.0]
    assert math.isnan(record.configs.loc["fast", "ratio_high"])  # inf is stored as null: an open end
    assert "1 repeats" in record.provenance() and "fake" in record.provenance()
    with pytest.raises(FileNotFoundError, match=r"service_waterfall\.py"):
        load_waterfall(tmp_path / "missing.json")


def test_parse_k6_summary_reads_trends_and_counts_dropped():
    summary = {
        "metrics": {
            "http_req_duration": {
                "values": {"p(50)": 1.5, "p(90)": 2.0, "p(95)": 2.5, "p(99)": 9.0, "max": 12.0}
            },
            "http_reqs": {"values": {"count": 990, "rate": 198.0}},
            "iterations": {"values": {"count": 990}},
            "dropped_iterations": {"values": {"count": 10}},
            "http_req_failed": {"values": {"rate": 0.0}},
            "vus_max": {"values": {"value": 50}},
        }
    }
    r = parse_k6_summary(summary, rate_rps=200, duration_s=5)
    assert isinstance(r, K6Result) and r.p99_ms == 9.0 and r.dropped_iterations == 10 and r.requests == 990
    assert not r.met_slo(100.0)  # dropped iterations fail the SLO
    del summary["metrics"]["dropped_iterations"]
    assert parse_k6_summary(summary, rate_rps=200, duration_s=5).met_slo(100.0)
    with pytest.raises(ValueError, match="no request"):
        parse_k6_summary({"metrics": {}}, rate_rps=1, duration_s=1)


@pytest.mark.timeout(300)
def test_smoke_run_of_the_benchmark_code_against_the_real_production_server(tmp_path):
    """A short run, pinned: the servers on one core, the generators, this process and k6 on the others."""
    import psutil

    from course_lib.core.affinity import split_cores
    from course_lib.core.bench import usable_cores
    from course_lib.measure.waterfall import FLOOR_STEP, PRODUCTION_STEP, WATERFALL, run_waterfall

    steps = [s for s in WATERFALL if s.name in (PRODUCTION_STEP, FLOOR_STEP)]
    # the server on the first usable core, the tools on the others (the course's machines have 2 or more)
    pin = split_cores(1) if usable_cores() >= 2 else None
    seen: list[tuple[str, list[int]]] = []  # (command line, cores) of this process and its children, mid-run

    def look(row: dict) -> None:
        if not seen:
            me = psutil.Process()
            seen.append(("this process", me.cpu_affinity()))
            for child in me.children(recursive=True):
                try:
                    seen.append((" ".join(child.cmdline()), child.cpu_affinity()))
                except (
                    psutil.NoSuchProcess
                ):  # gone since it was listed, or a zombie (ZombieProcess) not reaped yet
                    continue

    run = run_waterfall(
        steps,
        repeats=1,
        min_requests=60,
        min_duration_s=0.3,
        ladder_rps=[100, 200],
        start_rps={PRODUCTION_STEP: 100, FLOOR_STEP: 100},
        k6_step=PRODUCTION_STEP,
        lifetime_s=240,
        pin=pin,
        on_row=look,
    )
    everything = tuple(sorted(os.sched_getaffinity(0)))  # unpinned: every process on every core
    server_cores, tool_cores = (pin.server, pin.tools) if pin else (everything, everything)
    assert run.settings["pinned"] == (pin.describe() if pin else None)
    servers = [cores for cmd, cores in seen if "course_lib.serving.production" in cmd]
    generators = [cores for cmd, cores in seen if "multiprocessing" in cmd and "spawn" in cmd]
    assert servers and all(cores == list(server_cores) for cores in servers), seen
    assert len(generators) >= 2 and all(cores == list(tool_cores) for cores in generators), seen
    assert seen[0][1] == list(tool_cores)  # k6 starts from this process and inherits its cores
    assert (run.table["workers"] == len(server_cores)).all()  # one worker per core the server may use
    assert run.server_stats["production"]["workers"] == len(server_cores)
    assert f"{len(server_cores)} worker" in run.settings["servers"]["production"]  # described on its cores
    assert set(run.table.index) == {PRODUCTION_STEP, FLOOR_STEP}
    assert (run.runs["sent"] >= 1).all() and (run.knees["knee_rps"] >= 0).all()
    assert run.table.loc[PRODUCTION_STEP, "handle_ms"] > 0 and run.table.loc[FLOOR_STEP, "handle_ms"] == 0
    assert set(run.tools["tool"]) == {"course generator", "k6"} and set(run.tools["repeat"]) == {0}
    assert (run.tools["attempt"] >= 1).all() and "enough_requests" in run.tools
    assert run.server_stats["production"]["forward"] == "loop"  # ONNX Runtime's call is cheap enough
    path = save_waterfall(run.table, tmp_path / "w.json", floor_step=FLOOR_STEP, prototype_step=PRODUCTION_STEP,
                          production_step=PRODUCTION_STEP, generator="smoke", **run.settings)  # fmt: skip
    assert load_waterfall(path).floor_rps == run.table.loc[FLOOR_STEP, "median_knee_rps"]
    assert (f", pinned: {pin.text()}; file w.json" if pin else "; file w.json") in load_waterfall(
        path
    ).provenance()


def test_a_peer_and_every_process_it_forks_stop_with_its_launcher(tmp_path):
    """The peers' launcher takes the whole process group down (a LitServe-like peer forks a worker)."""
    import subprocess
    import sys

    import psutil

    from course_lib.core.waiting import wait_until
    from course_lib.measure.waterfall import PeerSpec, peer_command

    script = tmp_path / "peer.py"
    script.write_text(
        "import multiprocessing, time\n"
        "def work():\n    time.sleep(120)\n"
        "if __name__ == '__main__':\n"
        "    multiprocessing.Process(target=work).start()\n    time.sleep(120)\n"
    )
    spec = PeerSpec("fake", "fake", (str(script),), "/score", "/healthz")
    launcher = subprocess.Popen(peer_command(spec, sys.executable, workers=1))
    tree = psutil.Process(launcher.pid)
    wait_until(lambda: len(tree.children(recursive=True)) >= 2, timeout_s=30, what="the peer and its worker")
    processes = tree.children(recursive=True)
    launcher.terminate()
    launcher.wait(timeout=30)
    _, alive = psutil.wait_procs(processes, timeout=15)
    assert not alive


def test_k6_that_fails_is_reported_with_the_end_of_its_output(tmp_path):
    """k6 runs under the course's process guard; a script it cannot run fails with k6's own words."""
    from course_lib.measure.load_tools import run_k6

    script = tmp_path / "broken.js"
    script.write_text("this is not javascript\n")
    with pytest.raises(RuntimeError, match=r"k6 exited with code [1-9]\d*: .*broken\.js: Line 1"):
        run_k6("http://127.0.0.1:9/score", rate_rps=1, duration_s=1, ids=["SC-0000001"], script=script,
               log_dir=tmp_path / "k6")  # fmt: skip
    assert "Unexpected identifier" in (tmp_path / "k6" / "k6.log").read_text()


def test_parse_k6_summary_reads_the_measured_scenario_and_leaves_the_warm_up_out():
    """loadtests/churn.js exports the measured scenario's submetrics: they win over the whole test's metrics."""
    whole = {"p(50)": 9.0, "p(90)": 9.0, "p(95)": 9.0, "p(99)": 80.0, "max": 90.0}
    churn = {"p(50)": 1.0, "p(90)": 2.0, "p(95)": 3.0, "p(99)": 5.0, "max": 6.0}
    summary = {
        "metrics": {
            "http_req_duration": {"values": whole},
            "http_req_duration{scenario:churn}": {"values": churn},
            "http_req_duration{expected_response:true}": {"values": whole},
            "http_reqs": {"values": {"count": 1250, "rate": 416.0}},
            "http_reqs{scenario:churn}": {"values": {"count": 1000, "rate": 333.0}},
            "iterations": {"values": {"count": 1250}},
            "iterations{scenario:churn}": {"values": {"count": 1000}},
            "http_req_failed": {"values": {"rate": 0.2}},
            "http_req_failed{scenario:churn}": {"values": {"rate": 0.0}},
            "vus_max": {"values": {"value": 250}},
        }
    }
    r = parse_k6_summary(summary, rate_rps=500, duration_s=2)
    assert (r.p50_ms, r.p99_ms, r.requests, r.iterations, r.failed_rate) == (1.0, 5.0, 1000, 1000, 0.0)
    assert r.achieved_rps == 500.0 and r.vus_max == 250  # the scenario's count over its own duration
    assert r.met_slo(10.0)


def test_tool_agreement_reads_median_knees_over_repeats_and_a_retried_rate_as_met():
    rows = []
    knees = {"course generator": (400.0, 800.0, 800.0), "k6": (400.0, 400.0, 800.0)}
    for tool, by_repeat in knees.items():
        for repeat, knee in enumerate(by_repeat):
            for rate in (200.0, 400.0, 800.0, 1600.0):
                p50 = {"course generator": 1.1, "k6": 1.0}[tool] * (1 + repeat)
                if rate == 400.0 and repeat == 1:  # missed once, met on the retry
                    rows.append({"tool": tool, "repeat": repeat, "attempt": 1, "rate_rps": rate, "met": False,
                                 "p50_wire_ms": 99.0})  # fmt: skip
                met = rate <= knee
                rows.append({"tool": tool, "repeat": repeat, "attempt": 1 + (rate == 400.0 and repeat == 1),
                             "rate_rps": rate, "met": met, "p50_wire_ms": p50})  # fmt: skip
                if not met:
                    break
    a = tool_agreement(pd.DataFrame(rows))
    assert a["knees_by_repeat"] == {"course generator": [400.0, 800.0, 800.0], "k6": [400.0, 400.0, 800.0]}
    assert a["knee_rps"] == {"course generator": 800.0, "k6": 400.0} and a["repeats"] == 3
    assert a["knee_range_rps"] == {"course generator": (400.0, 800.0), "k6": (400.0, 800.0)}
    assert a["knee_ratio"] == 2.0 and not a["knee_agrees"]
    # p50 pairs only within a repeat where both met; the retried rate's pair is the try that met, never 99 ms
    assert a["p50_ratios"] == pytest.approx({200.0: 1.1, 400.0: 1.1, 800.0: 1.1}) and a["p50_agrees"]


def test_tool_agreement_compares_knees_and_like_for_like_p50s_within_the_tolerance():
    rows = []
    for rate, course_ms, k6_ms, course_met, k6_met in (
        (100.0, 1.25, 1.0, True, True),  # 25 % apart: outside 20 %
        (200.0, 2.1, 2.0, True, True),
        (400.0, 50.0, 3.0, False, True),  # only k6 met: no p50 pair
        (800.0, 90.0, 80.0, False, False),
    ):
        rows += [
            {"tool": "course generator", "rate_rps": rate, "met": course_met, "p50_wire_ms": course_ms},
            {"tool": "k6", "rate_rps": rate, "met": k6_met, "p50_wire_ms": k6_ms},
        ]
    a = tool_agreement(pd.DataFrame(rows))
    assert a["knee_rps"] == {"course generator": 200.0, "k6": 400.0} and a["knee_ratio"] == 0.5
    assert a["p50_ratios"] == pytest.approx({100.0: 1.25, 200.0: 1.05})
    assert a["worst_p50_ratio"] == pytest.approx(1.25) and not a["p50_agrees"] and not a["knee_agrees"]
    assert tool_agreement(pd.DataFrame(rows), tolerance=0.6)["knee_agrees"]
    with pytest.raises(ValueError, match="tolerance"):
        tool_agreement(pd.DataFrame(rows), tolerance=1.5)
    with pytest.raises(ValueError, match="p50_wire_ms"):
        tool_agreement(pd.DataFrame(rows).drop(columns="p50_wire_ms"))


def test_k6_offers_a_fractional_rate_per_hundred_seconds():
    """k6 takes whole iterations per time unit: half a ladder rung (380.5 requests/s) used to stop it."""
    from course_lib.measure.generators import serve_null
    from course_lib.measure.load_tools import run_k6

    with serve_null(lifetime_s=60) as url:
        r = run_k6(url + "/score", rate_rps=20.5, duration_s=2.0, ids=["SC-0000001"])
    assert r.dropped_iterations == 0 and r.failed_rate == 0
    assert 40 <= r.iterations <= 42  # 20.5/s for 2 s: k6 spaces the starts evenly; the warm-up's 50 left out
    for bad, message in (({"rate_rps": 0.004}, "rate_rps"), ({"rate_rps": 1000.004}, "rate_rps"),
                         ({"duration_s": 0.5}, "duration_s"), ({"ids": "SC-0000001"}, "ids"),
                         ({"grace_s": -1}, "grace_s"), ({"request_timeout_s": 1e-5}, "request_timeout_s"),
                         ({"warm_s": -1}, "warm_s")):  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=message):
            run_k6(url + "/score", **{"rate_rps": 10, "duration_s": 1.0, "ids": ["SC-0000001"], **bad})


def test_k6_opens_its_connections_in_the_warm_up_not_in_the_measured_run(tmp_path):
    """Each pre-allocated VU sends one request before the measured scenario, which then connects no more."""
    import json

    from course_lib.measure.generators import serve_null
    from course_lib.measure.load_tools import run_k6

    def connecting(folder) -> dict:
        metrics = json.loads((folder / "summary.json").read_text())["metrics"]
        return metrics["http_req_connecting{scenario:churn}"]["values"]

    with serve_null(lifetime_s=90) as url:
        warm = run_k6(url + "/score", rate_rps=200, duration_s=1.0, ids=["SC-0000001"], pre_allocated_vus=20,
                      warm_s=2.0, log_dir=tmp_path / "warm")  # fmt: skip
        cold = run_k6(url + "/score", rate_rps=200, duration_s=1.0, ids=["SC-0000001"], pre_allocated_vus=20,
                      warm_s=0, log_dir=tmp_path / "cold")  # fmt: skip
    assert (
        warm.failed_rate == cold.failed_rate == 0 and warm.dropped_iterations == cold.dropped_iterations == 0
    )
    assert (
        195 <= warm.requests <= 201 and 195 <= cold.requests <= 201
    )  # the measured run alone, 200/s for 1 s
    assert (
        connecting(tmp_path / "warm")["max"] == 0
    )  # every request of the measured run found its connection open
    assert connecting(tmp_path / "cold")["max"] > 0  # without the warm-up, the first requests connect


def test_k6_script_runs_by_hand_with_only_url_and_rate():
    """Lesson 12's 'try it yourself': without IDS_FILE or SUMMARY_FILE it sends the store's first ids and prints."""
    import subprocess

    from course_lib.measure.generators import serve_null
    from course_lib.measure.load_tools import K6_SCRIPT, k6_binary

    with serve_null(lifetime_s=60) as url:
        out = subprocess.run(
            [str(k6_binary()), "run", "--quiet", "--no-usage-report", "-e", f"URL={url}/score", "-e", "RATE=50",
             "-e", "DURATION=1s", str(K6_SCRIPT)],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    assert "churn scenario at 50 per 1s: 5" in out.stdout  # 50 or 51 requests
    assert "0.00 % failed, 0 iterations dropped" in out.stdout and "p99" in out.stdout


def test_spin_table_reads_each_settings_median_p50_ratio_and_its_range(tmp_path):
    from course_lib.measure.waterfall import load_tool_wire_p50, save_tool_wire_p50, spin_table

    rows = []
    for spin, gen_ms in ((0.002, (0.7, 0.8, 0.9)), (0.0, (1.0, 1.1, 1.3))):
        for repeat, ms in enumerate(gen_ms):
            rows += [
                {"tool": "course generator", "repeat": repeat, "attempt": 1, "rate_rps": 500.0, "met": True,
                 "p50_wire_ms": ms, "spin_s": spin},
                {"tool": "k6", "repeat": repeat, "attempt": 1, "rate_rps": 500.0, "met": True, "p50_wire_ms": 1.0,
                 "spin_s": spin},
                {"tool": "k6", "repeat": repeat, "attempt": 1, "rate_rps": 900.0, "met": False, "p50_wire_ms": 9.0,
                 "spin_s": spin},  # only k6 ran it, and missed: no pair
            ]  # fmt: skip
    table = spin_table(pd.DataFrame(rows))
    assert list(table.index) == [(0.0, 500.0), (0.002, 500.0)]
    assert table.loc[(0.002, 500.0), ["ratio", "ratio_low", "ratio_high", "pairs"]].tolist() == pytest.approx(
        [0.8, 0.7, 0.9, 3]
    )
    assert (
        table.loc[(0.0, 500.0), "ratio"] == pytest.approx(1.1) and table.loc[(0.0, 500.0), "k6_p50_ms"] == 1.0
    )
    path = save_tool_wire_p50(
        pd.DataFrame(rows), tmp_path / "t.json", repeats=3, min_requests=1000, server="fake"
    )
    record = load_tool_wire_p50(path)
    assert (
        record.table().equals(table) and "3 repeats" in record.provenance() and "fake" in record.provenance()
    )
    with pytest.raises(ValueError, match="spin_s"):
        spin_table(pd.DataFrame(rows).drop(columns="spin_s"))
    with pytest.raises(FileNotFoundError, match=r"tool_wire_p50\.py"):
        load_tool_wire_p50(tmp_path / "missing.json")


def test_generator_pool_refuses_a_negative_spin():
    from course_lib.measure.generators import GeneratorPool

    with GeneratorPool(1) as pool, pytest.raises(InvalidArgumentError, match="spin_s"):
        pool.run("http://127.0.0.1:9/score", [{}], rate_rps=10, duration_s=0.1, spin_s=-0.001)


def test_spin_table_and_verdict_survive_records_without_pairs():
    """A setting where k6 never met a rate, or only one setting recorded: no crash, and the verdict says so."""
    from course_lib.measure.waterfall import spin_table, spin_verdict

    rows = [
        {"tool": "course generator", "repeat": 0, "rate_rps": 500.0, "met": True, "p50_wire_ms": 1.0, "spin_s": 0.0},
        {"tool": "k6", "repeat": 0, "rate_rps": 500.0, "met": False, "p50_wire_ms": 9.0, "spin_s": 0.0},
        {"tool": "course generator", "repeat": 0, "rate_rps": 500.0, "met": True, "p50_wire_ms": 0.7, "spin_s": 0.002},
        {"tool": "k6", "repeat": 0, "rate_rps": 500.0, "met": True, "p50_wire_ms": 1.0, "spin_s": 0.002},
    ]  # fmt: skip
    table = spin_table(pd.DataFrame(rows))
    assert list(table.index) == [(0.002, 500.0)]
    assert "spin settings [0.002] s only" in spin_verdict(table)
    assert "spin settings [] s only" in spin_verdict(spin_table(pd.DataFrame(rows[:2])))
    with pytest.raises(ValueError, match="p50_wire_ms"):
        spin_table(pd.DataFrame(rows).drop(columns="p50_wire_ms"))


def test_tool_agreement_refuses_a_repeat_with_one_tool_only():
    rows = [{"tool": "course generator", "repeat": 0, "rate_rps": 100.0, "met": True, "p50_wire_ms": 1.0},
            {"tool": "k6", "repeat": 0, "rate_rps": 100.0, "met": True, "p50_wire_ms": 1.0},
            {"tool": "course generator", "repeat": 1, "rate_rps": 100.0, "met": True, "p50_wire_ms": 1.0}]  # fmt: skip
    with pytest.raises(ValueError, match=r"repeats \[1\] with rows of one tool only"):
        tool_agreement(pd.DataFrame(rows))


def test_comparisons_refuse_bad_arguments_before_running_anything():
    from course_lib.measure.load_tools import run_k6
    from course_lib.measure.waterfall import spin_comparison, tool_comparison

    pool = object()  # never used: every refusal comes first
    for kwargs, name in (({"spin_s": 1.0}, "spin_s"), ({"spin_s": -0.1}, "spin_s"), ({"order_shift": -1}, "order_shift"),
                         ({"pre_allocated_vus": 500}, "max_vus"), ({"repeats": 0}, "repeats")):  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=name):
            tool_comparison(
                pool, "http://127.0.0.1:9/score", ["SC-0000001"], [100.0], p99_limit_ms=100, **kwargs
            )
    with pytest.raises(InvalidArgumentError, match="ids"):
        tool_comparison(pool, "http://127.0.0.1:9/score", [], [100.0], p99_limit_ms=100)
    with pytest.raises(InvalidArgumentError, match="spins_s"):
        spin_comparison(
            pool, "http://127.0.0.1:9/score", ["SC-0000001"], [100.0], p99_limit_ms=100, spins_s=(0.0, 0.0)
        )
    with pytest.raises(InvalidArgumentError, match=r"warm_s must be 0 \(no warm-up\) or at least 1 s"):
        run_k6("http://127.0.0.1:9/score", rate_rps=10, duration_s=1.0, ids=["SC-0000001"], warm_s=0.5)


def test_parse_k6_summary_gives_nan_percentiles_for_an_empty_run_and_refuses_half_a_scenario():
    empty = {"count": 0, "p(50)": 0.0, "p(99)": 0.0, "max": 0.0}
    summary = {"metrics": {"http_req_duration": {"values": {"count": 50, "p(50)": 1.0}},
                           "http_req_duration{scenario:churn}": {"values": empty},
                           "http_reqs": {"values": {"count": 50}},
                           "http_reqs{scenario:churn}": {"values": {"count": 0}}}}  # fmt: skip
    r = parse_k6_summary(summary, rate_rps=100, duration_s=1)
    assert r.requests == 0 and math.isnan(r.p50_ms) and math.isnan(r.p99_ms) and not r.met_slo(100.0)
    del summary["metrics"]["http_reqs{scenario:churn}"]
    with pytest.raises(ValueError, match=r"http_reqs\{scenario:churn\}"):
        parse_k6_summary(summary, rate_rps=100, duration_s=1)
