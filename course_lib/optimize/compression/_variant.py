"""``make_variant``: write an FP16 or INT8 variant of an FP32 ONNX file, or refuse with a report.

The one entry point of ``course_lib.optimize.compression``; the size arithmetic, the quantizability
report, the FP16 conversion and the INT8 calibration it uses are that package's other private modules
(its docstring lists them).

References
----------
ONNX Runtime documentation, "Quantize ONNX models". Kirana Kart module 19, "Quantisation".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from course_lib.core.checks import InvalidArgumentError, instance_of, one_of
from course_lib.optimize.compression._fp16 import convert_to_fp16
from course_lib.optimize.compression._int8 import (
    CALIBRATION_METHODS,
    FeedsCalibrationReader,
)
from course_lib.optimize.compression._quantizability import (
    NotQuantizableError,
    quantizability_report,
)

#: Variant modes ``make_variant`` can produce from an FP32 ONNX file.
VARIANT_MODES: tuple[str, ...] = ("fp16", "int8-dynamic", "int8-static")


def _check_paths(src: str | Path, dst: str | Path) -> tuple[Path, Path]:
    src_p = Path(instance_of("src", src, (str, Path)))
    dst_p = Path(instance_of("dst", dst, (str, Path)))
    if not src_p.is_file():
        raise FileNotFoundError(f"src: FP32 ONNX file not found: {src_p}")
    if dst_p.suffix != ".onnx":
        raise InvalidArgumentError(f"dst must end in .onnx, got {dst_p.name!r}")
    if not dst_p.parent.is_dir():
        raise FileNotFoundError(f"dst folder does not exist: {dst_p.parent} (create it first)")
    if dst_p.resolve() == src_p.resolve():
        raise InvalidArgumentError(f"dst must differ from src; both are {src_p}")
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
    one_of("mode", mode, VARIANT_MODES)
    one_of("calibration_method", calibration_method, CALIBRATION_METHODS)
    _check_calibration_feeds(mode, calibration_feeds)
    src_p, dst_p = _check_paths(src, dst)
    fp32 = onnx.load(str(src_p))
    if mode == "fp16":
        onnx.save(convert_to_fp16(fp32), str(dst_p))
        return dst_p
    report = quantizability_report(fp32)
    if not report.quantizable:
        raise NotQuantizableError(report)
    ops = None if op_types_to_quantize is None else list(op_types_to_quantize)
    if mode == "int8-dynamic":
        _quantize_dynamic(src_p, dst_p, ops=ops, per_channel=per_channel)
        return dst_p
    assert calibration_feeds is not None  # int8-static: checked on entry
    reader = FeedsCalibrationReader(calibration_feeds, batch_size=calibration_batch_size)
    _quantize_static(src_p, dst_p, reader, calibration_method, ops=ops, per_channel=per_channel)
    return dst_p


def _check_calibration_feeds(mode: str, calibration_feeds: Mapping[str, np.ndarray] | None) -> None:
    """Calibration feeds are required by ``int8-static`` and refused by every other mode."""
    if mode == "int8-static" and calibration_feeds is None:
        raise InvalidArgumentError("mode 'int8-static' needs calibration_feeds (a held-out calibration set)")
    if mode != "int8-static" and calibration_feeds is not None:
        raise InvalidArgumentError(f"calibration_feeds are only used by mode 'int8-static', not {mode!r}")


def _quantize_dynamic(src: Path, dst: Path, *, ops: list[str] | None, per_channel: bool) -> None:
    """INT8 weights, activation ranges computed on every call (ONNX Runtime's ``quantize_dynamic``)."""
    # ONNX Runtime's quantization tools load only for the INT8 modes
    from onnxruntime.quantization import (  # noqa: PLC0415 (heavy optional dependency)
        QuantType,
        quantize_dynamic,
    )

    quantize_dynamic(
        str(src),
        str(dst),
        op_types_to_quantize=ops,
        per_channel=per_channel,
        weight_type=QuantType.QInt8,
    )


def _quantize_static(
    src: Path,
    dst: Path,
    reader: FeedsCalibrationReader,
    calibration_method: str,
    *,
    ops: list[str] | None,
    per_channel: bool,
) -> None:
    """INT8 weights and activation ranges calibrated on ``reader``'s batches, written in QDQ format."""
    from onnxruntime.quantization import (  # noqa: PLC0415 (heavy optional dependency)
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[calibration_method]
    quantize_static(
        str(src),
        str(dst),
        reader,
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=ops,
        per_channel=per_channel,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=method,
    )
