"""Environment report and the side-by-side timing harness (structure only, never absolute times)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from course_lib import env_report
from course_lib.core.bench import (
    calls_per_round,
    compare_latency,
    compare_latency_by_batch,
    interleaved_rounds_ns,
    time_calls_ns,
    usable_cores,
)


def test_env_report_names_cpu_cores_threads_and_versions():
    report = env_report()
    text = str(report)
    assert report.logical_cores >= 1 and report.usable_cores >= 1
    assert "OMP_NUM_THREADS" in report.thread_env
    assert "onnxruntime" in report.packages and "numpy" in report.packages
    assert "CPUExecutionProvider" in report.onnxruntime_providers
    for word in ("python", "cpu", "cores", "threads", "onnxruntime"):
        assert word in text


def test_time_calls_counts_every_timed_call_and_skips_warmup():
    calls = []
    samples = time_calls_ns(lambda: calls.append(1), 7, warmup_calls=3)
    assert len(calls) == 10
    assert samples.shape == (7,) and (samples >= 0).all()


def test_compare_latency_reports_each_candidate_against_the_baseline():
    counts = {"a": 0, "b": 0}

    def make(name):
        def fn():
            counts[name] += 1

        return fn

    table = compare_latency({"a": make("a"), "b": make("b")}, n_calls=10, rounds=3, warmup_calls=2)
    assert counts == {"a": 2 + 30, "b": 2 + 30}  # warm-up, then 3 rounds of 10
    assert list(table.index) == ["a", "b"]
    assert table.loc["a", "speedup"] == pytest.approx(1.0)
    assert set(table.columns) == {"median_us", "p99_us", "us_per_item", "speedup"}


def test_compare_latency_by_batch_times_each_batch_size_in_turn_with_its_calls():
    calls: list[tuple[int, str]] = []
    built: list[int] = []

    def candidates_at(batch):
        built.append(batch)
        return {name: (lambda name=name: calls.append((batch, name))) for name in ("a", "b")}

    tables = compare_latency_by_batch(candidates_at, [4, 1], n_calls={4: 3, 1: 5}, rounds=2, warmup_calls=1)
    assert list(tables) == [4, 1] and built == [4, 1]  # built just before each is timed, in the order given
    assert calls.count((4, "a")) == 1 + 2 * 3 and calls.count((1, "b")) == 1 + 2 * 5
    assert all(b == 4 for b, _ in calls[: 2 * (1 + 2 * 3)])  # batch 4 done before batch 1 starts
    table = tables[4]
    assert list(table.index) == ["a", "b"]
    assert table["us_per_item"].tolist() == pytest.approx((table["median_us"] / 4).tolist())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n_calls": 0}, "n_calls"), ({"rounds": 0}, "rounds"), ({"baseline": "zzz"}, "baseline")],
)
def test_compare_latency_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compare_latency({"a": lambda: None}, **kwargs)


def test_rounds_interleave_the_candidates_and_keep_one_row_per_round():
    order = []
    candidates = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    samples = interleaved_rounds_ns(candidates, n_calls=2, rounds=3, warmup_calls=1)
    assert order[:3] == ["a", "b", "c"]  # warm-up, one call each
    # A B C, B C A, C A B: the order rotates, so no candidate always runs first
    assert order[3:] == [
        "a",
        "a",
        "b",
        "b",
        "c",
        "c",
        "b",
        "b",
        "c",
        "c",
        "a",
        "a",
        "c",
        "c",
        "a",
        "a",
        "b",
        "b",
    ]
    assert {k: v.shape for k, v in samples.items()} == {"a": (3, 2), "b": (3, 2), "c": (3, 2)}
    assert all(v.dtype == np.int64 and (v >= 0).all() for v in samples.values())


def test_without_n_calls_the_one_rule_sizes_every_candidate_alike():
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(0.002)  # work being timed, not ordering

    samples = interleaved_rounds_ns({"fast": fast, "slow": slow}, rounds=2, target_s=0.02, min_calls=1)
    n = samples["fast"].shape[1]
    assert samples["slow"].shape == (2, n)
    assert n <= 5  # 0.02 s / (2 rounds x >= 2 ms): the slowest candidate sets the count
    assert calls == {"fast": 1 + 2 * n, "slow": 1 + 2 * n}  # one probe, then the rounds


@pytest.mark.parametrize(
    ("seconds", "kwargs", "expected"),
    [
        (0.001, {"target_s": 1.0, "rounds": 5}, 200),
        (1e-9, {"target_s": 1.0, "rounds": 5}, 1000),
        (10.0, {"target_s": 1.0, "rounds": 5}, 20),
        (0.01, {"target_s": 1.0, "rounds": 9, "min_calls": 5, "max_calls": 10}, 10),
    ],
)
def test_calls_per_round_is_target_time_over_rounds_clipped(seconds, kwargs, expected):
    assert calls_per_round(seconds, **kwargs) == expected


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target_s": 0, "rounds": 1}, "target_s"),
        ({"target_s": 1, "rounds": 0}, "rounds"),
        ({"target_s": 1, "rounds": 1, "min_calls": 5, "max_calls": 2}, "min_calls"),
    ],
)
def test_calls_per_round_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        calls_per_round(0.001, **kwargs)


def test_interleaved_rounds_rejects_bad_arguments():
    with pytest.raises(ValueError, match="candidates"):
        interleaved_rounds_ns({})
    with pytest.raises(ValueError, match="n_calls"):
        interleaved_rounds_ns({"a": lambda: None}, n_calls=0)
    with pytest.raises(ValueError, match="warmup_calls"):
        interleaved_rounds_ns({"a": lambda: None}, warmup_calls=-1)


def test_usable_cores_is_what_the_environment_report_prints():
    assert usable_cores() == env_report().usable_cores >= 1


def test_the_report_says_whether_this_is_the_course_environment(tmp_path):
    from course_lib.core.env import course_environment

    lock = tmp_path / "requirements.lock"
    lock.write_text("# comment\nnumpy==0.0.1\nxgboost==9.9; sys_platform == 'darwin'\n")
    verdict = course_environment(lock)
    assert verdict.startswith("NOT the course environment: numpy ")
    assert "(lock: 0.0.1)" in verdict and "make lab" in verdict and "xgboost" not in verdict
    import numpy

    lock.write_text(f"numpy=={numpy.__version__}\n")
    assert course_environment(lock).startswith("course environment")
    assert course_environment(tmp_path / "missing.lock") == ""
    assert "environment     course environment" in str(env_report())  # this checkout's own venv
