"""Many models on one pool: sizing arithmetic, real memory readings, helper processes that stop."""

from __future__ import annotations

import signal
import subprocess

import onnx
import pytest

from course_lib.churn.export import pipeline_to_onnx
from course_lib.operate.model_pool import (
    _command,
    _start_batch_job,
    measure_startup_s,
    pool_plan,
    rss_per_model_mib,
)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory, churn_model):
    path = tmp_path_factory.mktemp("pool") / "churn.onnx"
    onnx.save(pipeline_to_onnx(churn_model.pipeline), str(path))
    return path


def test_pool_plan_fifteen_small_models():
    table = pool_plan(
        [5.0] * 15,
        rps_per_replica=50,
        model_memory_mib=2,
        base_memory_mib=250,
        replica_memory_mib=1024,
    ).set_index("layout")
    assert table.loc["dedicated", "replicas"] == 30  # a pair each
    assert table.loc["shared pool", "replicas"] == 3  # ceil(75 / 50) + 1 survives one lost replica
    assert table.loc["shared pool", "memory_per_replica_mib"] == 280
    assert table["fits"].all()


def test_pool_that_does_not_fit_in_memory_is_flagged():
    table = pool_plan([1.0] * 15, rps_per_replica=50, model_memory_mib=100, base_memory_mib=250,
                      replica_memory_mib=1024).set_index("layout")  # fmt: skip
    assert not table.loc["shared pool", "fits"] and table.loc["dedicated", "fits"]
    with pytest.raises(ValueError, match="fit one replica"):
        pool_plan([60.0], rps_per_replica=50, model_memory_mib=1, base_memory_mib=1, replica_memory_mib=1)
    with pytest.raises(ValueError, match="peak_rps"):
        pool_plan([], rps_per_replica=50, model_memory_mib=1, base_memory_mib=1, replica_memory_mib=1)


def test_memory_grows_with_each_loaded_model(model_path):
    readings = rss_per_model_mib(model_path, 3)
    assert len(readings) == 4
    assert readings[-1] > readings[0]
    with pytest.raises(ValueError, match="n_models"):
        rss_per_model_mib(model_path, 0)
    with pytest.raises(FileNotFoundError):
        rss_per_model_mib(model_path.with_name("missing.onnx"), 1)


def test_startup_reports_every_phase(model_path):
    out = measure_startup_s(model_path, warmup_calls=5)
    phases = {"interpreter_and_imports_s", "session_s", "data_s", "first_call_ms", "warmup_s"}
    assert set(out) == phases | {"spawn_to_ready_s"}
    inside = out["session_s"] + out["data_s"] + out["first_call_ms"] / 1000 + out["warmup_s"]
    assert out["interpreter_and_imports_s"] == pytest.approx(out["spawn_to_ready_s"] - inside)
    assert out["interpreter_and_imports_s"] > 0


def test_batch_job_stops_by_its_lifetime_and_when_terminated(model_path):
    args = ["batch-job", "--model", str(model_path), "--rows", "100"]
    lone = subprocess.Popen(_command(*args, "--lifetime-s", "1"), stdout=subprocess.DEVNULL)
    assert lone.wait(timeout=120) == 0  # its lifetime ended it, ready or not
    proc = _start_batch_job(args)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_noisy_neighbour_rotates_the_conditions_and_gives_each_ratio_its_interval(model_path):
    """Structure only (no timing asserted): rounds, rotated order, ratios next to the same round's alone."""
    from course_lib.operate.model_pool import noisy_neighbour

    calls = []
    table = noisy_neighbour(
        lambda: calls.append(1), model_path, calls_per_block=1000, rounds=6, batch_rows=200
    )
    assert len(calls) == 1000 * (1 + 3 * 6)  # warm-up block, then 3 conditions x 6 rounds
    assert table["condition"].iloc[0] == "alone" and len(table) == 3
    alone = table.iloc[0]
    assert (alone["p99_vs_alone"], alone["p99_low"], alone["p99_high"]) == (1.0, 1.0, 1.0)
    assert (table["p99_low"] <= table["p99_vs_alone"]).all() and (
        table["p99_vs_alone"] <= table["p99_high"]
    ).all()
    interval = table.attrs["intervals"][(table.loc[1, "condition"], "p99")]
    assert interval.rounds == 6 and interval.ratio == table.loc[1, "p99_vs_alone"]
