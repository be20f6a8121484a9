"""promtool, Prometheus's own rule checker, on the replayed incident of ``course_lib.operate.alerting``.

``promtool_test_file`` turns the Python timeline of ``alerting.evaluate_rules`` into a ``promtool
test rules`` unit-test file: the scraped series written out one value per scrape, and at each
asserted instant the firing alerts of every rule (``alert_rule_test``) and the pending ones through
the ``ALERTS`` series (``promql_expr_test``). ``write_promtool_tests`` regenerates the committed
files under ``prometheus/tests/``; ``promtool_report`` runs ``promtool check rules`` and ``promtool
test rules`` on them, or returns the recorded output where promtool is not installed.

References
----------
Prometheus documentation, "Unit testing for rules" and "Defining recording/alerting rules"
(``promtool check rules``).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from course_lib.core.files import atomic_write_text
from course_lib.operate.alerting import (
    PROMETHEUS_DIR,
    RULES,
    SCRAPE_INTERVAL_S,
    AlertRule,
    IncidentSeries,
    Labels,
    evaluate_rules,
    simulate_incident,
)

__all__ = [
    "PROMTOOL_OUTPUT",
    "PROMTOOL_TESTS",
    "promtool_path",
    "promtool_report",
    "promtool_test_file",
    "run_promtool",
    "write_promtool_tests",
]


def _fmt_minutes(t_s: float) -> str:
    return f"{int(t_s // 60)}m{int(t_s % 60)}s" if t_s % 60 else f"{int(t_s // 60)}m"


def _selector(name: str, labels: Mapping[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _checks_at(
    t: float, now: list[tuple[str, Labels, str]], mine: dict[str, AlertRule]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """At instant ``t`` (s) with the alert states ``now``: one ``alert_rule_test`` per rule of ``mine``
    (its firing alerts) and the ``promql_expr_test`` of the pending ones (the ``ALERTS`` series)."""
    alert_tests = []
    for rule in mine.values():
        exp = [
            {
                "exp_labels": {**rule.labels, **dict(labels)},
                "exp_annotations": {"summary": rule.summary.format(version=dict(labels).get("version", ""))},
            }
            for alert, labels, state in now
            if alert == rule.name and state == "firing"
        ]
        alert_tests.append({"eval_time": _fmt_minutes(t), "alertname": rule.name, "exp_alerts": exp})
    pending = [
        {
            "labels": _selector(
                "ALERTS",
                {"alertname": alert, "alertstate": "pending", **mine[alert].labels, **dict(labels)},
            ),
            "value": 1,
        }
        for alert, labels, state in now
        if state == "pending"
    ]
    expr = {"expr": 'ALERTS{alertstate="pending"}', "eval_time": _fmt_minutes(t), "exp_samples": pending}
    return alert_tests, expr


def promtool_test_file(
    incident: IncidentSeries,
    rule_file: str,
    check_times_s: Sequence[float] | np.ndarray,
    rules: Sequence[AlertRule] = RULES,
) -> str:
    """A ``promtool test rules`` file asserting the Python timeline at ``check_times_s``.

    Only instants where Prometheus 2 (closed range) and Prometheus 3 (left-open range) semantics
    give the same states are asserted, so the file holds for either promtool. At each instant it
    asserts the firing alerts of every rule (``alert_rule_test``) and the pending ones through the
    ``ALERTS`` series (``promql_expr_test``).

    Returns
    -------
    str, YAML text (series values written out explicitly, one per scrape).

    Raises
    ------
    ValueError
        If no rule of ``rules`` comes from ``rule_file``.
    """
    mine = {r.name: r for r in rules if r.file == rule_file}
    if not mine:
        raise ValueError(f"no rule comes from {rule_file!r}; files: {sorted({r.file for r in rules})}")
    closed = evaluate_rules(incident, list(mine.values()))
    opened = evaluate_rules(incident, list(mine.values()), left_open=True)

    def states(tl: pd.DataFrame, t: float) -> set[tuple[str, Labels, str]]:
        at = tl[tl["t_s"] == t]
        return set(zip(at["alert"], at["labels"], at["state"], strict=True))

    series = [
        {"series": _selector(name, dict(labels)), "values": " ".join(str(int(v)) for v in values)}
        for (name, labels), values in incident.series.items()
    ]
    alert_tests, expr_tests = [], []
    for t in check_times_s:
        now = sorted(states(closed, t))
        if set(now) != states(opened, t):
            continue
        alerts, pending = _checks_at(t, now, mine)
        alert_tests += alerts
        expr_tests.append(pending)
    doc = {
        "rule_files": [f"../{rule_file}"],
        "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        "tests": [
            {
                "interval": f"{SCRAPE_INTERVAL_S}s",
                "input_series": series,
                "alert_rule_test": alert_tests,
                "promql_expr_test": expr_tests,
            }
        ],
    }
    header = (
        f"# Generated by course_lib.operate.promtool.promtool_test_file for {rule_file}: the IncidentSpec() incident,\n"
        f"# scraped every {SCRAPE_INTERVAL_S} s, asserted at {len(expr_tests)} instants. Do not edit by hand.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=10_000)


def promtool_path() -> str | None:
    """Path of ``promtool`` on this machine, or None (Debian: ``apt-get install prometheus``)."""
    return shutil.which("promtool")


def run_promtool(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``promtool args...`` in ``prometheus/`` and return the finished process (stdout+stderr text).

    Raises
    ------
    FileNotFoundError
        If promtool is not installed (the message says how to install it).
    """
    exe = promtool_path()
    if exe is None:
        raise FileNotFoundError(
            "promtool is not installed: `apt-get install prometheus` (or `make system-deps`)"
        )
    return subprocess.run(
        [exe, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=timeout_s, check=False
    )


#: The committed unit-test files and the rule file each one tests.
PROMTOOL_TESTS: dict[str, str] = {
    "alerts_test.yml": "alerts.yml",
    "source004_alerts_test.yml": "source004_alerts.yml",
}


def write_promtool_tests(folder: str | Path | None = None) -> dict[str, Path]:
    """(Re)write ``prometheus/tests/*.yml`` from ``simulate_incident()``, asserting every evaluation (15 s).

    Returns
    -------
    dict of test-file name -> path written.
    """
    out_dir = Path(folder) if folder is not None else PROMETHEUS_DIR / "tests"
    out_dir.mkdir(parents=True, exist_ok=True)
    incident = simulate_incident()
    check = np.arange(0, incident.times_s[-1] + 1, SCRAPE_INTERVAL_S)
    written = {}
    for test_name, rule_file in PROMTOOL_TESTS.items():
        path = out_dir / test_name
        atomic_write_text(path, promtool_test_file(incident, rule_file, check))
        written[test_name] = path
    return written


#: promtool's answer to ``promtool_report()``'s commands, recorded on a machine that has it.
PROMTOOL_OUTPUT = PROMETHEUS_DIR / "tests" / "promtool_output.txt"


def promtool_report() -> tuple[bool, str]:
    """``promtool check rules`` and ``promtool test rules`` on the committed files, or the stored answer.

    Returns
    -------
    (ran, text)
        ``ran`` is True when promtool ran here (``text`` is its output, with the exit codes); False
        when it is not installed, in which case ``text`` is the output recorded in
        ``prometheus/tests/promtool_output.txt``.
    """
    if promtool_path() is None:
        return False, PROMTOOL_OUTPUT.read_text()
    parts = []
    for args in (
        ("check", "rules", *sorted({r.file for r in RULES})),
        ("test", "rules", *(f"tests/{name}" for name in PROMTOOL_TESTS)),
    ):
        result = run_promtool(*args)
        parts.append(
            f"$ promtool {' '.join(args)}\n{result.stdout}{result.stderr}(exit code {result.returncode})\n"
        )
    return True, "\n".join(parts)
