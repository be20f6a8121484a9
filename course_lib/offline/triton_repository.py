"""Export the churn model as an NVIDIA Triton Inference Server model repository.

Two models are written, each as ``<repository>/<name>/config.pbtxt`` plus ``<name>/1/<model file>``:

* ``churn`` — the whole pipeline as one ONNX graph for Triton's ONNX Runtime backend
  (``platform: "onnxruntime_onnx"``), taking the 19 raw features as 19 named inputs, with Lesson 3's
  batching knobs: ``max_batch_size``, ``dynamic_batching { max_queue_delay_microseconds,
  preferred_batch_size }`` and ``instance_group``. On a GPU this graph still runs its tree ensemble on
  the CPU: ONNX Runtime's CUDA execution provider has no TreeEnsemble kernel.
* ``churn_fil`` — the XGBoost booster alone for Triton's FIL (Forest Inference Library) backend, which
  does run trees on the GPU (``backend: "fil"``, ``model_type: "xgboost_json"``). It takes the 40
  already-encoded columns as one FP32 tensor: the one-hot encoding must happen before it (in the
  client, or in a Triton ensemble with a preprocessing step).

Each configuration is built as Triton's own ``ModelConfig`` protobuf message (``tritonclient``'s
generated ``model_config_pb2``) and written with ``google.protobuf.text_format``, so a field Triton does
not know cannot be written; :func:`parse_config` reads a file back into the same message.

Serving it (not run here; no timings of Triton are claimed by the course)::

    docker run --rm -p8000:8000 -p8001:8001 -p8002:8002 -v $PWD/build/triton:/models \\
        nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models
    perf_analyzer -m churn --request-rate-range=100:1000:100 --percentile=99 \\
        --input-data=random --string-data=Yes --measurement-interval=5000

``perf_analyzer --request-rate-range`` sends an open-loop schedule like Lesson 6's generator
(``--concurrency-range`` would be closed-loop).

References
----------
Triton Inference Server documentation: "Model Repository", "Model Configuration" (``max_batch_size``,
``dynamic_batching``, ``instance_group``, ``reshape``), the ONNX Runtime backend README, the FIL backend
README (``model_type``, ``output_class``, ``predict_proba``), and "perf_analyzer".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

import onnx
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from course_lib.core.checks import integer, integers
from course_lib.core.files import atomic_write_bytes

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

__all__ = ["export_triton_repository", "fil_config", "onnx_config", "parse_config"]

_ONNX_TO_TRITON: dict[int, int] = {
    onnx.TensorProto.FLOAT: mc.TYPE_FP32,
    onnx.TensorProto.DOUBLE: mc.TYPE_FP64,
    onnx.TensorProto.INT64: mc.TYPE_INT64,
    onnx.TensorProto.STRING: mc.TYPE_STRING,
}


def _check_batching(max_batch_size: int, preferred: Sequence[int], delay_us: int, instances: int) -> None:
    max_batch_size = integer("max_batch_size", max_batch_size, min=1)
    integers("preferred_batch_sizes", preferred, min=1, max=max_batch_size, allow_empty=True)
    integer("max_queue_delay_us", delay_us, min=0)
    integer("instance_count", instances, min=1)


def _batching(
    config: mc.ModelConfig, preferred: Sequence[int], delay_us: int, instances: int, kind: int
) -> None:
    config.dynamic_batching.preferred_batch_size.extend(preferred)
    config.dynamic_batching.max_queue_delay_microseconds = delay_us
    config.instance_group.add(count=instances, kind=kind)


def onnx_config(
    model: onnx.ModelProto,
    *,
    name: str = "churn",
    max_batch_size: int = 64,
    preferred_batch_sizes: Sequence[int] = (16, 32),
    max_queue_delay_us: int = 2000,
    instance_count: int = 1,
    gpu: bool = False,
) -> mc.ModelConfig:
    """Triton configuration of the ONNX pipeline: inputs and outputs read from the graph itself.

    Every graph input and output must have a batch dimension first; the rest of each shape becomes
    ``dims`` (a shape of just the batch becomes ``dims: [1]`` with ``reshape { shape: [] }``).
    ``intra_op_thread_count`` is pinned to 1 as in the course. Raises ``ValueError`` for knobs out of
    range or a tensor type Triton's ONNX backend would not map.
    """
    _check_batching(max_batch_size, preferred_batch_sizes, max_queue_delay_us, instance_count)
    config = mc.ModelConfig(name=name, platform="onnxruntime_onnx", max_batch_size=max_batch_size)
    for values, adder in ((model.graph.input, config.input.add), (model.graph.output, config.output.add)):
        for value in values:
            elem = value.type.tensor_type.elem_type
            if elem not in _ONNX_TO_TRITON:
                raise ValueError(
                    f"tensor {value.name!r} has ONNX type {elem}, which this export does not map"
                )
            dims = [d.dim_value for d in value.type.tensor_type.shape.dim[1:]]
            entry = adder(name=value.name, data_type=_ONNX_TO_TRITON[elem], dims=dims or [1])
            if not dims:
                entry.reshape.SetInParent()  # shape [] per item: the batch dimension only
    _batching(
        config,
        preferred_batch_sizes,
        max_queue_delay_us,
        instance_count,
        mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU,
    )
    config.parameters["intra_op_thread_count"].string_value = "1"
    return config


def fil_config(
    n_features: int,
    *,
    name: str = "churn_fil",
    max_batch_size: int = 1024,
    preferred_batch_sizes: Sequence[int] = (256, 1024),
    max_queue_delay_us: int = 2000,
    instance_count: int = 1,
) -> mc.ModelConfig:
    """Triton configuration for the FIL backend serving the XGBoost booster on a GPU.

    Input ``input__0``: FP32, ``[n_features]`` encoded columns; output ``output__0``: FP32 ``[2]``
    class probabilities (``output_class: true`` with ``predict_proba: true``).
    """
    _check_batching(max_batch_size, preferred_batch_sizes, max_queue_delay_us, instance_count)
    integer("n_features", n_features, min=1)
    config = mc.ModelConfig(name=name, backend="fil", max_batch_size=max_batch_size)
    config.input.add(name="input__0", data_type=mc.TYPE_FP32, dims=[n_features])
    config.output.add(name="output__0", data_type=mc.TYPE_FP32, dims=[2])
    _batching(
        config, preferred_batch_sizes, max_queue_delay_us, instance_count, mc.ModelInstanceGroup.KIND_GPU
    )
    params = {"model_type": "xgboost_json", "output_class": "true", "predict_proba": "true", "threshold": "0.5",
              "storage_type": "AUTO"}  # fmt: skip
    for key, value in params.items():
        config.parameters[key].string_value = value
    return config


def parse_config(path: str | Path) -> mc.ModelConfig:
    """Read a ``config.pbtxt`` into Triton's ``ModelConfig``; ``text_format.ParseError`` if it is not one."""
    return text_format.Parse(Path(path).read_text(), mc.ModelConfig())


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)


class _Batching(TypedDict, total=False):
    """The ``onnx_config`` options ``export_triton_repository`` passes on."""

    max_batch_size: int
    preferred_batch_sizes: Sequence[int]
    max_queue_delay_us: int
    instance_count: int
    gpu: bool


def export_triton_repository(
    repository: str | Path, onnx_model: onnx.ModelProto, pipeline: Pipeline, **batching: Unpack[_Batching]
) -> dict[str, Path]:
    """Write ``churn`` (ONNX) and ``churn_fil`` (XGBoost JSON) into ``repository``; return the config paths.

    ``batching`` goes to :func:`onnx_config` (``max_batch_size``, ``preferred_batch_sizes``,
    ``max_queue_delay_us``, ``instance_count``, ``gpu``). ``pipeline`` is the fitted scikit-learn
    pipeline whose last step is the ``XGBClassifier``.
    """
    root = Path(repository)
    onnx_cfg = onnx_config(onnx_model, **batching)
    _write(root / onnx_cfg.name / "1" / "model.onnx", onnx_model.SerializeToString())
    _write(root / onnx_cfg.name / "config.pbtxt", text_format.MessageToString(onnx_cfg).encode())
    booster = pipeline[-1].get_booster()
    fil_cfg = fil_config(int(booster.num_features()))
    _write(root / fil_cfg.name / "1" / "xgboost.json", bytes(booster.save_raw(raw_format="json")))
    _write(root / fil_cfg.name / "config.pbtxt", text_format.MessageToString(fil_cfg).encode())
    return {cfg.name: root / cfg.name / "config.pbtxt" for cfg in (onnx_cfg, fil_cfg)}
