"""The service waterfall's steps and what their knees say: one lever at a time, as ratios with intervals.

Each :class:`WaterfallStep` is one server configuration and endpoint, and names the step it changes one
lever from (its ``base``). ``WATERFALL`` lists the steps from the prototype (Lesson 6's server,
``course_lib.serving.prototype``) to the production service (``course_lib.serving.production``), one lever
each, plus the null endpoint of the production stack as the floor; ``SERVERS`` the configurations they run
on. The steps are climbed with the one rate-ladder climber,
``course_lib.measure.ladder.climb``, taking turns at every rung (in an order that rotates from repeat to
repeat, so drift of a shared machine and order effects hit them alike); each rung holds at least
``min_requests`` requests, enough for the p99 it judges (10 / (1 - 0.99) = 1,000), and a missed rung is
tried once more. Latency is timed from each request's intended send time, so a generator that falls
behind only makes a rung harder to meet: a rung met is met, and a rung missed while the generator's
send-lag p99 was over its bound is flagged ``generator_bound``. ``course_lib.measure.ladder.knees`` reads
each step's knee per repeat and the first rung that failed; :func:`lever_table` turns them into ratios
to the base with the interval the ladder and the repeats allow:

    per repeat: knee / first_fail_base  <=  gain  <=  first_fail / knee_base

and over the repeats the lowest low and the highest high. A lever is a *gain* only when the whole
interval lies above 1, a *loss* only when it lies below 1; otherwise the run did not resolve it
(``course_lib.core.intervals.interval_verdict``; :func:`lever_sentence` words a row).

:func:`floor_model` says how close a service comes to its floor (the same stack doing no work) and what
its own measured work predicts.

References
----------
Google SRE book, ch. 4 (percentile SLOs). Gil Tene, "How NOT to measure latency" (send lag).
The 10 / (1 - q) rule: a p99 judged on n requests rests on its n / 100 slowest; with 1,000 that is ten.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from course_lib.core.checks import integer
from course_lib.core.intervals import interval_verdict, verdict_words
from course_lib.serving.production import PRODUCTION, ProductionConfig


@dataclass(frozen=True)
class WaterfallStep:
    """One bar of the waterfall: ``server`` (a key of the benchmark's servers) and ``path`` under load,
    ``base`` the step it changes one ``lever`` from (None for the prototype)."""

    name: str
    server: str
    path: str
    base: str | None
    lever: str


def _ratio_bounds(k: pd.Series, ff: pd.Series, kb: pd.Series, ffb: pd.Series) -> tuple[float, float]:
    lows = [a / b if b > 0 and math.isfinite(b) else 0.0 for a, b in zip(k, ffb, strict=True)]
    highs = [a / b if b > 0 and math.isfinite(a) else math.inf for a, b in zip(ff, kb, strict=True)]
    return float(min(lows)), float(max(highs))


PROTOTYPE_STEP, PRODUCTION_STEP, FLOOR_STEP = "prototype", "production", "null endpoint (floor)"


class _Common(TypedDict):
    forward: str
    workers: int


_C: _Common = {"forward": "loop", "workers": 1}
#: The production runtime with the prototype's pure-Python parser and loop (h11 + asyncio).
_PY = PRODUCTION.server.replace(http="h11", loop="asyncio")
#: The servers the steps run on: ``None`` is the prototype (``serve_churn``), else a production config.
SERVERS: dict[str, ProductionConfig | None] = {
    "prototype": None,
    "native-thread": ProductionConfig(
        runtime="xgboost", forward="thread", encoder="json", workers=1, server=_PY
    ),
    "onnx": ProductionConfig(encoder="json", server=_PY, **_C),
    "onnx-thread": ProductionConfig(forward="thread", encoder="json", workers=1, server=_PY),
    "onnx-c": ProductionConfig(encoder="json", **_C),
    "onnx-c-orjson": ProductionConfig(**_C),
    "production": PRODUCTION,
}
#: Prototype to production, one lever at a time, and the floor.
WATERFALL: tuple[WaterfallStep, ...] = (
    WaterfallStep(
        PROTOTYPE_STEP, "prototype", "/score", None,
        "Lesson 6's server: native model on the event loop, h11 + asyncio, json, one process",
    ),
    WaterfallStep(
        "native, forward in a thread", "native-thread", "/score", PROTOTYPE_STEP,
        "the native model call moved off the event loop into a worker thread",
    ),
    WaterfallStep(
        "native, dynamic batching", "native-thread", "/predict", "native, forward in a thread",
        "concurrent requests share one native call (batches of up to 64, 2 ms delay)",
    ),
    WaterfallStep(
        "ONNX Runtime", "onnx", "/score", PROTOTYPE_STEP,
        "ONNX Runtime forward, on the event loop (the production app, same stack)",
    ),
    WaterfallStep(
        "ONNX, forward in a thread", "onnx-thread", "/score", "ONNX Runtime",
        "the ONNX call moved off the event loop into a worker thread",
    ),
    WaterfallStep(
        "+ httptools + uvloop", "onnx-c", "/score", "ONNX Runtime", "uvicorn's C parser and event loop",
    ),
    WaterfallStep(
        "+ one orjson encode", "onnx-c-orjson", "/score", "+ httptools + uvloop",
        "the answer encoded once with orjson instead of json",
    ),
    WaterfallStep(
        PRODUCTION_STEP, "production", "/score", "+ one orjson encode", "one worker process per usable core",
    ),
    WaterfallStep(
        "production, dynamic batching", "production", "/predict", PRODUCTION_STEP,
        "ONNX calls through the dynamic batcher",
    ),
    WaterfallStep(
        FLOOR_STEP, "production", "/null", PRODUCTION_STEP,
        "constant JSON on the same stack and workers: no service work (the floor)",
    ),
)  # fmt: skip


def lever_table(steps: Sequence[WaterfallStep], knee_table: pd.DataFrame) -> pd.DataFrame:
    """One row per step: knees over the repeats, the ratio to its base and the verdict on the lever.

    Returns
    -------
    DataFrame indexed by step name with ``lever``, ``base``, ``knee_rps`` (list, one per repeat),
    ``median_knee_rps``, ``median_first_fail_rps`` (NaN where no rung failed), ``min_knee_rps``,
    ``max_knee_rps``, ``ratio_to_base`` (median over median),
    ``ratio_low``/``ratio_high`` (the interval in the module docstring; NaN without a base) and
    ``verdict`` (``course_lib.core.intervals.interval_verdict``; ``""`` without a base).
    """
    rows = {}
    by_step = {name: part.sort_values("repeat") for name, part in knee_table.groupby("target")}
    for step in steps:
        part = by_step.get(step.name)
        if part is None:
            continue
        row: dict[str, Any] = {
            "lever": step.lever,
            "base": step.base or "",
            "knee_rps": [float(x) for x in part["knee_rps"]],
            "first_fail_rps": [float(x) for x in part["first_fail_rps"]],
            "median_knee_rps": float(np.median(part["knee_rps"])),
            "median_first_fail_rps": float(part["first_fail_rps"].median()),
            "min_knee_rps": float(part["knee_rps"].min()),
            "max_knee_rps": float(part["knee_rps"].max()),
            "generator_bound": bool(part["generator_bound"].any()),
        }
        base = by_step.get(step.base) if step.base else None
        if base is not None and len(base) == len(part):
            low, high = _ratio_bounds(
                part["knee_rps"], part["first_fail_rps"], base["knee_rps"], base["first_fail_rps"]
            )
            base_median = float(np.median(base["knee_rps"]))
            row.update(
                ratio_to_base=row["median_knee_rps"] / base_median if base_median > 0 else math.nan,
                ratio_low=low,
                ratio_high=high,
                verdict=interval_verdict(low, high),
            )
        else:
            row.update(ratio_to_base=math.nan, ratio_low=math.nan, ratio_high=math.nan, verdict="")
        rows[step.name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def lever_sentence(row: pd.Series) -> str:
    """One row of :func:`lever_table` (or of a record's ``configs``) in words: ratio, interval and verdict.

    >>> lever_sentence(pd.Series({"base": "prototype", "ratio_to_base": 2.0, "ratio_low": 1.5,
    ...                           "ratio_high": float("nan"), "verdict": "gain"}))
    "2.00x the knee of 'prototype', interval [1.50x, open]: a gain"
    """
    high = "open" if math.isnan(row["ratio_high"]) else f"{row['ratio_high']:.2f}x"
    return (
        f"{row['ratio_to_base']:.2f}x the knee of '{row['base']}', interval [{row['ratio_low']:.2f}x, {high}]: "
        + verdict_words(row["verdict"])
    )


def floor_model(table: pd.DataFrame, *, service: str, floor: str, workers: int) -> dict[str, float]:
    """How close a service comes to its floor, and what its own measured work predicts.

    Each request costs the stack ``s`` ms of CPU, read off the floor (the same stack and ``workers``
    answering a constant): ``s = 1000 x workers / floor knee``; the service adds its measured work ``w``
    (``handle_ms``, from ``Server-Timing``). Then floor ~ workers / s, service ~ workers / (s + w), and
    the service reaches ``s / (s + w)`` of its floor.

    Parameters
    ----------
    table : a waterfall table (``median_knee_rps`` and ``handle_ms`` by step name).
    service, floor : step names.
    workers : int >= 1

    Returns
    -------
    dict with ``floor_rps``, ``service_rps``, ``measured_fraction`` (service / floor), ``stack_ms`` (s),
    ``work_ms`` (w) and ``predicted_fraction`` (s / (s + w)).

    >>> t = pd.DataFrame({"median_knee_rps": [1000.0, 2000.0], "handle_ms": [1.0, 0.0]}, index=["svc", "null"])
    >>> floor_model(t, service="svc", floor="null", workers=2)["predicted_fraction"]
    0.5
    """
    n = integer("workers", workers, min=1)
    floor_rps, service_rps = (
        float(table["median_knee_rps"].loc[floor]),
        float(table["median_knee_rps"].loc[service]),
    )
    stack_ms = 1000.0 * n / floor_rps if floor_rps > 0 else math.nan
    work_ms = float(table["handle_ms"].loc[service])
    return {
        "floor_rps": floor_rps,
        "service_rps": service_rps,
        "measured_fraction": service_rps / floor_rps if floor_rps > 0 else math.nan,
        "stack_ms": stack_ms,
        "work_ms": work_ms,
        "predicted_fraction": stack_ms / (stack_ms + work_ms),
    }
