"""The churn pipeline as one ONNX graph: export, pinned ONNX Runtime sessions, parity, the file's identity.

* ``_onnx``: ``pipeline_to_onnx`` (scikit-learn preprocessing + XGBoost in one graph), ``make_session``
  (threads pinned), ``OnnxChurnScorer`` (input checks that name the bad column), ``check_parity``;
* ``_metadata``: the model version and data sha256 stamped into ``metadata_props`` (one writer,
  ``stamp_identity``), and ``ModelMismatchError`` when a session and a pipeline disagree.
"""

from __future__ import annotations

from course_lib.churn.export._metadata import (
    METADATA_DATA_SHA256,
    METADATA_MODEL_VERSION,
    stamp_identity,
)
from course_lib.churn.export._onnx import (
    PARITY_ATOL,
    ModelMismatchError,
    OnnxChurnScorer,
    ParityError,
    ParityReport,
    check_parity,
    make_session,
    pipeline_to_onnx,
)

__all__ = [
    "METADATA_DATA_SHA256",
    "METADATA_MODEL_VERSION",
    "PARITY_ATOL",
    "ModelMismatchError",
    "OnnxChurnScorer",
    "ParityError",
    "ParityReport",
    "check_parity",
    "make_session",
    "pipeline_to_onnx",
    "stamp_identity",
]
