"""Locust, the tool people use: run it headless in a bounded subprocess, read its CSV, know its rounding.

``run_locust`` starts ``locust --headless -u U -r R -t T --csv PREFIX`` on ``loadtests/locustfile.py``
in a subprocess that stops after its run time (``-t`` plus ``--stop-timeout``), is killed if it
overruns, and dies with the process that started it (it runs under the course's process guard,
``python -m course_lib.core._process``). ``read_locust_stats`` reads the ``_stats.csv`` back.

Two properties of Locust's numbers, reproduced here so tests can check them against Locust's own code:

* its users are closed loops (send, wait, send), so it suffers coordinated omission;
* it stores each response time rounded into a bucket (``bucket_response_time_ms``, from
  ``locust.stats.bucket_response_time``): whole ms below 100 ms, 10 ms steps below 1 s, 100 ms steps
  below 10 s, 1 s steps above, with Python's ``round`` (halves go to the even neighbour: 0.5 -> 0,
  2.5 -> 2). Percentiles are read from the buckets (``locust_percentile``, from
  ``locust.stats.calculate_response_time_percentile``): sub-millisecond latencies collapse to 0 or 1
  ms, and a percentile can exceed the largest latency observed (996 ms is stored as 1000).
  Its rank is int(q x n) + 1 counted from the bottom, one above nearest rank whenever q x n is whole.

References
----------
Locust documentation, "Running without the web UI", "Retrieve test statistics in CSV format";
``locust/stats.py`` (version pinned in requirements.lock).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from course_lib.core._io import REPO_ROOT
from course_lib.core._process import child_env

__all__ = ["LOCUSTFILE", "bucket_response_time_ms", "locust_percentile", "read_locust_stats", "run_locust"]

#: The course's locustfile.
LOCUSTFILE = REPO_ROOT / "loadtests" / "locustfile.py"

#: Runs a command and stops it when this process dies (see ``course_lib.core._process``).
_GUARD = [sys.executable, "-m", "course_lib.core._process", "--"]


def bucket_response_time_ms(response_time_ms: float) -> int:
    """The bucket Locust stores a response time in (``locust.stats.bucket_response_time``)."""
    if response_time_ms < 100:
        return round(response_time_ms)
    if response_time_ms < 1000:
        return int(round(response_time_ms, -1))
    if response_time_ms < 10000:
        return int(round(response_time_ms, -2))
    return int(round(response_time_ms, -3))


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
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q!r}")
    buckets = pd.Series([bucket_response_time_ms(float(x)) for x in samples_ms])
    if buckets.empty:
        raise ValueError("samples_ms is empty")
    counts = buckets.value_counts().sort_index(ascending=False)
    n = int(counts.sum())
    at_or_below = int(n * q / 100.0)
    processed = 0
    for value, count in counts.items():
        processed += int(count)
        if n - processed <= at_or_below:
            return int(value)
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
    if isinstance(users, bool) or not isinstance(users, int) or users < 1:
        raise ValueError(f"users must be an integer >= 1, got {users!r}")
    if not spawn_rate > 0:
        raise ValueError(f"spawn_rate must be > 0 users per second, got {spawn_rate!r}")
    if isinstance(run_time_s, bool) or not isinstance(run_time_s, int) or run_time_s < 1:
        raise ValueError(f"run_time_s must be an integer >= 1 second, got {run_time_s!r}")
    Path(csv_prefix).parent.mkdir(parents=True, exist_ok=True)
    args = [
        "-f", str(locustfile), "--headless", "--host", host, "-u", str(users), "-r", f"{spawn_rate:g}",
        "-t", f"{run_time_s}s", "--stop-timeout", str(stop_timeout_s), "--csv", str(csv_prefix),
        "--only-summary", "--loglevel", "ERROR", "--exit-code-on-error", "0",
    ]  # fmt: skip
    root = str(REPO_ROOT)  # the locustfile imports this checkout's course_lib
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH", "")]))
    deadline = run_time_s + stop_timeout_s + 60
    try:
        done = subprocess.run(
            [*_GUARD, sys.executable, "-m", "locust", *args],
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
