"""An ONNX file's identity: one writer of the model-version and data keys, used by export and model_versions."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from course_lib.churn import versions as model_versions
from course_lib.churn.export import METADATA_DATA_SHA256, METADATA_MODEL_VERSION, stamp_identity
from course_lib.churn.export import _onnx as export


def _tiny_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "tiny", [x], [y])
    return helper.make_model(graph)


def _props(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(p.key, p.value) for p in model.metadata_props]


def test_the_keys_have_one_source():
    assert export.METADATA_MODEL_VERSION is METADATA_MODEL_VERSION is model_versions.METADATA_MODEL_VERSION
    assert export.METADATA_DATA_SHA256 is METADATA_DATA_SHA256 is model_versions.METADATA_DATA_SHA256


def test_stamp_writes_data_then_version_then_extra_and_keeps_other_keys():
    model = _tiny_model()
    helper.set_model_props(model, {"author": "course", METADATA_MODEL_VERSION: "old"})
    out = stamp_identity(model, model_version="abc", data_sha256="f00d", extra={"course_release": "v1"})
    assert out is model
    assert _props(model) == [
        ("author", "course"),
        (METADATA_MODEL_VERSION, "abc"),
        (METADATA_DATA_SHA256, "f00d"),
        ("course_release", "v1"),
    ]


def test_no_version_writes_only_the_data_checksum():
    model = stamp_identity(_tiny_model(), model_version=None, data_sha256="f00d")
    assert _props(model) == [(METADATA_DATA_SHA256, "f00d")]


def test_stamp_metadata_of_model_versions_goes_through_the_same_writer():
    model = model_versions.stamp_metadata(_tiny_model(), release="v2", content_hash="abc", data_sha256="f00d")
    assert dict(_props(model)) == {
        METADATA_DATA_SHA256: "f00d",
        METADATA_MODEL_VERSION: "abc",
        model_versions.METADATA_RELEASE: "v2",
    }


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"model_version": "", "data_sha256": "f00d"}, METADATA_MODEL_VERSION),
        ({"model_version": "abc", "data_sha256": ""}, METADATA_DATA_SHA256),
        ({"model_version": "abc", "data_sha256": "f00d", "extra": {"course_release": ""}}, "course_release"),
        ({"model_version": 7, "data_sha256": "f00d"}, METADATA_MODEL_VERSION),
    ],
)
def test_empty_or_non_str_values_are_refused_with_their_key(kwargs, key):
    model = _tiny_model()
    with pytest.raises(ValueError, match=key):
        stamp_identity(model, **kwargs)
    assert _props(model) == []  # nothing written
