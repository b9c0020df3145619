"""A CompoundWorkflow's status: its conditions, Ready, a generation's start, the metrics' counts."""

from __future__ import annotations

from collections.abc import Mapping

from compass.api.compoundworkflow import (
    CompoundWorkflowSpec,
    CompoundWorkflowStatus,
    Phase,
    WorkflowConditionType,
)
from compass.api.conditions import Condition
from compass.controllers.builders import PROFILES_KEY, RESULT_KEY, search_name
from compass.controllers.conditions import (
    Event,
    find_condition,
    one_line,
    set_condition,
    set_conditions,
)
from compass.controllers.workflow_spec import InvalidSpecError
from compass.controllers.workflow_state import ledger_facts, seed_origin, state_counts
from compass.domain.statistics import describe_schedule

ACTIVE_PHASES = frozenset({Phase.SEARCHING, Phase.PROFILING, Phase.PLANNING})
# Ready's and PolicyReady's reason while a plan waits for review (spec.autoApply false).
AWAITING_REVIEW = "AwaitingReview"

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


_LR = WorkflowConditionType.LEDGER_READ


def summarized(status: CompoundWorkflowStatus, generation: int, now: str) -> CompoundWorkflowStatus:
    """The status with Ready and the completion time as its phase says."""
    others = [c for c in status.conditions if c.type != WorkflowConditionType.READY]
    if status.phase is Phase.READY:
        ready = ("True", "PolicyReady", f"ParetoPolicy {status.policy} serves the planned front")
    elif status.phase is Phase.PLANNED:
        # Not Ready: nothing serves this plan until someone applies it.
        awaiting = find_condition(others, WorkflowConditionType.POLICY_READY)
        ready = ("False", AWAITING_REVIEW, awaiting.message if awaiting else "awaiting review")
    elif status.phase is Phase.FAILED:
        # LedgerRead=False says what was not carried over: never why a generation failed.
        failing = next((c for c in others if c.status == "False" and c.type != _LR), None) or next(
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


def ledger_unread_status(
    status: CompoundWorkflowStatus, message: str, generation: int, now: str, taken: bool = False
) -> CompoundWorkflowStatus:
    """The status with LedgerRead False: states refused, or (``taken``) another has the name."""
    condition = workflow_condition(
        _LR,
        "False",
        reason="StateNameTaken" if taken else "StateRefused",
        message=message,
        generation=generation,
    )
    return status.model_copy(
        update={"conditions": set_condition(status.conditions, condition, now)}
    )


def start_status(
    previous: CompoundWorkflowStatus,
    workflow: str,
    generation: int,
    spec: CompoundWorkflowSpec,
    space_size: int,
    state: Mapping[str, str],
    now: str,
) -> tuple[CompoundWorkflowStatus, Event]:
    """A generation's status and Event at its start: Planning when the profiles were carried over,
    else Searching (the search Job runs, or the timer moves on at once with a carried result)."""
    origin = seed_origin(state)
    search_job: str | None = None
    if origin["profiles"] is not None and state.get(PROFILES_KEY):
        message = (
            f"generation {generation}: only the SLO changed; re-planning the profiles of "
            f"generation {origin['profiles']}"
        )
        phase, event = Phase.PLANNING, Event("Normal", "PlanningStarted", message)
        started = [
            (WorkflowConditionType.SEARCH_SUCCEEDED, "True", "Reused"),
            (WorkflowConditionType.PROFILED, "True", "Reused"),
        ]
    else:
        if origin["result"] is not None and state.get(RESULT_KEY):
            message = (
                f"generation {generation}: the search is unchanged; reusing the result of "
                f"generation {origin['result']}"
            )
        else:
            resumed = ledger_facts(state)
            message = (
                f"generation {generation}: searching {space_size} configurations for accuracy >= "
                f"{spec.evaluation.tau:g} (budgets {_budgets_text(spec)})"
                + (
                    f", {resumed} recorded batches carried over from generation {origin['ledger']}"
                    if resumed and origin["ledger"] is not None
                    else ""
                )
            )
            search_job = search_name(workflow, generation)
        phase, event = Phase.SEARCHING, Event("Normal", "SearchStarted", message)
        started = [(WorkflowConditionType.SEARCH_SUCCEEDED, "Unknown", "Searching")]
    valid = f"{space_size} configurations in the space"
    conditions = [
        workflow_condition(WorkflowConditionType.SPEC_VALID, "True", "Valid", valid, generation),
        *(workflow_condition(*each, message, generation) for each in started),
    ]
    status = previous.model_copy(
        update={
            "observed_generation": generation,
            "ledger_config_map": search_name(workflow, generation),
            "profiling_job": None,
            "planned_policy": None,
            "start_time": now,
            "completion_time": None,
            **state_counts(state),
            "phase": phase,
            "search_job": search_job,
            "conditions": set_conditions([], conditions, now),
        }
    )
    return summarized(status, generation, now), event


def _budgets_text(spec: CompoundWorkflowSpec) -> str:
    """The search's schedule for a status message."""
    evaluation = spec.evaluation
    budgets = None if evaluation.budgets is None else tuple(evaluation.budgets)
    return describe_schedule(budgets, evaluation.interval, evaluation.dataset.size)


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
    """The Job transitions a status write makes, as (search|profiling, started|succeeded|failed);
    a result or profiles reused ran no Job, and a condition written again counts once."""
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
    """New sample evaluations between two statuses of a generation (none across generations)."""
    if before.observed_generation != after.observed_generation:
        return 0
    return max(0, (after.samples_used or 0) - (before.samples_used or 0))
