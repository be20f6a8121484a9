"""The fan-out check: slow pages against 1 - (1 - p)^k, exact intervals, and what breaks independence."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from course_lib.measure.tail import binomial_interval, fanout_check, stalled_calls
from course_lib.serving.hedging import FanoutRun
from course_lib.serving.replica import is_slow


def _run(call_ms, page_extra_ms=0.0):
    call_ms = np.asarray(call_ms, dtype=float)
    pages, k = call_ms.shape
    ids = np.array([[f"f-{p}-{j}" for j in range(k)] for p in range(pages)])
    primary = np.tile(np.arange(k) % 2, (pages, 1))
    return FanoutRun(call_ms.max(axis=1) + page_extra_ms, call_ms, primary, ids)


def test_binomial_interval_is_scipys_exact_interval():
    ci = binomtest(7, 50).proportion_ci(confidence_level=0.9, method="exact")
    assert binomial_interval(7, 50, 0.9) == (ci.low, ci.high)
    with pytest.raises(ValueError, match="successes must be an integer >= 0 and <= 10, got 11"):
        binomial_interval(11, 10)


def test_independent_stalls_give_the_formulas_share_of_slow_pages():
    rng = np.random.default_rng(0)
    stalled = rng.random((4000, 5)) < 0.03
    run = _run(np.where(stalled, 100.0, 2.0))
    check = fanout_check(run, stalled, slow_ms=50.0)
    assert check.k == 5 and check.pages == 4000
    assert check.p_call == pytest.approx(stalled.mean())
    assert check.predicted == pytest.approx(1 - (1 - stalled.mean()) ** 5)
    assert check.p_call_low < check.p_call < check.p_call_high
    assert check.predicted_low < check.predicted < check.predicted_high
    assert check.slow_pages == pytest.approx(stalled.any(axis=1).mean())
    assert check.agrees and check.slow_without_stall == 0 and check.stalled_not_slow == 0
    assert check.pages_with_stall == int(stalled.any(axis=1).sum())


def test_a_page_that_queues_by_itself_breaks_the_formula_and_is_counted():
    stalled = np.zeros((200, 20), dtype=bool)
    stalled[:10, 0] = True  # 10 stalled calls in 4,000
    run = _run(np.where(stalled, 100.0, 2.0), page_extra_ms=60.0)  # every page queues over the threshold
    check = fanout_check(run, stalled, slow_ms=50.0)
    assert check.slow_pages == 1.0 and check.slow_without_stall == 190
    assert not check.agrees  # the formula at p = 10/4000 says 4.9 %, not every page
    with pytest.raises(ValueError, match="stalled must have the shape"):
        fanout_check(run, stalled[:, :3], slow_ms=50.0)


def test_stalled_calls_are_the_seeded_choice_of_the_stalling_replica_only():
    ids = np.array([[f"x-{p}-{j}" for j in range(4)] for p in range(500)])
    primary = np.tile([0, 1, 0, 1], (500, 1))
    stalled = stalled_calls(ids, primary, replica=0, seed=3, slow_fraction=0.2)
    expected = np.vectorize(lambda i: is_slow(i, seed=3, slow_fraction=0.2))(ids) & (primary == 0)
    assert (stalled == expected).all() and not stalled[:, 1::2].any() and stalled.any()
    with pytest.raises(ValueError, match="same shape"):
        stalled_calls(ids, primary[:, :2], replica=0, seed=3, slow_fraction=0.2)
