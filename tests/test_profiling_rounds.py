"""Several request paths profiled side by side in rotated rounds (course_lib.serving.profiling.profile_in_rounds)."""

from __future__ import annotations

import pytest

from course_lib.serving.profiling import LatencyBudget, RequestProfile, profile_in_rounds


def _sender(log, name, ms):
    def send(key):
        log.append((name, key))
        return RequestProfile(key, {"work": ms})

    return send


def test_rounds_rotate_the_configurations_and_slice_their_keys():
    log = []
    keys = {"a": [f"a{i}" for i in range(240)], "b": [f"b{i}" for i in range(120)]}
    senders = {"a": _sender(log, "a", 2.0), "b": _sender(log, "b", 1.0)}
    result = profile_in_rounds(senders, keys, rounds=6, warmup_requests={"a": 3, "b": 0})
    assert log[:3] == [("a", "a0"), ("a", "a1"), ("a", "a2")]  # warm-up, untimed
    timed = log[3:]
    firsts = [timed[i][0] for i in range(0, len(timed), 60)]  # each round: 40 of a and 20 of b
    assert firsts == ["a", "b", "a", "b", "a", "b"]  # the order rotates
    assert [len(b) for b in result.rounds["a"]] == [40] * 6 and len(result.budgets["b"]) == 120
    assert [p.request_id for p in result.rounds["b"][2].profiles] == [f"b{i}" for i in range(40, 60)]
    ratio = result.ratio("b", "a", stage="work")
    assert (ratio.ratio, ratio.low, ratio.high) == (0.5, 0.5, 0.5)


def test_rounds_keep_the_budget_targets_and_refuse_mismatches():
    keys = {"a": [str(i) for i in range(6)]}
    result = profile_in_rounds(
        {"a": _sender([], "a", 5.0)},
        keys,
        rounds=6,
        warmup_requests=0,
        budget=lambda: LatencyBudget(target_p99_ms=1.0),
    )
    assert bool(result.budgets["a"].summary().loc["end_to_end", "p99_breached"])
    with pytest.raises(ValueError, match="same configurations"):
        profile_in_rounds({"a": _sender([], "a", 1.0)}, {"b": ["x"] * 6})
    with pytest.raises(ValueError, match="at least 6 keys"):
        profile_in_rounds({"a": _sender([], "a", 1.0)}, {"a": ["x"] * 5})
    with pytest.raises(ValueError, match="at least 20 samples"):
        result.ratio("a", "a")  # one request per round: too few for a median
