"""The batch job's row checks, encoding and runtimes on Arrow chunks (course_lib.offline.rows / scorers / compiled)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from course_lib.churn.data import CATEGORICAL_LEVELS, FEATURE_COLUMNS, ID_COLUMN, make_customers
from course_lib.core.vocabulary import BATCH_RUNTIMES
from course_lib.offline import compiled
from course_lib.offline.rows import Encoding, check_rows, encode_rows, row_problems
from course_lib.offline.scorers import choose_runtime, make_scorer, runtime_unavailable, scorer_spec
from course_lib.offline.store import build_parquet_store, plan_chunks, read_chunk


@pytest.fixture(scope="module")
def chunk(tmp_path_factory) -> pa.Table:
    store = build_parquet_store(6_000, 4, folder=tmp_path_factory.mktemp("rows"), row_group_rows=2_500)
    return read_chunk(plan_chunks(store, 6_000), 0)


def _bad_frame() -> pd.DataFrame:
    frame = make_customers(40, 1)[[ID_COLUMN, *FEATURE_COLUMNS]]
    frame = frame.astype({c: object for c in (ID_COLUMN, *CATEGORICAL_LEVELS)} | {"senior_citizen": "Int64"})
    frame["tenure"] = frame["tenure"].astype(float)
    frame.loc[1, "tenure"] = 2.5
    frame.loc[3, "tenure"] = -5
    frame.loc[7, "monthly_charges"] = np.inf
    frame.loc[9, "monthly_charges"] = 500.0
    frame.loc[11, "contract"] = "Lifetime"
    frame.loc[12, "payment_method"] = None
    frame.loc[13, "senior_citizen"] = None
    frame.loc[15, "tenure"] = -1  # two problems: the first in schema order (tenure before contract) wins
    frame.loc[15, "contract"] = "Lifetime"
    frame.loc[17, "total_charges"] = np.nan  # missing is allowed
    frame.loc[20, ID_COLUMN] = None
    frame.loc[22, ID_COLUMN] = frame.loc[21, ID_COLUMN]
    return frame


def test_the_chunk_is_read_with_dictionary_categoricals(chunk):
    assert chunk.num_rows == 6_000
    for name in CATEGORICAL_LEVELS:
        assert pa.types.is_dictionary(chunk.schema.field(name).type), name


def test_encoding_equals_the_pipelines_own_transform(chunk, churn_model):
    encoding = Encoding.from_pipeline(churn_model.pipeline)
    checked = check_rows(chunk)
    X = encode_rows(checked, encoding)
    expected = churn_model.pipeline.named_steps["preprocess"].transform(
        chunk.to_pandas()[list(FEATURE_COLUMNS)]
    )
    assert encoding.width == 40 and X.dtype == np.float32 and X.flags["C_CONTIGUOUS"]
    assert np.array_equal(X, expected.astype(np.float32), equal_nan=True)
    assert np.isnan(X).any(), "missing total_charges stay NaN for the model"
    buffer = np.full((7_000, 40), -1.0, dtype=np.float32)  # a reused buffer, larger than the chunk
    into = encode_rows(checked, encoding, out=buffer)
    assert (
        np.shares_memory(into, buffer) and into.shape == X.shape and np.array_equal(into, X, equal_nan=True)
    )
    with pytest.raises(ValueError, match="out must be"):
        encode_rows(checked, encoding, out=np.empty((100, 40), dtype=np.float32))


def test_each_bad_row_gets_the_first_violation_in_schema_order():
    reasons = row_problems(_bad_frame())
    assert "tenure=2.5" in reasons[1] and "integer" in reasons[1]
    assert reasons[3].startswith("tenure=-5.0: must be an integer in [0, 72]")
    assert reasons[7].startswith("monthly_charges=inf: must be a finite number")
    assert reasons[9].startswith("monthly_charges=500.0")
    assert reasons[11].startswith("contract='Lifetime': must be one of ['Month-to-month'")
    assert reasons[12].startswith("payment_method=None: must be one of")
    assert reasons[13].startswith("senior_citizen=None: must be an integer in [0, 1]")
    assert reasons[15].startswith("tenure=-1.0:")
    assert reasons[20] == f"{ID_COLUMN} is missing"
    assert reasons[22] == f"{ID_COLUMN} appears earlier in the same chunk"
    flagged = {i for i, r in enumerate(reasons) if r is not None}
    assert flagged == {1, 3, 7, 9, 11, 12, 13, 15, 20, 22}


def test_bad_rows_are_left_out_of_the_encoded_matrix(churn_model):
    frame = _bad_frame()
    table = pa.Table.from_pandas(
        frame.assign(**{ID_COLUMN: frame[ID_COLUMN].astype("string")}), preserve_index=False
    )
    checked = check_rows(table)
    X = encode_rows(checked, Encoding.from_pipeline(churn_model.pipeline))
    good = frame.drop(index=checked.bad_rows.tolist())
    expected = churn_model.pipeline.named_steps["preprocess"].transform(good[list(FEATURE_COLUMNS)])
    assert X.shape == (len(frame) - 10, 40)
    assert np.array_equal(X, expected.astype(np.float32), equal_nan=True)


def test_repeated_ids_are_found_in_any_order():
    ids = pa.array(["c", "a", "b", "a", None, "c", "d", None, "b"])
    table = make_customers(9, 0)[list(FEATURE_COLUMNS)]
    checked = check_rows(pa.Table.from_pandas(table, preserve_index=False).append_column(ID_COLUMN, ids))
    assert checked.bad_rows.tolist() == [3, 4, 5, 7, 8]
    assert checked.reasons == [
        f"{ID_COLUMN} appears earlier in the same chunk",
        f"{ID_COLUMN} is missing",
        f"{ID_COLUMN} appears earlier in the same chunk",
        f"{ID_COLUMN} is missing",
        f"{ID_COLUMN} appears earlier in the same chunk",
    ]


def test_columns_of_the_wrong_type_are_rejected_not_coerced(chunk):
    n = chunk.num_rows
    as_text = chunk.set_column(chunk.schema.get_field_index("tenure"), "tenure", pa.array(["12"] * n))
    as_bool = chunk.set_column(chunk.schema.get_field_index("partner"), "partner", pa.array([True] * n))
    as_int = chunk.set_column(chunk.schema.get_field_index("contract"), "contract", pa.array([1] * n))
    plain = chunk.set_column(
        chunk.schema.get_field_index("contract"), "contract", chunk["contract"].cast(pa.string())
    )
    assert (
        check_rows(as_text).reasons[0] == "tenure='12': must be an integer in [0, 72] (or null for missing)"
    )
    assert check_rows(as_bool).reasons[0] == "partner=True: must be an integer in [0, 1]"
    assert check_rows(as_int).reasons[0].startswith("contract=1: must be one of")
    assert len(check_rows(plain).bad_rows) == 0, "plain strings are dictionary-encoded, not refused"


def test_xgboost_scores_equal_predict_proba_bit_for_bit(chunk, churn_model):
    X = chunk.to_pandas()[list(FEATURE_COLUMNS)]
    expected = churn_model.pipeline.predict_proba(X)[:, 1]
    assert np.array_equal(make_scorer(churn_model, "xgboost")(X), expected)
    assert np.array_equal(make_scorer(churn_model, "xgboost", threads=2)(X), expected)


@pytest.mark.parametrize("runtime", ["onnxruntime", "treelite"])
def test_other_runtimes_agree_with_xgboost(chunk, churn_model, runtime):
    if runtime_unavailable(runtime):
        pytest.skip(runtime_unavailable(runtime))
    X = chunk.to_pandas()[list(FEATURE_COLUMNS)]
    got = make_scorer(churn_model, runtime)(X)
    assert got.dtype == np.float64 and got.shape == (len(X),)
    assert np.abs(got - churn_model.pipeline.predict_proba(X)[:, 1]).max() <= 1e-5


def test_scorer_arguments_are_checked(churn_model):
    with pytest.raises(ValueError, match="runtime"):
        make_scorer(churn_model, "tensorrt")
    with pytest.raises(ValueError, match="threads"):
        make_scorer(churn_model, "xgboost", threads=0)
    with pytest.raises(ValueError, match="row 0 is outside the feature schema"):
        make_scorer(churn_model, "xgboost")(_bad_frame().iloc[[3]][list(FEATURE_COLUMNS)])


def test_choose_runtime_times_every_available_runtime(chunk, churn_model):
    best, table = choose_runtime(churn_model, chunk, rounds=2)
    assert list(table.index) == list(BATCH_RUNTIMES)
    timed = table.dropna(subset=["median_us"])
    assert best == timed["median_us"].idxmin() and {"xgboost", "onnxruntime"} <= set(timed.index)
    assert (timed["rows_per_s"] - 1e6 / timed["us_per_item"]).abs().max() < 1e-6
    assert (timed["max_abs_diff"] <= 1e-5).all() and table.loc["xgboost", "max_abs_diff"] == 0.0


def test_without_a_c_compiler_compiled_trees_are_left_out(chunk, churn_model, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    assert compiled.c_compiler() is None
    assert "no C compiler" in runtime_unavailable("treelite")
    with pytest.raises(RuntimeError, match="no C compiler"):
        scorer_spec(churn_model, "treelite")
    best, table = choose_runtime(churn_model, chunk.slice(0, 500), rounds=1)
    assert np.isnan(table.loc["treelite", "median_us"]) and "no C compiler" in table.loc["treelite", "note"]
    assert best in ("xgboost", "onnxruntime")


def test_compiled_trees_are_built_once_and_say_nothing(churn_model, tmp_path, capfd):
    if runtime_unavailable("treelite"):
        pytest.skip(runtime_unavailable("treelite"))
    spec = scorer_spec(churn_model, "xgboost")
    first, log = compiled.compile_trees(spec.artifact, churn_model.model_version, folder=tmp_path)
    again, log_again = compiled.compile_trees(spec.artifact, churn_model.model_version, folder=tmp_path)
    assert first == again and first.is_file() and log_again == ""
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == "", "native messages are captured, not printed"
    assert isinstance(log, str)
