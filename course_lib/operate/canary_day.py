"""A simulated day of a canary rollout: real models, real routing, resampled latencies, delayed labels.

Each hour of the day, ``requests_per_hour`` support-desk requests arrive for customers drawn from a
population the model never trained on. The ``RampController``'s router sends each one to v1 or the
canary; the churn score is the version's real ONNX output for that customer (scored once, in a
batch, before the day starts); the latency is drawn from the per-request latencies passed for that
version (measured ones make the day's outcome depend on how busy the machine was while it measured:
Lesson 9 passes one seeded pool for every version, so that the day is decided by scores and labels);
a share of the requests get their churn label ``label_delay_h`` hours later (a support rep records the
outcome). At the end of every hour the controller judges the stage so far
and promotes, holds or rolls back.

Only the clock is simulated: a day of traffic takes a second instead of 24 hours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from course_lib.churn.model import tenure_band
from course_lib.core.percentiles import percentile
from course_lib.operate.canary import DecisionRules, HashRouter, RampController

__all__ = ["CanaryDay", "hourly_metrics", "simulate_canary_day"]


@dataclass
class CanaryDay:
    """The outcome: every request, the decision log, the checks and the controller."""

    requests: pd.DataFrame
    decisions: pd.DataFrame
    checks: pd.DataFrame
    controller: RampController


def simulate_canary_day(
    population: pd.DataFrame,
    scores: Mapping[str, np.ndarray],
    latency_ms: Mapping[str, np.ndarray],
    *,
    stable: str = "v1",
    canary: str = "v2",
    hours: int = 24,
    requests_per_hour: int = 6000,
    label_share: float = 0.3,
    label_delay_h: int = 2,
    rules: DecisionRules | None = None,
    min_windows: int = 2,
    seed: int = 0,
) -> CanaryDay:
    """Run a canary of ``canary`` against ``stable`` through one simulated day.

    Parameters
    ----------
    population : customers (``customer_id``, ``tenure``, ``churn``) that requests are drawn from.
    scores : version -> churn probability of every population row, shape (len(population),).
    latency_ms : version -> per-request latencies (ms) to resample from (measured, or a seeded pool).
    label_share, label_delay_h : share of requests whose label arrives, and how many hours later.

    Returns
    -------
    CanaryDay; ``requests`` has ``hour``, ``customer_id``, ``version``, ``latency_ms``, ``status``,
    ``score``, ``tenure_band``, ``label`` (NaN if it never arrives) and ``label_hour``.

    Raises
    ------
    ValueError
        If a version lacks scores or latencies, or the score arrays do not match the population.
    """
    for v in (stable, canary):
        if v not in scores or v not in latency_ms:
            raise ValueError(f"version {v!r} needs both scores and latency samples")
        if len(scores[v]) != len(population):
            raise ValueError(f"scores[{v!r}] has {len(scores[v])} values for {len(population)} customers")
    rng = np.random.default_rng(seed)
    controller = RampController(HashRouter(stable, canary), rules, min_windows=min_windows)
    ids = population["customer_id"].astype(str).to_numpy()
    bands = tenure_band(population["tenure"]).astype(str).to_numpy()
    churn = population["churn"].astype(int).to_numpy()
    hours_done: list[pd.DataFrame] = []
    stage_start = 0
    for hour in range(hours):
        rows = rng.integers(0, len(population), size=requests_per_hour)
        version = np.array([controller.router.version_for(c) for c in ids[rows]])
        latency = np.empty(len(rows))
        score = np.empty(len(rows))
        for v in (stable, canary):
            mask = version == v
            latency[mask] = rng.choice(np.asarray(latency_ms[v]), size=int(mask.sum()))
            score[mask] = np.asarray(scores[v])[rows[mask]]
        labelled = rng.random(len(rows)) < label_share
        frame = pd.DataFrame(
            {
                "hour": hour,
                "customer_id": ids[rows],
                "version": version,
                "latency_ms": latency,
                "status": 200,
                "score": score,
                "tenure_band": bands[rows],
                "label": np.where(labelled, churn[rows], np.nan),
                "label_hour": np.where(labelled, hour + label_delay_h, np.nan),
                "canary_percent": controller.router.percent,
            }
        )
        hours_done.append(frame)
        stage = pd.concat(hours_done[stage_start:], ignore_index=True)
        arrived = stage[stage["label_hour"] <= hour + 1]
        before = controller.router.percent
        controller.decide(hour + 1, stage, arrived)
        if controller.router.percent != before:
            stage_start = hour + 1
    checks = pd.DataFrame([{"t": t, **c.__dict__} for t, c in controller.checks])
    return CanaryDay(pd.concat(hours_done, ignore_index=True), controller.log_frame(), checks, controller)


def hourly_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """Per hour and version: requests, p95 latency (ms, nearest rank), mean score, canary percent."""
    rows = []
    for (hour, version), part in requests.groupby(["hour", "version"], sort=True):
        rows.append(
            {
                "hour": hour,
                "version": version,
                "requests": len(part),
                "p95_ms": percentile(part["latency_ms"], 95),
                "mean_score": float(part["score"].mean()),
                "canary_percent": float(part["canary_percent"].iloc[0]),
            }
        )
    return pd.DataFrame(rows)
