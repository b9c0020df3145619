"""The CompoundWorkflow controller's next step: a pure function of what is observed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from compass.api.compoundworkflow import (
    CompoundWorkflowSpec,
    CompoundWorkflowStatus,
    Phase,
    WorkflowConditionType,
)
from compass.api.routing import RoutingTarget
from compass.controllers.builders import (
    CURVE_PROGRESS_KEY,
    PROFILE_PROGRESS_KEY,
    PROFILES_KEY,
    RESULT_KEY,
    planned_policy,
    policy_name,
    profile_name,
    search_name,
)
from compass.controllers.conditions import Event, find_condition, one_line, set_conditions
from compass.controllers.workflow_plan import PlanOutcome, plan_policy, review_command
from compass.controllers.workflow_state import (
    feasible_set_empty_message,
    job_text,
    seed_origin,
    state_counts,
    state_json,
)
from compass.controllers.workflow_status import (
    ACTIVE_PHASES,
    AWAITING_REVIEW,
    summarized,
    workflow_condition,
)

# ---------------------------------------------------------------------------- observing


@dataclass(frozen=True)
class JobView:
    """What the controller needs from a Job's status."""

    name: str
    active: int = 0
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
        failed=int(status.get("failed") or 0),
        complete=complete,
        failed_final=failed,
        reason=reason,
        message=message,
    )


def pod_failure_message(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The last failed pod's termination message (its `compass job` line, else its last)."""
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


# ---------------------------------------------------------------------------- the next step


class Create(StrEnum):
    """Objects a step needs to exist (created idempotently)."""

    STATE = "state"
    SEARCH_JOB = "search-job"
    PROFILE_JOB = "profile-job"


@dataclass(frozen=True)
class GenerationObservation:
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
    """What to do: objects to create, a policy to apply, the status to write, and an Event, posted
    only when the status write wins (so a transition is announced once, however handlers race)."""

    status: CompoundWorkflowStatus | None = None
    create: tuple[Create, ...] = ()
    policy_spec: dict[str, Any] | None = None
    event: Event | None = None


def decide(observation: GenerationObservation, now: str) -> Step:
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
    observation: GenerationObservation,
    now: str,
    conditions: Sequence[tuple[WorkflowConditionType, str, str, str]],
    **fields: Any,
) -> CompoundWorkflowStatus:
    """The status with these fields and conditions (type, status, reason, message) set."""
    updates = [workflow_condition(*c, observation.generation) for c in conditions]
    current = set_conditions(observation.status.conditions, updates, now)
    status = observation.status.model_copy(update={**fields, "conditions": current})
    return summarized(status, observation.generation, now)


def _lost_state(observation: GenerationObservation, now: str) -> Step:
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


def _searching(observation: GenerationObservation, state: Mapping[str, str], now: str) -> Step:
    job = observation.search_job
    result = state_json(state, RESULT_KEY)
    counts = state_counts(state)
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
    # Started but the Job is missing (deleted by hand, or the start was cut short): create it
    # again; it resumes from the ledger.
    create = (Create.SEARCH_JOB,) if job is None and result is None else ()
    status = _update(observation, now, [], **counts)
    return Step(status=_changed(observation.status, status), create=create)


# What each Job must write, and how its absence after a Complete Job is reported:
# role -> (state key, condition, reason, Event reason).
_OUTPUTS: dict[str, tuple[str, WorkflowConditionType, str, str]] = {
    "search": (RESULT_KEY, WorkflowConditionType.SEARCH_SUCCEEDED, "NoResult", "SearchFailed"),
    "profiling": (PROFILES_KEY, WorkflowConditionType.PROFILED, "NoProfiles", "ProfilingFailed"),
}


def _no_output(
    observation: GenerationObservation, job: JobView, now: str, role: Literal["search", "profiling"]
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
    observation: GenerationObservation,
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


def _profiling(observation: GenerationObservation, now: str) -> Step:
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
    progress = state_json(observation.state or {}, PROFILE_PROGRESS_KEY)
    said = profile_progress_message(progress) if isinstance(progress, dict) else None
    curves = state_json(observation.state or {}, CURVE_PROGRESS_KEY)  # an older image's Job
    if said is None and isinstance(curves, dict):
        said = curve_progress_message(curves)
    if said is not None:
        status = _update(
            observation, now, [(WorkflowConditionType.PROFILED, "Unknown", "Profiling", said)]
        )
        return Step(status=_changed(observation.status, status))
    return Step()


def profile_progress_message(progress: Mapping[str, Any]) -> str | None:
    """The profiling Job's progress (profile-progress.json) as a condition message; None: done."""
    phase = progress.get("phase")
    if phase == "stopped":
        return job_text(progress.get("message"), 400) or "profiling stopped at its time bound"
    if phase not in ("latency", "capacity"):
        return None
    what = "latency" if phase == "latency" else "capacity curves"
    bound = progress.get("max_seconds")
    elapsed = progress.get("elapsed_s")
    timing = "" if elapsed is None else f"; {elapsed} s" + (f" of {bound} s" if bound else "")
    return (
        f"measuring {what}: {progress.get('done', 0)} of {progress.get('total', '?')} on "
        f"{progress.get('pods', '?')} pod(s), {job_text(progress.get('rate'), 400) or '--'}{timing}"
    )


def curve_progress_message(progress: Mapping[str, Any]) -> str:
    """The profiling Job's progress through the capacity curves, as a condition message."""
    return (
        f"measuring capacity curves: {progress.get('curves_done', 0)} of "
        f"{progress.get('curves_total', '?')} done; {progress.get('configuration', '?')} at "
        f"{progress.get('offered_qps', '?')}/s, p95 {progress.get('p95_ms', '?')} ms"
    )


def _planning(observation: GenerationObservation, state: Mapping[str, str], now: str) -> Step:
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
        "latency measured on the Triton pods",
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


def _planned(
    observation: GenerationObservation,
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


def policy_blocked(
    observation: GenerationObservation, reason: str, message: str, now: str
) -> tuple[CompoundWorkflowStatus, Event | None]:
    """Stay in Planning, saying why the ParetoPolicy cannot be written yet (an Event per reason)."""
    before = find_condition(observation.status.conditions, WorkflowConditionType.POLICY_READY)
    status = _update(
        observation,
        now,
        [(WorkflowConditionType.POLICY_READY, "False", reason, message)],
        phase=Phase.PLANNING,
    )
    fresh = before is None or before.reason != reason
    return status, Event("Warning", reason, message) if fresh else None
