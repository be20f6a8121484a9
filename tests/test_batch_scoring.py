"""Batch scoring: chunks, parallel workers, resume after a SIGKILL, rejects with reasons, Dask, Triton."""

from __future__ import annotations

import datetime as dt
import glob
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.protobuf import text_format

from course_lib.churn.data import CATEGORICAL_LEVELS, FEATURE_COLUMNS, ID_COLUMN, make_customers
from course_lib.churn.export import pipeline_to_onnx
from course_lib.core.waiting import wait_until
from course_lib.offline.chunk import ChunkTask, peak_rss_mib
from course_lib.offline.job import (
    build_parquet_store,
    iter_store_chunks,
    recorded_plan,
    same_output,
    score_store,
)
from course_lib.offline.resumable import chunk_scorer, interrupted_after, score_resumable
from course_lib.offline.scorers import ScorerSpec, scorer_spec
from course_lib.offline.store import plan_chunks
from course_lib.offline.triton_repository import (
    export_triton_repository,
    fil_config,
    onnx_config,
    parse_config,
)
from course_lib.offline.workers import run_chunks
from course_lib.serving.feature_store import build_feature_store

REPO = Path(__file__).resolve().parents[1]


AT = dt.datetime(2026, 11, 30, 8, 0, tzinfo=dt.UTC)


def _parts(folder: Path, prefix: str = "part") -> pd.DataFrame:
    files = sorted(glob.glob(str(folder / f"{prefix}-*.parquet")))
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


def _pool_workers() -> list[psutil.Process]:
    """Worker processes of this process's pools: children of multiprocessing's fork server."""
    servers = [c for c in psutil.Process().children() if "forkserver" in " ".join(c.cmdline())]
    return [w for server in servers for w in server.children()]


def _live(processes: list[psutil.Process]) -> list[psutil.Process]:
    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [p for p in processes if running(p)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_parquet_store(20_000, 0, folder=tmp_path_factory.mktemp("store"), row_group_rows=5_000)


def test_chunked_scores_equal_one_shot_scores(store, churn_model, tmp_path):
    summary = score_store(store, tmp_path / "out", churn_model, chunk_rows=7_000, progress=False)
    assert (summary.rows_read, summary.rows_scored, summary.rows_rejected, summary.chunks) == (
        20_000,
        20_000,
        0,
        3,
    )
    got = _parts(tmp_path / "out")
    frame = pq.read_table(store).to_pandas()
    one_shot = churn_model.pipeline.predict_proba(frame[list(FEATURE_COLUMNS)])[:, 1]
    assert list(got[ID_COLUMN]) == list(frame[ID_COLUMN])
    assert np.array_equal(got["churn_probability"].to_numpy(), one_shot)
    assert set(got["model_version"]) == {churn_model.model_version}
    assert set(summary.stage_s) == {"read", "check", "encode", "model", "write"}
    assert json.loads((tmp_path / "out" / "_SUCCESS").read_text())["rows_scored"] == 20_000


def test_the_resumable_core_crashed_and_resumed_equals_one_pass_and_the_job(churn_model, tmp_path):
    """Lesson 11's vectors: 10 rows in chunks of 4, a crash after chunk 2, then the hardened job."""
    source = build_parquet_store(10, 0, folder=tmp_path, row_group_rows=4)
    table = pq.read_table(source)
    score = chunk_scorer(churn_model)
    assert score_resumable(table, tmp_path / "one", score, chunk_rows=4) == [0, 1, 2]
    with pytest.raises(InterruptedError):
        score_resumable(table, tmp_path / "crash", interrupted_after(score, 2), chunk_rows=4)
    assert sorted(p.name for p in (tmp_path / "crash").iterdir()) == [
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    assert score_resumable(table, tmp_path / "crash", score, chunk_rows=4) == [2]
    one, resumed = _parts(tmp_path / "one"), _parts(tmp_path / "crash")
    pd.testing.assert_frame_equal(one, resumed)
    score_store(source, tmp_path / "job", churn_model, chunk_rows=4, workers=1, progress=False)
    job = _parts(tmp_path / "job")
    assert list(job[ID_COLUMN]) == list(one[ID_COLUMN])
    assert np.array_equal(job["churn_probability"].to_numpy(), one["churn_probability"].to_numpy())


def test_parquet_store_matches_the_sqlite_store_population(tmp_path):
    pq_path = build_parquet_store(3_000, 5, folder=tmp_path)
    sql_path = build_feature_store(3_000, 5, folder=tmp_path).path
    a = pd.concat(f for _, f in iter_store_chunks(pq_path, 1_000))
    b = pd.concat(f for _, f in iter_store_chunks(sql_path, 1_000))
    as_text = {c: str for c in (ID_COLUMN, *CATEGORICAL_LEVELS)}
    expected = make_customers(3_000, 5)[[ID_COLUMN, *FEATURE_COLUMNS]].astype(as_text)
    for got in (a, b):
        pd.testing.assert_frame_equal(got.reset_index(drop=True).astype(as_text), expected, check_dtype=False)


def test_the_sqlite_feature_store_scores_like_its_parquet_twin(tmp_path, churn_model):
    parquet = build_parquet_store(3_000, 5, folder=tmp_path)
    sqlite = build_feature_store(3_000, 5, folder=tmp_path).path
    a = score_store(
        parquet, tmp_path / "a", churn_model, chunk_rows=1_000, workers=2, scored_at=AT, progress=False
    )
    b = score_store(
        sqlite, tmp_path / "b", churn_model, chunk_rows=1_000, workers=2, scored_at=AT, progress=False
    )
    assert (a.rows_scored, b.rows_scored, b.chunks) == (3_000, 3_000, 3)
    pd.testing.assert_frame_equal(_parts(tmp_path / "a"), _parts(tmp_path / "b"))


def test_bad_rows_are_rejected_with_their_reason_never_scored(churn_model, tmp_path):
    frame = make_customers(50, 1)[[ID_COLUMN, *FEATURE_COLUMNS]]
    frame = frame.astype({c: object for c in (ID_COLUMN, *CATEGORICAL_LEVELS)} | {"senior_citizen": "Int64"})
    frame.loc[3, "tenure"] = -5
    frame.loc[7, "monthly_charges"] = np.inf
    frame.loc[11, "contract"] = "Lifetime"
    frame.loc[13, "senior_citizen"] = None
    frame.loc[17, "total_charges"] = np.nan  # missing is allowed: scored
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    summary = score_store(path, tmp_path / "out", churn_model, chunk_rows=20, progress=False)
    rejects = _parts(tmp_path / "out", "rejects").set_index(ID_COLUMN)["reason"]
    scores = _parts(tmp_path / "out")
    assert summary.rows_read == 50 and summary.rows_rejected == 4 and summary.rows_scored == 46
    ids = frame[ID_COLUMN]
    assert sorted(rejects.index) == sorted(ids[[3, 7, 11, 13]])
    assert "tenure" in rejects[ids[3]] and "[0, 72]" in rejects[ids[3]]
    assert "monthly_charges" in rejects[ids[7]]
    assert "Lifetime" in rejects[ids[11]] and "one of" in rejects[ids[11]]
    assert "senior_citizen" in rejects[ids[13]]
    assert ids[17] in set(scores[ID_COLUMN])
    assert not set(scores[ID_COLUMN]) & set(rejects.index)


def test_missing_and_repeated_ids_are_rejected_not_fatal(churn_model, tmp_path):
    frame = make_customers(30, 3)[[ID_COLUMN, *FEATURE_COLUMNS]].astype({ID_COLUMN: object})
    frame.loc[0, ID_COLUMN] = None
    frame.loc[5, ID_COLUMN] = frame.loc[4, ID_COLUMN]
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    summary = score_store(path, tmp_path / "out", churn_model, chunk_rows=100, progress=False)
    rejects = _parts(tmp_path / "out", "rejects")
    assert (summary.rows_scored, summary.rows_rejected) == (28, 2)
    assert sorted(rejects["reason"].str.split(" ").str[1]) == ["appears", "is"]
    assert _parts(tmp_path / "out")[ID_COLUMN].is_unique


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux's")
def test_this_process_reports_the_jobs_peak_memory_not_its_lifetime_peak(store, churn_model, tmp_path):
    spike = np.ones(300 * 2**20 // 8)  # 300 MiB touched, then freed: a peak the job did not cause
    del spike
    lifetime_peak = peak_rss_mib()
    summary = score_store(store, tmp_path / "out", churn_model, workers=1, progress=False)
    assert summary.peak_rss_reset
    assert summary.peak_rss_mib_by_process["this"] < lifetime_peak - 200, (
        summary.peak_rss_mib_by_process,
        lifetime_peak,
    )


def test_a_refused_call_leaves_the_folder_usable(store, churn_model, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="chunk_rows"):
        score_store(store, out, churn_model, chunk_rows=0, progress=False)
    with pytest.raises(FileNotFoundError):
        score_store(store.with_name("typo.parquet"), out, churn_model, progress=False)
    with pytest.raises(ValueError, match="runtime"):
        score_store(store, out, churn_model, runtime="gpu", progress=False)
    with pytest.raises(ValueError, match="workers"):
        score_store(store, out, churn_model, workers=0, progress=False)
    assert not out.exists()
    assert score_store(store, out, churn_model, chunk_rows=10_000, progress=False).rows_scored == 20_000


def test_a_store_without_the_feature_columns_is_refused(tmp_path, churn_model):
    path = tmp_path / "thin.parquet"
    pq.write_table(pa.table({ID_COLUMN: ["a"], "tenure": [1]}), path)
    with pytest.raises(ValueError, match="lacks the columns"):
        score_store(path, tmp_path / "out", churn_model, progress=False)


def test_parallel_output_equals_the_single_process_output_bit_for_bit(churn_model, tmp_path):
    source = build_parquet_store(60_000, 7, folder=tmp_path, row_group_rows=5_000)
    runs = {
        w: score_store(
            source, tmp_path / f"w{w}", churn_model, chunk_rows=5_000, workers=w, scored_at=AT, progress=False
        )
        for w in (1, 2, 3)
    }
    assert [runs[w].workers for w in (1, 2, 3)] == [1, 2, 3]
    assert len(runs[3].peak_rss_mib_by_process) == 3, "this process and two worker processes scored chunks"
    workers = {pid: n for pid, n in runs[3].scorers_by_process.items() if pid != "this"}
    assert len(workers) == 2 and set(workers.values()) == {1}, "one scorer per worker, reused for every chunk"
    assert len(list((tmp_path / "w1").glob("*.parquet"))) == 24
    assert same_output(tmp_path / "w1", tmp_path / "w2") and same_output(tmp_path / "w1", tmp_path / "w3")
    (tmp_path / "empty").mkdir()
    assert not same_output(tmp_path / "w1", tmp_path / "empty")


def test_a_failing_chunk_stops_the_job_and_its_workers(churn_model, tmp_path):
    source = build_parquet_store(8_000, 1, folder=tmp_path, row_group_rows=1_000)
    good = scorer_spec(churn_model, "xgboost")
    broken = ScorerSpec("xgboost", "broken", b"not a booster", good.encoding)
    tasks = [ChunkTask(plan_chunks(source, 1_000), i, str(tmp_path), broken, 0) for i in range(8)]
    with pytest.raises(Exception) as error:  # XGBoost's own error for bytes that are no model
        run_chunks(tasks, workers=2, on_result=lambda result: None)
    assert "xgboost" in type(error.value).__module__.lower()
    assert not list(tmp_path.glob("part-*.parquet")), "no chunk was written"
    assert not _live(_pool_workers()), "the pool's worker processes are gone"


def test_a_worker_killed_mid_job_fails_the_job_instead_of_hanging(churn_model, tmp_path):
    from concurrent.futures.process import BrokenProcessPool

    source = build_parquet_store(60_000, 2, folder=tmp_path, row_group_rows=2_000)
    spec = scorer_spec(churn_model, "xgboost")
    tasks = [ChunkTask(plan_chunks(source, 2_000), i, str(tmp_path), spec, 0) for i in range(30)]

    def kill_a_worker(result) -> None:
        for worker in _live(_pool_workers()):
            worker.send_signal(signal.SIGKILL)

    with pytest.raises(BrokenProcessPool):
        run_chunks(tasks, workers=2, on_result=kill_a_worker)
    assert len(list(tmp_path.glob("part-*.parquet"))) < 30


def test_a_job_killed_by_sigkill_resumes_to_the_same_files(tmp_path, churn_model):
    source = build_parquet_store(40_000, 3, folder=tmp_path, row_group_rows=2_000)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "course_lib.offline", "--source", str(source), "--out", str(out)]
    cmd += ["--runtime", "xgboost", "--chunk-rows", "2000", "--workers", "2", "--no-progress"]
    job = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(
            lambda: len(glob.glob(str(out / "part-*.parquet"))) >= 3 or job.poll() is not None,
            timeout_s=300,
            what="three finished chunks",
        )
        family = psutil.Process(job.pid).children(recursive=True)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
    assert job.returncode == -signal.SIGKILL, "the job was still running when it was killed"
    wait_until(
        lambda: not _live(family), timeout_s=30, what="the killed job's worker processes to exit with it"
    )
    done_before = len(glob.glob(str(out / "part-*.parquet")))
    assert 3 <= done_before < 20 and not (out / "_SUCCESS").exists()
    recorded_at = dt.datetime.fromisoformat(recorded_plan(out)["scored_at"])
    summary = score_store(source, out, churn_model, runtime="xgboost", chunk_rows=2_000, progress=False)
    assert summary.chunks_resumed == done_before and summary.rows_read == 40_000
    assert summary.scored_at == recorded_at.isoformat(), "resumed parts carry the job's first start time"
    scores = _parts(out)
    assert len(scores) == 40_000 and scores[ID_COLUMN].is_unique and (out / "_SUCCESS").exists()
    assert not list(out.glob(".*.tmp")), "the killed run's temporary files are gone"
    reference = tmp_path / "uninterrupted"
    score_store(
        source,
        reference,
        churn_model,
        runtime="xgboost",
        chunk_rows=2_000,
        scored_at=recorded_at,
        progress=False,
    )
    assert same_output(out, reference)


def test_a_job_folder_refuses_other_settings(store, churn_model, tmp_path):
    score_store(store, tmp_path / "out", churn_model, chunk_rows=10_000, progress=False)
    with pytest.raises(ValueError, match="other settings"):
        score_store(store, tmp_path / "out", churn_model, chunk_rows=5_000, progress=False)
    with pytest.raises(ValueError, match="other settings"):  # a resumed job never mixes runtimes
        score_store(
            store, tmp_path / "out", churn_model, chunk_rows=10_000, runtime="onnxruntime", progress=False
        )
    with pytest.raises(ValueError, match="scored_at"):
        score_store(store, tmp_path / "out", churn_model, chunk_rows=10_000, scored_at=AT, progress=False)


def test_dask_writes_the_single_process_files_and_resumes_its_folders(churn_model, tmp_path):
    from course_lib.offline.dask_job import local_cluster, score_on_dask

    source = build_parquet_store(100_000, 0, folder=tmp_path, row_group_rows=25_000)
    single = score_store(
        source, tmp_path / "single", churn_model, chunk_rows=25_000, workers=1, scored_at=AT, progress=False
    )
    half = tmp_path / "half"  # a score_store folder with two of its four parts, finished on Dask
    score_store(source, half, churn_model, chunk_rows=25_000, workers=1, scored_at=AT, progress=False)
    for i in (1, 3):
        (half / f"part-{i:05d}.parquet").unlink()
    with local_cluster(2) as client:
        result = score_on_dask(source, tmp_path / "dask", churn_model, client=client, scored_at=AT)
        resumed = score_on_dask(source, half, churn_model, client=client)
    assert result.rows_scored == single.rows_scored == 100_000 and result.partitions == 4
    assert set(result.sessions_per_worker.values()) == {1}, "one scorer per worker"
    assert set(result.stage_s) == {"read", "check", "encode", "model", "write"}
    assert same_output(tmp_path / "dask", tmp_path / "single")
    assert (resumed.chunks_resumed, resumed.rows_read) == (2, 50_000)
    assert same_output(half, tmp_path / "single")
    assert (tmp_path / "dask" / "_SUCCESS").is_file()
    score_resumable(pq.read_table(source), tmp_path / "core", chunk_scorer(churn_model), chunk_rows=25_000)
    core, dask = _parts(tmp_path / "core"), _parts(tmp_path / "dask")
    assert list(core[ID_COLUMN]) == list(dask[ID_COLUMN])
    assert np.array_equal(core["churn_probability"].to_numpy(), dask["churn_probability"].to_numpy())


def test_dask_runs_twice_on_one_client_and_refuses_a_foreign_folder(churn_model, tmp_path):
    from course_lib.offline.dask_job import local_cluster, score_on_dask

    small = build_parquet_store(6_000, 1, folder=tmp_path, row_group_rows=2_000)
    other = build_parquet_store(4_000, 2, folder=tmp_path, row_group_rows=2_000)
    with local_cluster(1) as client:
        first = score_on_dask(small, tmp_path / "a", churn_model, client=client, runtime="onnxruntime")
        second = score_on_dask(other, tmp_path / "b", churn_model, client=client)
        with pytest.raises(ValueError, match="other settings"):
            score_on_dask(other, tmp_path / "a", churn_model, client=client)
        with pytest.raises(ValueError, match=r"\.parquet store"):
            score_on_dask(tmp_path / "a" / "_job.json", tmp_path / "c", churn_model, client=client)
    assert (first.rows_scored, second.rows_scored) == (6_000, 4_000)
    assert set(first.sessions_per_worker.values()) == {1}
    expected = churn_model.pipeline.predict_proba(pq.read_table(other).to_pandas()[list(FEATURE_COLUMNS)])[
        :, 1
    ]
    assert np.array_equal(_parts(tmp_path / "b")["churn_probability"].to_numpy(), expected)


def test_every_triton_config_parses_into_modelconfig(churn_model, tmp_path):
    model = pipeline_to_onnx(churn_model.pipeline)
    paths = export_triton_repository(
        tmp_path,
        model,
        churn_model.pipeline,
        max_batch_size=32,
        preferred_batch_sizes=(8, 16),
        max_queue_delay_us=500,
    )
    onnx_cfg, fil_cfg = parse_config(paths["churn"]), parse_config(paths["churn_fil"])
    assert onnx_cfg.platform == "onnxruntime_onnx" and onnx_cfg.max_batch_size == 32
    assert list(onnx_cfg.dynamic_batching.preferred_batch_size) == [8, 16]
    assert onnx_cfg.dynamic_batching.max_queue_delay_microseconds == 500
    assert {i.name for i in onnx_cfg.input} == set(FEATURE_COLUMNS)
    assert fil_cfg.backend == "fil" and fil_cfg.parameters["model_type"].string_value == "xgboost_json"
    assert fil_cfg.input[0].dims == [40]
    assert (
        onnx.load(str(tmp_path / "churn" / "1" / "model.onnx")).graph.input[0].name
        == model.graph.input[0].name
    )
    assert (tmp_path / "churn_fil" / "1" / "xgboost.json").stat().st_size > 0


def test_triton_knobs_are_checked_and_unknown_fields_cannot_parse(churn_model, tmp_path):
    model = pipeline_to_onnx(churn_model.pipeline)
    with pytest.raises(ValueError, match="preferred_batch_sizes"):
        onnx_config(model, max_batch_size=8, preferred_batch_sizes=(16,))
    with pytest.raises(ValueError, match="max_queue_delay_us"):
        fil_config(40, max_queue_delay_us=-1)
    with pytest.raises(ValueError, match="instance_count"):
        fil_config(40, instance_count=True)
    bad = tmp_path / "config.pbtxt"
    bad.write_text('name: "x"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_ms: 3 }\n')
    with pytest.raises(text_format.ParseError):
        parse_config(bad)


def test_the_benchmark_records_every_check_it_prints(tmp_path):
    record = tmp_path / "batch_scoring.json"
    cmd = [sys.executable, "benchmarks/batch_scoring.py", "--customers", "20000"]
    cmd += ["--memory-customers", "30000", "--repeats", "1", "--out", str(record)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    for line in ("runtime candidates", "=== verdicts", "byte for byte: True", "30,000 customers"):
        assert line in done.stdout
    data = json.loads(record.read_text())
    assert data["schema"] == "inference-workbook/batch-scoring/1" and data["usable_cores"] >= 1
    assert {"measured_at", "cpu", "load_average_1m", "runtime", "processes", "floor_rows_per_s"} <= set(data)
    assert len(data["runs"]) == 2 and all(
        r["rows_per_s"] > 0 and r["floor_rows_per_s"] > 0 for r in data["runs"]
    )
    assert {c["runtime"] for c in data["candidates"]} == {"xgboost", "onnxruntime", "treelite"}
    assert data["checks"]["parallel_equals_single_process"] and data["checks"]["resumed_equals_uninterrupted"]
    assert data["checks"]["workers_exited_after_kill"] and data["memory_run"]["rows_read"] == 30_000


def test_the_command_starts_the_fork_server_only_where_workers_may_be_needed():
    from course_lib.offline.__main__ import _one_process

    for argv in (
        ["--workers", "1"],
        ["--workers=1"],
        ["--work", "1"],
        ["--workers=01"],
        ["--workers", "x"],
        ["--help"],
        ["-h"],
        ["--source", "s.parquet", "--workers"],
    ):
        assert _one_process(argv), argv
    assert not _one_process(["--source", "s.parquet", "--workers", "2"])


PROBE = """
import json, sys
from course_lib.offline.workers import worker_pool

def probe():
    import xgboost.compat
    before = sorted(m for m in ("xgboost", "sklearn", "course_lib.offline.chunk") if m in sys.modules)
    import sklearn  # still importable in a worker: the mark that hid it is gone
    return before, xgboost.compat.SKLEARN_INSTALLED, sklearn.__name__

if __name__ == "__main__":
    pool = worker_pool(1)
    print(json.dumps(pool.submit(probe).result()))
    pool.shutdown()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="workers are spawned where there is no fork server")
def test_workers_start_with_xgboost_imported_and_scikit_learn_left_out(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    )
    before, sklearn_wrappers, imported = json.loads(run.stdout.strip().splitlines()[-1])
    assert before == ["course_lib.offline.chunk", "xgboost"], (
        "the fork server preloaded both, not scikit-learn"
    )
    assert sklearn_wrappers is False and imported == "sklearn"


def test_importing_the_worker_imports_elsewhere_keeps_xgboosts_scikit_learn_wrappers():
    code = "import course_lib.offline.worker_imports, xgboost.compat; print(xgboost.compat.SKLEARN_INSTALLED)"
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert run.stdout.strip() == "True", "only the fork server's preload leaves scikit-learn out"
