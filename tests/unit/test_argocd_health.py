"""The Argo CD health checks in docs/argocd/ run (Lua 5.1, as Argo CD's gopher-lua) on statuses
built by the controllers' own functions: every phase and condition reason they can produce maps
to the health it should, and one the scripts do not know fails here first."""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import lua51
from test_workflow_logic import (
    BEST,
    FULL,
    NOW,
    PROFILES,
    WORKFLOW,
    WORSE,
    _observe,
    _raw,
    _result,
    _state,
)

from compass.api.compoundworkflow import CompoundWorkflowStatus, Phase
from compass.api.schema import without_empty_strings
from compass.controllers import (
    policy_compile,
    policy_conditions,
    policy_decisions,
    policy_status,
    workflow_plan,
    workflow_spec,
    workflow_state,
    workflow_status,
    workflow_steps,
)
from compass.controllers.builders import PROFILES_KEY, RESULT_KEY, build_pareto_policy
from compass.controllers.metricsauth import REASON as METRICS_CREDENTIALS
from compass.dataplane.triton import RouterState
from compass.domain.policy import Observation, PolicyState
from compass.domain.space import config_key

REPO = Path(__file__).resolve().parents[2]
ARGOCD = REPO / "docs" / "argocd"
WORKFLOW_LUA = ARGOCD / "compoundworkflow-health.lua"
POLICY_LUA = ARGOCD / "paretopolicy-health.lua"


def health(script: Path, obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) of the health script on an object, as Argo CD runs it: a global
    ``obj`` (numbers as Lua numbers) and a returned table."""
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = _to_lua(lua, json.loads(json.dumps(obj)))
    result = lua.execute(script.read_text(encoding="utf-8"))
    return str(result["status"]), str(result["message"] or "")


def _to_lua(lua: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def _wire(status: CompoundWorkflowStatus) -> dict[str, Any]:
    """The status as the workflow controller writes it."""
    return dict(without_empty_strings(status.model_dump(mode="json", by_alias=True)))


def _workflow(status: CompoundWorkflowStatus | None, generation: int = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "rag", "generation": generation}}
    if status is not None:
        body["status"] = _wire(status)
    return body


def _stepped(observation: workflow_steps.GenerationObservation) -> CompoundWorkflowStatus:
    step = workflow_steps.decide(observation, NOW)
    assert step.status is not None
    return step.status


def _blocked(reason: str) -> CompoundWorkflowStatus:
    """Planning, its policy blocked for this reason, as the handler writes it."""
    apply = (
        workflow_plan.policy_crd_missing()
        if reason == "PolicyCrdMissing"
        else workflow_plan.decide_policy_apply(
            {"metadata": {"name": "rag", "ownerReferences": []}},
            build_pareto_policy(WORKFLOW, 1, {}),
            "uid-1",
        )
    )
    assert apply.reason == reason
    status, _ = workflow_steps.policy_blocked(
        _observe(Phase.PLANNING, {}), apply.reason, apply.message, NOW
    )
    return status


def _workflow_statuses() -> dict[str, tuple[CompoundWorkflowStatus | None, str]]:
    """Every phase the controller writes (and the cases within a phase that differ), built by
    its functions, with the health each must have."""
    spec, space = workflow_spec.validate_spec(_raw())
    fresh, _ = workflow_status.start_status(
        CompoundWorkflowStatus(), "rag", 1, spec, space, {}, NOW
    )
    seed = workflow_state.seed_state(spec, 2, {1: _state(spec, **FULL)})
    replanning, _ = workflow_status.start_status(
        CompoundWorkflowStatus(), "rag", 1, spec, space, seed, NOW
    )
    searched = {RESULT_KEY: _result([BEST], [BEST, WORSE])}
    done = workflow_steps.JobView("rag-search-g1", complete=True)
    profiled = {RESULT_KEY: _result([BEST], [BEST]), PROFILES_KEY: PROFILES}
    profile_done = workflow_steps.JobView("rag-profile-g1", complete=True)
    planning = _observe(Phase.PROFILING, profiled, profile=profile_done)
    review = dataclasses.replace(
        planning, spec=planning.spec.model_copy(update={"auto_apply": False})
    )
    failed_job = workflow_steps.JobView(
        "rag-search-g1", failed=2, failed_final=True, reason="Backoff"
    )
    invalid = workflow_status.invalid_status(
        CompoundWorkflowStatus(), 1, workflow_spec.InvalidSpecError("spec.slo", "bad"), NOW
    )
    return {
        "pending": (CompoundWorkflowStatus(), "Progressing"),
        "searching": (fresh, "Progressing"),
        "profiling": (_stepped(_observe(Phase.SEARCHING, searched, search=done)), "Progressing"),
        "planning": (replanning, "Progressing"),
        "planning-conflict": (_blocked("PolicyConflict"), "Degraded"),
        "planning-crd-missing": (_blocked("PolicyCrdMissing"), "Degraded"),
        "ready": (_stepped(planning), "Healthy"),
        "planned": (_stepped(review), "Suspended"),
        "failed-invalid-spec": (invalid, "Degraded"),
        "failed-search": (
            _stepped(_observe(Phase.SEARCHING, {}, search=failed_job)),
            "Degraded",
        ),
        "failed-feasible-set-empty": (
            _stepped(_observe(Phase.SEARCHING, {RESULT_KEY: _result([], [WORSE])}, search=done)),
            "Degraded",
        ),
    }


WORKFLOW_CASES = _workflow_statuses()


@pytest.mark.parametrize("case", list(WORKFLOW_CASES))
def test_workflow_health_of_each_status_the_controller_writes(case: str) -> None:
    status, expected = WORKFLOW_CASES[case]
    found, message = health(WORKFLOW_LUA, _workflow(status))
    assert found == expected, message
    assert status is not None
    assert message.startswith(status.phase.value)


def test_every_workflow_phase_is_built_above_and_known_to_the_script() -> None:
    built = {status.phase for status, _ in WORKFLOW_CASES.values() if status is not None}
    assert built == set(Phase)
    for phase in Phase:
        found, message = health(WORKFLOW_LUA, _workflow(CompoundWorkflowStatus(phase=phase)))
        assert found != "Unknown", message
    found, message = health(WORKFLOW_LUA, {"metadata": {}, "status": {"phase": "Exploding"}})
    assert (found, message) == (
        "Unknown",
        "phase Exploding is unknown to this health check: update it (docs/argocd/)",
    )


def test_every_blocked_policy_reason_is_degraded_in_the_script() -> None:
    """The reasons a plan cannot be written (PolicyApply BLOCKED in the controller) are those
    the script treats as waiting for a person."""
    tree = ast.parse(Path(workflow_plan.__file__).read_text(encoding="utf-8"))
    reasons = {
        keyword.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "PolicyApply"
        and node.args
        and getattr(node.args[0], "attr", None) == "BLOCKED"
        for keyword in node.keywords
        if keyword.arg == "reason" and isinstance(keyword.value, ast.Constant)
    }
    assert reasons == {"PolicyConflict", "PolicyCrdMissing"}
    for reason in reasons:
        assert health(WORKFLOW_LUA, _workflow(_blocked(reason)))[0] == "Degraded"


def test_workflow_without_status_or_of_a_newer_generation_is_progressing() -> None:
    assert health(WORKFLOW_LUA, _workflow(None))[0] == "Progressing"
    ready, _ = WORKFLOW_CASES["ready"]
    found, message = health(WORKFLOW_LUA, _workflow(ready, generation=2))
    assert (found, message) == ("Progressing", "waiting for the operator to take generation 2")


# ---------------------------------------------------------------------------- ParetoPolicy

COMPILED = policy_compile.compile_policy(
    {
        "front": [
            {"config": {"m": "fast"}, "accuracy": 0.8, "latencyMeanMs": 20, "latencyP95Ms": 25},
            {"config": {"m": "slow"}, "accuracy": 0.9, "latencyMeanMs": 40, "latencyP95Ms": 50},
        ],
        "slo": {"latencyMs": 300},
        "routing": {"grpcEndpoint": "triton:8001"},
    },
    generation=1,
)
FAST = COMPILED.plan.names[0]
FAST_KEY = config_key(COMPILED.plan.thresholds[0].profile.config)
PAUSES = {
    "active": policy_decisions.pause_of(COMPILED.spec, {}),
    "by-spec": policy_decisions.pause_of(COMPILED.spec.model_copy(update={"paused": True}), {}),
    "by-annotation": policy_decisions.pause_of(
        COMPILED.spec, {policy_decisions.PAUSE_ANNOTATION: "true"}
    ),
    "invalid-annotation": policy_decisions.pause_of(
        COMPILED.spec, {policy_decisions.PAUSE_ANNOTATION: "on"}
    ),
}
ROUTINGS = {
    "none": None,
    "serving": policy_conditions.routing_status([("a", FAST_KEY, None)], FAST_KEY),
    "lagging": policy_conditions.routing_status(
        [("a", FAST_KEY, None), ("b", None, "refused")], FAST_KEY
    ),
}
SPEC_ERRORS = {"none": None, "InvalidSpec": "InvalidSpec", "TargetNotAllowed": "TargetNotAllowed"}
# PerRequestBinding says how the routers serve, never whether the policy is healthy: the cases
# cycle through each (the health must not change with it).
BINDINGS = (
    None,
    policy_conditions.binding_condition(
        {"a": RouterState(FAST_KEY, "d", gate=(8, 1))}, "elastico", (8, 1)
    ),
    policy_conditions.binding_condition({"a": RouterState(FAST_KEY)}, "elastico", (8, 1)),
    policy_conditions.binding_condition({}, "elastico", (8, 1), per_request=False),
)
# What the product below varies, by Health field: a new field must be added here (and to the
# script, if it brings a new reason).
VARIED = {
    "spec_error",
    "claimed_by",
    "spec_reason",
    "unreachable",
    "switch_failed",
    "metrics_error",
    "metrics_reason",
    "metrics_read",
    "metrics_source",
    "pause",
    "active",
    "decision",
    "routing",
    "binding",
    "advisory_routing",
}


def _policy_status(health_: policy_conditions.Health) -> dict[str, Any]:
    """The status as the policy controller writes it for what one tick found."""
    conditions = policy_conditions.merge_conditions(
        [], policy_conditions.health_conditions(health_), NOW, 1
    )
    if health_.spec_error is not None or health_.unreachable is not None:
        return policy_status.error_status({}, conditions, 1)
    state = PolicyState(active=FAST)
    observation = Observation(time=1.8e9, queue_depth=2.0)
    return policy_status.build_status(
        COMPILED.plan, state, observation, {}, health_.decision, conditions, 1, health_.routing
    )


def _expected(health_: policy_conditions.Health) -> str:
    """Worst first: the spec or the data path broken, a pause, pods catching up, fine."""
    if health_.spec_error is not None:
        return "Degraded"
    if health_.claimed_by or health_.unreachable or health_.switch_failed or health_.metrics_error:
        return "Degraded"
    if health_.pause.reason == "InvalidPauseAnnotation":
        return "Degraded"
    if health_.pause.paused:
        return "Suspended"
    if health_.routing is not None and health_.routing.lagging:
        return "Progressing"
    return "Healthy"


def _healths() -> list[tuple[str, policy_conditions.Health]]:
    cases = []
    product = itertools.product(
        SPEC_ERRORS.items(),
        (None, "older-policy"),
        (None, "refused"),
        (None, "switch refused"),
        (None, "metrics gone"),
        ("MetricsUnavailable", METRICS_CREDENTIALS),
        (False, True),
        PAUSES.items(),
        ROUTINGS.items(),
    )
    for (error_id, reason), claimed, unreachable, switch, metrics, metrics_reason, read, (
        pause_id,
        pause,
    ), (
        routing_id,
        routing,
    ) in product:
        health_ = policy_conditions.Health(
            spec_error=None if reason is None else f"spec.x: bad; fix ({reason})",
            spec_reason=reason or "InvalidSpec",
            claimed_by=claimed,
            unreachable=unreachable,
            switch_failed=switch,
            metrics_error=metrics,
            metrics_reason=metrics_reason,
            metrics_read=read,
            metrics_source="triton",
            pause=pause,
            active=FAST,
            decision="hold: queue 2",
            routing=routing,
            binding=BINDINGS[len(cases) % len(BINDINGS)],
            # Advisory: Healthy or worse as an acting policy would be (Ready True, Advisory).
            advisory_routing=None if len(cases) % 3 else FAST,
        )
        flags = [bool(claimed), bool(unreachable), bool(switch), bool(metrics), read]
        name = "-".join([error_id, *map(str, flags), metrics_reason, pause_id, routing_id])
        cases.append((name, health_))
    return cases


POLICY_CASES = _healths()


def test_every_health_field_is_varied() -> None:
    assert {f.name for f in dataclasses.fields(policy_conditions.Health)} == VARIED


@pytest.mark.parametrize(("name", "health_"), POLICY_CASES, ids=[n for n, _ in POLICY_CASES])
def test_policy_health_of_each_status_the_controller_writes(
    name: str, health_: policy_conditions.Health
) -> None:
    status = _policy_status(health_)
    found, message = health(POLICY_LUA, {"metadata": {"generation": 1}, "status": status})
    assert found == _expected(health_), f"{name}: {message}"


def test_policy_health_message_says_why() -> None:
    paused = policy_conditions.Health(metrics_read=True, pause=PAUSES["by-annotation"], active=FAST)
    found, message = health(
        POLICY_LUA, {"metadata": {"generation": 1}, "status": _policy_status(paused)}
    )
    assert (found, message) == ("Suspended", f"annotation compass.io/paused: holding {FAST}")
    down = policy_conditions.Health(unreachable="connection refused", active=FAST)
    found, message = health(
        POLICY_LUA, {"metadata": {"generation": 1}, "status": _policy_status(down)}
    )
    assert (found, message) == ("Degraded", "connection refused; holding, retrying")


def test_policy_before_its_first_decision_or_of_a_newer_generation_is_progressing() -> None:
    assert health(POLICY_LUA, {"metadata": {"generation": 1}})[0] == "Progressing"
    serving = _policy_status(policy_conditions.Health(metrics_read=True, active=FAST))
    assert health(POLICY_LUA, {"metadata": {"generation": 2}, "status": serving})[0] == (
        "Progressing"
    )


def test_a_policy_reason_unknown_to_the_script_is_unknown_not_healthy() -> None:
    status = _policy_status(policy_conditions.Health(metrics_read=True, active=FAST))
    for condition in status["conditions"]:
        if condition["type"] == "Paused":
            condition["reason"] = "PausedByMoonPhase"
    found, message = health(POLICY_LUA, {"metadata": {"generation": 1}, "status": status})
    assert (found, message) == (
        "Unknown",
        "Paused reason PausedByMoonPhase is unknown to this health check: update it (docs/argocd/)",
    )


def test_the_argocd_cm_snippet_carries_the_scripts_verbatim() -> None:
    config = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text(encoding="utf-8"))
    data = config["data"]
    assert data["resource.customizations.health.compass.io_CompoundWorkflow"] == (
        WORKFLOW_LUA.read_text(encoding="utf-8")
    )
    assert data["resource.customizations.health.compass.io_ParetoPolicy"] == (
        POLICY_LUA.read_text(encoding="utf-8")
    )
