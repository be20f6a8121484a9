"""Alert rules: the real promtool checks them, and the Python timeline agrees with it everywhere."""

from __future__ import annotations

import pytest
from components import require_component

from course_lib.operate.alerting import PROMETHEUS_DIR, RULES, IncidentSpec, evaluate_rules, simulate_incident
from course_lib.operate.promtool import PROMTOOL_TESTS, promtool_path, run_promtool, write_promtool_tests


@pytest.fixture(scope="module")
def timeline():
    return evaluate_rules(simulate_incident())


def _first(timeline, alert, state):
    rows = timeline[(timeline["alert"] == alert) & (timeline["state"] == state)]
    return rows["t_s"].min() if len(rows) else None


def test_promtool_is_installed():
    require_component("promtool")
    assert promtool_path() is not None


@pytest.mark.needs("promtool")
def test_promtool_check_rules_accepts_both_rule_files():
    result = run_promtool("check", "rules", "alerts.yml", "source004_alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rules found" in result.stdout and "SUCCESS: 3 rules found" in result.stdout


@pytest.mark.needs("promtool")
def test_promtool_unit_tests_pass_on_the_replayed_incident():
    result = run_promtool("test", "rules", *(f"tests/{name}" for name in PROMTOOL_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(PROMTOOL_TESTS)


def test_committed_unit_tests_are_regenerated_identically(tmp_path):
    for name, path in write_promtool_tests(tmp_path).items():
        assert path.read_text() == (PROMETHEUS_DIR / "tests" / name).read_text(), f"regenerate {name}"


@pytest.mark.needs("promtool")
def test_promtool_catches_a_wrong_expectation(tmp_path):
    # Proof that the assertions are live: claim the latency alert is silent at 30m, promtool must object.
    text = (PROMETHEUS_DIR / "tests" / "alerts_test.yml").read_text()
    anchor = "  - eval_time: 30m\n    alertname: ChurnLatencyP95AboveSLO\n    exp_alerts:\n"
    assert anchor in text
    start = text.index(anchor) + len(anchor)
    end = text.index("  - eval_time:", start)
    broken = text[: text.index(anchor)] + anchor.replace("exp_alerts:\n", "exp_alerts: []\n") + text[end:]
    (tmp_path / "broken_test.yml").write_text(
        broken.replace("- ../alerts.yml", f"- {PROMETHEUS_DIR}/alerts.yml")
    )
    result = run_promtool("test", "rules", str(tmp_path / "broken_test.yml"))
    assert result.returncode != 0
    assert "ChurnLatencyP95AboveSLO" in result.stdout + result.stderr


def test_yaml_rules_are_the_ones_the_python_timeline_evaluates():
    import yaml

    for file in {r.file for r in RULES}:
        groups = yaml.safe_load((PROMETHEUS_DIR / file).read_text())["groups"]
        in_yaml = {r["alert"]: r for g in groups for r in g["rules"]}
        for rule in (r for r in RULES if r.file == file):
            assert " ".join(in_yaml[rule.name]["expr"].split()) == rule.expr
            minutes = int(in_yaml[rule.name]["for"].rstrip("m"))
            assert minutes * 60 == rule.for_s


def test_corrected_rules_page_for_the_incident_in_time(timeline):
    spec = IncidentSpec()
    start = spec.incident_start_min * 60
    latency_pending = _first(timeline, "ChurnLatencyP95AboveSLO", "pending")
    latency_firing = _first(timeline, "ChurnLatencyP95AboveSLO", "firing")
    errors_firing = _first(timeline, "ChurnErrorRatioHigh", "firing")
    assert start < latency_pending <= start + 60
    assert latency_firing == latency_pending + 120  # for: 2m
    assert start < errors_firing <= start + 180
    assert set(timeline[timeline["alert"].str.startswith("Churn")]["version"]) == {"v2"}
    # nothing fires before the incident, and everything resolves once v2's traffic is out of the 5m window
    corrected = timeline[timeline["alert"].str.startswith("Churn")]
    assert corrected["t_s"].min() > start
    assert corrected["t_s"].max() <= spec.rollback_min * 60 + 300


def test_source_rules_miss_the_incident(timeline):
    spec = IncidentSpec()
    assert _first(timeline, "Source004HighInferenceLatency", "firing") is None  # selects no series at all
    assert (
        _first(timeline, "Source004HighInferenceLatencyBuckets", "firing") is None
    )  # no rate(): diluted by hours
    source004_errors = _first(timeline, "Source004HighErrorRate", "firing")
    # the error "rate" rule pages on healthy traffic long before the incident: it cannot tell.
    assert source004_errors is not None and source004_errors < spec.incident_start_min * 60 / 4


def test_incident_spec_validates():
    with pytest.raises(ValueError, match="canary_share"):
        IncidentSpec(canary_share=1.5)
    with pytest.raises(ValueError, match="rollback_min"):
        IncidentSpec(incident_start_min=50, rollback_min=40)


@pytest.mark.needs("promtool")
def test_stored_promtool_output_is_what_promtool_says_now():
    from course_lib.operate.promtool import PROMTOOL_OUTPUT, promtool_report

    ran, text = promtool_report()
    assert ran and "(exit code 0)" in text and "exit code 1" not in text
    assert text == PROMTOOL_OUTPUT.read_text(), "re-record prometheus/tests/promtool_output.txt"
