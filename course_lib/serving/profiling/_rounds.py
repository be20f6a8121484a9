"""Several request paths profiled side by side: interleaved rounds, rotated order, intervals for ratios.

:func:`profile_in_rounds` is :func:`course_lib.serving.profiling.profile_requests` for a comparison: each
configuration (an HTTP server, an in-process service, ...) gets its requests in ``rounds`` slices, and
round by round every configuration sends its slice in an order that rotates
(:func:`course_lib.core.bench.round_order`), so whatever else the machine does hits all of them alike
and none always goes first. :meth:`RoundsProfile.ratio` compares two configurations' percentile of one
stage round by round, with the interval of :mod:`course_lib.core.intervals`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from course_lib.core import checks
from course_lib.core.bench import round_order
from course_lib.core.intervals import RatioInterval, ratio_interval
from course_lib.serving.profiling._stages import END_TO_END, LatencyBudget, RequestProfile


@dataclass
class RoundsProfile:
    """Per-round and merged latency budgets of several configurations measured side by side.

    Attributes
    ----------
    rounds : dict of name -> list of LatencyBudget, one per round (in round order).
    budgets : dict of name -> LatencyBudget, every round's profiles merged (with the targets given).
    """

    rounds: dict[str, list[LatencyBudget]]
    budgets: dict[str, LatencyBudget]

    def ratio(
        self,
        candidate: str,
        baseline: str,
        *,
        stage: str = END_TO_END,
        q: float = 50,
        confidence: float = 0.95,
    ) -> RatioInterval:
        """``candidate``'s q-th percentile of ``stage`` over ``baseline``'s, round by round, and its interval.

        Raises
        ------
        KeyError
            For an unknown configuration.
        InvalidArgumentError
            As :func:`course_lib.core.intervals.ratio_interval` (too few rounds, or too few requests per
            round for the percentile: 20 for a median).
        """
        cand = [b.samples_ms(stage) for b in self.rounds[candidate]]
        base = [b.samples_ms(stage) for b in self.rounds[baseline]]
        return ratio_interval(cand, base, q=q, confidence=confidence)


def profile_in_rounds(
    senders: Mapping[str, Callable[[str], RequestProfile]],
    keys: Mapping[str, Sequence[str]],
    *,
    rounds: int = 6,
    warmup_requests: Mapping[str, int] | int = 20,
    time_limit_s: float = 120.0,
    budget: Callable[[], LatencyBudget] = LatencyBudget,
) -> RoundsProfile:
    """Send every configuration its keys in ``rounds`` interleaved slices; profiles per round and merged.

    Parameters
    ----------
    senders : mapping name -> send(key) -> RequestProfile (e.g. ``ChurnClient.timed_score``,
        ``ChurnService.timed_score``); it should raise for a failed request.
    keys : mapping name -> the keys that configuration sends (its requests), in order. Round r sends the
        r-th of ``rounds`` equal slices (a remainder beyond ``rounds`` equal slices is not sent).
    rounds : int >= 1
    warmup_requests : int or mapping name -> int
        Untimed requests per configuration before the first round (its first keys, sent again later).
    time_limit_s : float > 0
        Stop starting new slices after this many seconds in all (a ``RuntimeWarning`` says so).
    budget : callable () -> LatencyBudget
        Makes each budget (e.g. ``lambda: LatencyBudget(target_p99_ms=60)`` for SLO flags).

    Returns
    -------
    RoundsProfile

    Raises
    ------
    InvalidArgumentError
        For names in one mapping but not the other, or fewer keys than rounds.
    """
    rounds = checks.integer("rounds", rounds, min=1)
    checks.positive_number("time_limit_s", time_limit_s)
    if set(senders) != set(keys):
        raise checks.InvalidArgumentError(
            f"senders and keys must name the same configurations, got {sorted(senders)} and {sorted(keys)}"
        )
    per_round = {name: len(ks) // rounds for name, ks in keys.items()}
    short = {name: n for name, n in per_round.items() if n < 1}
    if short:
        raise checks.InvalidArgumentError(
            f"every configuration needs at least {rounds} keys (one per round): {short}"
        )
    for name, send in senders.items():
        warm = warmup_requests if isinstance(warmup_requests, int) else warmup_requests.get(name, 0)
        for key in keys[name][: checks.integer("warmup_requests", warm, min=0)]:
            send(key)
    by_round: dict[str, list[LatencyBudget]] = {name: [] for name in senders}
    deadline = time.monotonic() + time_limit_s
    for r in range(rounds):
        if time.monotonic() > deadline:
            warnings.warn(
                f"profile_in_rounds stopped at its {time_limit_s:g} s limit after {r} of {rounds} rounds",
                RuntimeWarning,
                stacklevel=2,
            )
            break
        for name in round_order(list(senders), r):
            part = budget()
            for key in keys[name][r * per_round[name] : (r + 1) * per_round[name]]:
                part.record(senders[name](key))
            by_round[name].append(part)
    merged = {}
    for name, parts in by_round.items():
        total = budget()
        for part in parts:
            total.extend(part.profiles)
        merged[name] = total
    return RoundsProfile(by_round, merged)
