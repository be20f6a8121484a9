"""Locust, the tool people use: run it headless in a bounded subprocess, read its CSV, know its rounding.

``run_locust`` starts ``locust --headless -u U -r R -t T --csv PREFIX`` on :data:`LOCUSTFILE`
(``scripts/locustfile.py`` in this package, shipped as package data; ``loadtests/locustfile.py`` in a
checkout links to it)
in a subprocess that stops after its run time (``-t`` plus ``--stop-timeout``), is killed if it
overruns, and dies with the process that started it (it runs under the course's process guard,
``python -m course_lib.core.guard``). ``read_locust_stats`` reads the ``_stats.csv`` back.

Properties of Locust's numbers, reproduced here so tests check them against Locust's own code:

* its users are closed loops (send, wait, send), so it suffers coordinated omission;
* it stores each response time rounded into a bucket (``bucket_response_time_ms``, from
  ``locust.stats.bucket_response_time``): whole ms below 100 ms, 10 ms steps below 1 s, 100 ms steps
  below 10 s, 1 s steps above, with Python's ``round`` (halves go to the even neighbour: 0.5 -> 0,
  2.5 -> 2). Percentiles are read from the buckets (``locust_percentile``, from
  ``locust.stats.calculate_response_time_percentile``): sub-millisecond latencies collapse to 0 or 1
  ms, and a percentile can exceed the largest latency observed (996 ms is stored as 1000).
  Its rank is int(q x n) + 1 counted from the bottom, one above nearest rank whenever q x n is whole
  (``locust_rank``). The CSV's "Median Response Time" is the same rule at q = 50 clamped to the exact
  minimum and maximum; its "50%" column is not clamped.

Locust's *counts and rates* follow from its source too (``locust_closed_loop``):

* **users are closed loops**: with ``constant_pacing(p)`` a user starts a request, waits for the answer,
  and starts the next ``p`` seconds after the previous start, or at once if the answer took longer; a slow
  answer delays every later request of that user, so it sends fewer requests exactly while the service is
  slow (``locust.user.wait_time.constant_pacing``);
* **spawn**: ``-r R`` starts ``max(1, floor(R))`` users per dispatch, one dispatch every
  ``max(1, floor(R)) / R`` seconds (``locust.dispatch.UsersDispatcher``); with ``R >= -u`` every user
  starts at once, and paced users then stay in step: they send in bursts of ``-u`` requests, which a
  server that answers one at a time queues, so Locust's median can sit far above an open-loop
  generator's at the same mean rate;
* **Requests/s** in the CSV is ``StatsEntry.total_rps``: requests counted so far divided by the time
  from the statistics' start to the *completion* of the last request (``locust_requests_per_s``). A
  short run of paced users ends its window at its last answer, not at ``-t``: ``u x ceil(t / p)``
  requests over about ``(ceil(t / p) - 1) x p`` seconds reads higher than both ``u / p`` and
  requests / ``t``.

References
----------
Locust documentation, "Running without the web UI", "Retrieve test statistics in CSV format";
``locust/stats.py``, ``locust/dispatch.py``, ``locust/user/wait_time.py`` (version pinned in
requirements.lock).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from course_lib.core import checks
from course_lib.core.files import IMPORT_ROOT, package_file
from course_lib.core.guard import guard_command
from course_lib.core.process import child_env

__all__ = [
    "LOCUSTFILE",
    "bucket_response_time_ms",
    "locust_closed_loop",
    "locust_percentile",
    "locust_rank",
    "locust_requests_per_s",
    "read_locust_stats",
    "run_locust",
]

#: The course's locustfile, shipped inside this package (a checkout's ``loadtests/locustfile.py`` links here).
LOCUSTFILE = package_file("course_lib.measure.load_tools", "scripts", "locustfile.py")


def bucket_response_time_ms(response_time_ms: float) -> int:
    """The bucket Locust stores a response time in (``locust.stats.bucket_response_time``)."""
    if response_time_ms < 100:
        return round(response_time_ms)
    if response_time_ms < 1000:
        return int(round(response_time_ms, -1))
    if response_time_ms < 10000:
        return int(round(response_time_ms, -2))
    return int(round(response_time_ms, -3))


def locust_rank(n: int, q: float) -> int:
    """The 1-based rank (from the bottom, among ``n`` bucketed response times) whose bucket Locust reports.

    ``locust.stats.calculate_response_time_percentile`` walks the buckets from the top and returns the
    first whose count of smaller responses is at most ``int(n x q/100)``: the value at rank
    ``int(n x q/100) + 1``, capped at ``n``. Nearest rank is ``ceil(n x q/100)``: the same unless
    ``n x q/100`` is whole, where Locust is one rank higher (p99 of 100 responses: the 100th, the maximum).

    Raises
    ------
    ValueError
        For ``n`` < 1 or q outside [0, 100].

    Examples
    --------
    >>> locust_rank(100, 99), locust_rank(150, 99), locust_rank(10, 100)
    (100, 149, 10)
    """
    n = checks.integer("n", n, min=1)
    q = checks.number("q", q, min=0, max=100)
    return min(int(n * (q / 100.0)) + 1, n)


def locust_requests_per_s(n_requests: int, start_s: float, last_completion_s: float) -> float:
    """Locust's "Requests/s" (``StatsEntry.total_rps``): requests / (last completion - statistics start).

    Parameters
    ----------
    n_requests : int >= 0
        Requests Locust counted (it counts a request when its answer arrives).
    start_s : float
        When the statistics started (the run's start, or the reset after spawning with ``--reset-stats``).
    last_completion_s : float
        When the last counted answer arrived, on the same clock.

    Returns
    -------
    float, requests per second; 0.0 when no time passed (Locust's own answer then).

    Raises
    ------
    ValueError
        For a negative count or a last completion before the start.

    Examples
    --------
    >>> round(locust_requests_per_s(40, 0.0, 2.48), 1)  # 10 users paced 0.8 s for -t 3s: 16.1, not 12.5
    16.1
    """
    n_requests = checks.integer("n_requests", n_requests, min=0)
    if not last_completion_s >= start_s:
        raise ValueError(f"last_completion_s must be >= start_s, got {last_completion_s!r} < {start_s!r}")
    span = last_completion_s - start_s
    return float(n_requests) / span if span > 0 else 0.0


def locust_closed_loop(
    users: int,
    spawn_rate: float,
    pacing_s: float,
    run_time_s: float,
    *,
    response_time_s: float = 0.0,
) -> dict[str, object]:
    """What Locust's paced closed-loop users send in ``-t run_time_s``, from its scheduling rules.

    Every answer is assumed to take ``response_time_s`` (pass the run's median to compare with a real
    run). Users are spawned as ``locust.dispatch.UsersDispatcher`` does (``max(1, floor(spawn_rate))`` per
    dispatch, dispatches ``max(1, floor(spawn_rate)) / spawn_rate`` s apart); each starts its first
    request when spawned and the next at ``max(previous start + pacing_s, previous answer)``
    (``constant_pacing``); a request starts only before ``run_time_s``. The statistics start at 0.

    Parameters
    ----------
    users : int >= 1
        ``-u``.
    spawn_rate : float > 0
        ``-r``, users started per second.
    pacing_s : float > 0
        ``constant_pacing``'s period per user.
    run_time_s : float > 0
        ``-t``.
    response_time_s : float >= 0
        Time from a request's start to its answer.

    Returns
    -------
    dict with
        ``starts`` (DataFrame ``user``, ``start_s``, ``end_s``, sorted by start), ``requests``,
        ``asked_rps`` (users / pacing_s, the rate the locustfile aims at), ``sent_rps`` (requests /
        run_time_s), ``requests_per_s`` (what Locust's CSV reports: :func:`locust_requests_per_s` up to the
        last answer) and ``largest_burst`` (most requests started within ``response_time_s`` of one
        another, at least 1: requests that queue together at a server that serves one at a time).

    Raises
    ------
    ValueError
        For counts or times out of range.

    Examples
    --------
    >>> run = locust_closed_loop(10, 100, 0.8, 3, response_time_s=0.08)
    >>> run["requests"], run["asked_rps"], round(run["requests_per_s"], 1), run["largest_burst"]
    (40, 12.5, 16.1, 10)
    """
    users = checks.integer("users", users, min=1)
    spawn_rate = checks.positive_number("spawn_rate", spawn_rate)
    pacing_s = checks.positive_number("pacing_s", pacing_s)
    run_time_s = checks.positive_number("run_time_s", run_time_s)
    response_time_s = checks.positive_number("response_time_s", response_time_s, allow_zero=True)
    per_dispatch = max(1, math.floor(spawn_rate))
    gap_s = per_dispatch / spawn_rate
    rows = []
    for user in range(users):
        start = (user // per_dispatch) * gap_s
        while start < run_time_s:
            rows.append((user, start, start + response_time_s))
            start = max(start + pacing_s, start + response_time_s)
    starts = pd.DataFrame(rows, columns=["user", "start_s", "end_s"]).sort_values(["start_s", "user"])
    starts = starts.reset_index(drop=True)
    n = len(starts)
    times = starts["start_s"].to_numpy()
    window = max(response_time_s, 1e-9)
    burst = int(max(np.searchsorted(times, times + window, side="right") - np.arange(n))) if n else 0
    return {
        "starts": starts,
        "requests": n,
        "asked_rps": users / pacing_s,
        "sent_rps": n / run_time_s,
        "requests_per_s": locust_requests_per_s(n, 0.0, float(starts["end_s"].max())) if n else 0.0,
        "largest_burst": max(1, burst),
    }


def locust_percentile(samples_ms: Iterable[float], q: float) -> int:
    """The q-th percentile Locust reports for these response times (bucketed, its own rank rule).

    Parameters
    ----------
    samples_ms : response times in ms
    q : float in [0, 100]

    Raises
    ------
    ValueError
        For no samples or q outside [0, 100].
    """
    q = checks.number("q", q, min=0, max=100)
    buckets = pd.Series([bucket_response_time_ms(float(x)) for x in samples_ms])
    if buckets.empty:
        raise ValueError("samples_ms is empty")
    counts = buckets.value_counts().sort_index(ascending=False)
    n = int(counts.sum())
    at_or_below = int(n * (q / 100.0))  # Locust: int(num_requests * percent), percent = q / 100
    processed = 0
    for value, count in counts.items():
        processed += int(count)
        if n - processed <= at_or_below:
            return int(cast(int, value))  # a bucket: an int response time
    return 0


def read_locust_stats(csv_prefix: str | Path) -> pd.DataFrame:
    """Locust's ``<prefix>_stats.csv``: one row per request name plus ``Aggregated``.

    Raises
    ------
    FileNotFoundError
        If Locust wrote no stats file under that prefix.
    """
    return pd.read_csv(f"{csv_prefix}_stats.csv")


def run_locust(
    host: str,
    *,
    users: int,
    spawn_rate: float,
    run_time_s: int,
    csv_prefix: str | Path,
    env: Mapping[str, str] | None = None,
    locustfile: str | Path = LOCUSTFILE,
    stop_timeout_s: int = 2,
) -> pd.DataFrame:
    """Run Locust headless against ``host`` and return its stats CSV.

    Parameters
    ----------
    host : str
        Base URL, e.g. ``http://127.0.0.1:8123``.
    users : int >= 1
        Concurrent closed-loop users (``-u``).
    spawn_rate : float > 0
        Users started per second (``-r``).
    run_time_s : int >= 1
        Run time (``-t``); the process is killed if it has not exited
        ``run_time_s + stop_timeout_s + 60`` seconds after start (start-up included).
    csv_prefix : path
        ``--csv`` prefix (``<prefix>_stats.csv``, ``_stats_history.csv``, ``_failures.csv``).
    env : mapping, optional
        Extra environment for the locustfile (``CHURN_PATH``, ``CHURN_PACING_S``, ...).
    locustfile : path
    stop_timeout_s : int
        ``--stop-timeout``: how long users may finish their request at the end.

    Returns
    -------
    DataFrame (``read_locust_stats``).

    Raises
    ------
    ValueError
        For users < 1, spawn rate <= 0 or run time < 1.
    RuntimeError
        If Locust exits non-zero for a reason other than failed requests, or overruns (with its output).
    """
    users = checks.integer("users", users, min=1)
    spawn_rate = checks.positive_number("spawn_rate", spawn_rate, unit="users per second")
    run_time_s = checks.integer("run_time_s", run_time_s, min=1)
    Path(csv_prefix).parent.mkdir(parents=True, exist_ok=True)
    args = [
        "-f", str(locustfile), "--headless", "--host", host, "-u", str(users), "-r", f"{spawn_rate:g}",
        "-t", f"{run_time_s}s", "--stop-timeout", str(stop_timeout_s), "--csv", str(csv_prefix),
        "--only-summary", "--loglevel", "ERROR", "--exit-code-on-error", "0",
    ]  # fmt: skip
    root = str(IMPORT_ROOT)  # the locustfile imports this same course_lib
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH", "")]))
    deadline = run_time_s + stop_timeout_s + 60
    try:
        done = subprocess.run(
            guard_command([sys.executable, "-m", "locust", *args]),
            env=child_env({**(env or {}), "PYTHONPATH": path}),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=deadline,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"locust did not finish within {deadline} s: {str(exc.stderr)[-2000:]}") from None
    if done.returncode != 0:
        raise RuntimeError(f"locust exited with code {done.returncode}: {done.stderr[-2000:]}")
    return read_locust_stats(csv_prefix)
