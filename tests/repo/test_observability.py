"""docs/observability.md is generated, current and complete: every metric the operator defines,
every Event reason it posts and every condition reason it sets is in it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from prometheus_client import generate_latest

from compass.controllers.runtime import OperatorMetrics
from compass_dev.catalogue import CONDITIONS, EVENTS

REPO = Path(__file__).resolve().parents[2]
CONTROLLERS = REPO / "operator" / "compass" / "controllers"
DOC = REPO / "docs" / "observability.md"


def test_the_checked_in_doc_is_current() -> None:
    """`hack/gen_observability.py --check` as CI would run it: exit 0 (1 names the fix)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "gen_observability.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_check_fails_on_a_stale_doc(tmp_path: Path) -> None:
    """--check compares, and says what to run; it does not rewrite."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", REPO / "hack" / "gen_observability.py")
    assert spec is not None
    assert spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    stale = tmp_path / "observability.md"
    stale.write_text("old\n", encoding="utf-8")
    gen.OUTPUT = stale
    gen.REPO_ROOT = tmp_path
    assert gen.main(["--check"]) == 1
    assert stale.read_text(encoding="utf-8") == "old\n"
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0


def test_every_exported_metric_is_in_the_doc() -> None:
    text = DOC.read_text(encoding="utf-8")
    families = OperatorMetrics().registry.collect()
    names = {f.name + "_total" if f.type == "counter" else f.name for f in families}
    assert len(names) >= 20
    for name in names:
        assert f"| `{name}` |" in text, name
    assert generate_latest(OperatorMetrics().registry)  # the definitions export cleanly


def _sources() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(CONTROLLERS.glob("*.py")))


def test_every_event_reason_the_controllers_post_is_catalogued() -> None:
    posted = set(re.findall(r'Event\(\s*"(?:Normal|Warning)",\s*"([A-Za-z]+)"', _sources()))
    # Reasons posted from a condition's reason (policy Ready, workflow SpecValid/PolicyReady).
    posted |= {"TritonUnreachable", "SwitchFailed", "InvalidSpec", "TargetNotAllowed"}
    # Posted from a name bound to the reason (the pause annotation's Warning).
    posted |= set(re.findall(r'^\s*invalid = "([A-Za-z]+)"', _sources(), re.MULTILINE))
    assert "InvalidPauseAnnotation" in posted
    assert len(posted) >= 18
    catalogued = {e.reason for e in EVENTS}
    assert posted <= catalogued, posted - catalogued


def test_every_literal_condition_reason_is_catalogued() -> None:
    source = _sources()
    literal = set(
        re.findall(r'ConditionType\.[A-Z_]+,\s*"(?:True|False|Unknown)",\s*"([A-Za-z]+)"', source)
    )
    literal |= set(re.findall(r'reason="([A-Za-z]+)"', source))
    # reason="A" if ... else "B", and the per-role outputs (KEY, ConditionType.X, "Reason", ...)
    literal |= set(re.findall(r'reason="[A-Za-z]+" if [^\n]+ else "([A-Za-z]+)"', source))
    literal |= set(re.findall(r'ConditionType\.[A-Z_]+, "([A-Za-z]+)"', source))
    literal |= set(re.findall(r'PlanOutcome\([^\n]*"([A-Z][A-Za-z]+)"\)', source))
    # A module's named reason constant (metricsauth.REASON).
    literal |= set(re.findall(r'^REASON = "([A-Za-z]+)"', source, re.MULTILINE))
    literal |= set(re.findall(r'^AWAITING_REVIEW = "([A-Za-z]+)"', source, re.MULTILINE))
    # The pause's reasons: Pause(paused, "Reason", ...), over lines.
    literal |= set(re.findall(r'Pause\(\s*(?:True|False),\s*"([A-Za-z]+)"', source))
    literal -= {"True", "False", "Unknown"}  # a status, which the ConditionType pattern catches
    expected = {"Serving", "Paused", "MetricsRead", "AsPlanned", "FeasibleFound", "NoResult"}
    assert expected | {"MetricsCredentialsUnavailable", "AwaitingReview"} <= literal
    assert {"PausedByAnnotation", "InvalidPauseAnnotation"} <= literal
    catalogued = {c.reason for c in CONDITIONS}
    assert literal <= catalogued, literal - catalogued
