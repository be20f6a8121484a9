"""Environment report and the side-by-side timing harness (structure only, never absolute times)."""

from __future__ import annotations

import pytest

from course_lib import env_report
from course_lib.bench import compare_latency, time_calls_ns


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
    assert counts == {"a": 2 + 1 + 30, "b": 2 + 1 + 30}  # warm-up, the first timed probe, 3 rounds
    assert list(table.index) == ["a", "b"]
    assert table.loc["a", "speedup"] == pytest.approx(1.0)
    assert set(table.columns) == {"median_us", "p99_us", "us_per_item", "speedup"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n_calls": 0}, "n_calls"), ({"rounds": 0}, "rounds"), ({"baseline": "zzz"}, "baseline")],
)
def test_compare_latency_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compare_latency({"a": lambda: None}, **kwargs)


def test_the_report_says_whether_this_is_the_course_environment(tmp_path):
    from course_lib.env import course_environment

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
