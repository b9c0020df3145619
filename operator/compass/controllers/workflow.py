"""The CompoundWorkflow controller's decisions: pure functions from what is observed to what next.

No I/O here: compass.controllers.workflow_handlers reads the workflow, its state ConfigMap, its Jobs and their
pods, calls these functions, and writes back what they return. Everything a decision needs lives
in the cluster (the workflow's status, the state ConfigMap, the Jobs), so a restarted operator
decides exactly as the one before it would have.

The life of one spec generation::

    Searching --result.json--> Profiling --profiles.json--> (plan) Ready
        |  no feasible configuration -> Failed (FeasibleSetEmpty)
        |  Job failed (after its backoffLimit) -> Failed (the pod's message)
    Planning: the profiles were carried over from an earlier generation (only the SLO changed)
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, NoReturn

from pydantic import ValidationError

from compass.api.compoundworkflow import (
    CompoundWorkflowSpec,
    CompoundWorkflowStatus,
    EvaluatorType,
    Phase,
    WorkflowConditionType,
)
from compass.api.conditions import (
    Condition,
    find_condition,
    one_line,
    set_condition,
    set_conditions,
)
from compass.api.errors import field_path, first_error
from compass.api.meta import GROUP, POLICY_PLURAL
from compass.api.metricsource import MetricsSource, MetricsSourceType
from compass.api.paretopolicy import RoutingTarget
from compass.controllers.builders import (
    CURVE_PROGRESS_KEY,
    FIELD_MANAGER,
    LEDGER_KEY,
    PROFILES_KEY,
    PROGRESS_KEY,
    RESULT_KEY,
    SEED_KEY,
    SPEC_KEY,
    WORKFLOW_LABEL,
    controller_uid,
    planned_policy,
    policy_name,
    profile_name,
    search_name,
)
from compass.controllers.ledgerchunks import CHUNK_OF_LABEL, ledger_text
from compass.controllers.targets import (
    TargetAccess,
    TargetRefusedError,
    resolve_host,
    resolve_url,
)
from compass.conversion import spec_for_plan
from compass.domain.planner import PlanError, Slo, ThresholdModel, plan_from_profiles
from compass.domain.profiles import ProfileError, parse_profiles
from compass.domain.space import Space, SpaceError
from compass.domain.statistics import IntervalMethod, describe_schedule

ACTIVE_PHASES = frozenset({Phase.SEARCHING, Phase.PROFILING, Phase.PLANNING})
# Ready's and PolicyReady's reason while a plan waits for review (spec.autoApply false).
AWAITING_REVIEW = "AwaitingReview"


class InvalidSpecError(ValueError):
    """A spec that can never work (``reason`` InvalidSpec), or one naming a target the
    operator's settings refuse (TargetNotAllowed): one line, `<field>: <what is wrong and the
    fix>`."""

    def __init__(self, field: str, what: str, reason: str = "InvalidSpec") -> None:
        super().__init__(f"{field}: {what}")
        self.field, self.what, self.reason = field, what, reason


# ---------------------------------------------------------------------------- validation


def validate_spec(raw: Mapping[str, Any]) -> tuple[CompoundWorkflowSpec, Space]:
    """The spec and its space, or InvalidSpecError naming the first bad field and the fix.

    The API server has already checked the schema (types, ranges, enums); what is left is what
    the schema cannot say: constraints naming known parameters, budgets within the dataset, a
    space that is not empty.
    """
    spec = parse_spec(raw)
    try:
        space = Space(spec.space)
    except SpaceError as error:
        raise InvalidSpecError("spec.space", str(error)) from None
    return spec, space


def parse_spec(raw: Mapping[str, Any]) -> CompoundWorkflowSpec:
    """The spec without enumerating its space; InvalidSpecError naming the field and the fix."""
    try:
        spec = CompoundWorkflowSpec.model_validate(dict(raw))
    except ValidationError as error:
        loc, what = first_error(error)
        constraint = re.match(r"^constraint '(.*?)': (.*)$", what)
        space = raw.get("space")
        listed = space.get("constraints") if isinstance(space, Mapping) else None
        constraints = list(listed) if isinstance(listed, list) else []
        if constraint and constraint.group(1) in constraints:
            index = constraints.index(constraint.group(1))
            return _raise(f"spec.space.constraints[{index}]", constraint.group(0))
        return _raise(field_path(loc, "spec"), what)
    return spec


def _raise(field: str, what: str) -> NoReturn:
    raise InvalidSpecError(field, what)


def authorize_targets(spec: CompoundWorkflowSpec, namespace: str, access: TargetAccess) -> None:
    """InvalidSpecError (TargetNotAllowed) naming the field when the workflow's Triton, whose
    router its policy switches, or its metrics URL is not one the operator's settings allow."""
    triton = spec.triton
    try:
        if triton.namespace not in (None, namespace) and not access.namespace_allowed(
            triton.namespace, namespace
        ):
            raise TargetRefusedError(
                "triton.namespace",
                f"{triton.namespace} is not the workflow's namespace ({namespace}), and a "
                "workflow may only switch routers in its own",
                "serve the workflow from a Triton of this namespace, or ask the operator's "
                f"administrator to add {triton.namespace} to allowedTargetNamespaces (Helm value)",
            )
        if "." in triton.service:  # a host: NAME.NAMESPACE.svc, or one outside the cluster
            resolve_host(triton.service, "triton.service", namespace, access, router=True)
        metrics = spec.serving.metrics
        if metrics is not None and metrics.url:
            resolve_url(metrics.url, "serving.metrics.url", namespace, access)
    except TargetRefusedError as error:
        raise InvalidSpecError(
            f"spec.{error.field}", f"{error.what}; {error.fix}", "TargetNotAllowed"
        ) from error


def image_allowed(image: str, own: str, allowed: Sequence[str]) -> bool:
    """Whether a Job may run this image: the operator's own, one listed, or one under a listed
    prefix ending in '*' (registry.example.com/team/*); '*' alone allows any."""
    return image == own or any(
        image == pattern or (pattern.endswith("*") and image.startswith(pattern[:-1]))
        for pattern in allowed
    )


def authorize_images(spec: CompoundWorkflowSpec, own: str, allowed: Sequence[str]) -> None:
    """InvalidSpecError (ImageNotAllowed) naming the field when a Job would run an image the
    operator's settings do not allow: the Jobs hold a ServiceAccount that writes their state,
    so who may write a workflow must not also pick the code that runs with it."""
    for name, image in (
        ("search.image", spec.search.image),
        ("profiling.image", spec.profiling.image),
    ):
        if image and not image_allowed(image, own, allowed):
            raise InvalidSpecError(
                f"spec.{name}",
                f"{image} is not an image the operator's settings allow for Jobs (its own, "
                f"{own}, and allowedJobImages); leave {name} out to use the operator's image, or "
                "ask the operator's administrator to add it to allowedJobImages (Helm value)",
                "ImageNotAllowed",
            )


# ---------------------------------------------------------------------------- carrying state over


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def scoring_key(spec: CompoundWorkflowSpec) -> str:
    """What a recorded score depends on: the dataset and who scores."""
    evaluation = spec.evaluation.model_dump(mode="json", by_alias=True)
    parts: dict[str, Any] = {k: evaluation[k] for k in ("dataset", "evaluator")}
    if spec.evaluation.evaluator.type is EvaluatorType.TRITON:
        parts["triton"] = spec.triton.model_dump(mode="json", by_alias=True)
    return _digest(parts)


def search_key(spec: CompoundWorkflowSpec) -> str:
    """What a search result depends on: the scores, the space and the search settings."""
    return _digest(
        {
            "scoring": scoring_key(spec),
            "space": spec.space.model_dump(mode="json"),
            "evaluation": spec.evaluation.model_dump(mode="json", by_alias=True),
        }
    )


def profile_key(spec: CompoundWorkflowSpec) -> str:
    """What profiles depend on: the configurations profiled, where and how (with the measured
    model, the capacity curves too: the front they are measured for, and at what concurrency)."""
    inputs: dict[str, Any] = {
        "search": search_key(spec),
        "profiling": spec.profiling.model_dump(mode="json", by_alias=True),
        "triton": spec.triton.model_dump(mode="json", by_alias=True),
    }
    if spec.serving.threshold_model is ThresholdModel.MEASURED:
        inputs["curves"] = [spec.serving.router_instances, spec.slo.percentile]
    return _digest(inputs)


@dataclass(frozen=True)
class StoredState:
    """One generation's state: its data, the whole ledger under LEDGER_KEY, its ConfigMaps."""

    data: dict[str, str]
    names: tuple[str, ...]


def stored_states(
    items: Sequence[Mapping[str, Any]], generation_of: Callable[[Mapping[str, Any]], int]
) -> dict[int, StoredState]:
    """A workflow's state ConfigMaps by generation, each joined with its chunk ConfigMaps."""
    # Chunks whose state is gone are left to the garbage collector (they go with the workflow).
    chunks: dict[str, list[Mapping[str, Any]]] = {}
    states = []
    for item in items:
        of = (item["metadata"].get("labels") or {}).get(CHUNK_OF_LABEL)
        if of is None:
            states.append(item)
        else:
            chunks.setdefault(of, []).append(item)
    found = {}
    for state in states:
        name = state["metadata"]["name"]
        mine = chunks.get(name, [])
        data = {k: v for k, v in (state.get("data") or {}).items() if k != LEDGER_KEY}
        data[LEDGER_KEY] = ledger_text([state, *mine])
        names = (name, *sorted(c["metadata"]["name"] for c in mine))
        found[generation_of(state)] = StoredState(data, names)
    return found


@dataclass(frozen=True)
class Seed:
    """What a new generation's state ConfigMap starts with, and where it came from."""

    data: dict[str, str] = field(default_factory=dict)
    ledger_from: int | None = None
    result_from: int | None = None
    profiles_from: int | None = None

    @property
    def ledger_facts(self) -> int:
        """Lines of ledger carried over."""
        return sum(1 for line in self.data.get(LEDGER_KEY, "").splitlines() if line.strip())


def seed_state(
    spec: CompoundWorkflowSpec, generation: int, previous: Mapping[int, Mapping[str, str]]
) -> Seed:
    """Carry over from the newest earlier generation whose scores are still valid.

    The ledger is reused when the scores mean the same (dataset and evaluator unchanged):
    a new tau or new budgets re-run the search without evaluating any recorded sample again.
    The result is reused when the search itself is unchanged, the profiles when the profiling
    is unchanged too: a change of the SLO alone is re-planned without any Job.
    """
    for earlier in sorted((g for g in previous if g < generation), reverse=True):
        data = previous[earlier]
        try:
            old = CompoundWorkflowSpec.model_validate_json(data.get(SPEC_KEY, ""))
        except ValidationError:
            continue
        if scoring_key(old) != scoring_key(spec):
            continue
        seed: dict[str, str] = {LEDGER_KEY: data.get(LEDGER_KEY, "")}
        result_from = profiles_from = None
        if search_key(old) == search_key(spec) and data.get(RESULT_KEY):
            seed[RESULT_KEY] = data[RESULT_KEY]
            if data.get(PROGRESS_KEY):
                seed[PROGRESS_KEY] = data[PROGRESS_KEY]
            result_from = earlier
            if profile_key(old) == profile_key(spec) and data.get(PROFILES_KEY):
                seed[PROFILES_KEY] = data[PROFILES_KEY]
                profiles_from = earlier
        origin = {"ledger": earlier, "result": result_from, "profiles": profiles_from}
        seed[SEED_KEY] = json.dumps(origin, sort_keys=True)
        return Seed(seed, earlier, result_from, profiles_from)
    return Seed()


def seed_origin(state: Mapping[str, str]) -> dict[str, int | None]:
    """Which generation the state's ledger, result and profiles came from (None: its own)."""
    try:
        origin = json.loads(state.get(SEED_KEY) or "{}")
    except ValueError:
        origin = {}
    return {k: origin.get(k) for k in ("ledger", "result", "profiles")}


# ---------------------------------------------------------------------------- conditions


def workflow_condition(
    type_: WorkflowConditionType, status: str, reason: str, message: str, generation: int
) -> Condition:
    """A condition of this generation, its message made one line."""
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=one_line(message),
        observed_generation=generation,
    )


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event on the workflow: posted once, when its transition is written."""

    type: str  # Normal or Warning
    reason: str
    message: str


# ---------------------------------------------------------------------------- starting a generation


def invalid_status(
    previous: CompoundWorkflowStatus, generation: int, error: InvalidSpecError, now: str
) -> CompoundWorkflowStatus:
    """Failed, with SpecValid False naming the field and the fix."""
    invalid = workflow_condition(
        WorkflowConditionType.SPEC_VALID, "False", error.reason, str(error), generation
    )
    conditions = set_condition([], invalid, now)
    status = previous.model_copy(
        update={
            "phase": Phase.FAILED,
            "observed_generation": generation,
            "conditions": conditions,
            "search_job": None,
            "profiling_job": None,
            "start_time": now,
            "completion_time": None,
        }
    )
    return summarized(status, generation, now)


def summarized(status: CompoundWorkflowStatus, generation: int, now: str) -> CompoundWorkflowStatus:
    """The status with Ready and the completion time as its phase says: True once the policy
    is written; False with the failing condition's reason, or with the phase while it works."""
    others = [c for c in status.conditions if c.type != WorkflowConditionType.READY]
    if status.phase is Phase.READY:
        ready = ("True", "PolicyReady", f"ParetoPolicy {status.policy} serves the planned front")
    elif status.phase is Phase.PLANNED:
        # Not Ready: nothing serves this plan until someone applies it.
        awaiting = find_condition(others, WorkflowConditionType.POLICY_READY)
        ready = ("False", AWAITING_REVIEW, awaiting.message if awaiting else "awaiting review")
    elif status.phase is Phase.FAILED:
        failing = next((c for c in others if c.status == "False"), None) or next(
            (c for c in others if c.type == WorkflowConditionType.FEASIBLE_SET_EMPTY), None
        )
        ready = (
            ("False", failing.reason, failing.message)
            if failing is not None
            else ("False", "Failed", f"generation {generation} failed")
        )
    else:
        working = [c for c in others if c.status == "Unknown"]
        message = working[-1].message if working else f"generation {generation}"
        ready = ("False", status.phase.value, message)
    condition = workflow_condition(WorkflowConditionType.READY, *ready, generation)
    done = status.phase in (Phase.READY, Phase.PLANNED, Phase.FAILED)
    return status.model_copy(
        update={
            "conditions": set_condition(status.conditions, condition, now),
            "completion_time": (status.completion_time or now) if done else None,
        }
    )


def start_status(
    previous: CompoundWorkflowStatus,
    workflow: str,
    generation: int,
    spec: CompoundWorkflowSpec,
    space: Space,
    state: Mapping[str, str],
    now: str,
) -> tuple[CompoundWorkflowStatus, Event]:
    """The status of a generation just started from its state ConfigMap, and its Event.

    Profiles carried over: Planning (the timer plans at once). Otherwise Searching: the search
    Job runs, or, when the result was carried over, the timer moves on at its first tick.
    """
    origin = seed_origin(state)
    valid = f"{space.size} configurations in the space"
    conditions = set_condition(
        [],
        workflow_condition(WorkflowConditionType.SPEC_VALID, "True", "Valid", valid, generation),
        now,
    )
    counts = _counts(state)
    update: dict[str, Any] = {
        "observed_generation": generation,
        "ledger_config_map": search_name(workflow, generation),
        "profiling_job": None,
        "planned_policy": None,
        "start_time": now,
        "completion_time": None,
        **counts,
    }
    if origin["profiles"] is not None and state.get(PROFILES_KEY):
        message = (
            f"generation {generation}: only the SLO changed; re-planning the profiles of "
            f"generation {origin['profiles']}"
        )
        conditions = set_conditions(
            conditions,
            [
                workflow_condition(
                    WorkflowConditionType.SEARCH_SUCCEEDED, "True", "Reused", message, generation
                ),
                workflow_condition(
                    WorkflowConditionType.PROFILED, "True", "Reused", message, generation
                ),
            ],
            now,
        )
        status = previous.model_copy(
            update={**update, "phase": Phase.PLANNING, "search_job": None, "conditions": conditions}
        )
        return summarized(status, generation, now), Event("Normal", "PlanningStarted", message)
    if origin["result"] is not None and state.get(RESULT_KEY):
        message = (
            f"generation {generation}: the search is unchanged; reusing the result of "
            f"generation {origin['result']}"
        )
        search_job = None
    else:
        resumed = _ledger_facts(state)
        message = (
            f"generation {generation}: searching {space.size} configurations for accuracy >= "
            f"{spec.evaluation.tau:g} (budgets {_budgets_text(spec)})"
            + (
                f", {resumed} recorded batches carried over from generation {origin['ledger']}"
                if resumed and origin["ledger"] is not None
                else ""
            )
        )
        search_job = search_name(workflow, generation)
    searching = workflow_condition(
        WorkflowConditionType.SEARCH_SUCCEEDED, "Unknown", "Searching", message, generation
    )
    conditions = set_condition(conditions, searching, now)
    status = previous.model_copy(
        update={
            **update,
            "phase": Phase.SEARCHING,
            "search_job": search_job,
            "conditions": conditions,
        }
    )
    return summarized(status, generation, now), Event("Normal", "SearchStarted", message)


def _ledger_facts(state: Mapping[str, str]) -> int:
    return sum(1 for line in state.get(LEDGER_KEY, "").splitlines() if line.strip())


# ---------------------------------------------------------------------------- observing


@dataclass(frozen=True)
class JobView:
    """What the controller needs from a Job's status."""

    name: str
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    complete: bool = False
    failed_final: bool = False
    reason: str = ""
    message: str = ""

    @property
    def running(self) -> bool:
        """Still has work to do (not Complete, not Failed)."""
        return not (self.complete or self.failed_final)


def job_view(job: Mapping[str, Any]) -> JobView:
    """The Job's counts and its final condition, if it has one."""
    status = job.get("status") or {}
    complete = failed = False
    reason = message = ""
    for item in status.get("conditions") or []:
        if item.get("status") != "True":
            continue
        if item.get("type") == "Complete":
            complete = True
        elif item.get("type") == "Failed":
            failed = True
            reason, message = item.get("reason", ""), item.get("message", "")
    return JobView(
        name=job["metadata"]["name"],
        active=int(status.get("active") or 0),
        succeeded=int(status.get("succeeded") or 0),
        failed=int(status.get("failed") or 0),
        complete=complete,
        failed_final=failed,
        reason=reason,
        message=message,
    )


def pod_failure_message(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The last failed pod's termination message as one line, or None if no pod said anything.

    A compass Job prints its error last as `compass job ROLE: ...`; other programs' last
    non-empty line is taken.
    """
    found: list[tuple[str, str, int, str]] = []
    for pod in pods:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        for container in statuses:
            for state in (container.get("state") or {}, container.get("lastState") or {}):
                terminated = state.get("terminated")
                if terminated and int(terminated.get("exitCode", 0)) != 0:
                    found.append(
                        (
                            terminated.get("finishedAt") or "",
                            pod["metadata"]["name"],
                            int(terminated["exitCode"]),
                            terminated.get("message") or terminated.get("reason") or "",
                        )
                    )
    if not found:
        return None
    _, pod_name, code, text = max(found)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("compass job ")]
    line = (ours or lines or ["(no output)"])[-1]
    return one_line(f"pod {pod_name} exited {code}: {line}")


def _job_failure(role: str, job: JobView, pod_message: str | None) -> str:
    attempts = job.failed or 1
    cause = f"{job.reason}: {job.message}" if job.reason else "failed"
    where = f"; {pod_message}" if pod_message else ""
    return f"{role} Job {job.name} failed after {attempts} pod(s) ({cause}){where}"


# ---------------------------------------------------------------------------- counts and results


def _json(state: Mapping[str, str], key: str) -> Any:
    text = state.get(key)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _counts(state: Mapping[str, str]) -> dict[str, Any]:
    """Status counts from the result (once there) or the last progress snapshot."""
    result = _json(state, RESULT_KEY)
    if isinstance(result, dict):
        evaluated = result.get("evaluated") or []
        best = max((float(e["accuracy"]) for e in evaluated), default=None)
        return {
            "configurations_evaluated": int(result.get("configs_evaluated", len(evaluated))),
            "samples_used": int(result.get("sample_evals", 0)),
            "feasible_found": len(result.get("feasible") or []),
            "best_accuracy": None if best is None else round(best, 4),
        }
    progress = _json(state, PROGRESS_KEY)
    if isinstance(progress, dict):
        best = progress.get("best_accuracy")
        return {
            "configurations_evaluated": int(progress.get("configs_evaluated", 0)),
            "samples_used": int(progress.get("sample_evals", 0)),
            "feasible_found": int(progress.get("feasible", 0)),
            "best_accuracy": None if best is None else round(float(best), 4),
        }
    return {
        "configurations_evaluated": 0,
        "samples_used": 0,
        "feasible_found": 0,
        "best_accuracy": None,
    }


def config_name(config: Mapping[str, Any]) -> str:
    """A configuration as a short label: its values joined by '/' (as the planner names it)."""
    return "/".join(str(v) for v in config.values())


def feasible_set_empty_message(result: Mapping[str, Any], tau: float) -> str:
    """Why no configuration qualifies: the best accuracy reached and a tau that would work."""
    evaluated = list(result.get("evaluated") or [])
    if not evaluated:
        return (
            f"no configuration reaches tau {tau:g}: the search evaluated none; check the "
            f"evaluator and the dataset"
        )
    best = max(evaluated, key=lambda e: float(e["accuracy"]))
    accuracy = float(best["accuracy"])
    workable = math.floor(accuracy * 100) / 100
    return (
        f"no configuration reaches tau {tau:g}: the best accuracy reached is {accuracy:.3f} "
        f"({config_name(best['config'])} on {best.get('samples', '?')} samples, "
        f"{len(evaluated)} configurations evaluated); set evaluation.tau to {workable:.2f} or "
        f"lower, or widen the space"
    )


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
    return PlanOutcome(
        policy.model_dump(mode="json", by_alias=True, exclude_none=True), message, ""
    )


# ---------------------------------------------------------------------------- the next step


class Create(StrEnum):
    """Objects a step needs to exist (created idempotently)."""

    STATE = "state"
    SEARCH_JOB = "search-job"
    PROFILE_JOB = "profile-job"


@dataclass(frozen=True)
class Observation:
    """One workflow generation as the controller sees it."""

    workflow: str
    generation: int
    spec: CompoundWorkflowSpec
    status: CompoundWorkflowStatus
    state: Mapping[str, str] | None
    search_job: JobView | None
    profile_job: JobView | None
    pod_message: str | None = None  # of the failed Job of the current phase, if it failed
    routing: RoutingTarget | None = None
    metrics_url: str = ""
    namespace: str = ""


@dataclass(frozen=True)
class Step:
    """What to do: objects to create, a policy to apply, the status to write, an Event.

    The Event is posted only when the status write wins (optimistic concurrency), so a
    transition is announced once even when two handlers race.
    """

    status: CompoundWorkflowStatus | None = None
    create: tuple[Create, ...] = ()
    policy_spec: dict[str, Any] | None = None
    event: Event | None = None


def decide(observation: Observation, now: str) -> Step:
    """The next step for an active generation (Searching, Profiling, Planning)."""
    status = observation.status
    if status.observed_generation != observation.generation or status.phase not in ACTIVE_PHASES:
        return Step()
    if observation.state is None:
        return _lost_state(observation, now)
    if status.phase is Phase.SEARCHING:
        return _searching(observation, observation.state, now)
    if observation.state.get(PROFILES_KEY) and not (
        observation.profile_job is not None and observation.profile_job.running
    ):
        return _planning(observation, observation.state, now)
    return _profiling(observation, now)


def _update(
    observation: Observation,
    now: str,
    conditions: Sequence[tuple[WorkflowConditionType, str, str, str]],
    **fields: Any,
) -> CompoundWorkflowStatus:
    """The status with these fields and conditions (type, status, reason, message) set."""
    updates = [workflow_condition(*c, observation.generation) for c in conditions]
    current = set_conditions(observation.status.conditions, updates, now)
    status = observation.status.model_copy(update={**fields, "conditions": current})
    return summarized(status, observation.generation, now)


def _lost_state(observation: Observation, now: str) -> Step:
    message = (
        f"state ConfigMap {search_name(observation.workflow, observation.generation)} is gone "
        f"(deleted by hand?): searching again from an empty ledger"
    )
    status = _update(
        observation,
        now,
        [(WorkflowConditionType.SEARCH_SUCCEEDED, "Unknown", "Searching", message)],
        phase=Phase.SEARCHING,
        search_job=search_name(observation.workflow, observation.generation),
        profiling_job=None,
    )
    return Step(
        status=status,
        create=(Create.STATE, Create.SEARCH_JOB),
        event=Event("Warning", "SearchStarted", message),
    )


def _searching(observation: Observation, state: Mapping[str, str], now: str) -> Step:
    job = observation.search_job
    result = _json(state, RESULT_KEY)
    counts = _counts(state)
    if isinstance(result, dict) and not (job is not None and job.running and job.active):
        return _search_done(observation, state, result, counts, now)
    if job is not None and job.failed_final:
        message = _job_failure("search", job, observation.pod_message)
        status = _update(
            observation,
            now,
            [(WorkflowConditionType.SEARCH_SUCCEEDED, "False", job.reason or "JobFailed", message)],
            phase=Phase.FAILED,
            **counts,
        )
        return Step(status=status, event=Event("Warning", "SearchFailed", message))
    if job is not None and job.complete:
        return _no_output(observation, job, now, "search")
    if job is None and result is None:
        # Started but the Job is missing (deleted by hand, or the start was cut short):
        # create it again; it resumes from the ledger.
        status = _update(observation, now, [], **counts)
        return Step(status=_changed(observation.status, status), create=(Create.SEARCH_JOB,))
    status = _update(observation, now, [], **counts)
    return Step(status=_changed(observation.status, status))


# What each Job must write, and how its absence after a Complete Job is reported:
# role -> (state key, condition, reason, Event reason).
_OUTPUTS: dict[str, tuple[str, WorkflowConditionType, str, str]] = {
    "search": (RESULT_KEY, WorkflowConditionType.SEARCH_SUCCEEDED, "NoResult", "SearchFailed"),
    "profiling": (PROFILES_KEY, WorkflowConditionType.PROFILED, "NoProfiles", "ProfilingFailed"),
}


def _no_output(
    observation: Observation, job: JobView, now: str, role: Literal["search", "profiling"]
) -> Step:
    """Failed: the Job completed but wrote no output for the next phase to start from."""
    key, type_, reason, event = _OUTPUTS[role]
    message = f"{role} Job {job.name} completed without writing {key}"
    status = _update(observation, now, [(type_, "False", reason, message)], phase=Phase.FAILED)
    return Step(status=status, event=Event("Warning", event, message))


def _changed(
    before: CompoundWorkflowStatus, after: CompoundWorkflowStatus
) -> CompoundWorkflowStatus | None:
    return None if before == after else after


def _search_done(
    observation: Observation,
    state: Mapping[str, str],
    result: Mapping[str, Any],
    counts: Mapping[str, Any],
    now: str,
) -> Step:
    feasible = list(result.get("feasible") or [])
    origin = seed_origin(state)
    reused = (
        f" (result reused from generation {origin['result']})"
        if origin["result"] is not None
        else ""
    )
    summary = (
        f"{len(feasible)} feasible of {counts['configurations_evaluated']} configurations "
        f"evaluated with {counts['samples_used']} sample evaluations{reused}"
    )
    if not feasible:
        message = feasible_set_empty_message(result, observation.spec.evaluation.tau)
        status = _update(
            observation,
            now,
            [
                (WorkflowConditionType.SEARCH_SUCCEEDED, "True", "Completed", summary),
                (
                    WorkflowConditionType.FEASIBLE_SET_EMPTY,
                    "True",
                    "NoConfigurationReachesTau",
                    message,
                ),
                (WorkflowConditionType.POLICY_READY, "False", "FeasibleSetEmpty", message),
            ],
            phase=Phase.FAILED,
            **counts,
        )
        return Step(status=status, event=Event("Warning", "FeasibleSetEmpty", message))
    job = profile_name(observation.workflow, observation.generation)
    status = _update(
        observation,
        now,
        [
            (WorkflowConditionType.SEARCH_SUCCEEDED, "True", "FeasibleFound", summary),
            (WorkflowConditionType.FEASIBLE_SET_EMPTY, "False", "FeasibleFound", summary),
            (
                WorkflowConditionType.PROFILED,
                "Unknown",
                "Profiling",
                f"profiling {len(feasible)} configurations",
            ),
        ],
        phase=Phase.PROFILING,
        profiling_job=job,
        **counts,
    )
    return Step(
        status=status,
        create=(Create.PROFILE_JOB,),
        event=Event("Normal", "SearchSucceeded", f"{summary}; profiling Job {job}"),
    )


def _profiling(observation: Observation, now: str) -> Step:
    job = observation.profile_job
    if job is not None and job.failed_final:
        message = _job_failure("profiling", job, observation.pod_message)
        status = _update(
            observation,
            now,
            [
                (WorkflowConditionType.PROFILED, "False", job.reason or "JobFailed", message),
                (WorkflowConditionType.POLICY_READY, "False", "ProfilingFailed", message),
            ],
            phase=Phase.FAILED,
        )
        return Step(status=status, event=Event("Warning", "ProfilingFailed", message))
    if job is not None and job.complete:
        return _no_output(observation, job, now, "profiling")
    if job is None:
        name = profile_name(observation.workflow, observation.generation)
        status = summarized(
            observation.status.model_copy(update={"phase": Phase.PROFILING, "profiling_job": name}),
            observation.generation,
            now,
        )
        return Step(status=_changed(observation.status, status), create=(Create.PROFILE_JOB,))
    progress = _json(observation.state or {}, CURVE_PROGRESS_KEY)
    if isinstance(progress, dict):
        message = curve_progress_message(progress)
        status = _update(
            observation, now, [(WorkflowConditionType.PROFILED, "Unknown", "Profiling", message)]
        )
        return Step(status=_changed(observation.status, status))
    return Step()


def curve_progress_message(progress: Mapping[str, Any]) -> str:
    """The profiling Job's progress through the capacity curves, as a condition message."""
    return (
        f"measuring capacity curves: {progress.get('curves_done', 0)} of "
        f"{progress.get('curves_total', '?')} done; {progress.get('configuration', '?')} at "
        f"{progress.get('offered_qps', '?')}/s, p95 {progress.get('p95_ms', '?')} ms"
    )


def _planning(observation: Observation, state: Mapping[str, str], now: str) -> Step:
    outcome = plan_policy(
        observation.spec,
        state[PROFILES_KEY],
        observation.routing or RoutingTarget(),
        observation.metrics_url,
    )
    profiled = find_condition(observation.status.conditions, WorkflowConditionType.PROFILED)
    profiled_ok = (
        WorkflowConditionType.PROFILED,
        "True",
        "Profiled",
        "latency measured on the target node pool",
    )
    if profiled is not None and profiled.reason == "Reused":
        profiled_ok = (WorkflowConditionType.PROFILED, "True", "Reused", profiled.message)
    if outcome.policy_spec is None:
        status = _update(
            observation,
            now,
            [
                profiled_ok
                if outcome.reason == "SloUnreachable"
                else (WorkflowConditionType.PROFILED, "False", outcome.reason, outcome.message),
                (WorkflowConditionType.POLICY_READY, "False", outcome.reason, outcome.message),
            ],
            phase=Phase.FAILED,
        )
        return Step(status=status, event=Event("Warning", "PlanFailed", outcome.message))
    name = policy_name(observation.workflow)
    if not observation.spec.auto_apply:
        return _planned(observation, outcome, profiled_ok, now)
    message = f"ParetoPolicy {name}: {outcome.message}"
    status = _update(
        observation,
        now,
        [profiled_ok, (WorkflowConditionType.POLICY_READY, "True", "PolicyReady", message)],
        phase=Phase.READY,
        policy=name,
        planned_policy=None,
    )
    return Step(
        status=status,
        policy_spec=outcome.policy_spec,
        event=Event("Normal", "PolicyReady", message),
    )


def review_command(workflow: str, namespace: str) -> str:
    """The command that applies a workflow's plan held for review."""
    where = f" -n {namespace}" if namespace else ""
    return (
        f"kubectl get compoundworkflow {workflow}{where} -o jsonpath='{{.status.plannedPolicy}}' "
        "| kubectl apply -f -"
    )


def _planned(
    observation: Observation,
    outcome: PlanOutcome,
    profiled_ok: tuple[WorkflowConditionType, str, str, str],
    now: str,
) -> Step:
    """Planned, not applied (spec.autoApply false): the manifest waits in the status."""
    assert outcome.policy_spec is not None
    name = policy_name(observation.workflow)
    manifest = planned_policy(
        observation.workflow, observation.namespace, observation.generation, outcome.policy_spec
    )
    message = (
        f"ParetoPolicy {name} planned, not applied (spec.autoApply is false): {outcome.message}. "
        f"Review status.plannedPolicy; apply it with `"
        f"{review_command(observation.workflow, observation.namespace)}`, or set spec.autoApply "
        "to true (no new search)"
    )
    status = _update(
        observation,
        now,
        [profiled_ok, (WorkflowConditionType.POLICY_READY, "False", AWAITING_REVIEW, message)],
        phase=Phase.PLANNED,
        planned_policy=manifest,
    )
    return Step(status=status, event=Event("Normal", "PolicyPlanned", message))


class PolicyAction(StrEnum):
    """What to do with the workflow's ParetoPolicy."""

    APPLY = "apply"  # server-side apply the planned fields (creates it if missing)
    BLOCKED = "blocked"  # cannot be written yet: reason and message say why


# The field manager the kubernetes client writes under when none is named (its User-Agent):
# operators before server-side apply created and replaced the generated policy through it.
LEGACY_MANAGER = "OpenAPI-Generator"


@dataclass(frozen=True)
class PolicyApply:
    """The action on the ParetoPolicy: the body to apply (after the ``adopt`` JSON patch, when
    there is one), or why it cannot be."""

    action: PolicyAction
    body: dict[str, Any] | None = None
    adopt: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    message: str = ""


def decide_policy_apply(
    existing: Mapping[str, Any] | None, wanted: Mapping[str, Any], owner_uid: str
) -> PolicyApply:
    """Apply the planned fields to the workflow's ParetoPolicy (first taking over what older
    operators wrote through PUT), or stay blocked by one of that name it may not take.

    A policy without a controller that carries this workflow's label is taken: it was applied
    from this workflow's plan held for review (spec.autoApply false), which turned true."""
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
    """The JSON patch that hands the fields an older operator wrote (manager LEGACY_MANAGER,
    operation Update) to FIELD_MANAGER's apply; empty when there is nothing to take over.

    Without it those fields stay co-owned by the old manager, and a field the new plan drops
    would never be removed. Status fields stay with their writer: the apply does not own them.
    The patch tests the resourceVersion, so it fails (422) rather than rewrite newer owners."""
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


def policy_blocked(
    observation: Observation, reason: str, message: str, now: str
) -> tuple[CompoundWorkflowStatus, Event | None]:
    """Planned, but the ParetoPolicy cannot be written yet: stay in Planning and say why.

    The Event goes out only the first time this reason is reported.
    """
    before = find_condition(observation.status.conditions, WorkflowConditionType.POLICY_READY)
    status = _update(
        observation,
        now,
        [(WorkflowConditionType.POLICY_READY, "False", reason, message)],
        phase=Phase.PLANNING,
    )
    fresh = before is None or before.reason != reason
    return status, Event("Warning", reason, message) if fresh else None


def _budgets_text(spec: CompoundWorkflowSpec) -> str:
    """The search's schedule for a status message."""
    evaluation = spec.evaluation
    budgets = None if evaluation.budgets is None else tuple(evaluation.budgets)
    method = IntervalMethod(evaluation.interval.value)
    return describe_schedule(budgets, method, evaluation.dataset.size)


# ---------------------------------------------------------------------------- metrics

# The Jobs a workflow runs: the condition that reports each, and the status field naming it.
_JOB_CONDITIONS: tuple[tuple[str, WorkflowConditionType, str], ...] = (
    ("search", WorkflowConditionType.SEARCH_SUCCEEDED, "search_job"),
    ("profiling", WorkflowConditionType.PROFILED, "profiling_job"),
)
_JOB_RESULTS = {"Unknown": "started", "True": "succeeded", "False": "failed"}


def job_progress(
    before: CompoundWorkflowStatus, after: CompoundWorkflowStatus
) -> tuple[tuple[str, str], ...]:
    """The Job transitions a status write makes, as (search|profiling, started|succeeded|
    failed): the Job's condition turned Unknown, True or False, or the same for a newer
    generation. A result or profiles reused from an earlier generation ran no Job here and
    count nothing, and a condition written again unchanged counts once."""
    progress = []
    for stage, type_, job_field in _JOB_CONDITIONS:
        new = find_condition(after.conditions, type_)
        if new is None or getattr(after, job_field) is None or new.reason == "Reused":
            continue
        old = find_condition(before.conditions, type_)
        if old is not None and (old.status, old.observed_generation) == (
            new.status,
            new.observed_generation,
        ):
            continue
        result = _JOB_RESULTS.get(new.status)
        if result is not None:
            progress.append((stage, result))
    return tuple(progress)


def samples_evaluated(before: CompoundWorkflowStatus, after: CompoundWorkflowStatus) -> int:
    """New sample evaluations between two statuses of one generation (a new generation's
    count starts from what it carried over, which was counted when it was evaluated)."""
    if before.observed_generation != after.observed_generation:
        return 0
    return max(0, (after.samples_used or 0) - (before.samples_used or 0))
