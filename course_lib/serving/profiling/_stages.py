"""Where does a request's time go? Stage timers, per-request profiles and a latency budget.

A request passes through named stages (transport, parse, lookup, forward, format). ``StageTimer``
times one stage with ``time.perf_counter_ns``; ``RequestProfile`` holds one request's stage times in
milliseconds; ``LatencyBudget`` collects many profiles and summarises each stage and the end-to-end
total (count, mean, p50/p95/p99/max) against p50 and p99 targets.

Percentiles come from ``course_lib.core.percentiles.percentile`` (nearest rank), computed over the merged
samples: percentiles of stages do not add up to the percentile of the total, and percentiles of
different workers must never be averaged.

References
----------
MLOps course lesson 19, "Inference Engineering Basics" (source 000): the five-stage budget, the
``RequestProfile`` / latency-budget idea and its 90 x 30 ms, 8 x 70 ms, 2 x 150 ms test vector.
W3C, "Server Timing" (Working Draft): the ``Server-Timing`` header syntax ``name;dur=<ms>``, written
and read by :mod:`course_lib.serving.profiling._server_timing` (``format_server_timing`` /
``parse_server_timing`` are re-exported here).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from course_lib.core.checks import InvalidArgumentError, instance_of, integer, non_empty, positive_number
from course_lib.core.percentiles import percentile
from course_lib.serving.profiling._server_timing import (
    check_metric_name,
)

#: Row label of the end-to-end total in ``LatencyBudget.summary()``.
END_TO_END = "end_to_end"
#: Columns of ``LatencyBudget.summary()``, in order.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "count",
    "mean_ms",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
    "target_p50_ms",
    "target_p99_ms",
    "p50_breached",
    "p99_breached",
)


def _check_stage_name(name: object) -> str:
    name = check_metric_name(name, what="stage name")
    if name == END_TO_END:
        raise InvalidArgumentError(f"stage name {END_TO_END!r} is reserved for the total")
    return name


class StageTimer:
    """Context manager that measures the wall time of its block with ``time.perf_counter_ns``.

    Examples
    --------
    >>> with StageTimer() as timer:
    ...     sum(range(1000))
    499500
    >>> timer.elapsed_ms >= 0
    True
    """

    __slots__ = ("elapsed_ns", "start_ns")

    def __init__(self) -> None:
        self.start_ns: int | None = None
        self.elapsed_ns: int | None = None

    def __enter__(self) -> StageTimer:
        self.elapsed_ns = None
        self.start_ns = time.perf_counter_ns()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self.start_ns is not None  # __enter__ set it
        self.elapsed_ns = time.perf_counter_ns() - self.start_ns

    @property
    def elapsed_ms(self) -> float:
        """Elapsed time in milliseconds.

        Raises
        ------
        RuntimeError
            If read before the ``with`` block has finished.
        """
        if self.elapsed_ns is None:
            raise RuntimeError("elapsed_ms is only known after the with-block has finished")
        return self.elapsed_ns / 1e6


class _Stage(StageTimer):
    """``RequestProfile.stage``'s timer: stores its elapsed ms under ``name`` when the block ends.

    A perf_counter difference is a finite ms >= 0 and the name was checked by ``stage``, so the
    stage is stored without ``add_stage``'s checks, except that a name recorded meanwhile (an overlapping
    stage of the same name, or the same timer used twice) still raises, as ``add_stage`` does.
    """

    __slots__ = ("_name", "_profile", "_stages_ms")

    def __init__(self, profile: RequestProfile, name: str) -> None:
        super().__init__()
        self._profile, self._stages_ms, self._name = profile, profile.stages_ms, name

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        if self._name in self._stages_ms:  # an overlapping stage of the same name finished first
            self._profile.add_stage(self._name, self.elapsed_ms)  # raises: already recorded
        self._stages_ms[self._name] = self.elapsed_ms


@dataclass
class RequestProfile:
    """The stage times of one request, in milliseconds, in the order the stages ran.

    Parameters
    ----------
    request_id : str
        Free-form label (e.g. the customer id or a counter).
    stages_ms : dict of str -> float, optional
        Stage name -> duration in ms; validated like ``add_stage``.

    Notes
    -----
    The source lesson's profile adds each stage to a running total, so recording a stage twice
    counts it twice. Here a repeated stage name raises instead, and ``total_ms`` is always the sum
    of the recorded stages.
    """

    request_id: str = ""
    stages_ms: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given, self.stages_ms = dict(self.stages_ms), {}
        for name, duration_ms in given.items():
            self.add_stage(name, duration_ms)

    def add_stage(self, name: str, duration_ms: float) -> None:
        """Record a stage that took ``duration_ms`` milliseconds.

        Raises
        ------
        ValueError
            If ``name`` is not a token, is ``"end_to_end"``, was already recorded, or the duration
            is negative, NaN or infinite.
        TypeError
            If ``duration_ms`` is not a number.
        """
        name = _check_stage_name(name)
        if name in self.stages_ms:
            raise ValueError(
                f"stage {name!r} was already recorded for request {self.request_id!r}; "
                "give each stage its own name"
            )
        self.stages_ms[name] = positive_number("duration_ms", duration_ms, allow_zero=True)

    def stage(self, name: str) -> _Stage:
        """Time the ``with`` block as stage ``name`` (recorded even if the block raises).

        A plain class as context manager, not a generator one: a server times four stages on every
        request, and ``contextlib.contextmanager``'s generator machinery adds microseconds to each.

        Examples
        --------
        >>> profile = RequestProfile("r1")
        >>> with profile.stage("parse"):
        ...     _ = int("42")
        >>> list(profile.stages_ms)
        ['parse']
        """
        name = _check_stage_name(name)
        if name in self.stages_ms:
            self.add_stage(name, 0.0)  # raises: the stage was already recorded
        return _Stage(self, name)

    @property
    def total_ms(self) -> float:
        """End-to-end time: the sum of the recorded stages, in ms."""
        return float(sum(self.stages_ms.values()))

    def server_timing(self) -> str:
        """The stages as a ``Server-Timing`` header value, e.g. ``parse;dur=0.041, lookup;dur=0.012``.

        The same text as ``format_server_timing(self.stages_ms)``, without checking again what
        ``add_stage`` and ``stage`` checked when each stage was recorded.
        """
        return ", ".join(f"{name};dur={ms:.3f}" for name, ms in self.stages_ms.items())


class LatencyBudget:
    """Collect request profiles and summarise each stage and the end-to-end total.

    Parameters
    ----------
    target_p50_ms, target_p99_ms : float, optional
        End-to-end targets (e.g. an SLO of p99 < 60 ms). A percentile *above* its target is a breach.
    stage_targets_ms : dict of str -> (p50_ms or None, p99_ms or None), optional
        Per-stage targets, e.g. ``{"lookup": (None, 10.0)}``.

    Raises
    ------
    ValueError
        If a target is negative or not finite.

    References
    ----------
    MLOps course lesson 19 (source 000), ``LatencyBudgetProfiler``: p50/p99 targets and breach flags.
    """

    def __init__(
        self,
        target_p50_ms: float | None = None,
        target_p99_ms: float | None = None,
        *,
        stage_targets_ms: Mapping[str, tuple[float | None, float | None]] | None = None,
    ) -> None:
        self._targets: dict[str, tuple[float | None, float | None]] = {}
        names = {END_TO_END: ("target_p50_ms", "target_p99_ms")}
        for name, pair in {END_TO_END: (target_p50_ms, target_p99_ms), **(stage_targets_ms or {})}.items():
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise InvalidArgumentError(
                    f"stage_targets_ms[{name!r}] must be a (p50_ms, p99_ms) tuple, got {pair!r}"
                )
            labels = names.get(name, (f"stage_targets_ms[{name!r}][0]", f"stage_targets_ms[{name!r}][1]"))
            self._targets[name] = tuple(  # type: ignore[assignment]
                None if t is None else positive_number(label, t, allow_zero=True)
                for label, t in zip(labels, pair, strict=True)
            )
        self.profiles: list[RequestProfile] = []

    @property
    def target_p50_ms(self) -> float | None:
        return self._targets[END_TO_END][0]

    @property
    def target_p99_ms(self) -> float | None:
        return self._targets[END_TO_END][1]

    def record(self, profile: RequestProfile) -> None:
        """Add one request's profile.

        Raises
        ------
        TypeError
            If ``profile`` is not a ``RequestProfile``.
        ValueError
            If it holds no stages.
        """
        instance_of("profile", profile, RequestProfile)
        if not profile.stages_ms:
            raise ValueError(f"profile {profile.request_id!r} holds no stages; time at least one")
        self.profiles.append(profile)

    def extend(self, profiles: Iterable[RequestProfile]) -> None:
        """``record`` each profile in turn."""
        for profile in profiles:
            self.record(profile)

    def __len__(self) -> int:
        return len(self.profiles)

    @property
    def stage_names(self) -> list[str]:
        """Stage names in the order they first appeared."""
        seen: dict[str, None] = {}
        for profile in self.profiles:
            seen.update(dict.fromkeys(profile.stages_ms))
        return list(seen)

    def samples_ms(self, stage: str = END_TO_END) -> np.ndarray:
        """Durations of ``stage`` (or the end-to-end totals) over the requests that have it, shape (n,)."""
        if stage == END_TO_END:
            return np.array([p.total_ms for p in self.profiles], dtype=float)
        if stage not in self.stage_names:
            raise ValueError(f"stage {stage!r} was never recorded; recorded stages: {self.stage_names}")
        return np.array([p.stages_ms[stage] for p in self.profiles if stage in p.stages_ms], dtype=float)

    def to_frame(self) -> pd.DataFrame:
        """One row per request: ``request_id``, one column per stage (NaN where absent), ``end_to_end``."""
        rows = [{"request_id": p.request_id, **p.stages_ms, END_TO_END: p.total_ms} for p in self.profiles]
        return pd.DataFrame(rows, columns=["request_id", *self.stage_names, END_TO_END])

    def summary(self) -> pd.DataFrame:
        """Per-stage and end-to-end latency statistics with breach flags.

        Returns
        -------
        pandas.DataFrame
            Indexed by stage (in order of appearance) then ``end_to_end``; columns ``SUMMARY_COLUMNS``:
            ``count`` (requests with that stage), ``mean_ms``, nearest-rank ``p50_ms``, ``p95_ms``,
            ``p99_ms``, ``max_ms``, the targets (NaN when none) and ``p50_breached`` /
            ``p99_breached`` (nullable booleans: ``<NA>`` where no target was set).

        Raises
        ------
        ValueError
            If no profile has been recorded (a budget of nothing is not "0 ms, SLO met", as the source
            lesson's version reports).
        """
        if not self.profiles:
            raise ValueError("no profiles recorded: record at least one request before summarising")
        rows = {}
        for name in [*self.stage_names, END_TO_END]:
            ms = self.samples_ms(name)
            t50, t99 = self._targets.get(name, (None, None))
            p50, p95, p99 = (percentile(ms, q) for q in (50, 95, 99))
            rows[name] = {
                "count": len(ms),
                "mean_ms": float(ms.mean()),
                "p50_ms": p50,
                "p95_ms": p95,
                "p99_ms": p99,
                "max_ms": float(ms.max()),
                "target_p50_ms": np.nan if t50 is None else t50,
                "target_p99_ms": np.nan if t99 is None else t99,
                "p50_breached": pd.NA if t50 is None else p50 > t50,
                "p99_breached": pd.NA if t99 is None else p99 > t99,
            }
        table = pd.DataFrame.from_dict(rows, orient="index")[list(SUMMARY_COLUMNS)]
        table = table.astype({"count": "int64", "p50_breached": "boolean", "p99_breached": "boolean"})
        table.index.name = "stage"
        return table


def profile_requests(
    send: Callable[[str], RequestProfile],
    keys: Sequence[str],
    *,
    warmup_requests: int = 20,
    time_limit_s: float = 60.0,
    budget: LatencyBudget | None = None,
) -> LatencyBudget:
    """Send one request per key, one after another, and collect their profiles in a budget.

    Parameters
    ----------
    send : callable
        key (e.g. a customer id) -> the request's ``RequestProfile``; it should raise if the request
        failed (a refused request is not a latency sample).
    keys : sequence of str
        One request each, in order. The first ``warmup_requests`` keys are sent untimed first.
    warmup_requests : int
        Requests sent before measuring (connection set-up, first-call caches), >= 0.
    time_limit_s : float
        Stop after this many seconds even if keys remain; a ``RuntimeWarning`` then says how many
        requests were measured, and the budget's ``count`` shows it too.
    budget : LatencyBudget, optional
        Budget to add to (e.g. one with SLO targets); a new one without targets by default.

    Returns
    -------
    LatencyBudget

    Raises
    ------
    ValueError
        If ``keys`` is empty, ``warmup_requests`` < 0 or ``time_limit_s`` <= 0.
    """
    non_empty("keys", keys)
    warmup_requests = integer("warmup_requests", warmup_requests, min=0)
    time_limit_s = positive_number("time_limit_s", time_limit_s)
    out = budget if budget is not None else LatencyBudget()
    for key in keys[:warmup_requests]:
        send(key)
    deadline = time.monotonic() + time_limit_s
    for i, key in enumerate(keys):
        if time.monotonic() > deadline:
            warnings.warn(
                f"profile_requests stopped at its {time_limit_s:g} s limit after {i} of {len(keys)} requests",
                RuntimeWarning,
                stacklevel=2,
            )
            break
        out.record(send(key))
    return out
