"""A real Prometheus server scraping the monitored churn service, and the course's port of its
arithmetic giving the same answers on the same stored samples (Lesson 9).

Where the ``prometheus`` / ``promtool`` programs are missing these tests skip, saying why (``make
system-deps`` installs Debian's ``prometheus`` package). NOTE: CI must not skip them: once the course's
``require_binary`` helper is on this branch, these skips become failures in CI.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from course_lib.core.waiting import wait_until
from course_lib.operate.prom_quantile import extrapolated_rate, rate_rules
from course_lib.operate.prometheus_server import (
    PrometheusUnavailableError,
    find_prometheus,
    prometheus_server,
    prometheus_unavailable_reason,
    same_scrape_comparison,
    scrape_config,
)
from course_lib.operate.promtool import promtool_path

needs_prometheus = pytest.mark.skipif(
    find_prometheus() is None, reason=f"Prometheus server missing: {prometheus_unavailable_reason()}"
)
needs_promtool = pytest.mark.skipif(
    promtool_path() is None, reason="promtool missing: apt-get install prometheus (make system-deps)"
)


def test_scrape_config_names_the_targets_and_the_interval():
    cfg = scrape_config(["http://127.0.0.1:8000/", "127.0.0.1:8001"], scrape_interval_s=0.25, job="j")
    assert cfg["global"]["scrape_interval"] == "250ms"
    job = cfg["scrape_configs"][0]
    assert job["job_name"] == "j" and job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:8000", "127.0.0.1:8001"]
    for kwargs, match in (({"targets": []}, "targets"), ({"scrape_interval_s": 0}, "scrape_interval_s")):
        with pytest.raises(ValueError, match=match):
            scrape_config(**{"targets": ["127.0.0.1:1"], **kwargs})


def test_rate_rules_follow_the_version():
    assert rate_rules("2.42.0+ds") == {"left_open": False, "limit_to_zero_first": True}
    assert rate_rules("v2.51.0") == {"left_open": False, "limit_to_zero_first": False}
    assert rate_rules("3.0.1") == {"left_open": True, "limit_to_zero_first": False}
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        rate_rules("latest")


# Counter 10, 20, 30, 40 at minutes 0..3; rate(c[5m]) at 3m. The first sample is 120 s after the range
# start (beyond 1.1 x the 60 s interval), and the counter extrapolates to zero 60 s before it.
ZERO_CASE = ([0.0, 60.0, 120.0, 180.0], [10.0, 20.0, 30.0, 40.0], 180.0, 300.0)


def test_the_two_zero_limit_orders_differ_where_the_series_starts_inside_the_range():
    old = extrapolated_rate(*ZERO_CASE, limit_to_zero_first=True)  # < 2.51: extrapolate 60 s to the zero
    new = extrapolated_rate(*ZERO_CASE, limit_to_zero_first=False)  # >= 2.51: half an interval, 30 s
    assert old == pytest.approx(30 * (180 + 60) / 180 / 300)
    assert new == pytest.approx(30 * (180 + 30) / 180 / 300)


@needs_promtool
def test_the_port_matches_the_installed_promtools_rate(tmp_path):
    version = subprocess.run(["promtool", "--version"], capture_output=True, text=True).stdout.split()[2]
    expected = extrapolated_rate(*ZERO_CASE, **rate_rules(version))
    tests = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": "c", "values": "10 20 30 40"}],
                "promql_expr_test": [
                    {
                        "expr": "rate(c[5m])",
                        "eval_time": "3m",
                        "exp_samples": [{"labels": "{}", "value": expected}],
                    }
                ],
            }
        ],
    }
    (tmp_path / "rate_test.yml").write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        ["promtool", "test", "rules", "rate_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def monitored(churn_model, tmp_path_factory):
    """The Lesson 9 service (v1 and v2, canary at 25 %) on 127.0.0.1, with its metrics."""
    from course_lib.churn import versions as model_versions
    from course_lib.operate import canary
    from course_lib.operate.monitored_service import (
        ServiceMetrics,
        VersionedChurnService,
        create_monitored_app,
    )
    from course_lib.serving.feature_store import CachedFeatureStore, FeatureStore, build_feature_store
    from course_lib.serving.server import serve_in_thread
    from course_lib.serving.service import onnx_forward

    folder = tmp_path_factory.mktemp("versions")
    paths = model_versions.build_versions(model=churn_model, folder=folder)
    versions = model_versions.load_versions(paths)
    store = FeatureStore(build_feature_store(2_000, 0, folder=tmp_path_factory.mktemp("store")).path)
    cache = CachedFeatureStore(store)
    forwards = {r: onnx_forward(versions[r].scorer) for r in ("v1", "v2")}
    service = VersionedChurnService(
        cache.get, forwards, canary.HashRouter("v1", "v2", 25), metrics=ServiceMetrics(cache=cache)
    )
    with serve_in_thread(create_monitored_app(service), max_lifetime_s=240) as server:
        yield server
    store.close()


def _send(url: str, n: int) -> None:
    from course_lib.serving.feature_store import customer_id

    with httpx.Client(base_url=url) as http:
        for i in range(n):
            body = json.dumps({"customer_id": customer_id(i % 300 + 1, 2_000)})
            assert (
                http.post("/score", content=body, headers={"content-type": "application/json"}).status_code
                == 200
            )


@needs_prometheus
def test_prometheus_and_the_port_agree_on_the_same_scrape(monitored):
    with prometheus_server([monitored.url], scrape_interval_s=0.5, max_lifetime_s=120) as prom:
        assert prom.targets()[0]["health"] == "up"
        before = prom.instant("sum(churn_requests_total)", time.time())
        sent = int(next(iter(before.values()), 0.0))
        for _ in range(6):  # traffic over several scrapes, so the rate's range holds several samples
            _send(monitored.url, 100)
            sent += 100
            time.sleep(0.3)  # spreads the traffic over scrapes (not an ordering wait)

        def scraped_everything() -> bool:
            got = prom.instant("sum(churn_requests_total)", time.time())
            return bool(got) and next(iter(got.values())) == sent

        wait_until(scraped_everything, timeout_s=20, interval_s=0.1, what="a scrape after the last request")
        at_s = time.time()
        for version in ("v1", "v2"):
            for q in (0.5, 0.95, 0.99):
                c = same_scrape_comparison(
                    prom,
                    "churn_request_latency_seconds",
                    q=q,
                    range_s=4.0,
                    at_s=at_s,
                    matchers={"version": version},
                )
                assert not math.isnan(c["prometheus"]), c
                assert c["port"] == pytest.approx(c["prometheus"], rel=1e-12, abs=0), c
                assert (c["rate_by_le"]["samples"] >= 2).all()
        # rate() itself, on the requests counter, the same way
        from course_lib.operate.prom_quantile import extrapolated_rate as port_rate

        theirs = prom.instant('rate(churn_requests_total{status="200",version="v1"}[4s])', at_s)
        (frame,) = prom.samples('churn_requests_total{status="200",version="v1"}', 4.0, at_s).values()
        at_ms = round(at_s * 1000)
        ours = port_rate(
            ((frame["t_ms"] - at_ms) / 1000).tolist(),
            frame["value"].tolist(),
            0.0,
            4.0,
            **rate_rules(prom.version),
        )
        assert ours == pytest.approx(next(iter(theirs.values())), rel=1e-12)
        folder = prom.folder
    assert not folder.exists()  # storage and log removed


@needs_prometheus
def test_prometheus_stops_with_the_process_that_started_it(monitored, tmp_path):
    code = textwrap.dedent(
        f"""
        import sys, time
        from course_lib.operate.prometheus_server import prometheus_server
        with prometheus_server([{monitored.url!r}], scrape_interval_s=1.0, wait_for_first_scrape=False) as prom:
            print(prom.guard.pid, prom.folder, flush=True)
            time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ)
    guard_pid, folder = parent.stdout.readline().split()
    guard = psutil.Process(int(guard_pid))
    processes = [guard, *guard.children()]  # the guard and the Prometheus it runs
    assert len(processes) == 2 and "prometheus" in processes[1].name()
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    _, alive = psutil.wait_procs(processes, timeout=15)
    assert not alive, alive
    assert not Path(folder).exists()  # the guard removed storage and configuration


def test_a_missing_program_is_reported_with_the_reason(monkeypatch, tmp_path):
    from course_lib.operate.prometheus_server import _server

    monkeypatch.setattr(_server, "SYSTEM_PATHS", ())
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("PROMETHEUS", raising=False)
    assert find_prometheus() is None
    assert "apt-get install prometheus" in prometheus_unavailable_reason()
    with (
        pytest.raises(PrometheusUnavailableError, match="no prometheus program"),
        prometheus_server(["127.0.0.1:1"]),
    ):
        pass
