"""The committed Telco file, its checksum guard, cleaning, and the synthetic population."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

from course_lib.churn.data import (
    CATEGORICAL_LEVELS,
    FEATURE_COLUMNS,
    TELCO_PATH,
    TELCO_SHA256,
    DataIntegrityError,
    clean_telco,
    load_telco,
    make_customers,
)


def test_telco_has_the_published_shape_and_churn_rate(telco):
    assert telco.shape == (7043, 21)
    assert telco["churn"].dtype == bool
    assert round(telco["churn"].mean(), 4) == 0.2654
    assert telco["customer_id"].is_unique
    assert int(telco["total_charges"].isna().sum()) == 11


def test_telco_columns_are_typed(telco):
    for col, levels in CATEGORICAL_LEVELS.items():
        assert isinstance(telco[col].dtype, pd.CategoricalDtype)
        assert tuple(telco[col].cat.categories) == levels
        assert telco[col].notna().all()
    assert telco["tenure"].between(0, 72).all()
    assert len(FEATURE_COLUMNS) == 19


def test_corrupted_file_names_path_and_expected_checksum(tmp_path):
    bad = tmp_path / "telco.csv"
    shutil.copy(TELCO_PATH, bad)
    with bad.open("a") as fh:
        fh.write("TC-99999,No,1,0,0,0,1,1,No,DSL,No,No,No,No,No,No,One year,1,Mailed check,20.0,20.0\n")
    with pytest.raises(DataIntegrityError) as err:
        load_telco(bad)
    assert str(bad) in str(err.value)
    assert TELCO_SHA256 in str(err.value)


def test_missing_file_names_path_and_expected_checksum(tmp_path):
    with pytest.raises(DataIntegrityError, match="not found") as err:
        load_telco(tmp_path / "absent.csv")
    assert TELCO_SHA256 in str(err.value)


def test_unknown_category_level_is_rejected_when_checksum_is_skipped(tmp_path):
    raw = pd.read_csv(TELCO_PATH)
    raw.loc[0, "contract"] = "Three year"
    path = tmp_path / "edited.csv"
    raw.to_csv(path, index=False)
    with pytest.raises(DataIntegrityError, match="contract"):
        load_telco(path, expected_sha256=None)


def test_clean_fills_only_new_customers_blank_total_charges(telco):
    cleaned = clean_telco(telco)
    assert cleaned["total_charges"].notna().all()
    filled = telco["total_charges"].isna()
    assert (telco.loc[filled, "tenure"] == 0).all()
    assert (cleaned.loc[filled, "total_charges"] == 0.0).all()
    assert telco["total_charges"].isna().sum() == 11, "clean_telco must not modify its input"


def test_clean_refuses_to_fill_a_blank_for_an_existing_customer(telco):
    broken = telco.copy()
    broken.loc[broken.index[5], "total_charges"] = np.nan
    with pytest.raises(ValueError, match="tenure > 0"):
        clean_telco(broken)


def test_make_customers_is_seeded_and_keeps_the_schema(telco):
    a = make_customers(2_000, seed=3, source=telco)
    b = make_customers(2_000, seed=3, source=telco)
    c = make_customers(2_000, seed=4, source=telco)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)
    assert list(a.columns) == list(telco.columns)
    assert (a.dtypes == telco.dtypes).all()
    assert a["customer_id"].is_unique


def test_make_customers_keeps_the_joint_distribution(telco):
    synth = make_customers(50_000, seed=1, source=telco)
    real_rate = telco.groupby("contract", observed=True)["churn"].mean()
    synth_rate = synth.groupby("contract", observed=True)["churn"].mean()
    assert np.allclose(real_rate, synth_rate, atol=0.02)
    assert synth["tenure"].between(0, 72).all()
    assert (
        synth["monthly_charges"].between(telco["monthly_charges"].min(), telco["monthly_charges"].max()).all()
    )
    assert synth.loc[synth["tenure"] == 0, "total_charges"].isna().all()
    assert synth.loc[synth["tenure"] > 0, "total_charges"].notna().all()
    corr_real = telco[["tenure", "total_charges"]].corr().iloc[0, 1]
    corr_synth = synth[["tenure", "total_charges"]].corr().iloc[0, 1]
    assert abs(corr_real - corr_synth) < 0.03


@pytest.mark.parametrize("n", [0, -5, 2.5, "10", True])
def test_make_customers_rejects_a_bad_size(n, telco):
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        make_customers(n, source=telco)
