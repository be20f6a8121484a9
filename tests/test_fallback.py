"""Per-call timeouts with a flagged fallback: the slow call is cancelled and counted, nothing left running."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from course_lib.serving.fallback import FallbackScorer, SlowDependency, auc_with_fallbacks

FEATURES = {"SC-0000001": {"x": 1.0}, "SC-0000002": {"x": 2.0}}


def forward(records):
    return np.array([r["x"] / 10 for r in records])


def find_call_ids(dep: SlowDependency, n: int = 200) -> tuple[str, str]:
    stalled = next(f"c{i}" for i in range(n) if dep.stalls(f"c{i}"))
    normal = next(f"c{i}" for i in range(n) if not dep.stalls(f"c{i}"))
    return stalled, normal


def test_a_late_lookup_is_cancelled_and_answered_with_the_flagged_prior():
    dep = SlowDependency(FEATURES.get, base_ms=0.0, slow_ms=60_000.0, slow_fraction=0.5, seed=1)
    scorer = FallbackScorer(dep, forward, prior=0.27, timeout_ms=20.0)
    stalled, normal = find_call_ids(dep)

    async def main():
        return [
            await scorer.score("SC-0000001", call_id=stalled),
            await scorer.score("SC-0000002", call_id=normal),
        ]

    slow_answer, fast_answer = asyncio.run(main())
    assert slow_answer == {"customer_id": "SC-0000001", "churn_probability": 0.27, "fallback": True}
    assert fast_answer == {"customer_id": "SC-0000002", "churn_probability": 0.2, "fallback": False}
    assert (scorer.requests, scorer.fallbacks, scorer.fallback_rate) == (2, 1, 0.5)
    assert (dep.started, dep.finished, dep.cancelled, dep.running) == (2, 1, 1, 0)


def test_without_a_timeout_the_slow_call_is_waited_for():
    dep = SlowDependency(FEATURES.get, base_ms=0.0, slow_ms=5.0, slow_fraction=1.0)
    scorer = FallbackScorer(dep, forward, prior=0.27, timeout_ms=None)
    answer = asyncio.run(scorer.score("SC-0000002", call_id="a"))
    assert answer["fallback"] is False and scorer.fallbacks == 0 and dep.finished == 1


def test_unknown_customer_is_an_error_not_a_fallback():
    scorer = FallbackScorer(SlowDependency(FEATURES.get, base_ms=0.0, slow_fraction=0.0), forward, prior=0.3)
    with pytest.raises(KeyError, match="SC-0000009"):
        asyncio.run(scorer.score("SC-0000009", call_id="x"))


def test_auc_with_fallbacks_substitutes_the_prior_on_the_flagged_rows():
    y = np.array([0, 0, 1, 1])
    p = np.array([0.1, 0.4, 0.35, 0.8])
    out = auc_with_fallbacks(y, p, np.array([False, False, False, False]), prior=0.5)
    assert out["auc_model"] == out["auc_served"] == 0.75 and out["auc_loss"] == 0.0
    out = auc_with_fallbacks(y, p, np.array([False, True, False, False]), prior=0.0)
    assert out["auc_served"] == 1.0 and out["fallback_rate"] == 0.25
    with pytest.raises(ValueError, match="one shape"):
        auc_with_fallbacks(y, p[:3], np.zeros(4, bool), prior=0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"prior": 1.5}, "prior"), ({"prior": 0.2, "timeout_ms": 0.0}, "timeout_ms")]
)
def test_bad_fallback_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FallbackScorer(SlowDependency(FEATURES.get), forward, **kwargs)


def test_run_fallback_load_scores_every_customer_once_in_order():
    from course_lib.measure.experiments import run_fallback_load

    dep = SlowDependency(FEATURES.get, base_ms=0.0, slow_ms=60_000.0, slow_fraction=0.5, seed=2)
    scorer = FallbackScorer(dep, forward, prior=0.3, timeout_ms=10.0)
    ids = ["SC-0000001", "SC-0000002"] * 10
    table = asyncio.run(run_fallback_load(scorer, ids, rate_rps=1_000, seed=0))
    expected = [dep.stalls(str(i)) for i in range(len(ids))]
    assert table["request_id"].tolist() == list(range(len(ids)))
    assert table["fallback"].tolist() == expected
    assert scorer.fallbacks == dep.cancelled == sum(expected) and dep.running == 0
