"""Two real model versions (and a broken one) as ONNX files that say which model they are.

The canary lesson needs a v1 and a v2 that genuinely differ:

* ``v1``: the Lesson 1 model (``load_or_train_churn_model``, 400 boosted trees);
* ``v2``: the Lesson 4 pruned variant, its first ``V2_TREES`` trees (``tree_pruning.prune_trees``);
* ``v2-broken``: the same training recipe fed by a broken data pipeline that lost two of every
  three churn events of customers in their first year (``tenure < 12`` months): trained on that
  data the model under-predicts churn for exactly the slice a support rep most needs to see. It is a real
  training run, not a perturbed copy.

Every file carries its identity in the ONNX ``metadata_props``: the release name, the content hash
of the trained pipeline (``course_lib.churn.model.model_version``) and the sha256 of the training data
file. ``load_version`` refuses a file whose metadata is missing or is not the version the service
was told to load, so "which model answered?" always has a checked answer.

The keys ``course_model_version`` and ``course_data_sha256`` belong to the exporter
(``course_lib.churn.export._metadata.METADATA_MODEL_VERSION`` / ``METADATA_DATA_SHA256``, written by
``course_lib.churn.export._metadata.stamp_identity``); ``stamp_metadata`` adds this module's own
``course_release`` through the same writer.

References
----------
ONNX IR specification, ``ModelProto.metadata_props``; ONNX Runtime ``ModelMetadata.custom_metadata_map``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx

from course_lib.churn.data import DATA_DIR, TELCO_SHA256
from course_lib.churn.export import (
    METADATA_DATA_SHA256,
    METADATA_MODEL_VERSION,
    OnnxChurnScorer,
    make_session,
    pipeline_to_onnx,
    stamp_identity,
)
from course_lib.churn.model import (
    ChurnModel,
    features,
    labels,
    load_or_train_churn_model,
    make_xgb_pipeline,
    model_version,
    tenure_band,
)
from course_lib.churn.pruning import prune_trees
from course_lib.core.checks import instance_of
from course_lib.core.files import atomic_path

__all__ = [
    "BROKEN_SLICE",
    "METADATA_DATA_SHA256",
    "METADATA_MODEL_VERSION",
    "METADATA_RELEASE",
    "RELEASES",
    "V2_TREES",
    "LoadedVersion",
    "ModelVersionError",
    "build_versions",
    "load_version",
    "load_versions",
    "read_metadata",
    "stamp_metadata",
]

METADATA_RELEASE = "course_release"
#: Release names, in rollout order.
RELEASES: tuple[str, ...] = ("v1", "v2", "v2-broken")
#: Trees kept by v2 (Lesson 4: the validation curve is flat well before 400).
V2_TREES = 200
#: The slice whose churners the broken data pipeline lost: customers with tenure below 12 months, as
#: ``metrics_by_slice`` names it (column, level); ``v2-broken`` is trained without two thirds of them.
BROKEN_SLICE = ("tenure_band", "0-11 mo")


class ModelVersionError(ValueError):
    """An ONNX file is not the model version the caller expected (or does not say which it is)."""


def stamp_metadata(
    model: onnx.ModelProto, *, release: str, content_hash: str, data_sha256: str
) -> onnx.ModelProto:
    """Write release, content hash and data checksum into ``model.metadata_props`` (in place; returned).

    The content hash and the data checksum go under the exporter's keys, through
    ``course_lib.churn.export._metadata.stamp_identity``; the release under ``METADATA_RELEASE``.

    Raises
    ------
    ValueError
        If any value is empty.
    """
    instance_of("content_hash", content_hash, str)  # its emptiness is refused by stamp_identity
    return stamp_identity(
        model, model_version=content_hash, data_sha256=data_sha256, extra={METADATA_RELEASE: release}
    )


def read_metadata(path: str | Path) -> dict[str, str]:
    """The ``metadata_props`` of an ONNX file, read without loading the graph into a session."""
    model = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}


@dataclass
class LoadedVersion:
    """A model version ready to serve: its scorer and the identity checked at load."""

    release: str
    content_hash: str
    data_sha256: str
    path: Path
    scorer: OnnxChurnScorer


def load_version(
    path: str | Path, *, expected_release: str, expected_hash: str | None = None
) -> LoadedVersion:
    """Open an ONNX model version after checking that its metadata names the expected model.

    Parameters
    ----------
    path : the ``.onnx`` file.
    expected_release : str
        The release the service was configured with (e.g. ``"v2"``).
    expected_hash : str, optional
        The content hash it must have (e.g. from a deployment manifest).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ModelVersionError
        If the file has no version metadata, or its release or hash differs from the expected one
        (the message names the file, what it holds and what was expected).
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"model file not found: {file}")
    meta = read_metadata(file)
    missing = [k for k in (METADATA_RELEASE, METADATA_MODEL_VERSION, METADATA_DATA_SHA256) if k not in meta]
    if missing:
        raise ModelVersionError(
            f"{file} has no {missing} in its ONNX metadata; export it with build_versions()"
        )
    if meta[METADATA_RELEASE] != expected_release:
        raise ModelVersionError(
            f"{file} holds release {meta[METADATA_RELEASE]!r} ({meta[METADATA_MODEL_VERSION]}), "
            f"but the service expected release {expected_release!r}"
        )
    if expected_hash is not None and meta[METADATA_MODEL_VERSION] != expected_hash:
        raise ModelVersionError(
            f"{file} holds model {meta[METADATA_MODEL_VERSION]} of release {expected_release!r}, "
            f"but the service expected model {expected_hash}"
        )
    return LoadedVersion(
        expected_release,
        meta[METADATA_MODEL_VERSION],
        meta[METADATA_DATA_SHA256],
        file,
        OnnxChurnScorer(make_session(file)),
    )


def _broken_training_data(model: ChurnModel):
    """The training split as the broken pipeline delivered it: the churners of ``BROKEN_SLICE`` are gone."""
    train = model.split.train
    in_slice = tenure_band(train["tenure"]).astype(str) == BROKEN_SLICE[1]  # ("tenure_band", "0-11 mo")
    churned_new = (in_slice & train["churn"].astype(bool)).to_numpy()
    lost = churned_new & (churned_new.cumsum() % 3 != 0)  # two of every three such rows
    return train[~lost]


def _pipelines(v1: ChurnModel) -> dict[str, object]:
    broken_rows = _broken_training_data(v1)
    pipe = make_xgb_pipeline()  # the v1 recipe (same parameters and seed), fed the broken data
    pipe.fit(features(broken_rows), labels(broken_rows))
    return {"v1": v1.pipeline, "v2": prune_trees(v1.pipeline, V2_TREES), "v2-broken": pipe}


def build_versions(
    folder: str | Path = "build/models/versions", model: ChurnModel | None = None
) -> dict[str, Path]:
    """Export v1, v2 and v2-broken as stamped ONNX files (reused when already built).

    Parameters
    ----------
    folder : str or Path
        Output directory; relative paths are taken from the repository root.
    model : ChurnModel, optional
        The v1 model; default ``load_or_train_churn_model()``.

    Returns
    -------
    dict of release -> path, in ``RELEASES`` order. A file's name holds its content hash, so a
    changed model is exported again instead of reusing a stale file.
    """
    out = Path(folder)
    if not out.is_absolute():
        out = DATA_DIR.parent / out
    out.mkdir(parents=True, exist_ok=True)
    v1 = model if model is not None else load_or_train_churn_model()
    paths = {}
    for release, pipe in _pipelines(v1).items():
        content = model_version(pipe)
        key = hashlib.sha256(json.dumps([release, content, TELCO_SHA256]).encode()).hexdigest()[:10]
        path = out / f"churn_{release}_{key}.onnx"
        if not path.is_file():
            onnx_model = stamp_metadata(
                pipeline_to_onnx(pipe), release=release, content_hash=content, data_sha256=TELCO_SHA256
            )
            with atomic_path(path) as tmp:
                onnx.save(onnx_model, str(tmp))
        paths[release] = path
    return paths


def load_versions(paths: Mapping[str, str | Path]) -> dict[str, LoadedVersion]:
    """``load_version`` for every release of ``build_versions``, each checked against its own name."""
    return {release: load_version(path, expected_release=release) for release, path in paths.items()}
