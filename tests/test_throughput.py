"""Throughput measurement: the p99-limit rule, the stored record, the churn candidates and the script."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import numpy as np
import pandas as pd
import pytest

from course_lib.churn.data import DATA_DIR
from course_lib.core.percentiles import percentile
from course_lib.measure.throughput import (
    MEASUREMENTS_DIR,
    SCHEMA,
    Candidate,
    ThroughputRecord,
    churn_candidates,
    load_measurement,
    measure_batch_latency,
    onnx_node_placement,
    p99_median_of_rounds_us,
    rps_at_p99_limit,
)


def _table() -> pd.DataFrame:
    rows = [
        # candidate, batch, p99_us, rps
        ("a", 1, 100.0, 10_000.0),
        ("a", 16, 4_000.0, 60_000.0),
        ("a", 256, 20_000.0, 90_000.0),  # 2 x 20 ms = 40 ms > 30 ms: not admissible
        ("b", 1, 40_000.0, 25.0),  # never admissible
    ]
    return pd.DataFrame(rows, columns=["candidate", "batch_size", "p99_us", "rps_at_full_use"])


def test_p99_limit_picks_fastest_admissible_batch():
    out = rps_at_p99_limit(_table(), 30.0)
    assert out.loc["a", "batch_size"] == 16
    assert out.loc["a", "rps"] == 60_000
    assert out.loc["a", "p99_bound_ms"] == pytest.approx(8.0)
    assert out.loc["a", "rps_batch_1"] == 10_000


def test_p99_limit_reports_nan_when_nothing_fits():
    out = rps_at_p99_limit(_table(), 30.0)
    assert math.isnan(out.loc["b", "rps"]) and math.isnan(out.loc["b", "batch_size"])
    assert out.loc["b", "rps_batch_1"] == 25


def test_wait_factor_one_admits_the_larger_batch():
    assert rps_at_p99_limit(_table(), 30.0, wait_factor=1.0).loc["a", "batch_size"] == 256


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"p99_limit_ms": 0}, "p99_limit_ms"), ({"wait_factor": 0.5}, "wait_factor")]
)
def test_p99_limit_rejects_bad_settings(kwargs, name):
    args = {"p99_limit_ms": 30.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        rps_at_p99_limit(_table(), args.pop("p99_limit_ms"), **args)


def test_p99_limit_needs_the_measured_columns():
    with pytest.raises(ValueError, match="missing columns"):
        rps_at_p99_limit(_table().drop(columns=["p99_us"]), 30.0)


def test_measure_batch_latency_times_every_candidate_at_every_batch():
    work = np.arange(4096, dtype=np.float64)

    def summing(batch: int):
        part = work[:batch]
        return lambda: float(part.sum())

    candidates = [
        Candidate("sum", "numpy", "cpu", summing),
        Candidate("sum-small", "numpy", "cpu", summing, max_batch_size=8),
    ]
    table = measure_batch_latency(candidates, [64, 1, 8], target_s=0.01, rounds=2, min_calls=5, max_calls=10)
    assert list(zip(table["candidate"], table["batch_size"], strict=True)) == [
        ("sum", 1),
        ("sum-small", 1),
        ("sum", 8),
        ("sum-small", 8),
        ("sum", 64),
    ]
    assert (table["n_calls"] >= 10).all()
    assert (table["rounds"] == 2).all()
    assert (table["p99_pooled_us"] >= table["median_us"]).all()
    np.testing.assert_allclose(table["rps_at_full_use"], table["batch_size"] / (table["median_us"] / 1e6))


def test_p99_median_of_rounds_ignores_a_stall_in_one_round():
    quiet = np.full(100, 20_000, dtype=np.int64)  # 20 us calls
    stalled = quiet.copy()
    stalled[:5] = 8_000_000  # five 8 ms scheduler stalls, all in one round
    rounds = [quiet, stalled, quiet]
    assert p99_median_of_rounds_us(rounds) == pytest.approx(20.0)
    pooled = np.concatenate(rounds) / 1e3
    assert percentile(pooled, 99) == pytest.approx(8_000.0)  # 5 of 300 calls: the pooled p99 is a stall
    worse = [stalled, stalled, quiet]
    assert p99_median_of_rounds_us(worse) == pytest.approx(8_000.0)  # stalls in most rounds show


def test_p99_median_of_rounds_is_the_median_of_nearest_rank_p99s():
    rng = np.random.default_rng(0)
    rounds = [rng.integers(1_000, 100_000, size=n) for n in (50, 120, 333, 7)]
    expected = np.median([percentile(r / 1e3, 99) for r in rounds])
    assert p99_median_of_rounds_us(rounds) == pytest.approx(expected)


def test_p99_median_of_rounds_rejects_empty_input():
    with pytest.raises(ValueError, match="rounds_ns"):
        p99_median_of_rounds_us([])
    with pytest.raises(ValueError, match="rounds_ns"):
        p99_median_of_rounds_us([np.array([1, 2]), np.array([], dtype=np.int64)])


def test_p99_limit_can_hold_the_pooled_p99():
    table = _table().assign(p99_pooled_us=lambda t: t["p99_us"] * 10)
    robust = rps_at_p99_limit(table, 30.0)
    pooled = rps_at_p99_limit(table, 30.0, p99_column="p99_pooled_us")
    assert robust.loc["a", "batch_size"] == 16
    assert pooled.loc["a", "batch_size"] == 1  # 2 x 40 ms breaks 30 ms at batch 16; 2 x 1 ms fits at 1
    assert pooled.loc["a", "p99_call_ms"] == pytest.approx(1.0)
    assert (pooled["rps"].fillna(0) <= robust["rps"].fillna(0)).all()


@pytest.mark.parametrize("sizes", [[], [0], [1, 1], [2.5]])
def test_measure_batch_latency_rejects_bad_batch_sizes(sizes):
    cand = Candidate("x", "numpy", "cpu", lambda b: lambda: None)
    with pytest.raises(ValueError, match="batch_sizes"):
        measure_batch_latency([cand], sizes)


def test_churn_candidates_agree_with_each_other(churn_model, onnx_model):
    candidates = churn_candidates(churn_model, onnx_model, n_rows=64)
    assert [c.name for c in candidates] == ["onnxruntime/cpu", "xgboost/cpu"]
    onnx_p, xgb_p = (np.asarray(c.make_call(64)(), dtype=float) for c in candidates)
    assert onnx_p.shape == xgb_p.shape == (64,)
    np.testing.assert_allclose(onnx_p, xgb_p, atol=1e-5)


def test_churn_candidates_refuse_cuda_with_a_cpu_only_xgboost(churn_model, onnx_model, monkeypatch):
    import xgboost

    monkeypatch.setattr(xgboost, "build_info", lambda: {"USE_CUDA": False})
    with pytest.raises(RuntimeError, match="without CUDA"):
        churn_candidates(churn_model, onnx_model, runtimes=["xgboost"], device="cuda", n_rows=8)


def test_churn_candidates_reject_unknown_runtime(churn_model, onnx_model):
    with pytest.raises(ValueError, match="runtimes"):
        churn_candidates(churn_model, onnx_model, runtimes=["tensorrt"])


def test_node_placement_counts_cpu_nodes(onnx_model, onnx_scorer, telco):
    from course_lib.churn.model import features

    feeds = onnx_scorer.feeds(features(telco.head(4)))
    placement = onnx_node_placement(onnx_model, ["CPUExecutionProvider"], feeds)
    assert set(placement) == {"CPUExecutionProvider"}
    assert placement["CPUExecutionProvider"] >= len(onnx_model.graph.node) // 2


def _record(tmp_path) -> ThroughputRecord:
    table = _table().assign(runtime="numpy", device="cpu", n_calls=100, median_us=50.0, us_per_item=1.0)
    return ThroughputRecord(
        device="cpu",
        created_utc="2026-01-01 00:00:00 UTC",
        command="python benchmarks/measure_throughput.py",
        environment={"cpu": "test cpu", "usable_cores": 2, "packages": {"numpy": np.__version__}},
        settings={"p99_limit_ms": 30.0, "wait_factor": 2.0, "threads": "1"},
        results=table,
        at_p99_limit=rps_at_p99_limit(table, 30.0),
        notes=["a note"],
        not_measured={"xgboost/cuda": "not requested"},
    )


def test_record_round_trips_through_json(tmp_path):
    record = _record(tmp_path)
    path = tmp_path / "m.json"
    path.write_text(record.to_json())
    back = load_measurement(path)
    assert back.device == "cpu" and back.notes == ["a note"]
    pd.testing.assert_frame_equal(back.results[record.results.columns], record.results, check_dtype=False)
    assert back.at_p99_limit.loc["a", "rps"] == 60_000
    assert math.isnan(back.at_p99_limit.loc["b", "rps"])
    text = back.provenance()
    assert "test cpu" in text and "not measured  xgboost/cuda" in text


def test_load_measurement_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something/else"}))
    with pytest.raises(ValueError, match=SCHEMA):
        load_measurement(bad)
    with pytest.raises(FileNotFoundError):
        load_measurement(tmp_path / "absent.json")


def test_committed_cpu_measurement_is_consistent():
    record = load_measurement(MEASUREMENTS_DIR / "cpu_throughput.json")
    assert MEASUREMENTS_DIR.parent == DATA_DIR
    assert record.device == "cpu"
    assert {"onnxruntime/cpu", "xgboost/cpu"} <= set(record.at_p99_limit.index)
    recomputed = rps_at_p99_limit(
        record.results, record.settings["p99_limit_ms"], wait_factor=record.settings["wait_factor"]
    )
    pd.testing.assert_frame_equal(recomputed, record.at_p99_limit, check_dtype=False)
    assert record.environment["packages"]  # library versions travel with the numbers


def _script():
    path = DATA_DIR.parent / "benchmarks" / "measure_throughput.py"
    spec = importlib.util.spec_from_file_location("measure_throughput", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["measure_throughput"] = module
    spec.loader.exec_module(module)
    return module


def test_script_fails_clearly_without_cuda(monkeypatch, capsys, tmp_path):
    script = _script()
    monkeypatch.setattr(script.shutil, "which", lambda name: None)
    out = tmp_path / "gpu.json"
    assert script.main(["--device", "cuda", "--out", str(out)]) == 2
    assert "nvidia-smi" in capsys.readouterr().err
    assert not out.exists()  # no GPU numbers without a GPU


def test_script_writes_a_loadable_cpu_record(tmp_path):
    script = _script()
    out = tmp_path / "cpu.json"
    argv = ["--batch-sizes", "1,8", "--target-s", "0.02", "--rounds", "2", "--out", str(out)]
    assert script.main(argv) == 0
    record = load_measurement(out)
    assert sorted(record.results["batch_size"].unique()) == [1, 8]
    assert set(record.environment["onnx_node_placement"]["onnxruntime/cpu"]) == {"CPUExecutionProvider"}
    assert record.environment["max_abs_diff_vs_first_candidate"]["xgboost/cpu"] < 1e-5
    import xgboost

    assert record.environment["runtime_versions"]["xgboost"] == xgboost.__version__
    assert f"xgboost {xgboost.__version__}" in record.provenance()


@pytest.mark.parametrize(
    ("runtimes", "patch", "needle"),
    [
        ("xgboost", ("xgboost", "build_info", lambda: {"USE_CUDA": False}), "xgboost-cu13"),
        (
            "onnxruntime",
            ("onnxruntime", "get_available_providers", lambda: ["CPUExecutionProvider"]),
            "onnxruntime-gpu",
        ),
    ],
)
def test_script_names_the_missing_cuda_package(monkeypatch, capsys, tmp_path, runtimes, patch, needle):
    script = _script()
    monkeypatch.setattr(script, "gpu_info", lambda: {"name": "stand-in GPU"})
    module, attr, fake = patch
    monkeypatch.setattr(importlib.import_module(module), attr, fake)
    out = tmp_path / "gpu.json"
    assert script.main(["--device", "cuda", "--runtimes", runtimes, "--out", str(out)]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


def test_script_cuda_bookkeeping_with_a_stand_in_device(monkeypatch, tmp_path):
    """The CUDA path's record keeping, with CPU candidates standing in for the GPU (no GPU numbers)."""
    script = _script()
    real = script.churn_candidates
    monkeypatch.setattr(script, "preflight_cuda", lambda runtimes: {"gpu": {"name": "stand-in GPU"}})

    def stand_in(*args, device="cpu", **kwargs):
        cands = real(*args, device="cpu", **kwargs)
        return [
            Candidate(c.name.replace("/cpu", f"/{device}"), c.runtime, device, c.make_call, c.max_batch_size)
            for c in cands
        ]

    monkeypatch.setattr(script, "churn_candidates", stand_in)
    out = tmp_path / "gpu.json"
    argv = ["--device", "cuda", "--runtimes", "xgboost", "--batch-sizes", "1,8", "--max-cpu-batch", "1"]
    assert script.main([*argv, "--target-s", "0.02", "--rounds", "2", "--out", str(out)]) == 0
    record = load_measurement(out)
    assert record.device == "cuda (stand-in GPU)"
    assert record.environment["gpu"] == {"name": "stand-in GPU"}
    assert record.not_measured == {"onnxruntime/cuda": "not requested (--runtimes xgboost)"}
    measured = set(zip(record.results["candidate"], record.results["batch_size"], strict=True))
    assert ("xgboost/cuda", 8) in measured and ("xgboost/cpu", 8) not in measured  # CPU capped at 1
    assert "xgboost/cuda" in record.at_p99_limit.index
