"""What a prediction cache's hit and miss cost against no cache, measured side by side (Lesson 8).

It sits beside the cached service it measures (like ``course_lib.serving.profiling``, it times the
service in process; no load generator is involved).

:func:`measure_hit_miss` sends three kinds of requests in one interleaved run: a request to the
service *without* a cache for a customer nobody asked for before, a request to the cached service for
another such customer (a miss), and the same customer again (a hit). The customers of the two services
are drawn alike (first reads of the feature store for both, so neither path finds its rows warm), the
three kinds alternate request by request (which of the two services goes first alternates too), and
the run is split into rounds: each round gives one value of every comparison, and the rounds give an
interval (:mod:`course_lib.core.intervals`). Every request is timed twice: its stages (the service's
own profile) and its whole call from outside (``time.perf_counter_ns`` around ``timed_score``), so the
work no stage covers (building the cache key, reading the feature snapshot, encoding the request body,
building the answer) is measured as ``outside stages`` instead of being lost.

:func:`miss_cost_decomposition` splits the miss's extra mean time over no cache into those measured
parts; :func:`break_even_hit_rate` gives the hit rate above which the cache lowers the *mean* latency,
``(miss - plain) / (miss - hit)`` on means, per round and with its interval.

Every figure these functions report is a median over rounds of a per-round value (a round's mean
time, or a difference or ratio of the round's means), the same statistic their interval is for, so an
estimate always lies inside its own interval and one round that a busy machine spoiled (one stalled
request moves a round's mean) cannot decide it. Pooled means over all requests are in
:func:`hit_miss_table` only, as description.

References
----------
Source lesson 004, "Caching and Request Deduplication" (a hit "~1 ms" against "50 ms" inference).
The mean latency of a cache with hit rate h: h x hit + (1 - h) x miss.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pandas as pd

from course_lib.core import checks
from course_lib.core.intervals import median_interval
from course_lib.core.percentiles import percentile
from course_lib.serving.cache.service import CachedChurnService
from course_lib.serving.service import ChurnService

__all__ = [
    "KINDS",
    "break_even_hit_rate",
    "break_even_phrase",
    "hit_miss_table",
    "measure_hit_miss",
    "miss_cost_decomposition",
    "saving_at_hit_rate",
]

#: The three kinds of request, in the order of the tables.
KINDS: tuple[str, ...] = ("no cache", "miss", "hit")
OUTSIDE = "outside stages"
WALL = "whole call"


def _timed(service: ChurnService, customer_id: str) -> tuple[dict[str, float], float]:
    start = time.perf_counter_ns()
    profile = service.timed_score(customer_id)
    wall_us = (time.perf_counter_ns() - start) / 1e3
    return {name: ms * 1e3 for name, ms in profile.stages_ms.items()}, wall_us


def measure_hit_miss(
    plain: ChurnService,
    cached: CachedChurnService,
    plain_ids: Sequence[str],
    cached_ids: Sequence[str],
    *,
    rounds: int = 6,
    warmup: int = 20,
) -> pd.DataFrame:
    """Time no-cache requests, misses and hits side by side, interleaved, in ``rounds`` rounds.

    Parameters
    ----------
    plain : the service without a cache.
    cached : the same service behind a cache (its cache must not hold ``cached_ids`` yet).
    plain_ids, cached_ids : customer ids, distinct, not requested before (so every lookup is a first
        read); the first ``warmup`` of each are sent untimed, the rest in equal rounds (the same number of
        each kind in every round).
    rounds : int >= 1
    warmup : int >= 0

    Returns
    -------
    DataFrame, one row per timed request: ``round``, ``kind`` (one of ``KINDS``), ``customer_id``,
    one column per stage in microseconds (NaN where it did not run), ``outside stages`` (whole call
    minus its stages) and ``whole call`` (us).

    Raises
    ------
    InvalidArgumentError
        For bad counts, too few ids for the rounds, or ids used on both services.
    """
    rounds = checks.integer("rounds", rounds, min=1)
    warmup = checks.integer("warmup", warmup, min=0)
    if set(plain_ids) & set(cached_ids):
        raise checks.InvalidArgumentError(
            "plain_ids and cached_ids must not share customers (first reads for both)"
        )
    n = min(len(plain_ids), len(cached_ids)) - warmup
    per_round = n // rounds
    if per_round < 1:
        raise checks.InvalidArgumentError(
            f"need at least warmup + rounds = {warmup + rounds} ids of each kind, "
            f"got {len(plain_ids)} and {len(cached_ids)}"
        )
    for cid in plain_ids[:warmup]:
        plain.timed_score(cid)
    for cid in cached_ids[:warmup]:
        cached.timed_score(cid)
        cached.timed_score(cid)
    rows = []
    for r in range(rounds):
        for j in range(per_round):
            i = warmup + r * per_round + j
            pair = [("no cache", plain, plain_ids[i]), ("miss", cached, cached_ids[i])]
            if (r * per_round + j) % 2:  # alternate which service goes first
                pair.reverse()
            for kind, service, cid in pair:
                stages, wall = _timed(service, cid)
                rows.append({"round": r, "kind": kind, "customer_id": cid, **stages, WALL: wall})
                if kind == "miss":
                    stages, wall = _timed(service, cid)
                    rows.append({"round": r, "kind": "hit", "customer_id": cid, **stages, WALL: wall})
    frame = pd.DataFrame(rows)
    stage_cols = [c for c in frame.columns if c not in ("round", "kind", "customer_id", WALL)]
    frame[OUTSIDE] = frame[WALL] - frame[stage_cols].sum(axis=1, min_count=1)
    return frame[["round", "kind", "customer_id", *stage_cols, OUTSIDE, WALL]]


def _stage_columns(run: pd.DataFrame) -> list[str]:
    return [c for c in run.columns if c not in ("round", "kind", "customer_id")]


def hit_miss_table(run: pd.DataFrame) -> pd.DataFrame:
    """p50, p99 (nearest rank) and mean of every stage, per kind of request, in microseconds.

    Returns
    -------
    DataFrame indexed by stage (the stages, ``outside stages``, ``whole call``) with columns
    ``"<kind> p50"``, ``"<kind> p99"``, ``"<kind> mean"`` for each kind; NaN where a stage never ran.
    """
    out = {}
    for kind in KINDS:
        part = run[run["kind"] == kind]
        for stat in ("p50", "p99", "mean"):
            col = {}
            for stage in _stage_columns(run):
                values = part[stage].dropna()
                if values.empty:
                    col[stage] = np.nan
                elif stat == "mean":
                    col[stage] = float(values.mean())
                else:
                    col[stage] = percentile(values, 50 if stat == "p50" else 99)
            out[f"{kind} {stat}"] = col
    return pd.DataFrame(out).rename_axis("stage (us)")


def _per_round_means(run: pd.DataFrame) -> pd.DataFrame:
    """Mean of every stage per (round, kind); a stage that did not run counts as 0 us."""
    cols = _stage_columns(run)
    return run.assign(**{c: run[c].fillna(0.0) for c in cols}).groupby(["round", "kind"])[cols].mean()


def miss_cost_decomposition(run: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Where a miss's extra mean time over no cache goes, part by part, with an interval over rounds.

    For every part (every stage of either path, a stage one path does not run counting 0 there, so the
    cache stages appear with their full cost; ``outside stages``; and ``whole call``) each round gives the
    difference of its miss and no-cache means. Within a round the parts' differences add up exactly to the
    whole call's; the medians over rounds reported here add up to the whole call's median only
    approximately (a median is not additive; they agree exactly when the rounds agree).

    Returns
    -------
    DataFrame indexed by part with ``miss_us``, ``no_cache_us`` (the median over rounds of each round's
    mean), ``extra_us`` (the median over rounds of the per-round difference, miss - no cache), and
    ``low_us`` / ``high_us`` (its interval, :func:`course_lib.core.intervals.median_interval`); the last
    row is ``whole call``.
    """
    means = _per_round_means(run)
    rows = {}
    for part in _stage_columns(run):
        miss = means.xs("miss", level="kind")[part]
        plain = means.xs("no cache", level="kind")[part]
        low, high, _ = median_interval((miss - plain).to_numpy(), confidence)
        rows[part] = {
            "miss_us": float(miss.median()),
            "no_cache_us": float(plain.median()),
            "extra_us": float((miss - plain).median()),
            "low_us": low,
            "high_us": high,
        }
    return pd.DataFrame(rows).T.rename_axis("part")


def break_even_hit_rate(run: pd.DataFrame, confidence: float = 0.95) -> dict[str, float]:
    """The hit rate above which the cache lowers the mean latency: (miss - plain) / (miss - hit), on means.

    Computed per round from the rounds' mean whole-call times, then the median over rounds and its
    interval. A break-even below 0 (a miss no slower than no cache) is reported as it is: the cache then
    lowers the mean at any hit rate; at or above 1 (a hit no faster than no cache at all) it never does.

    Returns
    -------
    dict with ``break_even`` (median over rounds), ``low``, ``high``, ``confidence`` (achieved), and
    ``hit_us``, ``miss_us``, ``no_cache_us`` (whole call: the median over rounds of each round's mean).
    """
    means = _per_round_means(run)[WALL].unstack("kind")
    per_round = (means["miss"] - means["no cache"]) / (means["miss"] - means["hit"])
    low, high, achieved = median_interval(per_round.to_numpy(), confidence)
    whole = means.median()
    return {
        "break_even": float(per_round.median()),
        "low": low,
        "high": high,
        "confidence": achieved,
        "hit_us": float(whole["hit"]),
        "miss_us": float(whole["miss"]),
        "no_cache_us": float(whole["no cache"]),
    }


def break_even_phrase(result: dict[str, float]) -> str:
    """:func:`break_even_hit_rate`'s result in words the run supports.

    Returns
    -------
    str
        "lowers the mean latency above a 18 % hit rate (97 % interval 12 % to 25 %)" when the whole
        interval lies between 0 and 1; "lowers the mean latency at any hit rate" when it lies at or below
        0 (a miss costs no more than no cache); "never lowers the mean latency" when it lies at or above
        1 (a hit saves nothing); otherwise "break-even not resolved on this run" with the interval.

    Examples
    --------
    >>> break_even_phrase({"break_even": 0.18, "low": 0.12, "high": 0.25, "confidence": 0.97})
    'lowers the mean latency above a 18 % hit rate (97 % interval 12 % to 25 %)'
    >>> break_even_phrase({"break_even": 1.05, "low": 1.03, "high": 1.07, "confidence": 0.96})
    'never lowers the mean latency: a hit is no faster than no cache at all (96 % interval 103 % to 107 %)'
    >>> break_even_phrase({"break_even": 0.4, "low": -0.3, "high": 3.6, "confidence": 0.97})
    'break-even not resolved on this run (estimate 40 %, 97 % interval -30 % to 360 %)'
    """
    be, low, high, conf = (result[k] for k in ("break_even", "low", "high", "confidence"))
    interval = f"{_pct(conf)} interval {_pct(low)} to {_pct(high)}"
    if low > 0 and high < 1:
        return f"lowers the mean latency above a {_pct(be)} hit rate ({interval})"
    if high <= 0:
        return f"lowers the mean latency at any hit rate: a miss costs no more than no cache ({interval})"
    if low >= 1:
        return f"never lowers the mean latency: a hit is no faster than no cache at all ({interval})"
    return f"break-even not resolved on this run (estimate {_pct(be)}, {interval})"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.0f} %"


def saving_at_hit_rate(run: pd.DataFrame, hit_rate: float, confidence: float = 0.95) -> dict[str, float]:
    """The mean latency a cache with ``hit_rate`` gives, h x hit + (1 - h) x miss, against no cache.

    Computed per round from the rounds' mean whole-call times; the saving is 1 - cached mean / no-cache
    mean (negative: the cache makes the mean slower).

    Returns
    -------
    dict with ``mean_us`` (h x hit + (1 - h) x miss from the medians over rounds of each round's mean),
    ``saving`` (median over rounds), ``low``, ``high`` (its interval) and ``confidence``.

    Raises
    ------
    InvalidArgumentError
        Unless 0 <= hit_rate <= 1.
    """
    h = checks.number("hit_rate", hit_rate, min=0, max=1)
    means = _per_round_means(run)[WALL].unstack("kind")
    per_round = 1 - (h * means["hit"] + (1 - h) * means["miss"]) / means["no cache"]
    low, high, achieved = median_interval(per_round.to_numpy(), confidence)
    whole = means.median()
    return {
        "mean_us": float(h * whole["hit"] + (1 - h) * whole["miss"]),
        "saving": float(per_round.median()),
        "low": low,
        "high": high,
        "confidence": achieved,
    }
