"""The batch-scoring job: chunking, resume after a crash, rejects with reasons, Dask, Triton configs."""

from __future__ import annotations

import glob
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.protobuf import text_format

from course_lib.churn.data import CATEGORICAL_LEVELS, FEATURE_COLUMNS, ID_COLUMN, make_customers
from course_lib.churn.export import pipeline_to_onnx
from course_lib.core.waiting import wait_until
from course_lib.offline.job import (
    build_parquet_store,
    iter_store_chunks,
    make_scorer,
    row_problems,
    score_store,
)
from course_lib.offline.triton_repository import (
    export_triton_repository,
    fil_config,
    onnx_config,
    parse_config,
)
from course_lib.serving.feature_store import build_feature_store

REPO = Path(__file__).resolve().parents[1]


def _parts(folder: Path, prefix: str = "part") -> pd.DataFrame:
    files = sorted(glob.glob(str(folder / f"{prefix}-*.parquet")))
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


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
    assert np.abs(got["churn_probability"].to_numpy() - one_shot).max() <= 1e-6
    assert set(got["model_version"]) == {churn_model.model_version}
    assert json.loads((tmp_path / "out" / "_SUCCESS").read_text())["rows_scored"] == 20_000


def test_parquet_store_matches_the_sqlite_store_population(tmp_path):
    pq_path = build_parquet_store(3_000, 5, folder=tmp_path)
    sql_path = build_feature_store(3_000, 5, folder=tmp_path).path
    a = pd.concat(f for _, f in iter_store_chunks(pq_path, 1_000))
    b = pd.concat(f for _, f in iter_store_chunks(sql_path, 1_000))
    as_text = {c: str for c in (ID_COLUMN, *CATEGORICAL_LEVELS)}
    expected = make_customers(3_000, 5)[[ID_COLUMN, *FEATURE_COLUMNS]].astype(as_text)
    for got in (a, b):
        pd.testing.assert_frame_equal(got.reset_index(drop=True).astype(as_text), expected, check_dtype=False)


def test_onnx_and_xgboost_runtimes_agree(store, churn_model):
    _, chunk = next(iter_store_chunks(store, 4_000))
    X = chunk[list(FEATURE_COLUMNS)]
    xgb = make_scorer(churn_model, "xgboost", threads=2)(X)
    ort = make_scorer(churn_model, "onnxruntime")(X)
    assert np.abs(xgb - ort).max() <= 1e-5
    assert np.array_equal(xgb, churn_model.pipeline.predict_proba(X)[:, 1])
    with pytest.raises(ValueError, match="runtime"):
        make_scorer(churn_model, "tensorrt")
    with pytest.raises(ValueError, match="threads"):
        make_scorer(churn_model, "xgboost", threads=0)


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


def test_a_refused_call_leaves_the_folder_usable(store, churn_model, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="chunk_rows"):
        score_store(store, out, churn_model, chunk_rows=0, progress=False)
    with pytest.raises(FileNotFoundError):
        score_store(store.with_name("typo.parquet"), out, churn_model, progress=False)
    with pytest.raises(ValueError, match="runtime"):
        score_store(store, out, churn_model, runtime="gpu", progress=False)
    assert score_store(store, out, churn_model, chunk_rows=10_000, progress=False).rows_scored == 20_000


def test_a_store_without_the_feature_columns_is_refused(tmp_path, churn_model):
    path = tmp_path / "thin.parquet"
    pq.write_table(pa.table({ID_COLUMN: ["a"], "tenure": [1]}), path)
    with pytest.raises(ValueError, match="lacks the columns"):
        score_store(path, tmp_path / "out", churn_model, progress=False)


def test_row_problems_names_column_value_and_range():
    frame = make_customers(5, 2)[[ID_COLUMN, *FEATURE_COLUMNS]]
    frame["tenure"] = frame["tenure"].astype(float)
    frame.loc[1, "tenure"] = 2.5
    reasons = row_problems(frame)
    assert reasons[0] is None and "tenure=2.5" in reasons[1] and "integer" in reasons[1]


def test_resume_after_a_crash_gives_exactly_one_row_per_customer(tmp_path, churn_model):
    source = build_parquet_store(30_000, 3, folder=tmp_path, row_group_rows=2_000)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "course_lib.offline", "--source", str(source), "--out", str(out),
           "--runtime", "xgboost", "--chunk-rows", "2000", "--no-progress"]  # fmt: skip
    job = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: len(glob.glob(str(out / "part-*.parquet"))) >= 2 or job.poll() is not None,
                   timeout_s=300, what="two finished chunks")  # fmt: skip
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
    done_before = len(glob.glob(str(out / "part-*.parquet")))
    assert not (out / "_SUCCESS").exists() or done_before == 15
    summary = score_store(source, out, churn_model, runtime="xgboost", chunk_rows=2_000, progress=False)
    scores = _parts(out)
    assert summary.chunks_resumed == done_before
    assert len(scores) == 30_000 and scores[ID_COLUMN].is_unique
    assert (out / "_SUCCESS").exists()


def test_a_job_folder_refuses_other_settings(store, churn_model, tmp_path):
    score_store(store, tmp_path / "out", churn_model, chunk_rows=10_000, progress=False)
    with pytest.raises(ValueError, match="other settings"):
        score_store(store, tmp_path / "out", churn_model, chunk_rows=5_000, progress=False)
    with pytest.raises(ValueError, match="other settings"):  # a resumed job never mixes runtimes
        score_store(
            store, tmp_path / "out", churn_model, chunk_rows=10_000, runtime="onnxruntime", progress=False
        )


def test_dask_result_equals_the_single_process_result(churn_model, tmp_path):
    from course_lib.offline.dask_job import local_cluster, score_on_dask

    source = build_parquet_store(100_000, 0, folder=tmp_path, row_group_rows=25_000)
    single = score_store(
        source, tmp_path / "single", churn_model, chunk_rows=50_000, threads=2, progress=False
    )
    onnx_bytes = pipeline_to_onnx(churn_model.pipeline).SerializeToString()
    with local_cluster(2) as client:
        result = score_on_dask(source, tmp_path / "dask", onnx_bytes, model_version=churn_model.model_version,
                               client=client)  # fmt: skip
    assert result.rows_scored == single.rows_scored == 100_000 and result.partitions == 4
    assert set(result.sessions_per_worker.values()) == {1}, "one ONNX Runtime session per worker"
    a, b = _parts(tmp_path / "dask"), _parts(tmp_path / "single")
    assert list(a[ID_COLUMN]) == list(b[ID_COLUMN])
    assert np.abs(a["churn_probability"].to_numpy() - b["churn_probability"].to_numpy()).max() <= 1e-6
    assert (tmp_path / "dask" / "_SUCCESS").is_file()


def test_dask_runs_twice_on_one_client_and_refuses_a_foreign_folder(churn_model, tmp_path):
    from course_lib.offline.dask_job import local_cluster, score_on_dask

    small = build_parquet_store(6_000, 1, folder=tmp_path, row_group_rows=2_000)
    other = build_parquet_store(4_000, 2, folder=tmp_path, row_group_rows=2_000)
    with local_cluster(1) as client:
        first = score_on_dask(small, tmp_path / "a", churn_model.pipeline, model_version="v1", client=client,
                              runtime="xgboost")  # fmt: skip
        second = score_on_dask(other, tmp_path / "b", churn_model.pipeline, model_version="v1", client=client,
                               runtime="xgboost")  # fmt: skip
        with pytest.raises(ValueError, match="other settings"):
            score_on_dask(other, tmp_path / "a", churn_model.pipeline, model_version="v2", client=client,
                          runtime="xgboost")  # fmt: skip
    assert (first.rows_scored, second.rows_scored) == (6_000, 4_000)
    expected = churn_model.pipeline.predict_proba(pq.read_table(other).to_pandas()[list(FEATURE_COLUMNS)])[
        :, 1
    ]
    assert np.array_equal(_parts(tmp_path / "b")["churn_probability"].to_numpy(), expected)


def test_every_triton_config_parses_into_modelconfig(churn_model, tmp_path):
    model = pipeline_to_onnx(churn_model.pipeline)
    paths = export_triton_repository(tmp_path, model, churn_model.pipeline, max_batch_size=32,
                                     preferred_batch_sizes=(8, 16), max_queue_delay_us=500)  # fmt: skip
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
