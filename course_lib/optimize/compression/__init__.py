"""Post-training compression of ONNX models: write an FP16 or INT8 variant of an FP32 file, or refuse.

* ``_variant``: ``make_variant``, the one entry point;
* ``_size``: the size arithmetic (parameters x bytes per parameter), also for files;
* ``_quantizability``: what ONNX Runtime's INT8 quantizer can rewrite (a tree ensemble's numbers live in
  node attributes: nothing to quantize, so ``make_variant`` refuses with a report);
* ``_fp16``: an FP16 conversion that ONNX Runtime can load (the upstream converter's Cast and
  shared-weight bugs repaired);
* ``_int8``: dynamic and static (QDQ) INT8, calibration, activation ranges.

References
----------
ONNX Runtime documentation, "Quantize ONNX models". Kirana Kart module 19, "Quantisation".
"""

from __future__ import annotations

from course_lib.optimize.compression._fp16 import (
    convert_to_fp16,
)
from course_lib.optimize.compression._int8 import (
    CALIBRATION_METHODS,
    FeedsCalibrationReader,
    activation_ranges,
)
from course_lib.optimize.compression._quantizability import (
    NotQuantizableError,
    QuantizabilityReport,
    graph_changes,
    quantizability_report,
)
from course_lib.optimize.compression._size import (
    BYTES_PER_PARAMETER,
    expected_size_bytes,
    size_table,
)
from course_lib.optimize.compression._variant import (
    VARIANT_MODES,
    make_variant,
)

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
