"""Post-training compression of ONNX models: FP16 and INT8 variants, and what cannot be compressed.

Four things live here, all about shrinking a trained model without retraining it:

* the size arithmetic (parameters x bytes per parameter) and the same arithmetic applied to real files;
* a quantizability check: ONNX Runtime's quantizer rewrites weight *initializers* of a short list of
  standard ops (MatMul, Gemm, Conv, Gather, ...). A tree ensemble keeps its thresholds and leaf
  values in ``ai.onnx.ml`` node attributes, so there is nothing to quantize; ``make_variant`` refuses
  with a report instead of handing back a "quantized" file that is the same model;
* an FP16 conversion that survives graphs with an explicit ``Cast`` (the upstream converter
  mis-types them, see ``convert_to_fp16``);
* INT8 variants: dynamic (activation ranges measured at run time) and static QDQ (ranges calibrated
  once on a held-out calibration set, with a choice of calibration method).

References
----------
ONNX Runtime documentation, "Quantize ONNX models" (dynamic vs static, QDQ format, calibration methods).
Kirana Kart module 19, "Quantisation": size = parameters x bytes per parameter (4 / 2 / 1 bytes).
microsoft/onnxconverter-common issue #320 and pull requests #326, #328 (Cast nodes left as FP32).
microsoft/onnxruntime issue #18792 (histogram calibration needs equal-shaped calibration batches).
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "BYTES_PER_PARAMETER",
    "CALIBRATION_METHODS",
    "VARIANT_MODES",
    "FeedsCalibrationReader",
    "NotQuantizableError",
    "QuantizabilityReport",
    "activation_ranges",
    "convert_to_fp16",
    "expected_size_bytes",
    "graph_changes",
    "make_variant",
    "quantizability_report",
    "size_table",
]

#: Storage per parameter by precision (IEEE float32 / float16, int8).
BYTES_PER_PARAMETER: dict[str, int] = {"fp32": 4, "fp16": 2, "int8": 1}
#: Variant modes ``make_variant`` can produce from an FP32 ONNX file.
VARIANT_MODES: tuple[str, ...] = ("fp16", "int8-dynamic", "int8-static")
#: Calibration methods of ONNX Runtime's static quantizer, by the names the course uses.
CALIBRATION_METHODS: tuple[str, ...] = ("minmax", "entropy", "percentile")
#: Op types whose weight initializers ONNX Runtime's quantizer rewrites (dynamic mode: IntegerOps
#: registry; static QDQ: these plus activations around them).
_WEIGHT_OP_TYPES: frozenset[str] = frozenset(
    {"MatMul", "Gemm", "Conv", "ConvTranspose", "Gather", "Attention", "LSTM"}
)
_FLOAT_ATTR_TYPES = (helper.AttributeProto.FLOAT, helper.AttributeProto.FLOATS, helper.AttributeProto.TENSOR)


# ---------------------------------------------------------------------------------------------
# Size arithmetic
# ---------------------------------------------------------------------------------------------


def _precision_of(name: str) -> str:
    precision = name.split("-", 1)[0]
    if precision not in BYTES_PER_PARAMETER:
        raise ValueError(
            f"variant name {name!r} must start with a precision, one of {sorted(BYTES_PER_PARAMETER)} "
            "(e.g. 'int8-dynamic')"
        )
    return precision


def expected_size_bytes(n_parameters: int, precision: str) -> int:
    """Bytes needed to store ``n_parameters`` numbers at ``precision``: parameters x bytes per parameter.

    Parameters
    ----------
    n_parameters : int
        Number of weights, >= 1.
    precision : {"fp32", "fp16", "int8"}

    Raises
    ------
    ValueError
        If ``n_parameters`` is not a positive integer or ``precision`` is unknown.

    References
    ----------
    Kirana Kart module 19, "Quantisation" (100,000,000 parameters -> 400 / 200 / 100 MB).
    """
    if isinstance(n_parameters, bool) or not isinstance(n_parameters, (int, np.integer)) or n_parameters < 1:
        raise ValueError(f"n_parameters must be a positive integer, got {n_parameters!r}")
    if precision not in BYTES_PER_PARAMETER:
        raise ValueError(f"precision must be one of {sorted(BYTES_PER_PARAMETER)}, got {precision!r}")
    return int(n_parameters) * BYTES_PER_PARAMETER[precision]


def size_table(n_parameters: int, file_bytes: Mapping[str, int] | None = None) -> pd.DataFrame:
    """The size arithmetic for one model, optionally next to the real files' sizes.

    Parameters
    ----------
    n_parameters : int
        Number of weights of the model.
    file_bytes : mapping of variant name -> file size in bytes, optional
        Variant names start with their precision (``"fp32"``, ``"fp16"``, ``"int8-dynamic"``, ...).
        Without it, one row per precision is returned.

    Returns
    -------
    DataFrame indexed by variant (or precision) with ``bytes_per_parameter`` (nominal),
    ``expected_bytes``, ``expected_mb`` (decimal, 1 MB = 1e6 bytes) and, when ``file_bytes`` is given,
    ``file_bytes``, ``file_bytes_per_parameter`` (file size / parameters, so file overhead and any
    tensors kept at higher precision show up as excess over the nominal value) and
    ``file_vs_expected`` (ratio).

    Raises
    ------
    ValueError
        From ``expected_size_bytes``; for a variant name without a known precision prefix, or a
        file size that is not a positive integer.
    """
    if file_bytes is None:
        rows = {
            p: {
                "bytes_per_parameter": b,
                "expected_bytes": expected_size_bytes(n_parameters, p),
            }
            for p, b in BYTES_PER_PARAMETER.items()
        }
    else:
        rows = {}
        for name, size in file_bytes.items():
            precision = _precision_of(name)
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
                raise ValueError(f"file_bytes[{name!r}] must be a positive integer, got {size!r}")
            expected = expected_size_bytes(n_parameters, precision)
            rows[name] = {
                "bytes_per_parameter": BYTES_PER_PARAMETER[precision],
                "expected_bytes": expected,
                "file_bytes": int(size),
                "file_bytes_per_parameter": int(size) / n_parameters,
                "file_vs_expected": int(size) / expected,
            }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.insert(2, "expected_mb", table["expected_bytes"] / 1e6)
    table.index.name = "variant" if file_bytes is not None else "precision"
    return table


# ---------------------------------------------------------------------------------------------
# What a quantizer can and cannot touch
# ---------------------------------------------------------------------------------------------


def _initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer}


def _attribute_floats(node: onnx.NodeProto) -> int:
    count = 0
    for attr in node.attribute:
        if attr.type == helper.AttributeProto.FLOATS:
            count += len(attr.floats)
        elif attr.type == helper.AttributeProto.FLOAT:
            count += 1
        elif attr.type == helper.AttributeProto.TENSOR:
            count += int(np.prod(attr.t.dims)) if attr.t.dims else 1
    return count


@dataclass(frozen=True)
class QuantizabilityReport:
    """What ONNX Runtime's INT8 quantizer could rewrite in a graph, and what it must leave alone.

    Attributes
    ----------
    op_counts : dict of "domain:op_type" -> number of nodes (default domain written as "ai.onnx").
    weight_nodes : names of MatMul/Gemm/Conv/Gather/... nodes whose weights are initializers (what
        the quantizer rewrites).
    n_weight_parameters : numbers stored in those initializers.
    attribute_parameters : dict of op_type -> float values held in node attributes (tree thresholds,
        leaf values, scaler offsets...), which no ONNX Runtime quantizer touches.
    """

    op_counts: dict[str, int]
    weight_nodes: tuple[str, ...]
    n_weight_parameters: int
    attribute_parameters: dict[str, int]

    @property
    def quantizable(self) -> bool:
        """True when at least one node holds weights that the INT8 quantizer can rewrite."""
        return bool(self.weight_nodes)

    @property
    def reason(self) -> str:
        if self.quantizable:
            return (
                f"{len(self.weight_nodes)} weight node(s) holding {self.n_weight_parameters:,} parameters "
                "can be quantized to INT8"
            )
        held = ", ".join(f"{op}: {n:,}" for op, n in sorted(self.attribute_parameters.items())) or "none"
        return (
            "not quantizable: no MatMul/Gemm/Conv/Gather node with weight initializers; the model's numbers "
            f"live in node attributes ({held}), which ONNX Runtime's quantizer never rewrites"
        )

    def __str__(self) -> str:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.op_counts.items()))
        return f"QuantizabilityReport({self.reason}; ops: {ops})"


class NotQuantizableError(ValueError):
    """Raised instead of writing an "INT8" file that would hold the same FP32 model; ``report`` says why."""

    def __init__(self, report: QuantizabilityReport):
        super().__init__(report.reason)
        self.report = report


def quantizability_report(model: onnx.ModelProto | str | Path) -> QuantizabilityReport:
    """Inspect a graph for weights that ONNX Runtime's INT8 quantizer can rewrite.

    Parameters
    ----------
    model : ModelProto or path to a ``.onnx`` file.

    Returns
    -------
    QuantizabilityReport

    Raises
    ------
    FileNotFoundError
        If ``model`` is a path that does not exist.
    TypeError
        If ``model`` is neither a ModelProto nor a path.
    """
    graph = _load(model, "model").graph
    inits = {t.name: t for t in graph.initializer}
    counts = collections.Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in graph.node)
    weight_nodes: list[str] = []
    n_weights = 0
    attr_params: dict[str, int] = collections.defaultdict(int)
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in _WEIGHT_OP_TYPES:
            weights = [inits[i] for i in node.input if i in inits and inits[i].data_type == TensorProto.FLOAT]
            if weights:
                weight_nodes.append(node.name or f"{node.op_type}#{len(weight_nodes)}")
                n_weights += sum(int(np.prod(w.dims)) for w in weights)
        n_attr = _attribute_floats(node)
        if n_attr:
            attr_params[node.op_type] += n_attr
    return QuantizabilityReport(dict(counts), tuple(weight_nodes), n_weights, dict(attr_params))


def graph_changes(
    before: onnx.ModelProto | str | Path, after: onnx.ModelProto | str | Path
) -> dict[str, object]:
    """What a conversion did to a graph: ops added and removed, initializers whose type changed.

    Parameters
    ----------
    before, after : ModelProto or paths to ``.onnx`` files.

    Returns
    -------
    dict with ``unchanged`` (bool: the same nodes with the same inputs, outputs and attributes, in any
    order since quantizers re-sort the graph; the same initializer names and types), ``ops_added`` and ``ops_removed`` (dict op_type -> count) and
    ``initializers_retyped`` (dict name -> (old type, new type) as ONNX type names).
    """
    a = _load(before, "before").graph
    b = _load(after, "after").graph
    ops_a = collections.Counter(n.op_type for n in a.node)
    ops_b = collections.Counter(n.op_type for n in b.node)
    types_a = {t.name: t.data_type for t in a.initializer}
    types_b = {t.name: t.data_type for t in b.initializer}
    retyped = {
        name: (TensorProto.DataType.Name(types_a[name]), TensorProto.DataType.Name(types_b.get(name, 0)))
        for name in types_a
        if types_b.get(name) != types_a[name]
    }
    same_nodes = sorted(n.SerializeToString(deterministic=True) for n in a.node) == sorted(
        n.SerializeToString(deterministic=True) for n in b.node
    )
    return {
        "unchanged": same_nodes and types_a == types_b,
        "ops_added": dict(ops_b - ops_a),
        "ops_removed": dict(ops_a - ops_b),
        "initializers_retyped": retyped,
    }


# ---------------------------------------------------------------------------------------------
# FP16
# ---------------------------------------------------------------------------------------------


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def convert_to_fp16(
    model: onnx.ModelProto,
    *,
    keep_io_types: bool = True,
    op_block_list: list[str] | None = None,
) -> onnx.ModelProto:
    """Convert an FP32 graph to FP16 with onnxconverter-common, repairing its explicit-Cast bug.

    ``onnxconverter_common.float16.convert_float_to_float16`` (1.15 and 1.16) marks the output of
    every explicit ``Cast(to=FLOAT)`` as FLOAT16 but leaves the node's ``to`` attribute at FLOAT, so
    ONNX Runtime refuses to load the result ("Type (tensor(float16)) of output arg ... does not match
    expected type (tensor(float))"). With ``keep_io_types=True`` its clean-up pass can also delete
    such a Cast together with the input cast it inserted, leaving an FP32 tensor wired into an FP16
    op. This function:

    1. replaces every ``Cast(to=FLOAT)`` whose input is already FLOAT by ``Identity`` (exactly the
       same computation in FP32, and not a Cast the converter can mistake for one of its own);
    2. converts with the upstream converter (ops in its default block list, such as the
       ``ai.onnx.ml`` tree ensembles, scalers and encoders, stay FP32 behind inserted casts);
    3. retargets every remaining ``Cast(to=FLOAT)`` whose output the converter marked FLOAT16 to
       ``to=FLOAT16`` (the fix proposed upstream);
    4. stores FP16 initializers as raw bytes: the converter writes each FP16 value into the
       ``int32_data`` field as a protobuf varint (up to 3 bytes for a 2-byte number), which would
       leave an "FP16" file well above half the FP32 size;
    5. checks the result with ``onnx.checker`` and records what it repaired in the model's metadata
       (``fp16_identity_casts``, ``fp16_retargeted_casts``, ``fp16_reencoded_initializers``).

    Parameters
    ----------
    model : onnx.ModelProto
        An FP32 model; it is not modified.
    keep_io_types : bool
        Keep FP32 graph inputs and outputs (casts inserted at the edges), so callers feed the same
        arrays as to the FP32 model.
    op_block_list : list of str, optional
        Op types to keep in FP32; defaults to the converter's ``DEFAULT_OP_BLOCK_LIST``.

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    TypeError
        If ``model`` is not a ModelProto.
    ValueError
        If the model already contains FP16 tensors.

    References
    ----------
    microsoft/onnxconverter-common issue #320 "convert_float_to_float16 does not patch Cast node",
    pull requests #326 (regression from #291) and #328 (retarget the Cast's ``to``).
    """
    from onnxconverter_common import float16

    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be an onnx.ModelProto, got {type(model).__name__}")
    work = copy.deepcopy(model)
    types = _elem_types(work)
    if any(t == TensorProto.FLOAT16 for t in types.values()):
        raise ValueError("model already holds FLOAT16 tensors; convert_to_fp16 expects an FP32 model")
    n_identity = 0
    for node in work.graph.node:
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
            to = next(a.i for a in node.attribute if a.name == "to")
            if to == TensorProto.FLOAT and types.get(node.input[0]) == TensorProto.FLOAT:
                del node.attribute[:]
                node.op_type = "Identity"
                n_identity += 1
    blocked = list(float16.DEFAULT_OP_BLOCK_LIST if op_block_list is None else op_block_list)
    out = float16.convert_float_to_float16(work, keep_io_types=keep_io_types, op_block_list=blocked)
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in (*out.graph.value_info, *out.graph.output)}
    n_retarget = 0
    for node in out.graph.node:
        if node.op_type != "Cast":
            continue
        for attr in node.attribute:
            if (
                attr.name == "to"
                and attr.i == TensorProto.FLOAT
                and declared.get(node.output[0]) == TensorProto.FLOAT16
            ):
                attr.i = TensorProto.FLOAT16
                n_retarget += 1
    n_reencoded = 0
    for i, tensor in enumerate(out.graph.initializer):
        if tensor.data_type == TensorProto.FLOAT16 and not tensor.raw_data:
            out.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name)
            )
            n_reencoded += 1
    onnx.checker.check_model(out)
    meta = {p.key: p.value for p in out.metadata_props}
    meta.update(
        fp16_identity_casts=str(n_identity),
        fp16_retargeted_casts=str(n_retarget),
        fp16_reencoded_initializers=str(n_reencoded),
    )
    onnx.helper.set_model_props(out, meta)
    return out


# ---------------------------------------------------------------------------------------------
# INT8
# ---------------------------------------------------------------------------------------------


class FeedsCalibrationReader:
    """Hand ONNX Runtime's static quantizer a held-out calibration set in equal-sized batches.

    Parameters
    ----------
    feeds : dict of input name -> array of shape (n_rows, ...)
        E.g. ``OnnxChurnScorer.feeds(calibration_frame)``; every array has the same first dimension.
    batch_size : int
        Rows per batch; must divide ``n_rows``. Histogram calibration (entropy, percentile) stacks the
        batches into one array and fails on a shorter last batch, so an uneven split is refused
        rather than silently dropping rows (microsoft/onnxruntime issue #18792).

    Raises
    ------
    ValueError
        Empty feeds, arrays of different lengths, or a ``batch_size`` that is not a positive divisor
        of the number of rows.
    """

    def __init__(self, feeds: Mapping[str, np.ndarray], batch_size: int = 1):
        if not feeds:
            raise ValueError("feeds must hold at least one input array")
        lengths = {name: len(arr) for name, arr in feeds.items()}
        n_rows = next(iter(lengths.values()))
        if len(set(lengths.values())) != 1 or n_rows == 0:
            raise ValueError(f"every feed must have the same, non-zero number of rows; got {lengths}")
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, int)
            or batch_size < 1
            or n_rows % batch_size
        ):
            raise ValueError(
                f"batch_size must be a positive divisor of the {n_rows} calibration rows, got {batch_size!r}"
            )
        self.feeds = dict(feeds)
        self.n_rows = n_rows
        self.batch_size = batch_size
        self._batches: Iterator[dict[str, np.ndarray]] = self._iterate()

    def _iterate(self) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, self.n_rows, self.batch_size):
            yield {k: v[start : start + self.batch_size] for k, v in self.feeds.items()}

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next batch of feeds, or None when the calibration set is exhausted."""
        return next(self._batches, None)

    def rewind(self) -> None:
        """Start again from the first batch."""
        self._batches = self._iterate()

    def __len__(self) -> int:
        return self.n_rows // self.batch_size


def _load(model: onnx.ModelProto | str | Path, name: str) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, Path)):
        raise TypeError(
            f"{name} must be an onnx.ModelProto or a path to a .onnx file, got {type(model).__name__}"
        )
    path = Path(model)
    if not path.is_file():
        raise FileNotFoundError(f"{name}: ONNX file not found: {path}")
    return onnx.load(str(path))


def _check_paths(src: str | Path, dst: str | Path) -> tuple[Path, Path]:
    if not isinstance(src, (str, Path)) or not isinstance(dst, (str, Path)):
        raise TypeError(f"src and dst must be paths, got {type(src).__name__} and {type(dst).__name__}")
    src_p, dst_p = Path(src), Path(dst)
    if not src_p.is_file():
        raise FileNotFoundError(f"src: FP32 ONNX file not found: {src_p}")
    if dst_p.suffix != ".onnx":
        raise ValueError(f"dst must end in .onnx, got {dst_p.name!r}")
    if not dst_p.parent.is_dir():
        raise FileNotFoundError(f"dst folder does not exist: {dst_p.parent} (create it first)")
    if dst_p.resolve() == src_p.resolve():
        raise ValueError(f"dst must differ from src; both are {src_p}")
    return src_p, dst_p


def make_variant(
    src: str | Path,
    dst: str | Path,
    mode: str,
    *,
    calibration_feeds: Mapping[str, np.ndarray] | None = None,
    calibration_method: str = "minmax",
    calibration_batch_size: int = 1,
    op_types_to_quantize: tuple[str, ...] | None = ("MatMul",),
    per_channel: bool = False,
) -> Path:
    """Write an FP16 or INT8 variant of the FP32 ONNX model at ``src`` to ``dst``.

    Parameters
    ----------
    src : path of the FP32 ``.onnx`` file.
    dst : path of the variant to write (``.onnx``, in an existing folder, different from ``src``).
    mode : {"fp16", "int8-dynamic", "int8-static"}
        ``fp16``: ``convert_to_fp16`` with FP32 inputs and outputs kept. ``int8-dynamic``: weights
        stored as INT8, activation ranges computed on every call. ``int8-static``: weights and
        activation ranges fixed in advance from ``calibration_feeds``, written in QDQ format
        (QuantizeLinear/DequantizeLinear pairs that ONNX Runtime fuses into integer kernels).
    calibration_feeds : dict of input name -> array, required for ``int8-static`` only
        A held-out calibration set (never the evaluation set), e.g. ``scorer.feeds(split.valid)``.
    calibration_method : {"minmax", "entropy", "percentile"}
        How the static quantizer picks each activation's range: the observed min/max, the range that
        minimises the KL divergence of the quantized histogram, or the 99.999th percentile.
    calibration_batch_size : int
        Rows per calibration batch (see ``FeedsCalibrationReader``).
    op_types_to_quantize : tuple of str, or None
        Ops whose inputs are quantized; the default quantizes only the MatMul layers of a network,
        leaving preprocessing (one-hot columns, raw charges in dollars) in FP32. ``None`` lets ONNX
        Runtime quantize every op type it supports, preprocessing included (the lesson shows what
        that does to a tensor that mixes 0/1 flags with dollar amounts).
    per_channel : bool
        One scale per output channel of each weight matrix instead of one per tensor.

    Returns
    -------
    pathlib.Path
        ``dst``.

    Raises
    ------
    FileNotFoundError
        ``src`` missing, or ``dst``'s folder missing.
    ValueError
        Unknown ``mode`` or ``calibration_method``; ``dst`` not ``.onnx`` or equal to ``src``;
        calibration feeds missing for ``int8-static`` or given for another mode.
    NotQuantizableError
        For an INT8 mode when the graph has no weights ONNX Runtime can quantize (e.g. a tree
        ensemble): the error's ``report`` says where the model's numbers live.
    """
    if mode not in VARIANT_MODES:
        raise ValueError(f"mode must be one of {list(VARIANT_MODES)}, got {mode!r}")
    if calibration_method not in CALIBRATION_METHODS:
        raise ValueError(
            f"calibration_method must be one of {list(CALIBRATION_METHODS)}, got {calibration_method!r}"
        )
    if mode == "int8-static" and calibration_feeds is None:
        raise ValueError("mode 'int8-static' needs calibration_feeds (a held-out calibration set)")
    if mode != "int8-static" and calibration_feeds is not None:
        raise ValueError(f"calibration_feeds are only used by mode 'int8-static', not {mode!r}")
    src_p, dst_p = _check_paths(src, dst)
    fp32 = onnx.load(str(src_p))
    if mode == "fp16":
        onnx.save(convert_to_fp16(fp32), str(dst_p))
        return dst_p
    report = quantizability_report(fp32)
    if not report.quantizable:
        raise NotQuantizableError(report)

    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    ops = None if op_types_to_quantize is None else list(op_types_to_quantize)
    if mode == "int8-dynamic":
        quantize_dynamic(
            str(src_p),
            str(dst_p),
            op_types_to_quantize=ops,
            per_channel=per_channel,
            weight_type=QuantType.QInt8,
        )
        return dst_p
    reader = FeedsCalibrationReader(calibration_feeds, batch_size=calibration_batch_size)
    method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[calibration_method]
    quantize_static(
        str(src_p),
        str(dst_p),
        reader,
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=ops,
        per_channel=per_channel,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=method,
    )
    return dst_p


def activation_ranges(model: onnx.ModelProto | str | Path) -> pd.DataFrame:
    """The real-valued range each ``QuantizeLinear`` of a QDQ model can represent.

    For scale ``s`` and zero point ``z`` of an integer type with limits ``[q_min, q_max]``, the
    representable range is ``[s (q_min - z), s (q_max - z)]`` in steps of ``s``; a value outside it
    is clipped and a difference smaller than ``s`` is lost.

    Parameters
    ----------
    model : ModelProto or path to a QDQ ``.onnx`` file (e.g. from ``make_variant(..., "int8-static")``).

    Returns
    -------
    DataFrame indexed by quantized tensor name with ``dtype``, ``scale``, ``zero_point``, ``low`` and
    ``high``; empty if the model has no QuantizeLinear node.

    References
    ----------
    ONNX operator specification, ``QuantizeLinear``: y = saturate(round(x / scale) + zero_point).
    """
    graph = _load(model, "model").graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    rows = {}
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or node.input[1] not in inits:
            continue
        scale = inits[node.input[1]]
        zero = (
            inits[node.input[2]] if len(node.input) > 2 and node.input[2] in inits else np.zeros((), np.uint8)
        )
        if scale.size != 1:
            continue
        info = np.iinfo(zero.dtype)
        s, z = float(scale.reshape(())), int(zero.reshape(()))
        rows[node.input[0]] = {
            "dtype": str(zero.dtype),
            "scale": s,
            "zero_point": z,
            "low": s * (info.min - z),
            "high": s * (info.max - z),
        }
    table = pd.DataFrame.from_dict(
        rows, orient="index", columns=["dtype", "scale", "zero_point", "low", "high"]
    )
    table.index.name = "tensor"
    return table
