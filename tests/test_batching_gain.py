"""The ladder-aware batching gain and Amdahl's bound (lesson logic of Lesson 3, moved into course_lib)."""

from __future__ import annotations

import asyncio
import math

import pandas as pd
import pytest

from course_lib.measure.batching_gain import (
    amdahl_bound,
    bound_verdict,
    gain_texts,
    gain_verdict,
    median_round_trip,
    one_call_verdict,
)

NAN = math.nan


def capacity(rows: dict[str, tuple[float, float]]) -> pd.DataFrame:
    return pd.DataFrame.from_dict(rows, orient="index", columns=["sustained_rps", "first_failed_rps"])


def test_both_limits_found_gives_the_ratio_and_its_interval():
    v = gain_verdict(capacity({"one": (200, 300), "batched": (400, 600)}), ["one"], "batched")
    assert v.ratio == 2.0 and v.text == "2.0x" and v.baseline == "one"
    assert (v.low, v.high) == pytest.approx((400 / 300, 600 / 200))
    assert "[1.33x, 3.00x]" in v.caveat and v.direction == "gain"


def test_batching_that_met_every_rung_is_only_a_lower_bound():
    v = gain_verdict(capacity({"one": (200, 400), "batched": (3200, NAN)}), ["one"], "batched")
    assert (
        v.text == "at least 8.0x" and math.isinf(v.high) and v.low == 8.0
    )  # the interval's low end, not 16x
    assert "only a lower bound" in v.caveat and v.direction == "gain"


def test_a_baseline_that_met_every_rung_makes_the_gain_an_upper_bound():
    v = gain_verdict(capacity({"one": (800, NAN), "batched": (600, 800)}), ["one"], "batched")
    assert v.text == "at most 1.0x" and v.low == 0.0 and v.high == 1.0  # the interval's high end
    assert v.direction == "not resolved"


def test_both_met_every_rung_means_the_gain_is_unknown():
    v = gain_verdict(capacity({"one": (800, NAN), "batched": (800, NAN)}), ["one"], "batched")
    assert "unknown" in v.caveat and v.low == 0.0 and math.isinf(v.high)


def test_the_best_of_several_baselines_is_used():
    table = capacity({"thread": (100, 200), "loop": (200, 400), "batched": (800, 1600)})
    v = gain_verdict(table, ["thread", "loop"], "batched")
    assert v.baseline == "loop" and v.ratio == 4.0


@pytest.mark.parametrize(
    ("baselines", "batched", "match"),
    [
        ([], "batched", "baselines must be non-empty"),
        (["nope"], "batched", "'nope' is not a target"),
        (["one"], "nope", "'nope' is not a target"),
    ],
)
def test_gain_verdict_rejects_bad_names(baselines, batched, match):
    table = capacity({"one": (200, 300), "zero": (0, 25), "batched": (400, 600)})
    with pytest.raises(ValueError, match=match):
        gain_verdict(table, baselines, batched)


def test_a_baseline_that_failed_every_rung_leaves_only_a_lower_bound():
    v = gain_verdict(capacity({"one": (0, 25), "batched": (400, 600)}), ["one"], "batched")
    assert math.isnan(v.ratio) and v.low == 16.0 and math.isinf(v.high)
    assert v.text == "at least 16.0x" and "start the ladder lower" in v.caveat


def test_amdahl_bound_matches_the_formula_and_its_limits():
    # h = 1.5 ms, m(1) = 3.6 ms, m(64) = 4.0 ms: (1.5 + 3.6) / (1.5 + 4.0 / 64)
    assert amdahl_bound(1.5, 3.6, 4.0, 64) == pytest.approx(5.1 / (1.5 + 4.0 / 64))
    assert amdahl_bound(0.0, 5.2, 30.6, 128) == pytest.approx(5.2 / (30.6 / 128))  # no per-request work
    assert amdahl_bound(2.0, 1.0, 1.0, 1) == 1.0  # a batch of one gains nothing
    assert amdahl_bound(1e9, 1.0, 64.0, 64) == pytest.approx(1.0)  # per-request work dominates


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1.0, 1.0, 1.0, 2), "per_request_ms"),
        ((1.0, 0.0, 1.0, 2), "call_ms_batch_1 must be a finite number > 0"),
        ((1.0, 1.0, math.nan, 2), "call_ms_batch"),
        ((1.0, 1.0, 1.0, 0), "batch_size"),
    ],
)
def test_amdahl_bound_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        amdahl_bound(*args)


def test_bound_verdict_places_the_bound_against_the_measured_interval():
    v = gain_verdict(capacity({"one": (200, 300), "batched": (400, 600)}), ["one"], "batched")  # [1.33, 3.0]
    assert "inside" in bound_verdict(v, 1.92) and "consistent" in bound_verdict(v, 1.92)
    assert "above the bound" in bound_verdict(v, 1.1)
    assert "below the bound" in bound_verdict(v, 3.27)
    with pytest.raises(ValueError, match="bound"):
        bound_verdict(v, math.inf)


def test_median_round_trip_excludes_warmup_and_checks_arguments():
    seen = []

    async def post(payload):
        seen.append(payload)

    trip = asyncio.run(median_round_trip(post, [1, 2, 3], n_requests=10, warmup_requests=2))
    assert trip.round_trip_ms >= 0 and trip.stages_ms == {} and seen == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    with pytest.raises(ValueError, match="payloads must be non-empty"):
        asyncio.run(median_round_trip(post, [], n_requests=3))
    with pytest.raises(ValueError, match="n_requests > warmup_requests"):
        asyncio.run(median_round_trip(post, [1], n_requests=2, warmup_requests=2))


def test_median_round_trip_reads_the_servers_own_stage_times():
    """The median of each Server-Timing stage over the measured answers (warm-up excluded); a stage
    that some answers lack is dropped rather than read from a subset."""

    class Answer:
        def __init__(self, header):
            self.headers = {"server-timing": header} if header is not None else {}

    headers = iter(
        ["forward;dur=99, queue;dur=9"] * 2 + [f"parse;dur=0.1, forward;dur={d}" for d in (1, 3, 2)]
    )

    async def post(payload):
        return Answer(next(headers))

    trip = asyncio.run(median_round_trip(post, [0], n_requests=5, warmup_requests=2))
    assert trip.stages_ms == {"parse": 0.1, "forward": 2.0}
    headers = iter(["forward;dur=1", "forward;dur=1, queue;dur=2", None])
    assert asyncio.run(median_round_trip(post, [0], n_requests=3, warmup_requests=0)).stages_ms == {}
    headers = iter(["forward"])  # a stage without its duration
    with pytest.raises(ValueError, match="dur"):
        asyncio.run(median_round_trip(post, [0], n_requests=1, warmup_requests=0))


def test_gain_texts_follow_the_verdict_rule_for_every_row():
    table = capacity({"thread": (0, 25), "loop": (50, 100), "batched": (800, 1600)})
    texts = gain_texts(table, ["thread", "loop"])
    assert texts["batched"] == gain_verdict(table, ["thread", "loop"], "batched").text == "16.0x"
    assert texts["loop"] == "1.0x"  # the better baseline, which the sentence divides by
    assert texts["thread"] == "0.0x"


def test_gain_texts_say_plainly_when_no_baseline_met_the_limit():
    table = capacity({"one": (0, 25), "batched": (400, 800)})
    texts = gain_texts(table, ["one"])
    assert texts["one"] == "no baseline met the limit"
    assert texts["batched"] == "at least 16.0x"
    assert not any("nan" in t or "inf" in t for t in texts)
    with pytest.raises(ValueError, match="baselines must be non-empty"):
        gain_texts(table, [])


def test_a_loss_is_called_only_when_the_whole_interval_lies_below_one():
    assert (
        gain_verdict(capacity({"one": (800, 1600), "batched": (200, 400)}), ["one"], "batched").direction
        == "loss"
    )
    assert gain_verdict(
        capacity({"one": (800, 1600), "batched": (800, 1600)}), ["one"], "batched"
    ).direction == ("not resolved")


def test_one_call_verdict_words_the_measured_knee_against_the_prediction():
    assert one_call_verdict(150, 134).startswith("above the prediction")
    assert one_call_verdict(67, 134).startswith("within the factor of 2")
    assert one_call_verdict(66, 134).startswith("more than one rung below")
    assert one_call_verdict(50, 134, rung_ratio=3).startswith("within the factor of 3")
    with pytest.raises(ValueError, match="predicted_rps"):
        one_call_verdict(50, 0)


def test_median_round_trip_refuses_a_wire_answer_outside_2xx_and_reads_a_wire_clients_stages():
    """A ``WireAnswer`` (the load generator's client) has no ``raise_for_status``: its status is checked here."""
    from course_lib.measure.targets.wire_client import WireAnswer
    from course_lib.serving.service import HttpStatusError

    answers = iter([WireAnswer(200, b"{}", {"server-timing": "forward;dur=2"}, 1.0)] * 3)

    async def post(payload):
        return next(answers)

    assert asyncio.run(median_round_trip(post, [0], n_requests=3, warmup_requests=1)).stages_ms == {
        "forward": 2.0
    }
    refused = WireAnswer(503, b'{"error": "queue_full"}', {"retry-after": "1"}, 1.0)

    async def refuse(payload):
        return refused

    with pytest.raises(HttpStatusError, match=r"request 0 answered HTTP 503 \(Retry-After: 1\)") as caught:
        asyncio.run(median_round_trip(refuse, [0], n_requests=2, warmup_requests=0))
    assert caught.value.shed  # 503 is load shedding, not an error of the request
