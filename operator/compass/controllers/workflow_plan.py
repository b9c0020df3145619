"""The workflow's ParetoPolicy: planned from the profiles, then applied server-side."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.meta import GROUP, POLICY_PLURAL
from compass.api.metricsource import MetricsSource, MetricsSourceType
from compass.api.routing import RoutingTarget
from compass.controllers.builders import FIELD_MANAGER, PROFILES_KEY, WORKFLOW_LABEL, controller_uid
from compass.conversion import spec_for_plan
from compass.domain.capacity import MIN_LATENCY_MS
from compass.domain.planner import PlanError, Slo, Threshold, ThresholdModel, plan_from_profiles
from compass.domain.profiles import ProfileError, parse_profiles

# ---------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class PlanOutcome:
    """A ParetoPolicy spec (camelCase, ready to apply) and a summary, or why there is none."""

    policy_spec: dict[str, Any] | None
    message: str
    reason: str


def plan_policy(
    spec: CompoundWorkflowSpec,
    profiles_text: str,
    routing: RoutingTarget,
    metrics_url: str,
) -> PlanOutcome:
    """Plan the measured profiles against the spec's SLO into a ParetoPolicy spec."""
    try:
        profiles = parse_profiles(json.loads(profiles_text), PROFILES_KEY)
    except (ValueError, ProfileError) as error:
        return PlanOutcome(None, f"{PROFILES_KEY}: {error}", "InvalidProfiles")
    try:
        plan = plan_from_profiles(
            profiles,
            Slo(spec.slo.latency_ms, spec.slo.percentile),
            spec.serving.hysteresis.slack_buffer_ms,
            spec.serving.threshold_model,
            spec.serving.switch_delay_ms,
            spec.serving.router_instances,
        )
    except PlanError as error:
        return PlanOutcome(None, f"spec.{error.field}: {error.what}; {error.fix}", "SloUnreachable")
    policy = spec_for_plan(
        plan,
        serving=spec.serving,
        routing=routing,
        # Without a source, Triton's own /metrics: every pod's (a Service) or the address's.
        metrics=spec.serving.metrics
        or (
            None
            if routing.service
            else MetricsSource(type=MetricsSourceType.TRITON, url=metrics_url)
        ),
    )
    front = plan.thresholds
    fastest, accurate = front[0].profile, front[-1].profile
    message = (
        f"{len(front)} configurations on the front ({len(plan.eligible)} within the SLO "
        f"{spec.slo.latency_ms:g} ms at p{spec.slo.percentile:g}): fastest {fastest.name} "
        f"(p{spec.slo.percentile:g} {front[0].tail_ms:.1f} ms), most accurate {accurate.name} "
        f"(accuracy {accurate.accuracy:.3f})"
    )
    loose = loose_curves(plan.thresholds, spec)
    if loose:
        message += (
            f"; warning: {'; '.join(loose)}: below its lowest rate the rate limit is a line "
            "from the idle latency and may be overstated; re-profile (change spec.profiling, "
            "e.g. curveMaxPoints, so a new generation measures the curves for this SLO)"
        )
    return PlanOutcome(
        policy.model_dump(mode="json", by_alias=True, exclude_none=True), message, ""
    )


def ladder_budget_ms(spec: CompoundWorkflowSpec) -> float:
    """The tightest latency budget read off a capacity curve: the SLO less the slack buffer."""
    return max(spec.slo.latency_ms - spec.serving.hysteresis.slack_buffer_ms, MIN_LATENCY_MS)


def loose_curves(thresholds: Sequence[Threshold], spec: CompoundWorkflowSpec) -> list[str]:
    """The eligible members whose curve was measured for a looser budget than the plan reads."""
    if spec.serving.threshold_model is not ThresholdModel.MEASURED:
        return []
    budget = ladder_budget_ms(spec)
    found = []
    for threshold in thresholds:
        profile, curve = threshold.profile, threshold.profile.capacity
        if not threshold.eligible or curve is None or curve.slo_ms is None:
            continue
        if not curve.low_end_resolved(
            budget, spec.slo.percentile, profile.mean_ms, profile.latency_at(95.0)
        ):
            found.append(
                f"{profile.name}'s capacity curve was measured for {curve.slo_ms:g} ms, the "
                f"plan reads it at {budget:g} ms (SLO {spec.slo.latency_ms:g} ms less the "
                f"slack buffer)"
            )
    return found


# ---------------------------------------------------------------------------- applying it


def review_command(workflow: str, namespace: str) -> str:
    """The command that applies a workflow's plan held for review."""
    where = f" -n {namespace}" if namespace else ""
    return (
        f"kubectl get compoundworkflow {workflow}{where} -o jsonpath='{{.status.plannedPolicy}}' "
        "| kubectl apply -f -"
    )


class PolicyAction(StrEnum):
    """What to do with the workflow's ParetoPolicy."""

    APPLY = "apply"  # server-side apply the planned fields (creates it if missing)
    BLOCKED = "blocked"  # cannot be written yet: reason and message say why


# The field manager the kubernetes client writes under when none is named (its User-Agent):
# operators before server-side apply created and replaced the generated policy through it.
LEGACY_MANAGER = "OpenAPI-Generator"


@dataclass(frozen=True)
class PolicyApply:
    """The action on the ParetoPolicy: the body (after the ``adopt`` JSON patch), or why not."""

    action: PolicyAction
    body: dict[str, Any] | None = None
    adopt: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    message: str = ""


def decide_policy_apply(
    existing: Mapping[str, Any] | None, wanted: Mapping[str, Any], owner_uid: str
) -> PolicyApply:
    """Apply the planned fields (first taking over what older operators wrote through PUT), or stay
    blocked by one of that name it may not take; one with no controller and this workflow's label
    is taken (applied from its plan held for review, spec.autoApply turned true)."""
    name = wanted["metadata"]["name"]
    if existing is not None and controller_uid(existing) != owner_uid:
        labels = (existing.get("metadata") or {}).get("labels") or {}
        workflow = wanted["metadata"]["labels"][WORKFLOW_LABEL]
        if controller_uid(existing) is not None or labels.get(WORKFLOW_LABEL) != workflow:
            return PolicyApply(
                PolicyAction.BLOCKED,
                reason="PolicyConflict",
                message=f"ParetoPolicy {name} exists and is not owned by this workflow; delete "
                f"it or rename the workflow",
            )
    adopt = [] if existing is None else adoption_patch(existing)
    return PolicyApply(PolicyAction.APPLY, copy.deepcopy(dict(wanted)), adopt)


def adoption_patch(existing: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch handing an older operator's fields (LEGACY_MANAGER, Update) to FIELD_MANAGER's
    apply, so a field the plan drops is removed; it tests the resourceVersion. Empty: nothing."""
    metadata = existing.get("metadata") or {}
    entries = list(metadata.get("managedFields") or [])
    if any(entry.get("manager") == FIELD_MANAGER for entry in entries):
        return []
    rewritten, taken = [], False
    for entry in entries:
        fields = entry.get("fieldsV1") or {}
        legacy = entry.get("manager") == LEGACY_MANAGER and entry.get("operation") == "Update"
        if not (legacy and "f:spec" in fields):
            rewritten.append(entry)
            continue
        taken = True
        owned = {k: v for k, v in fields.items() if k != "f:status"}
        rewritten.append(
            {**entry, "manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": owned}
        )
        if "f:status" in fields:
            rewritten.append({**entry, "fieldsV1": {"f:status": fields["f:status"]}})
    if not taken:
        return []
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": metadata["resourceVersion"]},
        {"op": "replace", "path": "/metadata/managedFields", "value": rewritten},
    ]


def policy_crd_missing() -> PolicyApply:
    """Blocked: the API server does not serve ParetoPolicies (its create answered 404)."""
    return PolicyApply(
        PolicyAction.BLOCKED,
        reason="PolicyCrdMissing",
        message=f"the API server does not serve {POLICY_PLURAL}.{GROUP}: install the "
        f"ParetoPolicy CRD (crds/); the plan is kept and applied once it is there",
    )
