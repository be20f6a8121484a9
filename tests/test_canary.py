"""Canary routing is sticky and monotone; the ramp controller promotes, holds and rolls back on the defined vectors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.operate.canary import (
    HASH_BUCKETS,
    DecisionRules,
    HashRouter,
    RampController,
    RandomRouter,
    canary_bucket,
    check_window,
    refresh_flips,
    sticky_version,
)
from course_lib.operate.canary_day import hourly_metrics, simulate_canary_day

IDS = [f"SC-{i:07d}" for i in range(1, 20_001)]


def test_bucket_is_deterministic_and_salted():
    assert canary_bucket("SC-0000042") == canary_bucket("SC-0000042")
    assert 0 <= canary_bucket("SC-0000042") < HASH_BUCKETS
    assert [canary_bucket(c) for c in IDS[:200]] != [canary_bucket(c, salt="other") for c in IDS[:200]]
    with pytest.raises(TypeError, match="customer_id"):
        canary_bucket(42)


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 100), st.floats(0, 100))
def test_raising_the_percentage_only_moves_customers_to_the_canary(p1, p2):
    low, high = sorted((p1, p2))
    router = HashRouter("v1", "v2", low)
    before = {c for c in IDS[:3000] if router.version_for(c) == "v2"}
    router.set_percent(high)
    after = {c for c in IDS[:3000] if router.version_for(c) == "v2"}
    assert before <= after


def test_share_matches_the_percentage_and_the_ends():
    for percent in (0, 5, 25, 100):
        router = HashRouter("v1", "v2", percent)
        share = np.mean([router.version_for(c) == "v2" for c in IDS])
        # binomial standard error at n = 20,000 is at most 0.0036; allow 4 of them
        assert abs(share - percent / 100) <= 4 * 0.0036
    assert all(HashRouter("v1", "v2", 0).version_for(c) == "v1" for c in IDS[:500])
    assert all(HashRouter("v1", "v2", 100).version_for(c) == "v2" for c in IDS[:500])


def test_sticky_router_never_flips_random_router_does():
    sticky = refresh_flips(HashRouter("v1", "v2", 25), IDS[:1000], refreshes=10)
    seeded = refresh_flips(RandomRouter("v1", "v2", 25, seed=1), IDS[:1000], refreshes=10)
    assert not sticky["flipped"].any()
    # P(flip in 10 refreshes at 25 %) = 1 - 0.75^10 - 0.25^10 = 0.944
    assert 0.90 < seeded["flipped"].mean() < 0.98


def test_percent_is_validated():
    with pytest.raises(ValueError, match="percent"):
        HashRouter("v1", "v2", 120)
    with pytest.raises(ValueError, match="percent"):
        HashRouter("v1", "v2").set_percent(-1)


def _window(n_stable=2000, n_canary=600, *, canary_latency=5.0, canary_errors=0.0, canary_shift=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for version, n in (("v1", n_stable), ("v2", n_canary)):
        scores = rng.beta(2, 5, n) + (canary_shift if version == "v2" else 0)
        status = np.where(rng.random(n) < (canary_errors if version == "v2" else 0), 500, 200)
        latency = rng.lognormal(np.log(canary_latency if version == "v2" else 5.0), 0.2, n)
        band = rng.choice(["0-11 mo", "48-72 mo"], n)
        rows.append(
            pd.DataFrame(
                {
                    "version": version,
                    "latency_ms": latency,
                    "status": status,
                    "score": np.where(status == 200, np.clip(scores, 0, 1), np.nan),
                    "tenure_band": band,
                    "label": (
                        rng.random(n) < np.clip(scores - (canary_shift if version == "v2" else 0), 0, 1)
                    ).astype(float),
                }
            )
        )
    return pd.concat(rows, ignore_index=True)


def _failed(checks):
    return {c.rule for c in checks if c.enough_data and not c.passed}


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"canary_latency": 30.0}, "p95_ms"),
        ({"canary_latency": 9.0}, "p95_ratio"),
        ({"canary_errors": 0.05}, "error_ratio"),
        ({"canary_shift": 0.3}, "score_psi"),
    ],
)
def test_each_rule_fails_on_its_vector(kwargs, rule):
    checks = check_window(_window(**kwargs), "v1", "v2", DecisionRules())
    assert rule in _failed(checks)
    assert not _failed(check_window(_window(), "v1", "v2", DecisionRules()))


def test_calibration_rule_fails_on_a_miscalibrated_slice():
    window = _window(n_canary=2000)
    bad = (window["version"] == "v2") & (window["tenure_band"] == "0-11 mo")
    window.loc[bad, "score"] = window.loc[bad, "score"] * 0.3
    assert "calibration_gap[0-11 mo]" in _failed(check_window(window, "v1", "v2", DecisionRules()))


def test_small_windows_hold_instead_of_deciding():
    controller = RampController(HashRouter("v1", "v2"))
    decision = controller.decide(1, _window(n_canary=50, canary_latency=50.0))
    assert decision.action == "hold" and controller.router.percent == 5


def test_controller_ramps_and_rolls_back():
    rules = DecisionRules(labels_before_leaving_percent=101)  # labels judged when present, not awaited
    controller = RampController(HashRouter("v1", "v2"), rules, min_windows=1)
    assert controller.decide(1, _window()).action == "promote" and controller.router.percent == 25
    assert controller.decide(2, _window()).action == "promote" and controller.router.percent == 100
    decision = controller.decide(3, _window(canary_errors=0.05))
    assert decision.action == "rollback" and controller.router.percent == 0
    assert any("error_ratio" in r for r in decision.reasons)
    assert controller.decide(4, _window()).action == "hold" and controller.router.percent == 0
    assert list(controller.log_frame()["action"]) == ["promote", "promote", "rollback", "hold"]


def test_label_gate_holds_at_25_percent_until_slices_have_labels():
    controller = RampController(HashRouter("v1", "v2"), min_windows=1)
    controller.decide(1, _window())
    unlabelled = _window().assign(label=np.nan)
    decision = controller.decide(2, unlabelled)
    assert decision.action == "hold" and controller.router.percent == 25
    assert controller.decide(3, unlabelled, _window(n_canary=2000)).action == "promote"


def test_stages_are_validated():
    with pytest.raises(ValueError, match="ending at 100"):
        RampController(HashRouter("v1", "v2"), stages=(5, 25))
    with pytest.raises(ValueError, match="ending at 100"):
        RampController(HashRouter("v1", "v2"), stages=(25, 5, 100))


def _population(n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    tenure = rng.integers(0, 73, n)
    p = np.clip(0.5 - tenure / 150 + rng.normal(0, 0.1, n), 0.01, 0.99)
    churn = rng.random(n) < p
    frame = pd.DataFrame({"customer_id": IDS[:n], "tenure": tenure, "churn": churn})
    return frame, p


def test_simulated_day_rolls_back_a_model_miscalibrated_on_one_slice():
    pop, p = _population()
    broken = np.where(pop["tenure"] < 12, p * 0.7, p)
    latency = {v: np.random.default_rng(1).lognormal(np.log(3), 0.3, 500) for v in ("v1", "v2")}
    good = simulate_canary_day(pop, {"v1": p, "v2": p}, latency, hours=16)
    bad = simulate_canary_day(pop, {"v1": p, "v2": broken}, latency, hours=16)
    assert "complete" in set(good.decisions["action"]) and "rollback" not in set(good.decisions["action"])
    rollback = bad.decisions[bad.decisions["action"] == "rollback"].iloc[0]
    assert rollback["stage_percent"] < 100 and "calibration_gap[0-11 mo]" in rollback["reasons"]
    after = bad.requests[bad.requests["hour"] >= rollback["t"]]
    assert (after["version"] == "v1").all()
    metrics = hourly_metrics(bad.requests)
    assert metrics.groupby("hour")["requests"].sum().eq(6000).all()


@pytest.mark.parametrize("percent", [0, 0.5, 5, 12.5, 25, 50, 99, 100])
def test_sticky_core_routes_every_customer_as_hash_router_does(percent):
    router = HashRouter("v1", "v2", percent)
    assert [sticky_version(c, percent) for c in IDS[:5000]] == [router.version_for(c) for c in IDS[:5000]]


def test_sticky_core_by_hand():
    """A customer whose bucket is b goes to v2 exactly when b < percent, on every call."""
    bucket = canary_bucket("SC-0000123") / 100  # in [0, 100)
    assert sticky_version("SC-0000123", bucket) == "v1"  # not below its own bucket
    assert sticky_version("SC-0000123", bucket + 0.01) == "v2"
    assert {sticky_version("SC-0000123", 25) for _ in range(10)} in ({"v1"}, {"v2"})
