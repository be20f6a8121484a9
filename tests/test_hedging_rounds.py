"""Hedge settings in interleaved rounds: pairing, rotation, per-round ratios; how busy each process was."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from replicas import running_replicas

from course_lib.measure.tail import HedgingRounds, busy_fractions, run_hedging_rounds
from course_lib.serving.hedging import HedgeStats


def _table(latency_ms, ok=None):
    latency_ms = np.asarray(latency_ms, dtype=float)
    ok = np.ones(latency_ms.size, dtype=bool) if ok is None else np.asarray(ok)
    return pd.DataFrame(
        {"request_id": range(latency_ms.size), "latency_ms": latency_ms, "ok": ok, "outcome": "ok"}
    )


def _rounds(n_rounds=6):
    base = np.arange(1.0, 1001.0)  # p99 (nearest rank) of 1..1000 is 990, p50 is 500
    plain = [_table(base * (1 + 0.01 * r)) for r in range(n_rounds)]
    hedged = [_table(base * (1 + 0.01 * r) / 4) for r in range(n_rounds)]
    stats = [HedgeStats(requests=1000, sent=1050, hedges=50) for _ in range(n_rounds)]
    return HedgingRounds(
        {"no hedging": None, "hedge": 5.0},
        {"no hedging": plain, "hedge": hedged},
        {"no hedging": [HedgeStats(requests=1000, sent=1000)] * n_rounds, "hedge": stats},
        [["no hedging", "hedge"]] * n_rounds,
    )


def test_ratio_is_the_median_of_per_round_ratios_with_an_interval_and_a_direction():
    rounds = _rounds()
    assert rounds.baseline == "no hedging" and rounds.rounds == 6
    assert rounds.percentile_rounds("no hedging", 99)[0] == 990.0
    interval = rounds.ratio("hedge", 99)
    assert interval.ratio == pytest.approx(0.25) and interval.direction == -1 and interval.rounds == 6
    assert rounds.ratio("no hedging", 50).direction == 0  # the baseline over itself: 1, not resolved
    with pytest.raises(ValueError, match="at least 6 repeats"):
        _rounds(3).ratio("hedge", 99)


def test_summary_gives_medians_over_rounds_and_totals_of_failures():
    table = _rounds().summary()
    assert list(table.index) == ["no hedging", "hedge"]
    assert table.loc["hedge", "extra_requests"] == pytest.approx(0.05)
    assert table.loc["no hedging", "requests"] == 6000 and table.loc["hedge", "errors"] == 0
    assert np.isnan(table.loc["no hedging", "hedge_after_ms"]) and table.loc["hedge", "hedge_after_ms"] == 5.0


@pytest.fixture(scope="module")
def two_replicas(replica_files):
    with running_replicas(replica_files, [None, None], max_lifetime_s=120) as (a, b):
        yield a, b


def test_rounds_rotate_the_order_and_send_the_same_requests_to_every_setting(two_replicas, ids):
    a, b = two_replicas
    settings = {"none": None, "late": 5_000.0, "at once": 0.0}
    rounds = asyncio.run(
        run_hedging_rounds(
            [a.url, b.url], ids, settings=settings, rounds=3, n_requests=30, rate_rps=200.0, seed=4
        )
    )
    assert rounds.orders == [
        ["none", "late", "at once"],
        ["late", "at once", "none"],
        ["at once", "none", "late"],
    ]
    for r in range(3):
        sent = [rounds.requests[name][r]["x_request_id"].tolist() for name in settings]
        assert sent[0] == sent[1] == sent[2] == [f"r{r}-{i}" for i in range(30)]  # a paired round
    assert all(t["ok"].all() and len(t) == 30 for ts in rounds.requests.values() for t in ts)
    assert [st.hedges for st in rounds.stats["none"]] == [0, 0, 0]
    assert [st.hedges for st in rounds.stats["at once"]] == [30, 30, 30]  # delay 0: every request hedged
    assert rounds.summary().loc["at once", "extra_requests"] == 1.0


def test_busy_fractions_are_cpu_seconds_over_wall_seconds_of_each_process():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with busy_fractions({"me": os.getpid(), "sleeper": sleeper.pid}) as busy:
            assert busy == {}  # filled in when the block ends
            end = time.process_time() + 0.2
            while time.process_time() < end:  # this process works for 0.2 s of CPU
                pass
        assert set(busy) == {"me", "sleeper"}
        assert busy["me"] > 0 and busy["sleeper"] < busy["me"]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_busy_fractions_count_the_rest_of_the_machine_as_others():
    burn = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\nprint('done', flush=True)\ntime.sleep(30)"
    burner = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        with (
            busy_fractions({"me": os.getpid(), "burner": burner.pid}) as alone,
            busy_fractions({"me": os.getpid()}, others=True) as busy,
        ):
            assert (
                burner.stdout is not None and burner.stdout.readline() == "done\n"
            )  # it burned 0.6 s of CPU
        assert set(busy) == {"me", "others"}
        # the burner is not named in the second block, so its CPU is part of "others" (clock ticks aside)
        assert alone["burner"] > 0 and busy["others"] >= 0.8 * alone["burner"] - 0.05
    finally:
        burner.kill()
        burner.wait()


def test_busy_fractions_refuse_a_process_named_others():
    with pytest.raises(ValueError, match="others"), busy_fractions({"others": os.getpid()}, others=True):
        pass
