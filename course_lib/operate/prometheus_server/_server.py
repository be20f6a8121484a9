"""A real, throw-away Prometheus server on 127.0.0.1 that scrapes a course service, and the port beside it.

``prometheus_server(targets)`` is a context manager: it finds the ``prometheus`` program (Debian's
``prometheus`` package, which ``make system-deps`` installs), writes a scrape configuration for the
given ``host:port`` targets (one job, a short scrape interval), starts the server on a free loopback
port with its storage in a private temporary folder, waits until ``/-/ready`` answers and checks that
the server answering is the one it started (its ``storage.tsdb.path`` flag is our folder), and always
stops it on exit. It cannot outlive its use: a watchdog stops it after ``max_lifetime_s``, and it
runs under the course's process guard (``course_lib.core.guard``, as ``redis-server`` does), which
stops it and removes its folder when the Python process that started it dies. Its log goes to an
anonymous file (never to a pipe nobody reads); the end of the log is in every error.

``PrometheusServer.query`` asks the HTTP API (``/api/v1/query``) at a fixed evaluation time, so a
PromQL answer and the raw samples behind it come from the same stored scrapes.

Where no ``prometheus`` program exists, :class:`PrometheusUnavailableError` says why, and
:func:`prometheus_unavailable_reason` asks without starting anything.

References
----------
Prometheus documentation, "Configuration" (``global.scrape_interval``, ``scrape_configs``,
``static_configs``), "HTTP API" (``/api/v1/query``, ``/api/v1/targets``, ``/api/v1/status/flags``,
``/api/v1/status/buildinfo``), "Management API" (``/-/ready``) and "Querying basics" (range vector
selectors).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import yaml

from course_lib.core import checks
from course_lib.core.guard import guard_command
from course_lib.core.process import ChildProcess, free_port, start_child
from course_lib.core.waiting import wait_until

_START_ATTEMPTS = 5  # free ports tried when another program takes the one we picked
#: Where Debian/Ubuntu's ``prometheus`` package puts the server (searched after PATH).
SYSTEM_PATHS: tuple[str, ...] = ("/usr/bin/prometheus",)


class PrometheusUnavailableError(RuntimeError):
    """No Prometheus server could be started here; the message says why."""


class _PortTakenError(PrometheusUnavailableError):
    """Another program took the port before the server bound it (try another)."""


def find_prometheus(executable: str | None = None) -> str | None:
    """The path of a ``prometheus`` program: ``executable``, ``$PROMETHEUS``, PATH, ``/usr/bin``; or None."""
    for path in (executable, os.environ.get("PROMETHEUS"), shutil.which("prometheus"), *SYSTEM_PATHS):
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def prometheus_unavailable_reason(executable: str | None = None) -> str | None:
    """Why a Prometheus server cannot be started here, or None when a ``prometheus`` program was found."""
    if find_prometheus(executable) is None:
        return (
            "no prometheus program found (looked at $PROMETHEUS, PATH and /usr/bin); install it "
            "(Debian/Ubuntu: apt-get install prometheus, which `make system-deps` does; macOS: brew "
            "install prometheus)"
        )
    return None


def scrape_config(
    targets: Sequence[str],
    *,
    scrape_interval_s: float = 1.0,
    job: str = "churn",
    metrics_path: str = "/metrics",
) -> dict[str, Any]:
    """The Prometheus configuration (as a dict, written as YAML) that scrapes ``targets`` every interval.

    Parameters
    ----------
    targets : sequence of "host:port" (or "http://host:port", the scheme is dropped), at least one.
    scrape_interval_s : float > 0
        ``global.scrape_interval`` (and the evaluation interval), written in milliseconds.
    job : str
        ``job_name``; Prometheus adds it as the ``job`` label of every scraped series.
    metrics_path : str
        Path of the exposition page on every target.

    Raises
    ------
    InvalidArgumentError
        For no targets, a non-positive interval or a path that does not start with "/".

    Examples
    --------
    >>> cfg = scrape_config(["http://127.0.0.1:8123"], scrape_interval_s=0.5)
    >>> cfg["global"]["scrape_interval"], cfg["scrape_configs"][0]["static_configs"][0]["targets"]
    ('500ms', ['127.0.0.1:8123'])
    """
    checks.non_empty("targets", targets)
    interval = checks.positive_number("scrape_interval_s", scrape_interval_s)
    if not metrics_path.startswith("/"):
        raise checks.InvalidArgumentError(f"metrics_path must start with '/', got {metrics_path!r}")
    hosts = [t.split("://", 1)[-1].rstrip("/") for t in targets]
    every = f"{max(1, round(interval * 1000))}ms"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
        "scrape_configs": [
            {"job_name": job, "metrics_path": metrics_path, "static_configs": [{"targets": hosts}]}
        ],
    }


def _labels_key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


@dataclass
class PrometheusServer:
    """A running Prometheus server: where it listens, what it scrapes, and how to ask it.

    ``guard`` is the process guard the server runs under (its only child is the server).
    """

    executable: str
    guard: ChildProcess
    folder: Path
    port: int
    scrape_interval_s: float
    version: str = ""

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.guard.running

    def log_tail(self, n_chars: int = 2000) -> str:
        """The end of the server's log (empty if it wrote none, or once it is stopped)."""
        return self.guard.tail(n_chars)

    def _get(self, path: str, **params: Any) -> Any:
        try:
            answer = httpx.get(self.url + path, params=params, timeout=10.0)
        except httpx.HTTPError as err:
            raise PrometheusUnavailableError(f"{path}: {err!r}; log: {self.log_tail(800)}") from None
        body = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else {}
        if answer.status_code != 200 or body.get("status") != "success":
            raise ValueError(f"Prometheus refused {path} {params}: {answer.status_code} {answer.text[:500]}")
        return body["data"]

    def query(self, expr: str, at_s: float) -> dict[str, Any]:
        """``/api/v1/query`` of ``expr`` evaluated at ``at_s`` (Unix seconds): ``{"resultType", "result"}``.

        Raises
        ------
        ValueError
            If Prometheus refuses the expression (the message holds its error).
        """
        return self._get("/api/v1/query", query=expr, time=f"{at_s:.3f}")

    def instant(self, expr: str, at_s: float) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant-vector (or scalar) answer as {sorted label pairs: value}; ``{(): v}`` for a scalar."""
        data = self.query(expr, at_s)
        if data["resultType"] == "scalar":
            return {(): float(data["result"][1])}
        if data["resultType"] != "vector":
            raise ValueError(f"{expr!r} is a {data['resultType']}, not an instant vector")
        return {_labels_key(r["metric"]): float(r["value"][1]) for r in data["result"]}

    def samples(
        self, selector: str, range_s: float, at_s: float
    ) -> dict[tuple[tuple[str, str], ...], pd.DataFrame]:
        """The stored samples of ``selector[range]`` at ``at_s``: {labels: DataFrame ``t_ms``, ``value``}.

        This is the range vector that ``rate(selector[range])`` evaluated at ``at_s`` reads.
        """
        data = self.query(f"{selector}[{max(1, round(range_s * 1000))}ms]", at_s)
        if data["resultType"] != "matrix":
            raise ValueError(f"{selector!r} with a range is a {data['resultType']}, not a matrix")
        out = {}
        for r in data["result"]:
            rows = [(round(float(t) * 1000), float(v)) for t, v in r["values"]]
            out[_labels_key(r["metric"])] = pd.DataFrame(rows, columns=["t_ms", "value"])
        return out

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their health and last scrape (``/api/v1/targets``)."""
        return list(self._get("/api/v1/targets")["activeTargets"])

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; remove the temporary folder (storage and config)."""
        self.guard.stop(timeout_s)
        shutil.rmtree(self.folder, ignore_errors=True)


def _start(
    executable: str, folder: Path, config_path: Path, port: int, startup_timeout_s: float
) -> tuple[ChildProcess, str]:
    """Start Prometheus on ``port``, wait until it is ready and provably ours; its guard and its version."""
    cmd = [
        executable,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={folder / 'data'}",
        "--storage.tsdb.retention.time=1h",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    guard = start_child(guard_command(cmd, remove=[str(folder)], stop_timeout_s=10.0), name="prometheus")
    server = PrometheusServer(executable, guard, folder, port, 0.0)

    def ready() -> bool:
        if not guard.running:
            return True
        try:
            return httpx.get(server.url + "/-/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, timeout_s=startup_timeout_s, what="Prometheus to answer /-/ready", interval_s=0.05)
    except TimeoutError:
        tail = server.log_tail()
        guard.stop()
        raise PrometheusUnavailableError(
            f"prometheus did not become ready within {startup_timeout_s:g} s; log: {tail}"
        ) from None
    if not guard.running:
        tail = server.log_tail()
        code = guard.stop()
        error = _PortTakenError if "address already in use" in tail else PrometheusUnavailableError
        raise error(f"prometheus exited with code {code}: {tail.strip()}")
    flags = server._get("/api/v1/status/flags")
    if flags.get("storage.tsdb.path") != str(folder / "data"):
        # somebody else's server answers on this port: never use it, stop ours
        guard.stop()
        raise _PortTakenError(
            f"127.0.0.1:{port} is served by another Prometheus ({flags.get('storage.tsdb.path')})"
        )
    return guard, str(server._get("/api/v1/status/buildinfo").get("version", ""))


def _start_on_a_free_port(
    path: str, folder: Path, config: dict[str, Any], startup_timeout_s: float
) -> tuple[ChildProcess, str, int]:
    """Start Prometheus (``path``) in ``folder`` with ``config`` on a free port: ``(guard, version, port)``.

    A free port can be taken before the server binds it, so up to ``_START_ATTEMPTS`` ports are tried.
    On any failure ``folder`` is removed and the error raised (``PrometheusUnavailableError`` when every
    port was taken).
    """
    config_path = folder / "prometheus.yml"
    try:
        for attempt in range(_START_ATTEMPTS):
            folder.mkdir(exist_ok=True)  # the guard of a failed attempt removes the folder as it stops
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            port = free_port()
            try:
                guard, version = _start(path, folder, config_path, port, startup_timeout_s)
                return guard, version, port
            except _PortTakenError as err:
                if attempt == _START_ATTEMPTS - 1:
                    raise PrometheusUnavailableError(
                        f"no free port after {_START_ATTEMPTS} attempts: {err}"
                    ) from None
                shutil.rmtree(folder / "data", ignore_errors=True)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _wait_for_first_scrape(server: PrometheusServer, n_targets: int, timeout_s: float) -> None:
    """Wait until ``server`` has scraped each of its ``n_targets`` targets successfully (``health`` up).

    Raises ``PrometheusUnavailableError`` (with each target's state) if that takes over ``timeout_s``.
    """

    def all_up() -> bool:
        found = server.targets()
        return len(found) == n_targets and all(t["health"] == "up" for t in found)

    try:
        wait_until(
            all_up, timeout_s=timeout_s, what="Prometheus's first scrape of every target", interval_s=0.1
        )
    except TimeoutError:
        raise PrometheusUnavailableError(
            f"Prometheus did not scrape every target within {timeout_s:g} s: "
            f"{[(t['scrapeUrl'], t['health'], t['lastError']) for t in server.targets()]}"
        ) from None


@contextmanager
def prometheus_server(
    targets: Sequence[str],
    *,
    scrape_interval_s: float = 1.0,
    job: str = "churn",
    metrics_path: str = "/metrics",
    max_lifetime_s: float = 300.0,
    startup_timeout_s: float = 30.0,
    wait_for_first_scrape: bool = True,
    executable: str | None = None,
) -> Iterator[PrometheusServer]:
    """Run a private Prometheus server that scrapes ``targets`` for the duration of the ``with`` block.

    Parameters
    ----------
    targets : sequence of "host:port" or base URLs of the services to scrape (e.g. ``server.url``).
    scrape_interval_s : float > 0
        How often every target is scraped (also the rule evaluation interval).
    job, metrics_path : as in :func:`scrape_config`.
    max_lifetime_s : float > 0
        A watchdog stops the server after this many seconds even if the block never ends.
    startup_timeout_s : float > 0
        How long to wait for ``/-/ready``, and then for the first scrape of every target.
    wait_for_first_scrape : bool
        Yield only once every target has been scraped successfully (``health == "up"``). Prometheus
        hands new targets to its scrape loops only every 5 seconds (its discovery and scrape managers
        batch updates), so the first scrape comes a few seconds after start: traffic sent before it
        would be missing from the first stored sample's *difference*, though not from the counters.
    executable : str, optional
        Path of the program; otherwise :func:`find_prometheus`.

    Yields
    ------
    PrometheusServer

    Raises
    ------
    PrometheusUnavailableError
        No ``prometheus`` program, or it exited or was not ready in time (with the end of its log),
        or every port tried was taken by another program.
    InvalidArgumentError
        For bad targets, intervals or time limits.
    """
    config = scrape_config(targets, scrape_interval_s=scrape_interval_s, job=job, metrics_path=metrics_path)
    checks.positive_number("max_lifetime_s", max_lifetime_s)
    checks.positive_number("startup_timeout_s", startup_timeout_s)
    path = find_prometheus(executable)
    if path is None:
        raise PrometheusUnavailableError(prometheus_unavailable_reason(executable) or "prometheus not found")
    folder = Path(tempfile.mkdtemp(prefix="course-prometheus-"))
    guard, version, port = _start_on_a_free_port(path, folder, config, startup_timeout_s)
    server = PrometheusServer(path, guard, folder, port, float(scrape_interval_s), version)
    watchdog = threading.Timer(max_lifetime_s, server.stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        if wait_for_first_scrape:
            _wait_for_first_scrape(server, len(targets), startup_timeout_s)
        yield server
    finally:
        watchdog.cancel()
        server.stop()
