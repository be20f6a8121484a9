"""Percentile hygiene: HdrHistogram's and Locust's numbers explained by their own rules (checked against
the installed hdrh and locust), and the course's nearest rank next to them."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from course_lib.core.percentiles import nearest_rank, percentile
from course_lib.measure.histograms import hdr_explain, hdr_explain_table, hdr_from_samples, hdr_rank
from course_lib.measure.load_tools.locust import (
    locust_closed_loop,
    locust_percentile,
    locust_rank,
    locust_requests_per_s,
)


@pytest.mark.parametrize("n", [1, 2, 10, 95, 100, 150, 1000, 1049, 1060, 10_300])
@pytest.mark.parametrize("q", [0, 1, 50, 90, 95, 99, 99.9, 100])
def test_hdr_rank_is_what_hdrh_reads(n, q):
    hist = HdrHistogram(1, 10**6, 3)
    hist.record_value(1, n)  # only the count matters for the target rank
    assert hdr_rank(n, q) == hist.get_target_count_at_percentile(q)


def test_hdr_rank_and_nearest_rank_part_where_the_fraction_is_below_one_half():
    for n in range(1, 3000):
        x = 99 * n / 100
        frac = x - math.floor(x)
        expected_gap = 1 if 0 < frac < 0.5 - 1e-9 else 0
        assert nearest_rank(n, 99) - hdr_rank(n, 99) == expected_gap, n


def test_hdr_explain_splits_the_difference_into_rank_rule_and_precision():
    rng = np.random.default_rng(4)
    samples = rng.lognormal(np.log(5.0), 0.9, size=1060)  # a heavy tail: one rank matters at p99
    e = hdr_explain(samples, 99)
    ordered = np.sort(samples)
    assert (e["nearest_rank"], e["hdr_rank"]) == (1050, 1049)
    assert e["exact_ms"] == percentile(samples, 99) == ordered[1049]
    assert e["at_hdr_rank_ms"] == ordered[1048]
    hist = hdr_from_samples(samples)
    assert e["hdr_ms"] == hist.get_value_at_percentile(99) / 1000
    # precision: never below the recorded sample, at most 0.5 us + one bucket above it (< 0.1 % + 0.5 us)
    assert -0.0005 <= e["precision_ms"] <= e["precision_bound_ms"] <= 0.0005 + e["at_hdr_rank_ms"] / 1024
    assert e["rank_rule_ms"] < 0 and e["total_ms"] == pytest.approx(e["rank_rule_ms"] + e["precision_ms"])


def test_hdr_explain_table_is_zero_rank_error_where_the_ranks_agree():
    samples = np.arange(1.0, 1001.0)  # 1,000 samples: q/100 x n is whole for these q
    table = hdr_explain_table(samples, qs=(50, 90, 99, 99.9))
    assert (table["nearest_rank"] == table["hdr_rank"]).all()
    assert (table["rank_rule_ms"] == 0).all()
    assert (table["precision_ms"].abs() <= table["precision_bound_ms"]).all()


def test_hdr_explain_refuses_bad_input():
    with pytest.raises(ValueError, match="empty"):
        hdr_explain([], 99)
    with pytest.raises(ValueError, match="q must be"):
        hdr_explain([1.0], 0)
    with pytest.raises(ValueError, match="n must be"):
        hdr_rank(0, 50)


def _locust(code: str, payload: object) -> object:
    """Run ``code`` with locust imported in a subprocess (importing locust monkey-patches the interpreter)."""
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + code],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_locust_rank_is_the_rank_of_locusts_percentile():
    ns, qs = [1, 7, 100, 101, 150, 999, 1000], [0, 10, 50, 90, 95, 99, 100]
    code = (
        "from locust.stats import calculate_response_time_percentile\n"
        "ns, qs = json.loads(sys.stdin.read())\n"
        "out = []\n"
        "for n in ns:\n"
        "    counts = {v: 1 for v in range(1, n + 1)}\n"  # distinct values 1..n: the value is the rank
        "    out.append([calculate_response_time_percentile(counts, n, q / 100) for q in qs])\n"
        "print(json.dumps(out))\n"
    )
    reference = _locust(code, [ns, qs])
    assert [[locust_rank(n, q) for q in qs] for n in ns] == reference
    # through Locust's buckets too, where the values are whole milliseconds below 100 ms (kept as they are)
    small = [i for i, n in enumerate(ns) if n < 100]
    assert [[locust_percentile(range(1, ns[i] + 1), q) for q in qs] for i in small] == [
        reference[i] for i in small
    ]


def test_locust_requests_per_s_is_locusts_total_rps():
    cases = [[40, 100.0, 102.48], [7, 5.0, 12.0], [0, 3.0, 3.0]]
    code = (
        "from locust.stats import RequestStats\n"
        "out = []\n"
        "for n, start, last in json.loads(sys.stdin.read()):\n"
        "    stats = RequestStats()\n"
        "    entry = stats.get('/score', 'POST')\n"
        "    entry.num_requests = n\n"
        "    stats.total.start_time, stats.total.last_request_timestamp = start, last\n"
        "    out.append(entry.total_rps)\n"
        "print(json.dumps(out))\n"
    )
    reference = _locust(code, cases)
    assert [locust_requests_per_s(n, a, b) for n, a, b in cases] == pytest.approx(reference)
    with pytest.raises(ValueError, match="last_completion_s"):
        locust_requests_per_s(1, 2.0, 1.0)


def test_locust_dispatch_and_pacing_follow_its_source():
    # the dispatcher's own attributes, read from a real instance
    code = (
        "from locust.dispatch import UsersDispatcher\n"
        "from locust import User\n"
        "from locust.runners import WorkerNode\n"
        "class U(User):\n"
        "    wait_time = lambda self: 1\n"
        "out = []\n"
        "for rate in json.loads(sys.stdin.read()):\n"
        "    d = UsersDispatcher(worker_nodes=[WorkerNode('w')], user_classes=[U])\n"
        "    d.new_dispatch(10, rate)\n"
        "    out.append([d._user_count_per_dispatch_iteration, d._wait_between_dispatch])\n"
        "print(json.dumps(out))\n"
    )
    reference = _locust(code, [0.5, 2.5, 100])
    for rate, (per_dispatch, gap_s) in zip([0.5, 2.5, 100], reference, strict=True):
        starts = locust_closed_loop(10, rate, 1000.0, 1000.0)["starts"].sort_values("user")["start_s"]
        expected = [(u // per_dispatch) * gap_s for u in range(10)]
        assert starts.tolist() == pytest.approx(expected)


def test_paced_users_that_start_together_send_in_bursts_and_read_high_on_requests_per_s():
    run = locust_closed_loop(10, 100, 0.8, 3.0, response_time_s=0.08)
    assert run["requests"] == 10 * math.ceil(3.0 / 0.8) == 40
    assert run["largest_burst"] == 10  # all ten users in step
    assert run["requests_per_s"] == pytest.approx(40 / (2.4 + 0.08))
    # Locust's Requests/s (16.1) > requests / -t (13.3) > users / pacing (12.5): fence posts at both ends
    assert run["requests_per_s"] > run["sent_rps"] > run["asked_rps"]
    spread = locust_closed_loop(3, 1, 0.8, 30.0, response_time_s=0.08)  # one user a second: out of step
    assert spread["largest_burst"] == 1
    in_step = locust_closed_loop(5, 1, 0.8, 30.0, response_time_s=0.08)  # users 0 and 4 start 4 s apart
    assert in_step["largest_burst"] == 2  # 4 s is five periods of 0.8 s: they meet again
    slow = locust_closed_loop(2, 10, 0.1, 2.0, response_time_s=0.25)  # answers slower than the pacing
    assert slow["requests"] < 2 * 2.0 / 0.1  # the closed loop sends fewer while answers are slow
    assert slow["starts"].groupby("user")["start_s"].diff().dropna().min() == pytest.approx(0.25)


def test_a_real_locust_run_stays_within_what_its_rules_allow(tmp_path):
    """Bounds that hold at any load: a closed loop never sends more than its schedule, and Requests/s
    is the count over a window no longer than -t plus the stop timeout."""
    from course_lib.measure.load_tools.locust import run_locust
    from course_lib.serving.prototype import serve_churn

    users, pacing_s, run_s, stop_s = 3, 0.25, 3, 2
    with serve_churn(lifetime_s=120) as server:
        stats = run_locust(
            server.url,
            users=users,
            spawn_rate=100,
            run_time_s=run_s,
            csv_prefix=tmp_path / "churn",
            env={"CHURN_PATH": "/score", "CHURN_PACING_S": str(pacing_s)},
            stop_timeout_s=stop_s,
        )
    row = stats.set_index("Name").loc["/score"]
    schedule = locust_closed_loop(users, 100, pacing_s, run_s)
    assert 0 < row["Request Count"] <= schedule["requests"] == users * math.ceil(run_s / pacing_s)
    assert row["Requests/s"] >= row["Request Count"] / (run_s + stop_s)
    assert row["Min Response Time"] <= row["Median Response Time"] <= row["Max Response Time"]
