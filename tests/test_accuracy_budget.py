"""course_lib.optimize.accuracy_budget: a budget declared first, per-slice AUC drops, verdicts, paired bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.churn.model import labels, metrics_by_slice
from course_lib.optimize.accuracy_budget import (
    AccuracyBudget,
    auc_difference_ci,
    budget_verdicts,
    slice_auc_drops,
    slices_over_budget,
)


@pytest.fixture(scope="module")
def test_frame(churn_model):
    df = churn_model.split.test
    return df, churn_model.predict_proba(df)


def test_identical_predictions_lose_nothing_and_pass(test_frame):
    df, p = test_frame
    verdict = budget_verdicts(df, p, {"copy": p.copy()}, AccuracyBudget())
    row = verdict.loc["copy"]
    assert row["max_slice_auc_drop"] == 0 and row["log_loss_increase"] == 0 and bool(row["passes"])


def test_damage_on_one_slice_fails_the_budget_and_names_that_slice(test_frame):
    df, p = test_frame
    damaged = p.copy()
    two_year = (df["contract"] == "Two year").to_numpy()
    rng = np.random.default_rng(0)
    damaged[two_year] = rng.uniform(0, 1, two_year.sum())  # scramble the ranking inside one slice
    drops = slice_auc_drops(df, p, {"damaged": damaged})
    assert drops.loc[("contract", "Two year"), "damaged"] > 0.1
    verdict = budget_verdicts(df, p, {"damaged": damaged}, AccuracyBudget(max_slice_auc_drop=0.01))
    assert not verdict.loc["damaged", "passes"]
    # the worst slice is Two year itself or a slice that overlaps it (most have no internet service)
    assert verdict.loc["damaged", "max_slice_auc_drop"] >= drops.loc[("contract", "Two year"), "damaged"]
    assert drops.loc[("all", "all"), "damaged"] < drops.loc[("contract", "Two year"), "damaged"]


def test_log_loss_limit_catches_a_calibration_shift_that_auc_ignores(test_frame):
    df, p = test_frame
    squashed = 0.5 + (p - 0.5) * 0.5  # same ranking, worse probabilities
    verdict = budget_verdicts(df, p, {"squashed": squashed}, AccuracyBudget())
    assert verdict.loc["squashed", "max_slice_auc_drop"] == pytest.approx(0, abs=1e-12)
    assert verdict.loc["squashed", "log_loss_increase"] > 0.01
    assert not verdict.loc["squashed", "passes"]


def test_single_class_slices_are_counted_not_hidden(test_frame):
    df, p = test_frame
    sub = df[df["contract"] == "Two year"]
    sub = sub[~sub["churn"]]  # no churner left: AUC undefined on every slice
    ps = p[: len(sub)]
    verdict = budget_verdicts(sub, ps, {"same": ps}, AccuracyBudget())
    assert verdict.loc["same", "n_slices_undefined"] > 0


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "0.01", True])
def test_bad_budget_raises(bad):
    with pytest.raises(ValueError, match="max_slice_auc_drop"):
        AccuracyBudget(max_slice_auc_drop=bad)


def test_bad_candidates_raise(test_frame):
    df, p = test_frame
    with pytest.raises(ValueError, match="candidates must be non-empty"):
        slice_auc_drops(df, p, {})
    with pytest.raises(ValueError, match="probabilities for"):
        slice_auc_drops(df, p, {"short": p[:-1]})
    with pytest.raises(TypeError, match="AccuracyBudget"):
        budget_verdicts(df, p, {"x": p}, {"max_slice_auc_drop": 0.01})


def test_auc_difference_of_a_model_with_itself_is_exactly_zero(test_frame):
    df, p = test_frame
    ci = auc_difference_ci(labels(df), p, p, n_boot=100)
    assert ci["difference"] == ci["ci_low"] == ci["ci_high"] == 0


def test_auc_difference_is_antisymmetric_and_brackets_the_point_estimate(test_frame):
    df, p = test_frame
    noisy = np.clip(p + np.random.default_rng(1).normal(0, 0.2, len(p)), 0, 1)
    ab = auc_difference_ci(labels(df), p, noisy, n_boot=200, seed=3)
    ba = auc_difference_ci(labels(df), noisy, p, n_boot=200, seed=3)
    assert ab["difference"] == pytest.approx(-ba["difference"])
    assert ab["ci_low"] == pytest.approx(-ba["ci_high"])
    assert ab["ci_low"] <= ab["difference"] <= ab["ci_high"]
    assert ab["ci_low"] > 0  # noise of sd 0.2 clearly hurts


def test_bad_bootstrap_arguments_raise(test_frame):
    df, p = test_frame
    with pytest.raises(ValueError, match="n_boot"):
        auc_difference_ci(labels(df), p, p, n_boot=10)
    with pytest.raises(ValueError, match="level"):
        auc_difference_ci(labels(df), p, p, level=1.5)
    with pytest.raises(ValueError, match="equal length"):
        auc_difference_ci(labels(df), p, p[:-1])


def test_auc_interval_with_a_single_class_raises_a_clear_value_error():
    y = np.zeros(50, dtype=int)
    p = np.linspace(0, 1, 50)
    with pytest.raises(ValueError, match="single class"):
        auc_difference_ci(y, p, p[::-1], n_boot=100)


def test_the_core_on_the_lessons_hand_example():
    reference = {"all": 0.84, "contract=Month-to-month": 0.76, "contract=Two year": 0.80}
    candidate = {"all": 0.835, "contract=Month-to-month": 0.755, "contract=Two year": 0.77}
    broken = slices_over_budget(reference, candidate, max_drop=0.01)
    assert list(broken) == ["contract=Two year"] and broken["contract=Two year"] == pytest.approx(0.03)
    assert slices_over_budget(reference, reference, max_drop=0.0) == {}


def test_hardened_verdicts_agree_with_the_core_on_the_same_vectors(test_frame):
    df, p = test_frame
    rng = np.random.default_rng(1)
    damaged = p.copy()
    two_year = (df["contract"] == "Two year").to_numpy()
    damaged[two_year] = rng.uniform(0, 1, two_year.sum())
    candidates = {
        "copy": p.copy(),
        "noisy": np.clip(p + rng.normal(0, 0.01, len(p)), 0, 1),
        "damaged": damaged,
    }
    loose_log_loss = AccuracyBudget(max_slice_auc_drop=0.01, max_log_loss_increase=10.0)
    verdicts = budget_verdicts(df, p, candidates, loose_log_loss)
    ref = metrics_by_slice(df, p)["roc_auc"].dropna()
    for name, probs in candidates.items():
        cand = metrics_by_slice(df, probs)["roc_auc"]
        broken = slices_over_budget(ref.to_dict(), cand.to_dict(), max_drop=0.01)
        assert bool(verdicts.loc[name, "passes"]) == (not broken), name
        if broken:
            worst = max(broken, key=broken.__getitem__)
            assert "=".join(worst) == verdicts.loc[name, "worst_slice"]
            assert broken[worst] == pytest.approx(verdicts.loc[name, "max_slice_auc_drop"])
