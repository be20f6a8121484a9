"""What ONNX Runtime's INT8 quantizer can and cannot touch in a graph, and what a conversion changed.

ONNX Runtime's quantizer rewrites weight *initializers* of a short list of standard ops (MatMul, Gemm,
Conv, Gather, ...). A tree ensemble keeps its thresholds and leaf values in ``ai.onnx.ml`` node
attributes, so there is nothing to quantize; :func:`course_lib.optimize.compression._variant.make_variant`
refuses with this module's report instead of handing back a "quantized" file that is the same model.

References
----------
ONNX Runtime documentation, "Quantize ONNX models" (which operators are quantized);
``onnxruntime/python/tools/quantization/registry.py`` (the op registries).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from course_lib.core.checks import instance_of

#: Op types whose weight initializers ONNX Runtime's quantizer rewrites (dynamic mode: IntegerOps
#: registry; static QDQ: these plus activations around them).
_WEIGHT_OP_TYPES: frozenset[str] = frozenset(
    {"MatMul", "Gemm", "Conv", "ConvTranspose", "Gather", "Attention", "LSTM"}
)


def load_model_proto(model: onnx.ModelProto | str | Path, name: str = "model") -> onnx.ModelProto:
    """``model`` itself if it is a ModelProto, else the model loaded from the ``.onnx`` file it names.

    Parameters
    ----------
    model : onnx.ModelProto, or a path (str or Path) to a ``.onnx`` file.
    name : str
        The caller's parameter name, used in error messages.

    Raises
    ------
    TypeError
        If ``model`` is neither a ModelProto nor a path.
    FileNotFoundError
        If the path does not exist.
    """
    model = instance_of(name, model, (onnx.ModelProto, str, Path))
    if isinstance(model, onnx.ModelProto):
        return model
    path = Path(model)
    if not path.is_file():
        raise FileNotFoundError(f"{name}: ONNX file not found: {path}")
    return onnx.load(str(path))


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
    graph = load_model_proto(model, "model").graph
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
    order since quantizers re-sort the graph; the same initializer names and types), ``ops_added`` and
    ``ops_removed`` (dict op_type -> count) and ``initializers_retyped`` (dict name -> (old type, new type) as
    ONNX type names).
    """
    a = load_model_proto(before, "before").graph
    b = load_model_proto(after, "after").graph
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
