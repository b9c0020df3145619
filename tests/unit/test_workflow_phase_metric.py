"""compass_workflow_phase: the phase of every CompoundWorkflow a watch event shows, gone with it."""

from __future__ import annotations

from typing import Any

import kopf
from prometheus_client import generate_latest

from compass.controllers.runtime import RUNTIME_KEY, Runtime
from compass.controllers.workflow_handlers import forget_deleted_workflow


def phases(runtime: Runtime) -> dict[tuple[str, str], str]:
    """{(namespace, workflow): the phase whose series is 1}, from what a scrape reads."""
    found = {}
    for line in generate_latest(runtime.metrics.registry).decode().splitlines():
        if line.startswith("compass_workflow_phase{") and line.endswith(" 1.0"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            found[labels["namespace"].strip('"'), labels["workflow"].strip('"')] = labels[
                "phase"
            ].strip('"')
    return found


def event(runtime: Runtime, kind: str | None, name: str, status: dict[str, Any]) -> None:
    """One watch event of workflow ml/NAME (kind None: the listing at start-up)."""
    body = {"metadata": {"namespace": "ml", "name": name, "uid": f"uid-{name}"}, "status": status}
    forget_deleted_workflow(
        type=kind,  # type: ignore[arg-type]
        namespace="ml",
        name=name,
        uid=f"uid-{name}",
        body=kopf.Body(body),  # type: ignore[arg-type]
        memo=kopf.Memo({RUNTIME_KEY: runtime}),
    )


def test_each_event_exports_the_phase_and_a_delete_removes_it() -> None:
    """The listing at start-up, every change, a status without a phase (Pending); then deleted."""
    runtime = Runtime()
    event(runtime, None, "failed", {"phase": "Failed"})
    event(runtime, "ADDED", "new", {})
    assert phases(runtime) == {("ml", "failed"): "Failed", ("ml", "new"): "Pending"}
    event(runtime, "MODIFIED", "new", {"phase": "Searching"})
    assert phases(runtime)["ml", "new"] == "Searching"
    event(runtime, "DELETED", "failed", {"phase": "Failed"})
    assert phases(runtime) == {("ml", "new"): "Searching"}
    text = generate_latest(runtime.metrics.registry).decode()
    assert 'workflow="failed"' not in text
    # One series a phase for the live workflow: 1 for its own, 0 for the six others.
    assert text.count('compass_workflow_phase{namespace="ml",phase=') == 7


def test_an_event_in_flight_after_the_delete_sets_nothing() -> None:
    """A MODIFIED handled after the DELETED (kopf's queue) does not bring the series back."""
    runtime = Runtime()
    event(runtime, "DELETED", "w", {"phase": "Ready"})
    event(runtime, "MODIFIED", "w", {"phase": "Ready"})
    assert phases(runtime) == {}
