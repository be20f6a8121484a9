"""PSI on hand-computed vectors, the stated thresholds, the shifted week, slice AUC over time."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from course_lib.operate.drift import (
    PSI_ALERT,
    PSI_STABLE,
    psi,
    psi_table,
    psi_verdict,
    shifted_week,
    slice_auc_over_time,
)


def test_psi_of_categories_by_hand():
    reference = ["a"] * 50 + ["b"] * 50
    current = ["a"] * 80 + ["b"] * 20
    expected = (0.8 - 0.5) * math.log(0.8 / 0.5) + (0.2 - 0.5) * math.log(0.2 / 0.5)
    assert psi(reference, current) == pytest.approx(expected)
    assert psi(reference, reference) == 0.0


def test_psi_numeric_uses_reference_deciles_and_a_missing_bin():
    ref = np.arange(1000.0)
    assert psi(ref, ref) == pytest.approx(0.0)
    shifted = ref + 500  # deciles 0-4 empty, 5-8 keep 10 % each, the top one holds 60 %
    top_heavy = psi(ref, shifted)
    tenths = np.full(10, 0.1)
    got = np.array([0.0] * 5 + [0.1] * 4 + [0.6])
    by_hand = float(np.sum((np.maximum(got, 1e-4) - tenths) * np.log(np.maximum(got, 1e-4) / tenths)))
    assert top_heavy == pytest.approx(by_hand)
    with_missing = np.append(ref, [np.nan] * 100)
    assert psi(ref, with_missing) > 0  # missing values are a bin of their own


def test_psi_of_two_samples_of_one_distribution_is_small():
    rng = np.random.default_rng(0)
    values = [psi(rng.normal(size=5000), rng.normal(size=1000)) for _ in range(20)]
    assert max(values) < PSI_STABLE


def test_verdicts_follow_the_stated_thresholds():
    assert (PSI_STABLE, PSI_ALERT) == (0.10, 0.25)
    assert [psi_verdict(v) for v in (0.05, 0.10, 0.2, 0.25, 1.0)] == [
        "stable",
        "moderate shift",
        "moderate shift",
        "major shift",
        "major shift",
    ]


def test_psi_validates():
    with pytest.raises(ValueError, match="non-empty"):
        psi([], [1.0])
    with pytest.raises(ValueError, match="bins"):
        psi([1.0, 2.0], [1.0], bins=1)


@pytest.fixture(scope="module")
def week():
    return shifted_week(500, days=5, seed=1)


def test_shifted_week_moves_the_contract_mix(telco, week):
    share = week.groupby("day")["contract"].apply(lambda s: (s == "Month-to-month").mean())
    assert share.iloc[0] == pytest.approx((telco["contract"] == "Month-to-month").mean(), abs=0.06)
    assert share.iloc[-1] == pytest.approx(0.80, abs=0.05)
    table = psi_table(telco, week[week["day"] == 4], ["contract", "monthly_charges"])
    assert table.loc["contract", "psi"] > PSI_STABLE
    assert list(table.columns) == ["psi", "verdict"]


def test_slice_auc_over_time_uses_only_arrived_labels():
    rng = np.random.default_rng(0)
    n = 4000
    frame = pd.DataFrame(
        {
            "day": np.repeat([0, 1], n // 2),
            "tenure": rng.integers(0, 73, n),
            "churn": (rng.random(n) < 0.3).astype(float),
        }
    )
    frame["score"] = frame["churn"] * 0.5 + rng.random(n) * 0.6
    frame.loc[frame["day"] == 1, "churn"] = np.nan  # day 1's labels have not arrived
    table = slice_auc_over_time(frame, "score")
    assert list(table.index) == [0]
    assert 0.8 < table.loc[0, "all"] <= 1.0
    assert table.loc[0, "n_all"] == n // 2
