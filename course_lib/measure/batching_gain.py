"""What a load-test ladder says about a batching gain, and Amdahl's bound on that gain.

:func:`capacity_table` reads a climb of the rate ladder (``course_lib.measure.ladder.climb``) with its one
knee reader (``course_lib.measure.ladder.knees``): each configuration's ``sustained_rps`` (its knee: the
highest rung of the ladder that met the p99 limit) and ``first_failed_rps`` (the lowest rung where every
try missed; NaN if the configuration met every rung). Its true capacity lies between the two, so the
gain of a batched configuration over a baseline is only known to lie in an interval:

    sustained_batched / first_failed_baseline  <=  gain  <=  first_failed_batched / sustained_baseline

with an open end where a configuration met every rung. :func:`gain_verdict` reports the point ratio of
the sustained rungs together with that interval and its verdict
(``course_lib.core.intervals.interval_verdict``), and :func:`bound_verdict` says whether an Amdahl
bound lies below, inside or above it.

Amdahl's law for batching: a request costs ``h`` ms of per-request work (HTTP, parsing, lookup,
formatting) plus its share of the model call, ``m(1)`` alone or ``m(b) / b`` in batches of ``b``. The
throughput gain of batching can therefore not exceed ``(h + m(1)) / (h + m(b) / b)``
(:func:`amdahl_bound`). :func:`median_round_trip` times one request at a time and reads the server's own
``Server-Timing`` stages, so that ``m(1)`` is the call as the server made it and ``h`` the rest.

References
----------
Amdahl, G. M. (1967), "Validity of the single processor approach to achieving large scale computing
capabilities", AFIPS Conference Proceedings 30: 483-485.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from course_lib.core.checks import InvalidArgumentError, integer, non_empty, number, one_of, positive_number
from course_lib.core.intervals import interval_verdict
from course_lib.measure.ladder import knees
from course_lib.serving.profiling import parse_server_timing
from course_lib.serving.service import HttpStatusError

__all__ = [
    "GainVerdict",
    "RoundTrip",
    "amdahl_bound",
    "bound_verdict",
    "capacity_table",
    "gain_texts",
    "gain_verdict",
    "median_round_trip",
    "one_call_verdict",
]


@dataclass(frozen=True)
class GainVerdict:
    """A batching gain read off a rate ladder.

    ``ratio`` = sustained rung of the batched configuration / that of the best baseline; the true gain
    lies in [``low``, ``high``] (``high`` is ``inf`` when the batched configuration met every rung,
    ``low`` is 0 when the baseline did). ``text`` is the ratio worded with what the ladder leaves
    unknown ("2.0x"; "at least 8.0x", the interval's low end, when batching met every rung; "at most
    1.0x", its high end, when the baseline did), ``caveat`` the reason, ``baseline`` the name of the
    baseline used, and ``direction`` the verdict the interval allows.
    """

    ratio: float
    low: float
    high: float
    text: str
    caveat: str
    baseline: str

    @property
    def direction(self) -> str:
        """``"gain"`` if the whole interval lies above 1, ``"loss"`` if below, else ``"not resolved"``
        (``course_lib.core.intervals.interval_verdict``)."""
        return interval_verdict(self.low, self.high)


def capacity_table(climbed: pd.DataFrame, *, baseline: str | Sequence[str]) -> pd.DataFrame:
    """Per target of a climb: the highest rung that met the SLO and the gain over a baseline.

    Parameters
    ----------
    climbed : rows of ``course_lib.measure.ladder.climb`` (``target``, ``rate_rps``, ``met_slo``: the SLO
        that was applied; ``offered_rps``, ``achieved_rps``, ``p99_ms``, ``mean_batch_size`` where run).
    baseline : str or sequence of str
        Target the ``gain`` column divides by (e.g. the one-call-per-request configuration). With several
        names the one that sustained the highest rate is used, the rule of :func:`gain_verdict`; its name
        is in ``table.attrs["baseline"]``.

    Returns
    -------
    DataFrame indexed by target with ``sustained_rps`` (the knee, ``course_lib.measure.ladder.knees``: a
    lower bound, since the true limit lies below the next rung), the realised ``offered_rps`` and the
    ``achieved_rps`` of that run, its ``p99_ms`` and ``mean_batch_size`` at that rate (NaN without a
    knee), ``first_failed_rps`` (lowest rung where every try missed, NaN if none did) and ``gain``
    (sustained_rps / baseline's; NaN if the baseline met the SLO at no rate, in which case start the
    ladder lower).

    Raises
    ------
    ValueError
        If a ``baseline`` is not a target of the climb, or none is named.
    """
    baselines = [baseline] if isinstance(baseline, str) else list(baseline)
    non_empty("baseline", baselines)
    for name in baselines:
        one_of("baseline", name, sorted(set(climbed["target"])))
    found = knees(climbed.drop(columns=["repeat"], errors="ignore"))  # repeats pooled, per target
    rows: dict[Hashable, dict[str, float]] = {}
    for _, k in found.iterrows():
        rows[k["target"]] = {
            "sustained_rps": float(k["knee_rps"]),
            **{
                c: float(k.get(c, math.nan))
                for c in ("offered_rps", "achieved_rps", "p99_ms", "mean_batch_size")
            },
            "first_failed_rps": float(k["first_fail_rps"]),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "target"
    sustained = table["sustained_rps"]
    best = max(baselines, key=lambda name: sustained.loc[name])
    base = sustained.loc[best]
    table["gain"] = table["sustained_rps"] / base if base > 0 else math.nan
    table.attrs["baseline"] = best
    return table


def _rung(capacity: pd.DataFrame, name: str, column: str) -> float:
    if name not in capacity.index:
        raise ValueError(f"{name!r} is not a target of the capacity table; targets: {list(capacity.index)}")
    return float(capacity[column].loc[name])


def gain_verdict(capacity: pd.DataFrame, baselines: Sequence[str], batched: str) -> GainVerdict:
    """Batched capacity over the best baseline's, with the interval the ladder allows.

    Parameters
    ----------
    capacity : DataFrame from :func:`capacity_table`, indexed by target, with
        ``sustained_rps`` and ``first_failed_rps`` (requests/s).
    baselines : names of the one-call-per-request targets; the one that sustained most is used.
    batched : name of the batched target.

    Returns
    -------
    GainVerdict

    Raises
    ------
    ValueError
        If a name is not in ``capacity`` or ``baselines`` is empty. A baseline that met the limit at
        no rung (sustained 0 req/s) gives ``ratio`` NaN and only the lower end ``low``.
    """
    non_empty("baselines", baselines)
    best = max(baselines, key=lambda name: _rung(capacity, name, "sustained_rps"))
    base, base_fail = _rung(capacity, best, "sustained_rps"), _rung(capacity, best, "first_failed_rps")
    top, top_fail = _rung(capacity, batched, "sustained_rps"), _rung(capacity, batched, "first_failed_rps")
    low = top / base_fail if not math.isnan(base_fail) else 0.0
    if base <= 0:  # the baseline failed even the lowest rung: only a lower bound on the gain is known
        caveat = (
            "the baseline met the p99 limit at no rung of the ladder (a slow or busy machine: start the "
            "ladder lower), so only a lower bound is known"
        )
        return GainVerdict(math.nan, low, math.inf, f"at least {low:.1f}x", caveat, best)
    ratio = top / base
    high = top_fail / base if not math.isnan(top_fail) else math.inf
    if math.isnan(top_fail) and math.isnan(base_fail):
        text, caveat = (
            f"{ratio:.1f}x",
            "both met every rung, so both capacities are lower bounds and the gain is unknown",
        )
    elif math.isnan(base_fail):  # the baseline may sustain far more: only the upper end is known
        text, caveat = (
            f"at most {high:.1f}x",
            "the baseline met every rung, so its capacity is only a lower bound",
        )
    elif math.isnan(top_fail):  # the baseline may sustain up to its first failed rung: the lower end is low
        text, caveat = (
            f"at least {low:.1f}x",
            "batching met every rung, so its capacity is only a lower bound",
        )
    else:
        text, caveat = (
            f"{ratio:.1f}x",
            f"both found their limit on the ladder: the gain lies in [{low:.2f}x, {high:.2f}x]",
        )
    return GainVerdict(ratio, low, high, text, caveat, best)


def gain_texts(capacity: pd.DataFrame, baselines: Sequence[str]) -> pd.Series:
    """Every target's gain over the best baseline, worded as :func:`gain_verdict` words it.

    For a table column that follows the same rule as the sentence printed from ``gain_verdict``:
    "2.0x", "at least 16.0x", "at most 0.8x"; where no baseline met the limit at any rung, the
    baselines' own rows say so in words ("no baseline met the limit") instead of NaN or inf.

    Parameters
    ----------
    capacity : DataFrame from :func:`capacity_table`, indexed by target.
    baselines : names of the one-call-per-request targets; the one that sustained most is used.

    Returns
    -------
    Series of str indexed like ``capacity``, named ``gain``.

    Raises
    ------
    ValueError
        As :func:`gain_verdict`: an unknown name or no baseline.
    """
    non_empty("baselines", baselines)
    none_met = max(_rung(capacity, name, "sustained_rps") for name in baselines) <= 0
    texts = {
        name: "no baseline met the limit"
        if none_met and name in baselines
        else gain_verdict(capacity, baselines, name).text
        for name in capacity.index
    }
    return pd.Series(texts, name="gain")


def amdahl_bound(
    per_request_ms: float, call_ms_batch_1: float, call_ms_batch: float, batch_size: int
) -> float:
    """Largest throughput gain batching can give: ``(h + m(1)) / (h + m(b) / b)``.

    Parameters
    ----------
    per_request_ms : float >= 0
        ``h``, work per request that no batch shares (HTTP, parsing, lookup, formatting), ms.
    call_ms_batch_1, call_ms_batch : float > 0
        ``m(1)`` and ``m(b)``: one model call with 1 and with ``batch_size`` items, ms.
    batch_size : int >= 1

    Raises
    ------
    ValueError
        For a negative or non-finite time, a non-positive call time, or ``batch_size`` < 1.
    """
    per_request_ms = positive_number("per_request_ms", per_request_ms, allow_zero=True)
    call_ms_batch_1 = positive_number("call_ms_batch_1", call_ms_batch_1)
    call_ms_batch = positive_number("call_ms_batch", call_ms_batch)
    batch_size = integer("batch_size", batch_size, min=1)
    return (per_request_ms + call_ms_batch_1) / (per_request_ms + call_ms_batch / batch_size)


def bound_verdict(verdict: GainVerdict, bound: float) -> str:
    """Where an Amdahl ``bound`` lies relative to the interval of a measured gain, in words."""
    bound = positive_number("bound", bound)
    interval = f"[{verdict.low:.2f}x, {'open' if math.isinf(verdict.high) else f'{verdict.high:.2f}x'}]"
    if verdict.low > bound:
        return (
            f"the whole interval {interval} lies above the bound {bound:.2f}x: h was overestimated (the round "
            "trip at low load holds waiting, not only the cost per request at saturation), the baseline fell "
            "short of its own limit on a busy machine, or noise moved a rung"
        )
    if verdict.high < bound:
        return (
            f"the whole interval {interval} lies below the bound {bound:.2f}x: something besides per-request "
            "work limits the batched server (the client sharing the cores, the machine's load, the thread hop)"
        )
    return (
        f"the bound {bound:.2f}x lies inside the measured interval {interval}: consistent with Amdahl's law"
    )


def one_call_verdict(measured_rps: float, predicted_rps: float, *, rung_ratio: float = 2.0) -> str:
    """Where one call per request's measured capacity lies against the cost model's 1 / m(1), in words.

    Parameters
    ----------
    measured_rps : float >= 0
        The highest rung one call per request sustained.
    predicted_rps : float > 0
        ``1000 / m(1)``: the most one call at a time allows, before any per-request work.
    rung_ratio : float > 1
        How far apart the ladder's rungs are: a measured rung within one rung below the prediction
        is consistent with it.

    Returns
    -------
    str
        "above the prediction ..." (the fitted m(1) overstates this run's call, or a short rung passed
        a rate slightly above the limit before its queue grew past the p99 limit), "within one rung below it
        ..." (consistent), or "more than one rung below it ..." (per-request work took the rest).

    >>> one_call_verdict(50, 134)
    'more than one rung below it: per-request work (thread hop, load generator, other programs if any) took the rest'
    >>> one_call_verdict(100, 134)
    'within the factor of 2 between rungs below it: consistent with the prediction'
    """
    measured = number("measured_rps", measured_rps, min=0.0)
    predicted = number("predicted_rps", predicted_rps, min=0.0, min_open=True)
    step = number("rung_ratio", rung_ratio, min=1.0, min_open=True)
    if measured > predicted:
        return (
            "above the prediction: the fitted m(1) overstates this run's call, or the rung was too short for "
            "a rate slightly above the limit to build a queue that breaks the p99 limit"
        )
    if measured >= predicted / step:
        return f"within the factor of {step:g} between rungs below it: consistent with the prediction"
    return "more than one rung below it: per-request work (thread hop, load generator, other programs if any) took the rest"


@dataclass(frozen=True)
class RoundTrip:
    """One request at a time against a server: the median round trip and the server's own stage times.

    ``round_trip_ms``: median wall time from sending a request to reading its answer, ms. ``stages_ms``:
    the median of each stage the answers' ``Server-Timing`` header named (e.g. ``forward``, the model
    call as the server timed it), ms; empty if the answers carried none.
    """

    round_trip_ms: float
    stages_ms: dict[str, float]


async def median_round_trip(
    post: Callable[[Any], Any], payloads: Sequence[Any], *, n_requests: int = 120, warmup_requests: int = 20
) -> RoundTrip:
    """Median wall time of one request at a time, and of each ``Server-Timing`` stage, warm-up excluded.

    Parameters
    ----------
    post : async callable payload -> response, e.g. ``WireClient(url).post`` (the load generator's own
        client, ``course_lib.measure.targets.wire_client``: its round trip holds the least client work) or
        ``lambda p: client.post(url, json=p)`` with an ``httpx.AsyncClient``. A response with
        ``raise_for_status`` (httpx) is checked by it, one with an integer ``status`` (a ``WireAnswer``)
        must be 2xx, and one with ``headers`` has its ``Server-Timing`` read (W3C Server Timing;
        ``parse_server_timing``).
    payloads : sequence of payloads, used in order (cycled if shorter than ``n_requests``).
    n_requests : int > warmup_requests
    warmup_requests : int >= 0

    Returns
    -------
    RoundTrip
        A stage is kept only if every measured answer named it.

    Raises
    ------
    ValueError
        If ``payloads`` is empty or ``n_requests <= warmup_requests``; a malformed ``Server-Timing``
        header raises as ``parse_server_timing`` does.
    course_lib.serving.service.HttpStatusError
        For an answer with an integer ``status`` outside 2xx (httpx raises its own ``HTTPStatusError``):
        a refused request is not a latency.
    """
    non_empty("payloads", payloads)
    warmup_requests = integer("warmup_requests", warmup_requests, min=0)
    if n_requests <= warmup_requests:
        raise InvalidArgumentError(
            f"need n_requests > warmup_requests >= 0, got {n_requests!r} and {warmup_requests!r}"
        )
    samples, stages = [], []
    for i in range(n_requests):
        start = time.perf_counter_ns()
        response = await post(payloads[i % len(payloads)])
        elapsed_ms = (time.perf_counter_ns() - start) / 1e6
        headers = getattr(response, "headers", {})
        status = getattr(response, "status", None)
        if hasattr(response, "raise_for_status"):  # an httpx response: a refused request is not a latency
            response.raise_for_status()
        elif isinstance(status, int) and not 200 <= status < 300:  # a WireAnswer
            body = bytes(getattr(response, "body", b"")).decode("utf-8", errors="replace")
            raise HttpStatusError(status, body, retry_after=headers.get("retry-after"), where=f"request {i}")
        samples.append(elapsed_ms)
        header = headers.get("server-timing")
        stages.append(parse_server_timing(header) if header is not None else {})
    measured = stages[warmup_requests:]
    common = set.intersection(*(set(s) for s in measured))
    return RoundTrip(
        round_trip_ms=float(np.median(samples[warmup_requests:])),
        stages_ms={k: float(np.median([s[k] for s in measured])) for k in measured[0] if k in common},
    )
