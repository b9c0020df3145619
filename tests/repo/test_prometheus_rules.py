"""The chart's PrometheusRule: rendered by Helm, checked and unit-tested by promtool.

promtool ships in Debian's prometheus package (hack/lib/system.sh installs it); without it these
tests skip, or fail under COMPASS_REQUIRE_TIERS=1 (tests/tiers.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart_render import render

from compass.controllers.runtime import OperatorMetrics
from compass_rules.protocol import REFUSED_METRIC, SERVED_METRIC
from tiers import require_promtool

UNIT_TEST = Path(__file__).resolve().parent / "promtool" / "compass-rules.test.yaml"
ALERTS = {
    "CompassPolicyNotReady",
    "CompassPolicyMetricsLost",
    "CompassPolicyHeldAtFastest",
    "CompassCapacityPressure",
    "CompassOperatorMetricsAbsent",
    "CompassPolicyFenced",
    "CompassSchedulerBehind",
    "CompassWorkflowFailed",
    "CompassWorkflowStuck",
    "CompassRouterRefusing",
}
ROUTER = (
    Path(__file__).resolve().parents[2]
    / "model-images"
    / "router"
    / "compass_router"
    / "metrics.py"
)
TROUBLESHOOTING = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"


def _rule_object(values: dict[str, Any] | None = None) -> dict[str, Any] | None:
    objects = render({"prometheusRule": {"enabled": True, **(values or {})}})
    found = [o for o in objects if o["kind"] == "PrometheusRule"]
    return found[0] if found else None


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    require_promtool()
    return subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60
    )


def test_no_rule_unless_enabled() -> None:
    assert not [o for o in render() if o["kind"] == "PrometheusRule"]


def _router_counters() -> set[str]:
    """The series the Triton router exports (compass_router.metrics registers the protocol's
    SERVED_METRIC and REFUSED_METRIC)."""
    registered = ROUTER.read_text()
    names = {"SERVED_METRIC": SERVED_METRIC, "REFUSED_METRIC": REFUSED_METRIC}
    return {value for name, value in names.items() if re.search(rf"^\s+{name},$", registered, re.M)}


def test_the_rules_name_only_metrics_that_are_exported() -> None:
    """Every compass_* series an alert reads is the operator's (a counter with _total, a
    histogram's parts) or the router's counters."""
    rule = _rule_object()
    assert rule is not None
    rules = rule["spec"]["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == ALERTS
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    exported = {
        family.name + suffix
        for family in OperatorMetrics().registry.collect()
        for suffix in ("", *suffixes.get(family.type, ()))
    } | _router_counters()
    assert {"compass_router_served_total", "compass_router_refused_total"} <= exported
    for r in rules:
        named = set(re.findall(r"\bcompass_\w+", r["expr"]))
        assert named, r["expr"]
        assert named <= exported, f"{r['alert']} reads {named - exported}, which nothing exports"


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a document's headings (lower case, spaces to -, punctuation dropped)."""
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", markdown, re.M)
    }


def test_every_alert_links_its_runbook() -> None:
    """Each alert's runbook_url is docs/troubleshooting.md at a heading that exists there."""
    rule = _rule_object()
    assert rule is not None
    anchors = _anchors(TROUBLESHOOTING.read_text())
    for r in rule["spec"]["groups"][0]["rules"]:
        url = r["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base.endswith("/docs/troubleshooting.md"), url
        assert anchor == r["alert"].lower(), url
        assert anchor in anchors, f"docs/troubleshooting.md has no heading for {r['alert']}"


def test_promtool_checks_and_unit_tests_the_rendered_rules(tmp_path: Path) -> None:
    """`promtool check rules` on what Helm renders, then `promtool test rules` with synthetic
    series: each alert fires after its minutes, not before, and stops with its cause."""
    rule = _rule_object()
    assert rule is not None
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    checked = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout
    shutil.copy(UNIT_TEST, tmp_path / UNIT_TEST.name)
    tested = _promtool("test", "rules", UNIT_TEST.name, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_minutes_come_from_the_values(tmp_path: Path) -> None:
    """A shorter notReadyMinutes makes the unit test's expectations wrong: promtool says so (the
    test file really pins the values)."""
    rule = _rule_object({"notReadyMinutes": 1, "severity": "page", "labels": {"release": "kp"}})
    assert rule is not None
    assert rule["metadata"]["labels"]["release"] == "kp"
    first = rule["spec"]["groups"][0]["rules"][0]
    assert (first["for"], first["labels"]["severity"]) == ("1m", "page")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    shutil.copy(UNIT_TEST, tmp_path / UNIT_TEST.name)
    tested = _promtool("test", "rules", UNIT_TEST.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "CompassPolicyNotReady" in tested.stdout + tested.stderr


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"notReadyMinutes": 0}, "/prometheusRule/notReadyMinutes"),
        ({"severity": ""}, "/prometheusRule/severity"),
        ({"forMinutes": 3}, "/prometheusRule"),
    ],
)
def test_bad_rule_values_are_refused_naming_the_key(values: dict[str, Any], path: str) -> None:
    with pytest.raises(Exception, match=path):
        _rule_object(values)
