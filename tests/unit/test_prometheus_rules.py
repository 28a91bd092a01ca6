"""deploy/prometheus/rules.yml: valid for Prometheus (`promtool check rules`), every alert
firing on a failing federation's series and silent on a healthy one (`promtool test rules
deploy/prometheus/tests.yml`, Debian's `prometheus` package: a skip without it, a failure under
CI=true), each alert with a severity, a summary, a description and a runbook section of
docs/troubleshooting.md that exists. A real Prometheus runs them against real routers and a
broker in tests/integration/test_prometheus.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.integration.prometheus import RULES, binary, rule_requirements, rules_doc

ROOT = Path(__file__).resolve().parents[2]
TESTS = RULES.with_name("tests.yml")
RUNBOOK = ROOT / "docs" / "troubleshooting.md"


def _alerts() -> list[dict[str, Any]]:
    return [rule for group in rules_doc()["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules_doc()['groups'][0]['rules']) + len(_alerts())} rules" in (
        done.stdout + done.stderr
    )


def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run(
        [binary("promtool"), "test", "rules", str(TESTS)],
        capture_output=True, text=True, timeout=120, cwd=TESTS.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_silent() -> None:
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - fires == set(), "alerts never shown firing"
    assert names - silent == set(), "alerts never shown silent on healthy series"


def _anchors(markdown: str) -> set[str]:
    """The ids MkDocs gives the headings (their text, lower case; our headings are one word)."""
    return {m.group(1).strip().lower() for m in re.finditer(r"^#{2,4} (\S+)\s*$", markdown, re.M)}


def test_every_alert_has_labels_annotations_and_a_runbook_section() -> None:
    anchors = _anchors(RUNBOOK.read_text())
    for alert in _alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        notes = alert["annotations"]
        assert notes["summary"] and notes["description"], name
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "docs/troubleshooting.md", name
        assert anchor == name.lower() and anchor in anchors, f"{name}: no section #{anchor}"


def test_every_rule_metric_is_a_scoperouter_metric_of_the_contract() -> None:
    """The metric names the rules use: the router's and the broker's (docs/router/metrics.md,
    docs/broker/operator-commands.md); a typo here would otherwise only show on a live
    Prometheus."""
    known = {
        "scoperouter_requests_total",
        "scoperouter_request_duration_seconds_bucket",
        "scoperouter_upstream_up",
        "scoperouter_worker_restarts_total",
        "scoperouter_breaker_open",
        "scoperouter_certificate_expiry_timestamp_seconds",
        "scoperouter_config_reloads_total",
        "scoperouter_config_info",
        "scoperouter_broker_operations_total",
        "scoperouter_broker_operations_stuck",
        "scoperouter_broker_database_up",
    }
    assert set(rule_requirements(rules_doc())) == known
    needs = rule_requirements(rules_doc())
    assert needs["scoperouter_upstream_up"] == {
        "kind", "job", "instance", "source_cloud", "cloud", "upstream"
    }  # fmt: skip
    assert needs["scoperouter_request_duration_seconds_bucket"] == {
        "source_cloud", "decision", "le"
    }  # fmt: skip
