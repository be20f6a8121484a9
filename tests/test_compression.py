"""course_lib.optimize.compression._variant: size arithmetic, the FP16 Cast repair, INT8 variants, and what cannot be quantized."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from course_lib.churn.export import OnnxChurnScorer, make_session, pipeline_to_onnx
from course_lib.churn.model import features, labels
from course_lib.churn.neural import mlp_n_parameters, train_mlp_churn_model
from course_lib.optimize.compression import (
    BYTES_PER_PARAMETER,
    FeedsCalibrationReader,
    NotQuantizableError,
    activation_ranges,
    convert_to_fp16,
    expected_size_bytes,
    graph_changes,
    make_variant,
    quantizability_report,
    size_table,
)

#: FP16 stores about 3 significant decimal digits; a churn probability may move by this much.
FP16_ATOL = 2e-3


def _cast_mul_graph(input_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """x -> Cast(to=FLOAT) -> Mul by [1, 2, 3] -> y: the smallest graph that trips the upstream converter."""
    x = helper.make_tensor_value_info("x", input_type, [None, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])
    w = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], dtype=np.float32), "w")
    nodes = [
        helper.make_node("Cast", ["x"], ["x_float"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Mul", ["x_float", "w"], ["y"], name="mul"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "cast_mul", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


# --- size arithmetic ------------------------------------------------------------------------------


def test_source_size_arithmetic_gives_400_200_100_mb_for_100m_parameters():
    table = size_table(100_000_000)
    assert table["expected_mb"].to_dict() == {"fp32": 400.0, "fp16": 200.0, "int8": 100.0}


@given(st.integers(min_value=1, max_value=10**12), st.sampled_from(sorted(BYTES_PER_PARAMETER)))
def test_expected_size_is_parameters_times_bytes_per_parameter(n, precision):
    assert expected_size_bytes(n, precision) == n * BYTES_PER_PARAMETER[precision]
    assert expected_size_bytes(n, "fp16") * 2 == expected_size_bytes(n, "fp32")


def test_size_table_reports_real_files_bytes_per_parameter():
    table = size_table(1000, {"fp32": 4100, "int8-dynamic": 1300})
    assert table.loc["fp32", "file_bytes_per_parameter"] == pytest.approx(4.1)
    assert table.loc["int8-dynamic", "bytes_per_parameter"] == 1
    assert table.loc["int8-dynamic", "file_vs_expected"] == pytest.approx(1.3)


@pytest.mark.parametrize(
    ("n", "precision", "match"),
    [
        (0, "fp32", "n_parameters"),
        (1.5, "fp32", "n_parameters"),
        (True, "fp32", "n_parameters"),
        (10, "int4", "precision"),
    ],
)
def test_bad_size_arithmetic_input_raises(n, precision, match):
    with pytest.raises(ValueError, match=match):
        expected_size_bytes(n, precision)


def test_variant_name_without_precision_prefix_raises():
    with pytest.raises(ValueError, match="must start with a precision"):
        size_table(10, {"quantized": 100})
    with pytest.raises(ValueError, match=r"file_bytes\['fp32'\] must be an integer >= 1, got 0"):
        size_table(10, {"fp32": 0})


# --- FP16 and the explicit-Cast bug ---------------------------------------------------------------


def test_upstream_converter_alone_breaks_the_cast_mul_graph():
    """Documents microsoft/onnxconverter-common#320: if this starts passing, upstream fixed it."""
    from onnxconverter_common import float16

    broken = float16.convert_float_to_float16(_cast_mul_graph(), keep_io_types=True)
    with pytest.raises(Exception, match="Type"):
        ort.InferenceSession(broken.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("keep_io_types", [True, False])
def test_cast_mul_graph_converts_to_fp16_loads_and_returns_1_2_3(keep_io_types):
    fp16 = convert_to_fp16(_cast_mul_graph(), keep_io_types=keep_io_types)
    assert any(t.data_type == TensorProto.FLOAT16 for t in fp16.graph.initializer)
    x = np.ones((1, 3), dtype=np.float32 if keep_io_types else np.float16)
    out = _run(fp16, x)
    np.testing.assert_array_equal(out, [[1.0, 2.0, 3.0]])
    assert out.dtype == (np.float32 if keep_io_types else np.float16)


def test_cast_from_int64_is_retargeted_to_fp16():
    fp16 = convert_to_fp16(_cast_mul_graph(TensorProto.INT64))
    meta = {p.key: p.value for p in fp16.metadata_props}
    assert meta["fp16_retargeted_casts"] == "1"
    np.testing.assert_array_equal(_run(fp16, np.ones((2, 3), dtype=np.int64)), [[1, 2, 3], [1, 2, 3]])


def test_converting_an_fp16_model_again_raises():
    with pytest.raises(ValueError, match="already holds FLOAT16"):
        convert_to_fp16(convert_to_fp16(_cast_mul_graph(), keep_io_types=False))
    with pytest.raises(TypeError, match="ModelProto"):
        convert_to_fp16(b"not a model")


def _shared_weight_graph() -> onnx.ModelProto:
    """onnxconverter-common PR #329: ``a = Add(x, B)``, ``Y = Mul(a, B)``, one float32 initializer B."""
    weight = numpy_helper.from_array(np.array([1.5, 2.0, -0.5], dtype=np.float32), "B")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "B"], ["a"], name="add"),
            helper.make_node("Mul", ["a", "B"], ["Y"], name="mul"),
        ],
        "shared_weight",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_upstream_converter_alone_breaks_the_shared_weight_graph():
    """Documents onnxconverter-common PR #329: if this starts passing, upstream fixed it."""
    from onnxconverter_common import float16

    broken = float16.convert_float_to_float16(
        _shared_weight_graph(), keep_io_types=True, op_block_list=["Add"]
    )
    onnx.checker.check_model(broken)  # passes the checker ...
    with pytest.raises(Exception, match="bound to different types"):  # ... and does not load
        ort.InferenceSession(broken.SerializeToString(), providers=["CPUExecutionProvider"])


def test_a_weight_shared_by_an_fp32_and_an_fp16_op_gets_its_own_cast():
    fp16 = convert_to_fp16(_shared_weight_graph(), op_block_list=["Add"])
    meta = {p.key: p.value for p in fp16.metadata_props}
    assert meta["fp16_shared_initializer_casts"] == "1"
    x = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]], dtype=np.float32)
    b = np.array([1.5, 2.0, -0.5], dtype=np.float32)
    np.testing.assert_allclose(_run(fp16, x), (x + b) * b, rtol=1e-3)  # Add in FP32, Mul in FP16
    (weight,) = fp16.graph.initializer
    assert weight.data_type == TensorProto.FLOAT  # the FP32 op still reads the FP32 value


def test_a_conversion_that_does_not_load_is_refused_before_anything_is_written(monkeypatch):
    import course_lib.optimize.compression._fp16 as fp16_module

    monkeypatch.setattr(fp16_module, "_cast_shared_fp32_initializers", lambda model: 0)  # repair off
    with pytest.raises(ValueError, match="cannot load"):
        convert_to_fp16(_shared_weight_graph(), op_block_list=["Add"])


# --- the tree ensemble cannot be quantized ----------------------------------------------------------


def test_tree_graph_is_reported_not_quantizable(onnx_model):
    report = quantizability_report(onnx_model)
    assert not report.quantizable
    assert report.weight_nodes == ()
    assert report.attribute_parameters["TreeEnsembleClassifier"] > 1000
    assert "not quantizable" in report.reason and "TreeEnsembleClassifier" in report.reason


def test_make_variant_refuses_int8_for_the_tree_graph(onnx_model, tmp_path):
    src = tmp_path / "tree.onnx"
    onnx.save(onnx_model, src)
    with pytest.raises(NotQuantizableError) as info:
        make_variant(src, tmp_path / "tree_int8.onnx", "int8-dynamic")
    assert not info.value.report.quantizable
    assert not (tmp_path / "tree_int8.onnx").exists()


def test_onnx_runtime_dynamic_quantizer_returns_the_tree_graph_unchanged(onnx_model, tmp_path):
    from onnxruntime.quantization import quantize_dynamic

    src, dst = tmp_path / "tree.onnx", tmp_path / "tree_dyn.onnx"
    onnx.save(onnx_model, src)
    quantize_dynamic(str(src), str(dst))
    changes = graph_changes(onnx_model, dst)
    assert changes["unchanged"], changes


def test_fp16_conversion_keeps_tree_ensemble_fp32_and_only_adds_casts(onnx_model):
    fp16 = convert_to_fp16(onnx_model)
    changes = graph_changes(onnx_model, fp16)
    assert set(changes["ops_added"]) == {"Cast"}
    assert changes["ops_removed"] == {}
    tree = next(n for n in fp16.graph.node if n.op_type == "TreeEnsembleClassifier")
    original = next(n for n in onnx_model.graph.node if n.op_type == "TreeEnsembleClassifier")
    assert list(tree.attribute) == list(original.attribute)  # thresholds and leaf values untouched
    assert tree.input[0] != original.input[0]  # it now reads a Cast back to FP32 inserted before it


# --- MLP variants ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp_files(churn_model, tmp_path_factory):
    """A small MLP on the course split, exported, plus its FP16 and INT8 variants."""
    folder = tmp_path_factory.mktemp("mlp")
    pipe = train_mlp_churn_model(churn_model.split.train, hidden_layer_sizes=(64,), max_iter=30)
    fp32 = folder / "fp32.onnx"
    onnx.save(pipeline_to_onnx(pipe), fp32)
    calib = OnnxChurnScorer(make_session(fp32)).feeds(features(churn_model.split.valid))
    paths = {
        "fp32": fp32,
        "fp16": make_variant(fp32, folder / "fp16.onnx", "fp16"),
        "int8-dynamic": make_variant(fp32, folder / "int8_dynamic.onnx", "int8-dynamic"),
        "int8-static-minmax": make_variant(
            fp32,
            folder / "int8_minmax.onnx",
            "int8-static",
            calibration_feeds=calib,
            calibration_method="minmax",
        ),
        "int8-static-entropy": make_variant(
            fp32,
            folder / "int8_entropy.onnx",
            "int8-static",
            calibration_feeds=calib,
            calibration_method="entropy",
        ),
    }
    return pipe, paths, calib


def test_mlp_graph_is_quantizable(mlp_files):
    pipe, paths, _ = mlp_files
    report = quantizability_report(paths["fp32"])
    assert report.quantizable and len(report.weight_nodes) == 2
    assert report.n_weight_parameters == sum(w.size for w in pipe.named_steps["mlp"].coefs_)


def test_every_variant_loads_and_fp16_matches_fp32_within_tolerance(mlp_files, churn_model):
    pipe, paths, _ = mlp_files
    X = features(churn_model.split.test)
    probs = {
        name: OnnxChurnScorer(make_session(p)).predict_proba(X).astype(float) for name, p in paths.items()
    }
    np.testing.assert_allclose(probs["fp32"], pipe.predict_proba(X)[:, 1], atol=1e-5)
    assert np.max(np.abs(probs["fp16"] - probs["fp32"])) <= FP16_ATOL
    y = labels(churn_model.split.test)
    from sklearn.metrics import roc_auc_score

    auc32 = roc_auc_score(y, probs["fp32"])
    for name in ("int8-dynamic", "int8-static-minmax", "int8-static-entropy"):
        diff = np.max(np.abs(probs[name] - probs["fp32"]))
        print(
            f"{name}: max |p - p_fp32| = {diff:.4f}, AUC {roc_auc_score(y, probs[name]):.4f} vs {auc32:.4f}"
        )
        assert np.isfinite(diff) and 0 < diff < 0.1
        assert abs(roc_auc_score(y, probs[name]) - auc32) < 0.02


def _weight_bytes(path, data_type):
    model = onnx.load(path)
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer if t.data_type == data_type)


def test_int8_and_fp16_files_store_weights_in_fewer_bytes(mlp_files):
    pipe, paths, _ = mlp_files
    sizes = {name: p.stat().st_size for name, p in paths.items()}
    assert sizes["int8-dynamic"] < sizes["fp16"] < sizes["fp32"]
    fp32_bytes = _weight_bytes(paths["fp32"], TensorProto.FLOAT)
    assert _weight_bytes(paths["fp16"], TensorProto.FLOAT16) == fp32_bytes // 2
    coefs = pipe.named_steps["mlp"].coefs_
    # one byte per weight, plus one INT8 zero point per weight matrix
    assert _weight_bytes(paths["int8-dynamic"], TensorProto.INT8) == sum(w.size for w in coefs) + len(coefs)
    n = mlp_n_parameters(pipe)
    assert n == 40 * 64 + 64 + 64 + 1
    table = size_table(n, sizes)
    assert (table["file_bytes_per_parameter"] > table["bytes_per_parameter"]).all()


def test_fp16_initializers_are_stored_as_raw_bytes(mlp_files):
    _, paths, _ = mlp_files
    model = onnx.load(paths["fp16"])
    halves = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT16]
    assert halves and all(t.raw_data and not t.int32_data for t in halves)


def test_static_variant_ranges_cover_the_calibration_data(mlp_files):
    _, paths, _ = mlp_files
    ranges = activation_ranges(paths["int8-static-minmax"])
    assert len(ranges) >= 2
    assert (ranges["low"] <= 0).all() and (ranges["high"] > 0).all()
    assert activation_ranges(paths["fp32"]).empty


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "int4"}, ValueError, "mode must be one of"),
        ({"mode": "int8-static"}, ValueError, "needs calibration_feeds"),
        ({"mode": "int8-dynamic", "calibration_method": "mse"}, ValueError, "calibration_method"),
        ({"mode": "int8-dynamic", "calibration_feeds": {"x": np.ones((2, 1))}}, ValueError, "only used by"),
    ],
)
def test_bad_modes_raise(mlp_files, tmp_path, kwargs, error, match):
    _, paths, _ = mlp_files
    mode = kwargs.pop("mode")
    with pytest.raises(error, match=match):
        make_variant(paths["fp32"], tmp_path / "out.onnx", mode, **kwargs)


def test_bad_paths_raise(mlp_files, tmp_path):
    _, paths, _ = mlp_files
    with pytest.raises(FileNotFoundError, match="src"):
        make_variant(tmp_path / "missing.onnx", tmp_path / "out.onnx", "fp16")
    with pytest.raises(ValueError, match=r"\.onnx"):
        make_variant(paths["fp32"], tmp_path / "out.bin", "fp16")
    with pytest.raises(FileNotFoundError, match="folder does not exist"):
        make_variant(paths["fp32"], tmp_path / "nowhere" / "out.onnx", "fp16")
    with pytest.raises(ValueError, match="must differ"):
        make_variant(paths["fp32"], paths["fp32"], "fp16")
    with pytest.raises(TypeError, match=r"src must be a str or pathlib\.Path, got 123"):
        make_variant(123, tmp_path / "out.onnx", "fp16")
    with pytest.raises(FileNotFoundError):
        quantizability_report(tmp_path / "missing.onnx")


@given(st.integers(min_value=1, max_value=60), st.integers(min_value=1, max_value=6))
def test_calibration_reader_yields_every_row_once_in_equal_batches(n_batches, batch_size):
    n = n_batches * batch_size
    reader = FeedsCalibrationReader({"a": np.arange(n).reshape(-1, 1)}, batch_size=batch_size)
    seen = []
    while (batch := reader.get_next()) is not None:
        assert len(batch["a"]) == batch_size
        seen.extend(batch["a"].ravel().tolist())
    assert seen == list(range(n)) and len(reader) == n_batches
    reader.rewind()
    assert reader.get_next() is not None


def test_calibration_reader_refuses_uneven_batches_and_ragged_feeds():
    with pytest.raises(ValueError, match="positive divisor of the 10"):
        FeedsCalibrationReader({"a": np.zeros((10, 1))}, batch_size=3)
    with pytest.raises(ValueError, match="same, non-zero number of rows"):
        FeedsCalibrationReader({"a": np.zeros((10, 1)), "b": np.zeros((9, 1))})
    with pytest.raises(ValueError, match="feeds must be non-empty"):
        FeedsCalibrationReader({})
