"""Which model and which data made an ONNX file: the keys of its ``metadata_props`` and their one writer.

One concept: an exported file's identity. ``course_lib.churn.export._onnx.pipeline_to_onnx`` stamps every file
it writes with the trained model's version and the training data's sha256 through :func:`stamp_identity`;
``course_lib.churn.versions.stamp_metadata`` adds a release name through the same function, and
``course_lib.churn.export._onnx.OnnxChurnScorer`` reads the keys back, so "which model answered?" has one
spelling. ``course_lib.churn.export._onnx`` re-exports the keys.

References
----------
ONNX IR specification, ``ModelProto.metadata_props``; ONNX Runtime ``ModelMetadata.custom_metadata_map``.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

#: ONNX ``metadata_props`` keys written by ``pipeline_to_onnx``: which model and which data made the file.
METADATA_MODEL_VERSION = "course_model_version"
METADATA_DATA_SHA256 = "course_data_sha256"


def stamp_identity(
    model: onnx.ModelProto,
    *,
    model_version: str | None,
    data_sha256: str,
    extra: Mapping[str, str] | None = None,
) -> onnx.ModelProto:
    """Write which model and which data made ``model`` into its ``metadata_props`` (in place; returned).

    The one writer of ``METADATA_MODEL_VERSION`` and ``METADATA_DATA_SHA256``:
    ``course_lib.churn.export._onnx.pipeline_to_onnx`` and ``course_lib.churn.versions.stamp_metadata`` both
    call it. Keys already present keep their place and take the new value; new keys follow in the order data
    checksum, model version, ``extra``.

    Parameters
    ----------
    model : onnx.ModelProto
    model_version : str or None
        The trained model's version (``course_lib.churn.model.model_version``); None writes no version.
    data_sha256 : str
        sha256 of the training data file.
    extra : mapping of str -> str, optional
        Further keys to write (e.g. ``course_release``).

    Raises
    ------
    ValueError
        If a value to write is not a non-empty str (the message names its key).
    """
    values = {METADATA_DATA_SHA256: data_sha256}
    if model_version is not None:
        values[METADATA_MODEL_VERSION] = model_version
    values.update(extra or {})
    empty = [key for key, value in values.items() if not isinstance(value, str) or not value]
    if empty:
        raise ValueError(f"metadata values must be non-empty strings; empty or not a str: {empty}")
    onnx.helper.set_model_props(model, {p.key: p.value for p in model.metadata_props} | values)
    return model
