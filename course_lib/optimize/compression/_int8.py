"""INT8 variants of an ONNX model: dynamic and static (QDQ) quantization, calibration, activation ranges.

Dynamic quantization stores weights as INT8 and measures each activation's range on every call (so a
score can depend on the other rows of its batch); static quantization fixes the activation ranges in
advance from a held-out calibration set, with a choice of calibration method.

References
----------
ONNX Runtime documentation, "Quantize ONNX models" (dynamic vs static, QDQ format, calibration methods).
microsoft/onnxruntime issue #18792 (histogram calibration needs equal-shaped calibration batches).
ONNX operator specification, ``QuantizeLinear``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
from onnx import numpy_helper

from course_lib.core.checks import InvalidArgumentError, integer, non_empty
from course_lib.optimize.compression._quantizability import load_model_proto

#: Calibration methods of ONNX Runtime's static quantizer, by the names the course uses.
CALIBRATION_METHODS: tuple[str, ...] = ("minmax", "entropy", "percentile")


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
        non_empty("feeds", feeds)
        lengths = {name: len(arr) for name, arr in feeds.items()}
        n_rows = next(iter(lengths.values()))
        if len(set(lengths.values())) != 1 or n_rows == 0:
            raise ValueError(f"every feed must have the same, non-zero number of rows; got {lengths}")
        batch_size = integer("batch_size", batch_size, min=1)
        if n_rows % batch_size:
            raise InvalidArgumentError(
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
    graph = load_model_proto(model, "model").graph
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
