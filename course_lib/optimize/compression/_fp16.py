"""FP16 conversion of an ONNX graph that ONNX Runtime can load, repairing the upstream converter's bugs.

``onnxconverter_common.float16.convert_float_to_float16`` halves the weights but, on some graphs, writes
a model that passes ``onnx.checker`` and that ONNX Runtime then refuses to load: explicit ``Cast`` nodes
left at FLOAT, and initializers shared by an op kept in FP32 and an op converted to FP16.
:func:`convert_to_fp16` repairs both, and refuses (ValueError) rather than return a model that does not load.

References
----------
microsoft/onnxconverter-common issue #320 and pull requests #326, #328 (Cast nodes left as FP32) and
#329 (a weight shared by a blocked and a converted op). ONNX Runtime documentation, "Float16 and mixed
precision models".
"""

from __future__ import annotations

import copy

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxconverter_common import float16

from course_lib.core.checks import instance_of


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
    4. stores FP16 initializers as raw bytes (the converter writes each as a protobuf varint, up to
       3 bytes for a 2-byte number);
    5. casts a weight shared between a blocked (FP32) op and a converted (FP16) op, which ONNX Runtime
       refuses ("Type parameter (T) of Optype (Mul) bound to different types"): a ``Cast(to=FLOAT16)``
       in front of each FP16 consumer (onnxconverter-common PR #329);
    6. checks the result with ``onnx.checker`` and by loading it in ONNX Runtime, and records what it
       repaired in the model's metadata (``fp16_identity_casts``, ``fp16_retargeted_casts``,
       ``fp16_reencoded_initializers`` and, when step 5 inserted any, ``fp16_shared_initializer_casts``).

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
        If the model already contains FP16 tensors, or the converted model still fails to load in ONNX
        Runtime (the message names the failure; nothing is returned, so nothing gets written).

    References
    ----------
    microsoft/onnxconverter-common issue #320 "convert_float_to_float16 does not patch Cast node",
    pull requests #326 (regression from #291), #328 (retarget the Cast's ``to``) and #329 (an initializer
    shared by a blocked and a converted node).
    """
    instance_of("model", model, onnx.ModelProto)
    work = copy.deepcopy(model)
    types = _elem_types(work)
    if any(t == TensorProto.FLOAT16 for t in types.values()):
        raise ValueError("model already holds FLOAT16 tensors; convert_to_fp16 expects an FP32 model")
    n_identity = _fp32_casts_to_identity(work, types)
    blocked = list(float16.DEFAULT_OP_BLOCK_LIST if op_block_list is None else op_block_list)
    out = float16.convert_float_to_float16(work, keep_io_types=keep_io_types, op_block_list=blocked)
    repairs = {
        "fp16_identity_casts": n_identity,
        "fp16_retargeted_casts": _retarget_fp16_casts(out),
        "fp16_reencoded_initializers": _reencode_fp16_initializers(out),
    }
    n_shared = _cast_shared_fp32_initializers(out)
    if n_shared:
        repairs["fp16_shared_initializer_casts"] = n_shared
    onnx.checker.check_model(out)
    _check_loads(out)
    _record_repairs(out, repairs)
    return out


def _fp32_casts_to_identity(model: onnx.ModelProto, types: dict[str, int]) -> int:
    """Replace, in place, each ``Cast(to=FLOAT)`` of a FLOAT input by ``Identity``; returns how many.

    The same computation in FP32, and no longer a Cast the converter's clean-up pass can mistake for
    one of its own and delete (onnxconverter-common issue #320).
    """
    n_identity = 0
    for node in model.graph.node:
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
            to = next(a.i for a in node.attribute if a.name == "to")
            if to == TensorProto.FLOAT and types.get(node.input[0]) == TensorProto.FLOAT:
                del node.attribute[:]
                node.op_type = "Identity"
                n_identity += 1
    return n_identity


def _retarget_fp16_casts(model: onnx.ModelProto) -> int:
    """Set ``to=FLOAT16`` on each ``Cast(to=FLOAT)`` whose output the converter declared FLOAT16.

    The converter marks the output FLOAT16 but leaves ``to`` at FLOAT, which ONNX Runtime refuses to
    load (onnxconverter-common PR #328). Edits in place; returns the number of casts retargeted.
    """
    graph = model.graph
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in (*graph.value_info, *graph.output)}
    n_retarget = 0
    for node in graph.node:
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
    return n_retarget


def _reencode_fp16_initializers(model: onnx.ModelProto) -> int:
    """Store each FP16 initializer as raw bytes; returns how many were rewritten.

    The converter writes each FP16 value into ``int32_data`` as a protobuf varint (up to 3 bytes for a
    2-byte number), which would leave an "FP16" file well above half the FP32 size.
    """
    n_reencoded = 0
    for i, tensor in enumerate(model.graph.initializer):
        if tensor.data_type == TensorProto.FLOAT16 and not tensor.raw_data:
            model.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name)
            )
            n_reencoded += 1
    return n_reencoded


def _record_repairs(model: onnx.ModelProto, repairs: dict[str, int]) -> None:
    """Add the repair counts to the model's metadata, keeping the properties it already has."""
    meta = {p.key: p.value for p in model.metadata_props}
    meta.update({key: str(count) for key, count in repairs.items()})
    onnx.helper.set_model_props(model, meta)


def _cast_shared_fp32_initializers(model: onnx.ModelProto) -> int:
    """Insert ``Cast(to=FLOAT16)`` where an FP32 initializer feeds a node whose other inputs are FP16.

    After conversion an initializer is still FP32 only because a blocked node reads it; any FP16 node
    reading it too needs its own FP16 copy of the value, else ONNX Runtime refuses to load the model
    (onnxconverter-common PR #329). Returns the number of node inputs rewired.
    """
    graph = model.graph
    fp32_inits = {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    if not fp32_inits:
        return 0
    types = _elem_types(model)
    casts: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    n_rewired = 0
    for node in graph.node:
        others = {types.get(name) for name in node.input if name and name not in fp32_inits}
        if node.op_type != "Cast" and TensorProto.FLOAT16 in others and TensorProto.FLOAT not in others:
            for k, name in enumerate(node.input):
                if name not in fp32_inits:
                    continue
                if name not in casts:
                    casts[name] = f"{name}_shared_fp16"
                    nodes.append(
                        helper.make_node(
                            "Cast", [name], [casts[name]], name=f"{name}_shared_cast", to=TensorProto.FLOAT16
                        )
                    )
                node.input[k] = casts[name]
                n_rewired += 1
        nodes.append(node)
    if n_rewired:
        del graph.node[:]
        graph.node.extend(nodes)
    return n_rewired


def _check_loads(model: onnx.ModelProto) -> None:

    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime raises its own Fail/InvalidGraph types
        raise ValueError(
            "convert_to_fp16 produced a model ONNX Runtime cannot load; refusing to return it "
            f"(keep the failing op in FP32 with op_block_list): {exc}"
        ) from exc
