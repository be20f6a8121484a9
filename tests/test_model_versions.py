"""Model versions carry their identity in the ONNX metadata, and loading checks it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from course_lib.churn.model import features, tenure_band
from course_lib.churn.versions import (
    BROKEN_SLICE,
    METADATA_DATA_SHA256,
    METADATA_MODEL_VERSION,
    METADATA_RELEASE,
    RELEASES,
    ModelVersionError,
    _broken_training_data,
    build_versions,
    load_version,
    load_versions,
    read_metadata,
    stamp_metadata,
)


@pytest.fixture(scope="module")
def versions(churn_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("versions")
    return build_versions(folder, model=churn_model)


def test_every_file_names_its_release_hash_and_data(versions, churn_model):
    from course_lib.churn.data import TELCO_SHA256

    assert list(versions) == list(RELEASES)
    metas = {r: read_metadata(p) for r, p in versions.items()}
    assert {m[METADATA_RELEASE] for m in metas.values()} == set(RELEASES)
    assert metas["v1"][METADATA_MODEL_VERSION] == churn_model.model_version
    assert len({m[METADATA_MODEL_VERSION] for m in metas.values()}) == 3
    assert all(m[METADATA_DATA_SHA256] == TELCO_SHA256 for m in metas.values())


def test_build_reuses_finished_files(versions, churn_model):
    stamps = {r: p.stat().st_mtime_ns for r, p in versions.items()}
    again = build_versions(next(iter(versions.values())).parent, model=churn_model)
    assert again == versions and {r: p.stat().st_mtime_ns for r, p in again.items()} == stamps


def test_load_checks_release_and_hash(versions):
    loaded = load_versions(versions)
    assert loaded["v2"].release == "v2"
    with pytest.raises(ModelVersionError, match="expected release 'v2'"):
        load_version(versions["v2-broken"], expected_release="v2")
    with pytest.raises(ModelVersionError, match="expected model"):
        load_version(versions["v1"], expected_release="v1", expected_hash="000000000000")
    with pytest.raises(FileNotFoundError):
        load_version(versions["v1"].with_name("missing.onnx"), expected_release="v1")


def test_a_file_without_metadata_is_refused(versions, tmp_path):
    model = onnx.load(str(versions["v1"]))
    del model.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(model, str(bare))
    with pytest.raises(ModelVersionError, match=r"no .* in its ONNX metadata"):
        load_version(bare, expected_release="v1")
    with pytest.raises(ValueError, match="non-empty"):
        stamp_metadata(model, release="", content_hash="x", data_sha256="y")


def test_versions_really_differ(versions, churn_model):
    loaded = load_versions(versions)
    test = churn_model.split.test
    p = {r: v.scorer.predict_proba(features(test)) for r, v in loaded.items()}
    assert np.allclose(p["v1"], churn_model.predict_proba(test), atol=1e-5)
    assert np.abs(p["v2"] - p["v1"]).max() > 0.01  # 200 of 400 trees: a different model
    new = test["tenure"].to_numpy() < 12
    observed = test["churn"].to_numpy()[new].mean()
    # the broken data pipeline under-predicts churn of first-year customers; v1 does not
    assert abs(p["v1"][new].mean() - observed) < 0.05
    assert observed - p["v2-broken"][new].mean() > 0.15


def test_the_broken_pipeline_loses_churners_of_broken_slice_only(churn_model):
    """``BROKEN_SLICE`` names the slice v2-broken's training data lost two thirds of its churners in."""
    column, band = BROKEN_SLICE
    before = churn_model.split.train.assign(**{column: lambda d: tenure_band(d["tenure"]).astype(str)})
    after = _broken_training_data(churn_model).assign(
        **{column: lambda d: tenure_band(d["tenure"]).astype(str)}
    )
    churners = {
        name: frame[frame["churn"].astype(bool)].groupby(column).size()
        for name, frame in (("before", before), ("after", after))
    }
    lost = churners["before"] - churners["after"].reindex(churners["before"].index, fill_value=0)
    assert set(lost[lost > 0].index) == {band}
    assert lost[band] == churners["before"][band] - churners["before"][band] // 3
    assert len(before) - len(after) == lost[band]  # non-churners and other slices are untouched
