"""The CompoundWorkflow controller's pure decisions (compass.controllers.workflow_*) and builders."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from compass.api.compoundworkflow import (
    DATASET_DIR,
    CompoundWorkflowSpec,
    CompoundWorkflowStatus,
    Phase,
    WorkflowConditionType,
)
from compass.api.conditions import MESSAGE_CHARS, Condition
from compass.api.paretopolicy import ParetoPolicySpec
from compass.api.routing import RoutingTarget
from compass.commands.job import best_accuracy, error_line
from compass.controllers import workflow_plan, workflow_state, workflow_status, workflow_steps
from compass.controllers.builders import (
    CURVE_PROGRESS_KEY,
    DEFAULT_SEARCH_RESOURCES,
    LEDGER_KEY,
    PROFILE_PARTIAL_KEY,
    PROFILE_PROGRESS_KEY,
    PROFILES_KEY,
    PROGRESS_KEY,
    RESULT_KEY,
    SEED_KEY,
    SPEC_KEY,
    WORKFLOW_LABEL,
    build_job_role,
    build_job_role_binding,
    build_job_service_account,
    build_pareto_policy,
    build_profile_job,
    build_search_job,
    build_state_config_maps,
    job_env,
    job_rules,
    job_service_account_name,
    metrics_url,
    planned_policy,
    routing_target,
)
from compass.controllers.conditions import Event, find_condition
from compass.controllers.ledgerchunks import MAX_CHUNKS, ledger_text, state_names
from compass.controllers.targets import TargetAccess
from compass.controllers.workflow_plan import (
    LEGACY_MANAGER,
    PolicyAction,
    adoption_patch,
    decide_policy_apply,
)
from compass.controllers.workflow_spec import (
    InvalidSpecError,
    authorize_images,
    authorize_workflow_targets,
    validate_spec,
)
from compass.controllers.workflow_state import ledger_facts, seed_origin, seed_state
from compass.controllers.workflow_status import invalid_status, workflow_condition
from compass.controllers.workflow_steps import (
    Create,
    GenerationObservation,
    JobView,
    decide,
    job_view,
    pod_failure_message,
)
from compass.conversion import policy_plan

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:01:00Z"
WORKFLOW = {
    "apiVersion": "compass.io/v1alpha1",
    "kind": "CompoundWorkflow",
    "metadata": {"name": "rag", "namespace": "ml", "uid": "uid-1", "generation": 1},
}


def _raw(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "space": {
            "parameters": [
                {"name": "generator", "values": ["big", "small"]},
                {"name": "retriever_k", "type": "integer", "values": [5, 10]},
                {"name": "reranker_k", "type": "integer", "values": [1, 5]},
            ],
            "constraints": ["reranker_k <= retriever_k"],
        },
        "evaluation": {
            "dataset": {"size": 100, "imagePath": "/data/qa.jsonl"},
            "tau": 0.8,
            "evaluator": {"type": "replay", "replayConfigMap": "ledger"},
        },
        "slo": {"latencyMs": 300},
        "triton": {"service": "triton"},
    }
    for path, value in changes.items():
        node = raw
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return raw


def _spec(**changes: Any) -> CompoundWorkflowSpec:
    return CompoundWorkflowSpec.model_validate(_raw(**changes))


# ---------------------------------------------------------------------------- validation


def test_valid_spec_gives_its_space() -> None:
    spec, size = validate_spec(_raw())
    assert spec.evaluation.tau == 0.8
    assert size == 8


def test_unknown_parameter_in_a_constraint_names_the_constraint_and_the_fix() -> None:
    raw = _raw()
    raw["space"]["constraints"] = ["retriever_k >= 1", "reranker_k <= retriver_k"]
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(raw)
    assert error.value.field == "spec.space.constraints[1]"
    assert str(error.value) == (
        "spec.space.constraints[1]: constraint 'reranker_k <= retriver_k': unknown parameter "
        "'retriver_k'; known parameters: generator, retriever_k, reranker_k (quote a "
        "categorical value: 'retriver_k')"
    )


def test_budgets_beyond_the_dataset_name_the_budgets() -> None:
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(_raw(**{"evaluation.budgets": [10, 50, 200]}))
    assert error.value.field == "spec.evaluation.budgets"
    assert "200 exceeds dataset.size 100; lower the last budget" in str(error.value)


def test_a_configmap_dataset_with_the_triton_evaluator_is_refused_with_the_fix() -> None:
    """The triton evaluator sends sample indices only: a ConfigMap it would never read is
    refused, not mounted and silently ignored."""
    raw = _raw(**{"evaluation.evaluator": {"type": "triton"}})
    raw["evaluation"]["dataset"] = {"size": 100, "configMap": {"name": "qa", "key": "q.jsonl"}}
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(raw)
    assert error.value.field == "spec.evaluation.dataset.configMap"
    message = str(error.value)
    assert "the triton evaluator never reads it" in message
    assert "leave configMap out, or score with evaluator type command" in message
    raw["evaluation"]["evaluator"] = {"type": "command", "command": ["score"]}
    spec, _ = validate_spec(raw)
    assert spec.evaluation.dataset.config_map is not None


def test_incomplete_evaluator_names_its_field() -> None:
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(_raw(**{"evaluation.evaluator": {"type": "command"}}))
    assert error.value.field == "spec.evaluation.evaluator.command"


def test_a_space_no_configuration_satisfies_is_invalid() -> None:
    raw = _raw()
    raw["space"]["constraints"] = ["reranker_k > retriever_k"]
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(raw)
    assert error.value.field == "spec.space"
    assert "relax a constraint" in str(error.value)


def test_missing_field_is_named() -> None:
    raw = _raw()
    del raw["slo"]
    with pytest.raises(InvalidSpecError, match=r"^spec\.slo: Field required"):
        validate_spec(raw)


# ---------------------------------------------------------------------------- carrying state over


def _state(spec: CompoundWorkflowSpec, **data: str) -> dict[str, str]:
    return {SPEC_KEY: spec.model_dump_json(by_alias=True, exclude_none=True), **data}


FULL = {
    LEDGER_KEY: '{"config": {"generator": "big"}, "samples": [0], "scores": [1.0]}\n',
    RESULT_KEY: '{"feasible": []}',
    PROGRESS_KEY: '{"configs_evaluated": 1}',
    PROFILES_KEY: '{"profiles": []}',
}


def test_only_the_slo_changed_reuses_ledger_result_and_profiles() -> None:
    old = _spec()
    seed = seed_state(_spec(**{"slo.latencyMs": 200}), 2, {1: _state(old, **FULL)})
    assert seed_origin(seed) == {"ledger": 1, "result": 1, "profiles": 1}
    assert seed[PROFILES_KEY] == FULL[PROFILES_KEY]
    assert json.loads(seed[SEED_KEY]) == {"ledger": 1, "result": 1, "profiles": 1}


def test_a_new_tau_reuses_the_recorded_scores_only() -> None:
    seed = seed_state(_spec(**{"evaluation.tau": 0.7}), 2, {1: _state(_spec(), **FULL)})
    assert seed_origin(seed) == {"ledger": 1, "result": None, "profiles": None}
    assert set(seed) == {LEDGER_KEY, SEED_KEY}
    assert ledger_facts(seed) == 1


def test_new_profiling_settings_reuse_the_result_but_profile_again() -> None:
    seed = seed_state(_spec(**{"profiling.measuredRuns": 9}), 2, {1: _state(_spec(), **FULL)})
    assert seed_origin(seed) == {"ledger": 1, "result": 1, "profiles": None}


def test_a_raised_profiling_bound_keeps_the_measurements_with_a_new_clock() -> None:
    """A profiling stopped at maxSeconds left its measurements: the generation that raises the
    bound starts from them (not measuring them again), its own bound counting from its start;
    another profiling setting measures everything again."""
    partial = {"started_unix": 1000.0, "entries": {"full|{}": {"latency_mean_ms": 5.0}}}
    stopped = {k: v for k, v in FULL.items() if k != PROFILES_KEY}
    stopped[PROFILE_PARTIAL_KEY] = json.dumps(partial)
    old = _spec(**{"profiling.maxSeconds": 60})
    seed = seed_state(_spec(**{"profiling.maxSeconds": 600}), 2, {1: _state(old, **stopped)})
    assert seed_origin(seed)["profiles"] is None
    assert json.loads(seed[PROFILE_PARTIAL_KEY]) == {"entries": partial["entries"]}
    other = seed_state(_spec(**{"profiling.measuredRuns": 9}), 2, {1: _state(old, **stopped)})
    assert PROFILE_PARTIAL_KEY not in other


def test_another_dataset_starts_from_nothing() -> None:
    changed = _spec(**{"evaluation.dataset": {"size": 100, "imagePath": "/data/other.jsonl"}})
    assert seed_state(changed, 2, {1: _state(_spec(), **FULL)}) == {}


def test_the_newest_matching_generation_is_the_seed() -> None:
    other = _spec(**{"evaluation.dataset": {"size": 100, "imagePath": "/data/other.jsonl"}})
    states = {1: _state(_spec(), **FULL), 2: _state(other, **FULL), 3: {SPEC_KEY: "garbage"}}
    assert seed_origin(seed_state(_spec(**{"evaluation.tau": 0.9}), 4, states)) == {
        "ledger": 1,
        "result": None,
        "profiles": None,
    }


def test_state_config_map_holds_the_frozen_spec_and_the_seed() -> None:
    spec = _spec()
    body, chunk = build_state_config_maps(WORKFLOW, spec, {LEDGER_KEY: "x\n", SEED_KEY: "{}"})
    assert body["metadata"]["name"] == "rag-search-g1"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert LEDGER_KEY not in body["data"]
    assert chunk["metadata"]["name"] == "rag-search-g1-c1"
    assert chunk["metadata"]["ownerReferences"] == body["metadata"]["ownerReferences"]
    assert ledger_text([body, chunk]) == "x\n"
    assert CompoundWorkflowSpec.model_validate_json(body["data"][SPEC_KEY]) == spec
    [empty] = build_state_config_maps(WORKFLOW, spec)
    assert ledger_text([empty]) == ""


# ---------------------------------------------------------------------------- conditions and status


def test_workflow_conditions_carry_the_generation_and_one_line() -> None:
    condition = workflow_condition(
        WorkflowConditionType.PROFILED, "False", "R", "two\nlines   here", 3
    )
    assert (condition.type, condition.message) == ("Profiled", "two lines here")
    assert condition.observed_generation == 3
    long = workflow_condition(WorkflowConditionType.PROFILED, "False", "R", "x " * 1000, 3)
    assert len(long.message) == MESSAGE_CHARS


def test_a_step_keeps_the_transition_time_of_an_unchanged_status() -> None:
    planning = _observe(Phase.PLANNING, {})
    first, _ = workflow_steps.policy_blocked(planning, "PolicyCrdMissing", "a", NOW)
    again, _ = workflow_steps.policy_blocked(
        replace(planning, status=first), "PolicyConflict", "b", LATER
    )
    ready = find_condition(again.conditions, "PolicyReady")
    assert ready is not None
    assert (ready.reason, ready.last_transition_time) == ("PolicyConflict", NOW)
    assert [c.type for c in again.conditions] == ["PolicyReady", "Ready"]


def test_invalid_status_is_failed_with_the_reason() -> None:
    error = InvalidSpecError("spec.space", "no configuration")
    status = workflow_status.invalid_status(CompoundWorkflowStatus(), 3, error, NOW)
    assert status.phase is Phase.FAILED
    assert status.observed_generation == 3
    assert (status.start_time, status.completion_time) == (NOW, NOW)
    condition, ready = status.conditions
    assert (condition.type, condition.status, condition.reason) == (
        "SpecValid",
        "False",
        "InvalidSpec",
    )
    assert condition.message == "spec.space: no configuration"
    # kubectl wait --for=condition=Ready sees why it will not become ready.
    assert (ready.type, ready.status, ready.reason, ready.message) == (
        "Ready",
        "False",
        "InvalidSpec",
        condition.message,
    )


def test_start_searching_names_the_job_and_resets_counts() -> None:
    spec, size = validate_spec(_raw())
    before = CompoundWorkflowStatus(phase=Phase.READY, samples_used=99, policy="rag")
    status, event = workflow_status.start_status(
        before, "rag", 2, spec, size, {LEDGER_KEY: ""}, NOW
    )
    assert status.phase is Phase.SEARCHING
    assert status.observed_generation == 2
    assert status.search_job == "rag-search-g2"
    assert status.ledger_config_map == "rag-search-g2"
    assert status.samples_used == 0
    assert status.policy == "rag"  # the previous plan keeps serving meanwhile
    assert event.reason == "SearchStarted"
    # A new generation is not Ready until its own plan is: the search says what it does.
    assert (status.start_time, status.completion_time) == (NOW, None)
    ready = find_condition(status.conditions, "Ready")
    assert ready is not None
    assert (ready.status, ready.reason) == ("False", "Searching")
    assert ready.message == event.message
    assert "searching 8 configurations for accuracy >= 0.8" in event.message


def test_start_with_reused_profiles_goes_to_planning_without_a_job() -> None:
    spec, size = validate_spec(_raw())
    seed = seed_state(spec, 2, {1: _state(spec, **FULL)})
    status, event = workflow_status.start_status(
        CompoundWorkflowStatus(), "rag", 2, spec, size, seed, NOW
    )
    assert status.phase is Phase.PLANNING
    assert status.search_job is None
    assert event.reason == "PlanningStarted"


# ---------------------------------------------------------------------------- Jobs and pods


def test_job_view_reads_the_final_condition() -> None:
    job = {
        "metadata": {"name": "j"},
        "status": {
            "failed": 2,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "m",
                }
            ],
        },
    }
    view = job_view(job)
    assert (view.failed_final, view.complete, view.running, view.failed) == (True, False, False, 2)
    assert view.reason == "BackoffLimitExceeded"
    running = job_view({"metadata": {"name": "j"}, "status": {"active": 1}})
    assert running.running


def _pod(name: str, finished: str, message: str, code: int = 1) -> dict[str, Any]:
    terminated = {"exitCode": code, "finishedAt": finished, "message": message}
    return {
        "metadata": {"name": name},
        "status": {"containerStatuses": [{"state": {"terminated": terminated}}]},
    }


def test_pod_failure_message_is_the_last_pods_own_line() -> None:
    pods = [
        _pod("p-1", "2026-01-01T00:00:01Z", "compass job search: old"),
        _pod("p-2", "2026-01-01T00:00:09Z", "noise\ncompass job search: X: boom\ntrailing"),
    ]
    assert pod_failure_message(pods) == "pod p-2 exited 1: compass job search: X: boom"
    assert pod_failure_message([_pod("q", NOW, "a\n\nlast words\n")]) == (
        "pod q exited 1: last words"
    )
    assert pod_failure_message([_pod("ok", NOW, "fine", code=0)]) is None


# ---------------------------------------------------------------------------- the next step


def _result(feasible: list[dict[str, Any]], evaluated: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "feasible": feasible,
            "evaluated": evaluated,
            "sample_evals": 40,
            "configs_evaluated": len(evaluated),
        }
    )


BEST = {"config": {"generator": "big", "retriever_k": 10}, "accuracy": 0.8731, "samples": 100}
WORSE = {"config": {"generator": "small", "retriever_k": 5}, "accuracy": 0.61, "samples": 10}


def _observe(
    phase: Phase,
    state: dict[str, str] | None,
    search: JobView | None = None,
    profile: JobView | None = None,
    pod_message: str | None = None,
    tau: float = 0.8,
    slo_ms: float = 300,
    conditions: list[Condition] | None = None,
) -> GenerationObservation:
    return GenerationObservation(
        workflow="rag",
        generation=1,
        spec=_spec(**{"evaluation.tau": tau, "slo.latencyMs": slo_ms}),
        status=CompoundWorkflowStatus(
            phase=phase, observed_generation=1, conditions=conditions or []
        ),
        state=state,
        search_job=search,
        profile_job=profile,
        pod_message=pod_message,
        routing=routing_target(WORKFLOW, _spec()),
        metrics_url="http://triton.ml:8002/metrics",
    )


def test_progress_updates_counts_only_when_they_change() -> None:
    progress = {
        "configs_evaluated": 3,
        "sample_evals": 30,
        "feasible": 1,
        "best_accuracy": 0.91234,
    }
    state = {PROGRESS_KEY: json.dumps(progress)}
    step = decide(_observe(Phase.SEARCHING, state, JobView("rag-search-g1", active=1)), NOW)
    assert step.status is not None
    assert (step.status.configurations_evaluated, step.status.samples_used) == (3, 30)
    assert (step.status.feasible_found, step.status.best_accuracy) == (1, 0.9123)
    assert step.event is None
    assert step.create == ()
    unchanged = _observe(Phase.SEARCHING, state, JobView("rag-search-g1", active=1))
    unchanged = GenerationObservation(**{**unchanged.__dict__, "status": step.status})
    assert decide(unchanged, LATER) == workflow_steps.Step()


def test_a_missing_search_job_is_created_again() -> None:
    assert decide(_observe(Phase.SEARCHING, {}), NOW).create == (Create.SEARCH_JOB,)


def test_search_success_starts_profiling() -> None:
    state = {RESULT_KEY: _result([BEST], [BEST, WORSE])}
    step = decide(_observe(Phase.SEARCHING, state, JobView("rag-search-g1")), NOW)
    assert step.create == (Create.PROFILE_JOB,)
    assert step.status is not None
    assert step.status.phase is Phase.PROFILING
    assert step.status.profiling_job == "rag-profile-g1"
    assert (step.status.feasible_found, step.status.best_accuracy) == (1, 0.8731)
    assert step.event is not None
    assert step.event.reason == "SearchSucceeded"
    assert step.event.message.startswith("1 feasible of 2 configurations evaluated with 40 sample")


def test_result_while_the_pod_still_runs_waits() -> None:
    state = {RESULT_KEY: _result([BEST], [BEST])}
    step = decide(_observe(Phase.SEARCHING, state, JobView("rag-search-g1", active=1)), NOW)
    assert step.create == ()
    assert step.status is None or step.status.phase is Phase.SEARCHING


def test_no_feasible_configuration_names_the_best_accuracy_and_a_workable_tau() -> None:
    state = {RESULT_KEY: _result([], [WORSE, BEST])}
    step = decide(_observe(Phase.SEARCHING, state, tau=0.95), NOW)
    assert step.status is not None
    assert step.status.phase is Phase.FAILED
    assert step.create == ()
    empty = find_condition(step.status.conditions, "FeasibleSetEmpty")
    assert empty is not None
    assert empty.status == "True"
    assert empty.message == (
        "no configuration reaches tau 0.95: the best accuracy reached is 0.873 (big/10 on 100 "
        "samples, 2 configurations evaluated); set evaluation.tau to 0.87 or lower, or widen "
        "the space"
    )
    assert step.event is not None
    assert (step.event.type, step.event.reason) == ("Warning", "FeasibleSetEmpty")


def test_a_failed_search_job_reports_the_pods_message() -> None:
    job = JobView("rag-search-g1", failed=4, failed_final=True, reason="BackoffLimitExceeded")
    step = decide(_observe(Phase.SEARCHING, {}, job, pod_message="pod p exited 1: boom"), NOW)
    assert step.status is not None
    assert step.status.phase is Phase.FAILED
    searched = find_condition(step.status.conditions, "SearchSucceeded")
    assert searched is not None
    assert searched.reason == "BackoffLimitExceeded"
    assert searched.message == (
        "search Job rag-search-g1 failed after 4 pod(s) (BackoffLimitExceeded: ); pod p exited "
        "1: boom"
    )
    assert step.event is not None
    assert step.event.reason == "SearchFailed"


def test_a_failed_profiling_job_is_profiling_failed() -> None:
    state = {RESULT_KEY: _result([BEST], [BEST])}
    job = JobView("rag-profile-g1", failed=1, failed_final=True, reason="DeadlineExceeded")
    step = decide(_observe(Phase.PROFILING, state, profile=job, pod_message="pod q: x"), NOW)
    assert step.status is not None
    assert step.status.phase is Phase.FAILED
    assert step.event is not None
    assert step.event.reason == "ProfilingFailed"
    ready = find_condition(step.status.conditions, "PolicyReady")
    assert ready is not None
    assert ready.reason == "ProfilingFailed"


def test_the_profiling_job_reports_its_capacity_curves_in_the_profiled_condition() -> None:
    """While the Job measures curves, the Profiled condition says which and how far."""
    progress = {
        "curves_done": 1,
        "curves_total": 3,
        "configuration": "big/10",
        "offered_qps": 12.5,
        "p95_ms": 140.2,
    }
    state = {RESULT_KEY: _result([BEST], [BEST]), CURVE_PROGRESS_KEY: json.dumps(progress)}
    job = JobView("rag-profile-g1", active=1)
    step = decide(_observe(Phase.PROFILING, state, profile=job), NOW)
    assert step.status is not None
    profiled = find_condition(step.status.conditions, "Profiled")
    assert profiled is not None
    assert profiled.status == "Unknown"
    assert profiled.message == (
        "measuring capacity curves: 1 of 3 done; big/10 at 12.5/s, p95 140.2 ms"
    )
    # The same progress again changes nothing.
    again = _observe(Phase.PROFILING, state, profile=job, conditions=step.status.conditions)
    assert decide(again, NOW).status is None


def test_the_profiling_job_reports_done_total_pods_and_eta_in_the_profiled_condition() -> None:
    """While the Job profiles over its pods, Profiled says what it measures, how far, on how
    many pods, at what rate and ETA, against its bound; stopped at the bound, it says why."""
    progress = {
        "phase": "latency",
        "done": 4,
        "total": 10,
        "pods": 2,
        "rate": "2.00 configs/min  ETA 3:00",
        "elapsed_s": 120.0,
        "max_seconds": 600,
    }
    state = {RESULT_KEY: _result([BEST], [BEST]), PROFILE_PROGRESS_KEY: json.dumps(progress)}
    job = JobView("rag-profile-g1", active=1)
    step = decide(_observe(Phase.PROFILING, state, profile=job), NOW)
    assert step.status is not None
    profiled = find_condition(step.status.conditions, "Profiled")
    assert profiled is not None
    assert profiled.status == "Unknown"
    assert profiled.message == (
        "measuring latency: 4 of 10 on 2 pod(s), 2.00 configs/min ETA 3:00; 120.0 s of 600 s"
    )
    stopped = {"phase": "stopped", "pods": 2, "message": "profiling stopped at its bound"}
    state[PROFILE_PROGRESS_KEY] = json.dumps(stopped)
    step = decide(_observe(Phase.PROFILING, state, profile=job), NOW)
    assert step.status is not None
    profiled = find_condition(step.status.conditions, "Profiled")
    assert profiled is not None
    assert profiled.message == "profiling stopped at its bound"


def _profiles(*entries: tuple[dict[str, Any], float, float, float]) -> str:
    return json.dumps(
        {
            "profiles": [
                {
                    "config": config,
                    "accuracy": accuracy,
                    "latency_mean_ms": mean,
                    "latency_p50_ms": mean,
                    "latency_p95_ms": p95,
                    "latency_p99_ms": p95 * 1.1,
                    "latency_std_ms": 1.0,
                }
                for config, accuracy, mean, p95 in entries
            ]
        }
    )


PROFILES = _profiles(
    ({"generator": "small", "retriever_k": 5}, 0.81, 20.0, 25.0),
    ({"generator": "big", "retriever_k": 10}, 0.87, 30.0, 38.0),
)


def test_profiles_are_planned_into_a_policy() -> None:
    state = {RESULT_KEY: _result([BEST], [BEST]), PROFILES_KEY: PROFILES}
    done = JobView("rag-profile-g1", complete=True)
    step = decide(_observe(Phase.PROFILING, state, profile=done), NOW)
    assert step.status is not None
    assert step.status.phase is Phase.READY
    assert step.status.policy == "rag"
    ready = find_condition(step.status.conditions, "Ready")
    assert ready is not None
    assert (ready.status, ready.reason, ready.last_transition_time) == ("True", "PolicyReady", NOW)
    assert step.status.completion_time == NOW
    assert step.policy_spec is not None
    assert [e["accuracy"] for e in step.policy_spec["front"]] == [0.81, 0.87]
    assert step.policy_spec["slo"] == {"latencyMs": 300.0, "percentile": 95.0}
    # Every pod of the workflow's Triton Service, each read on its own metrics port.
    assert step.policy_spec["routing"] == {
        "service": "triton",
        "grpcPort": 8001,
        "metricsPort": 8002,
        "routerModel": "router",
        "actuator": "triton",
    }
    assert "metrics" not in step.policy_spec
    assert step.event is not None
    assert step.event.reason == "PolicyReady"
    assert step.event.message.startswith("ParetoPolicy rag: 2 configurations on the front")


def test_without_auto_apply_the_plan_waits_for_review_in_the_status() -> None:
    state = {RESULT_KEY: _result([BEST], [BEST]), PROFILES_KEY: PROFILES}
    done = JobView("rag-profile-g1", complete=True)
    base = _observe(Phase.PROFILING, state, profile=done)
    observation = replace(base, spec=base.spec.model_copy(update={"auto_apply": False}))
    observation = replace(observation, namespace="team")
    step = decide(observation, NOW)
    assert step.policy_spec is None  # nothing is applied
    assert step.status is not None
    assert step.status.phase is Phase.PLANNED
    assert step.status.completion_time == NOW
    ready = find_condition(step.status.conditions, "Ready")
    policy = find_condition(step.status.conditions, "PolicyReady")
    assert ready is not None
    assert policy is not None
    assert (ready.status, ready.reason) == ("False", "AwaitingReview")
    assert (policy.status, policy.reason) == ("False", "AwaitingReview")
    command = (
        "kubectl get compoundworkflow rag -n team -o jsonpath='{.status.plannedPolicy}' "
        "| kubectl apply -f -"
    )
    assert command in policy.message
    assert "set spec.autoApply to true" in policy.message
    manifest = step.status.planned_policy
    assert manifest is not None
    assert (manifest["apiVersion"], manifest["kind"]) == ("compass.io/v1alpha1", "ParetoPolicy")
    assert (manifest["metadata"]["name"], manifest["metadata"]["namespace"]) == ("rag", "team")
    assert "ownerReferences" not in manifest["metadata"]
    assert [e["accuracy"] for e in manifest["spec"]["front"]] == [0.81, 0.87]
    assert "paused" not in manifest["spec"]
    # What the manifest holds is a valid ParetoPolicy spec.
    ParetoPolicySpec.model_validate(manifest["spec"])
    assert step.event is not None
    assert (step.event.reason, step.event.message) == ("PolicyPlanned", policy.message)
    # Planned is done for this generation: the timer stops.
    assert Phase.PLANNED not in workflow_status.ACTIVE_PHASES


def test_a_new_generation_clears_the_plan_held_for_review() -> None:
    spec, size = validate_spec(_raw())
    seed = seed_state(spec, 2, {1: _state(spec, **FULL)})
    held = CompoundWorkflowStatus(phase=Phase.PLANNED, planned_policy={"kind": "ParetoPolicy"})
    status, _ = workflow_status.start_status(held, "rag", 2, spec, size, seed, NOW)
    assert status.phase is Phase.PLANNING
    assert status.planned_policy is None


def test_auto_apply_is_no_part_of_what_the_search_or_profiles_depend_on() -> None:
    on, off = _spec(), _spec().model_copy(update={"auto_apply": False})
    assert workflow_state.profile_key(on) == workflow_state.profile_key(off)
    # A flip is a spec change whose profiles carry over: it re-plans, it does not search.
    spec, size = validate_spec(_raw())
    previous = _state(off, **FULL)
    seed = seed_state(spec, 2, {1: previous})
    status, event = workflow_status.start_status(
        CompoundWorkflowStatus(), "rag", 2, spec, size, seed, NOW
    )
    assert (status.phase, status.search_job, event.reason) == (
        Phase.PLANNING,
        None,
        "PlanningStarted",
    )


def test_the_serving_settings_reach_the_generated_policy_and_its_plan() -> None:
    """spec.serving: hysteresis, model, metrics source and interval, used by the planner too."""
    serving = {
        "hysteresis": {
            "downscaleCooldownSeconds": 2,
            "cooldownExponent": 0,
            "slackBufferMs": 5,
            "burstMemorySeconds": 30,
        },
        "thresholdModel": "paper-mean",
        "metrics": {"type": "prometheus", "url": "http://prometheus.monitoring:9090"},
        "onMetricsLoss": "fastest",
        "intervalSeconds": 0.5,
    }
    state = {RESULT_KEY: _result([BEST], [BEST]), PROFILES_KEY: PROFILES}
    observation = _observe(Phase.PROFILING, state, profile=JobView("p", complete=True))
    observation = replace(
        observation,
        spec=CompoundWorkflowSpec.model_validate(
            {**observation.spec.model_dump(by_alias=True, mode="json"), "serving": serving}
        ),
    )
    policy = decide(observation, NOW).policy_spec
    assert policy is not None
    assert policy["hysteresis"] == {
        "upscaleCooldownSeconds": 0.0,
        "downscaleCooldownSeconds": 2.0,
        "cooldownExponent": 0.0,
        "slackBufferMs": 5.0,
        "burstMemorySeconds": 30.0,
    }
    assert policy["thresholdModel"] == "paper-mean"
    assert policy["metrics"] == {"type": "prometheus", "url": "http://prometheus.monitoring:9090"}
    assert (policy["onMetricsLoss"], policy["intervalSeconds"]) == ("fastest", 0.5)
    # The routing still comes from spec.triton; the plan used the slack buffer and model.
    assert policy["routing"]["service"] == "triton"
    planned = policy_plan(ParetoPolicySpec.model_validate(policy))
    assert (planned.slack_buffer_ms, planned.model.value) == (5.0, "paper-mean")


def test_a_serving_change_alone_reuses_ledger_result_and_profiles() -> None:
    """Like an SLO change: the serving settings only shape the plan, never a measurement."""
    old = _spec()
    new = CompoundWorkflowSpec.model_validate(
        {**old.model_dump(by_alias=True, mode="json"), "serving": {"intervalSeconds": 2}}
    )
    seed = seed_state(new, 2, {1: _state(old, **FULL)})
    assert seed_origin(seed) == {"ledger": 1, "result": 1, "profiles": 1}


def test_an_slo_below_every_p95_names_the_closest_configuration() -> None:
    state = {PROFILES_KEY: PROFILES}
    step = decide(_observe(Phase.PLANNING, state, slo_ms=10), NOW)
    assert step.policy_spec is None
    assert step.status is not None
    assert step.status.phase is Phase.FAILED
    ready = find_condition(step.status.conditions, "PolicyReady")
    assert ready is not None
    assert ready.reason == "SloUnreachable"
    assert ready.message == (
        "spec.slo.latencyMs: 10 ms is below every configuration's p95: the closest, small/5, "
        "has 25.0 ms (15.0 ms over); raise the SLO above 25.0 ms or profile faster "
        "configurations"
    )
    assert step.event is not None
    assert step.event.reason == "PlanFailed"


def test_blocked_policy_keeps_planning_and_warns_once() -> None:
    observation = _observe(Phase.PLANNING, {PROFILES_KEY: PROFILES})
    status, event = workflow_steps.policy_blocked(
        observation, "PolicyCrdMissing", "install it", NOW
    )
    assert status.phase is Phase.PLANNING
    assert event is not None
    again = GenerationObservation(**{**observation.__dict__, "status": status})
    status2, event2 = workflow_steps.policy_blocked(again, "PolicyCrdMissing", "install it", LATER)
    assert event2 is None
    assert status2 == status


@pytest.mark.parametrize(
    ("phase", "search", "profile", "type_", "reason", "event", "key"),
    [
        (
            Phase.SEARCHING,
            JobView("rag-search-g1", complete=True),
            None,
            "SearchSucceeded",
            "NoResult",
            "SearchFailed",
            RESULT_KEY,
        ),
        (
            Phase.PROFILING,
            None,
            JobView("rag-profile-g1", complete=True),
            "Profiled",
            "NoProfiles",
            "ProfilingFailed",
            PROFILES_KEY,
        ),
    ],
)
def test_a_job_completed_without_its_output_fails_the_workflow(
    phase: Phase,
    search: JobView | None,
    profile: JobView | None,
    type_: str,
    reason: str,
    event: str,
    key: str,
) -> None:
    state = {} if phase is Phase.SEARCHING else {RESULT_KEY: _result([BEST], [BEST])}
    step = decide(_observe(phase, state, search, profile), NOW)
    assert step.status is not None
    assert step.status.phase is Phase.FAILED
    assert step.create == ()
    failed = find_condition(step.status.conditions, type_)
    assert failed is not None
    job = (search or profile or JobView("")).name
    role = "search" if phase is Phase.SEARCHING else "profiling"
    assert (failed.status, failed.reason) == ("False", reason)
    assert failed.message == f"{role} Job {job} completed without writing {key}"
    assert step.event == Event("Warning", event, failed.message)


def _existing(policy: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    """The policy as the API server returns it: with a resourceVersion and what else is set."""
    existing = json.loads(json.dumps(policy))
    existing["metadata"].update({"resourceVersion": "7", **metadata})
    return existing


def test_the_planned_policy_is_applied_whole_and_never_sets_paused() -> None:
    wanted = build_pareto_policy(WORKFLOW, 4, {"front": [1], "paused": False})
    assert "paused" not in wanted["spec"]
    apply = decide_policy_apply(None, wanted, "uid-1")
    assert (apply.action, apply.body, apply.adopt) == (PolicyAction.APPLY, wanted, [])


def test_the_workflows_own_applied_policy_is_applied_again_without_adoption() -> None:
    wanted = build_pareto_policy(WORKFLOW, 5, {"front": [2]})
    existing = _existing(
        build_pareto_policy(WORKFLOW, 4, {"front": [1]}),
        managedFields=[
            {"manager": "compass-operator", "operation": "Apply", "fieldsV1": {"f:spec": {}}},
            {"manager": LEGACY_MANAGER, "operation": "Update", "fieldsV1": {"f:status": {}}},
        ],
    )
    apply = decide_policy_apply(existing, wanted, "uid-1")
    # Server-side apply: only the planned fields; what others set stays theirs.
    assert (apply.action, apply.body, apply.adopt) == (PolicyAction.APPLY, wanted, [])


def test_a_policy_written_by_replace_is_adopted_status_left_to_its_writer() -> None:
    spec_and_status = {"f:metadata": {"f:labels": {}}, "f:spec": {"f:front": {}}, "f:status": {}}
    person = {"manager": "kubectl-edit", "operation": "Update", "fieldsV1": {"f:spec": {}}}
    legacy = {
        "manager": LEGACY_MANAGER,
        "operation": "Update",
        "apiVersion": "compass.io/v1alpha1",
        "time": NOW,
        "fieldsType": "FieldsV1",
        "fieldsV1": spec_and_status,
    }
    existing = _existing(build_pareto_policy(WORKFLOW, 4, {}), managedFields=[legacy, person])
    ops = adoption_patch(existing)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[1]["path"] == "/metadata/managedFields"
    assert ops[1]["value"] == [
        {
            **legacy,
            "manager": "compass-operator",
            "operation": "Apply",
            "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {"f:front": {}}},
        },
        {**legacy, "fieldsV1": {"f:status": {}}},
        person,
    ]
    apply = decide_policy_apply(existing, build_pareto_policy(WORKFLOW, 5, {}), "uid-1")
    assert apply.adopt == ops


@pytest.mark.parametrize(
    ("owners", "labels"),
    [
        ([{"uid": "uid-other", "controller": True}], None),
        ([{"uid": "uid-1"}], {}),  # a plain owner reference, not the controller
        ([], {}),  # nobody's, and not from this workflow's plan
        ([], {WORKFLOW_LABEL: "other"}),
    ],
    ids=["another-controller", "not-controller", "no-owner", "another-workflows-plan"],
)
def test_a_policy_this_workflow_does_not_control_blocks_it(
    owners: list[dict[str, Any]], labels: dict[str, str] | None
) -> None:
    wanted = build_pareto_policy(WORKFLOW, 4, {"front": [1]})
    # Even one already as planned: it is someone else's to change.
    existing = _existing(wanted, ownerReferences=owners)
    if labels is not None:
        existing["metadata"]["labels"] = labels
    apply = decide_policy_apply(existing, wanted, "uid-1")
    assert (apply.action, apply.body, apply.reason) == (
        PolicyAction.BLOCKED,
        None,
        "PolicyConflict",
    )
    assert apply.message == (
        "ParetoPolicy rag exists and is not owned by this workflow; delete it or rename the "
        "workflow"
    )


def test_a_reviewed_plan_applied_by_hand_is_taken_when_auto_apply_turns_on() -> None:
    manifest = planned_policy("rag", "team", 4, {"front": [1]})
    assert "ownerReferences" not in manifest["metadata"]
    wanted = build_pareto_policy(WORKFLOW, 5, {"front": [1]})
    apply = decide_policy_apply(_existing(manifest), wanted, "uid-1")
    assert (apply.action, apply.body) == (PolicyAction.APPLY, wanted)


def test_a_missing_policy_crd_blocks_with_the_fix() -> None:
    apply = workflow_plan.policy_crd_missing()
    assert (apply.action, apply.reason) == (PolicyAction.BLOCKED, "PolicyCrdMissing")
    assert "paretopolicies.compass.io" in apply.message
    assert "install the ParetoPolicy CRD" in apply.message


def test_lost_state_searches_again() -> None:
    step = decide(_observe(Phase.PROFILING, None), NOW)
    assert step.create == (Create.STATE, Create.SEARCH_JOB)
    assert step.status is not None
    assert step.status.phase is Phase.SEARCHING


def test_inactive_or_unobserved_generations_are_left_alone() -> None:
    assert decide(_observe(Phase.READY, {}), NOW) == workflow_steps.Step()
    observation = _observe(Phase.SEARCHING, {})
    stale = GenerationObservation(
        **{**observation.__dict__, "status": CompoundWorkflowStatus(phase=Phase.SEARCHING)}
    )
    assert decide(stale, NOW) == workflow_steps.Step()


# ---------------------------------------------------------------------------- builders and commands.job


def test_each_workflows_jobs_run_as_an_account_of_their_own_that_goes_with_the_workflow() -> None:
    name = job_service_account_name("compass-job", WORKFLOW["metadata"]["name"])
    assert name == "compass-job-rag"
    account = build_job_service_account(WORKFLOW, name)
    assert account["metadata"]["name"] == name
    assert account["metadata"]["namespace"] == WORKFLOW["metadata"]["namespace"]
    assert account["metadata"]["labels"][WORKFLOW_LABEL] == "rag"
    # Owned by the workflow: the garbage collector deletes it with the workflow, and nothing
    # waits on it (no finalizers permission asked of the operator).
    [owner] = account["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "CompoundWorkflow",
        "rag",
        WORKFLOW["metadata"]["uid"],
    )
    assert owner["controller"] is True
    assert owner["blockOwnerDeletion"] is False
    # The Jobs run as it.
    job = build_search_job(WORKFLOW, _spec(), "compass:test", name)
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == name


def test_a_generations_role_may_only_get_and_patch_its_own_state_and_create_config_maps() -> None:
    spec = _spec()
    [state] = build_state_config_maps(WORKFLOW, spec)
    stored = {**state, "metadata": {**state["metadata"], "uid": "s1"}}
    role = build_job_role(stored, spec)
    name = "rag-search-g1"
    assert role["metadata"]["name"] == name
    by_name, create, slices, pods, replayed = role["rules"]
    assert by_name["verbs"] == ["get", "patch"]
    assert by_name["resources"] == ["configmaps"]
    assert by_name["resourceNames"] == [name] + [f"{name}-c{i}" for i in range(1, MAX_CHUNKS + 1)]
    # RBAC cannot narrow create by name: a rule of its own, on configmaps only.
    assert create == {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}
    # The profiling lists the Service's EndpointSlices (its ready pods), and may change none.
    assert slices == {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "verbs": ["list"],
    }
    # ...and reads each Pod they name, by name (never lists them): only a Pod of the namespace
    # at the slice's address is measured.
    assert pods == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
    # The replay evaluator's ledger (the spec's replayConfigMap) may be read, by name, only.
    assert replayed["verbs"] == ["get"]
    assert replayed["resourceNames"] == state_names("ledger")
    assert job_rules(name) == [by_name, create, slices, pods]  # other evaluators read no ledger
    binding = build_job_role_binding(stored, "compass-job-rag")
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "compass-job-rag", "namespace": "ml"}
    ]
    # Owned by the state, so collected with it (an old generation's, or the workflow's).
    for obj in (role, binding):
        [owner] = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("ConfigMap", name, "s1")
        assert obj["metadata"]["labels"] == state["metadata"]["labels"]


def test_jobs_get_the_triton_override_only_when_set() -> None:
    spec = _spec()
    search = build_search_job(WORKFLOW, spec, "img", "sa", job_env("10.0.0.1:8001"))
    env = {
        e["name"]: e["value"] for e in search["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["COMPASS_TRITON_ADDRESS"] == "10.0.0.1:8001"
    profile = build_profile_job(WORKFLOW, spec, "img", "sa", job_env(None))
    names = [e["name"] for e in profile["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert "COMPASS_TRITON_ADDRESS" not in names


@pytest.mark.parametrize(
    ("dataset", "volume", "path"),
    [
        (
            {"configMap": {"name": "qa", "key": "samples.jsonl"}},
            {"name": "dataset", "configMap": {"name": "qa"}},
            f"{DATASET_DIR}/samples.jsonl",
        ),
        (
            {"volume": {"claimName": "data", "path": "/sets/qa.jsonl"}},
            {"name": "dataset", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
            f"{DATASET_DIR}/sets/qa.jsonl",
        ),
        ({"imagePath": "/data/qa.jsonl"}, None, "/data/qa.jsonl"),
        ({}, None, None),
    ],
    ids=["configMap", "volume", "imagePath", "none"],
)
def test_the_search_job_mounts_the_dataset_where_compass_dataset_says(
    dataset: dict[str, Any], volume: dict[str, Any] | None, path: str | None
) -> None:
    spec = _spec(**{"evaluation.dataset": {"size": 100, **dataset}})
    pod = build_search_job(WORKFLOW, spec, "img", "sa")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env.get("COMPASS_DATASET") == path
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes.get("dataset") == volume
    if volume is None:
        assert "dataset" not in mounts
    else:
        assert mounts["dataset"] == {"name": "dataset", "mountPath": DATASET_DIR, "readOnly": True}


def test_job_pods_run_read_only_with_a_scratch_tmp_and_bounded_resources() -> None:
    """The image cannot be written (only /tmp, an emptyDir), and a search pod without
    resources given still has requests and a memory limit; given ones replace them."""
    spec = _spec()
    for job in (
        build_search_job(WORKFLOW, spec, "img", "sa"),
        build_profile_job(WORKFLOW, spec, "img", "sa"),
    ):
        pod = job["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
    search = build_search_job(WORKFLOW, spec, "img", "sa")
    resources = search["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == DEFAULT_SEARCH_RESOURCES
    given = {"limits": {"memory": "4Gi"}}
    search = build_search_job(WORKFLOW, _spec(**{"search.resources": given}), "img", "sa")
    assert search["spec"]["template"]["spec"]["containers"][0]["resources"] == given


def test_a_triton_service_in_another_namespace_is_routed_to_by_address() -> None:
    """A policy watches EndpointSlices in its own namespace only: elsewhere, the address."""
    spec = _spec(**{"triton.namespace": "serving"})
    assert routing_target(WORKFLOW, spec) == RoutingTarget(grpc_endpoint="triton.serving.svc:8001")
    assert routing_target(WORKFLOW, _spec()).service == "triton"


def test_metrics_url_is_tritons_metrics_port_on_its_grpc_host() -> None:
    assert metrics_url(WORKFLOW, _spec()) == "http://triton.ml.svc:8002/metrics"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"triton.namespace": "payments"}, "spec.triton.namespace"),
        ({"triton.service": "triton.payments.svc"}, "spec.triton.service"),
        ({"triton.service": "triton.example.com"}, "spec.triton.service"),
    ],
)
def test_a_triton_the_settings_do_not_allow_is_refused_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    """A workflow's policy switches its Triton: another namespace's only where the settings
    allow it, a host outside the cluster only where they list it."""
    spec = _spec(**change)
    with pytest.raises(InvalidSpecError) as error:
        authorize_workflow_targets(spec, "ml", TargetAccess())
    assert (error.value.field, error.value.reason) == (field, "TargetNotAllowed")
    assert "allowed" in str(error.value)
    status = invalid_status(CompoundWorkflowStatus(), 1, error.value, NOW)
    condition = find_condition(status.conditions, "SpecValid")
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "TargetNotAllowed")
    assert condition.message.startswith(f"{field}: ")
    allowed = TargetAccess(("triton.example.com",), ("payments",))
    authorize_workflow_targets(spec, "ml", allowed)


@pytest.mark.parametrize(
    ("change", "allowed", "field"),
    [
        ({"search.image": "evil.example/miner:1"}, [], "spec.search.image"),
        (
            {"profiling.image": "registry.local/other/x:1"},
            ["registry.local/eval/*"],
            "spec.profiling.image",
        ),
        ({"search.image": "registry.local/eval"}, ["registry.local/eval/*"], "spec.search.image"),
        ({"search.image": "registry.local/eval/scorer:2"}, ["registry.local/eval/*"], None),
        ({"search.image": "registry.local/scorer:2"}, ["registry.local/scorer:2"], None),
        ({"search.image": "anything:1"}, ["*"], None),
        ({"search.image": "img"}, [], None),
        ({}, [], None),
    ],
)
def test_job_images_are_the_operators_own_unless_the_settings_allow_more(
    change: dict[str, Any], allowed: list[str], field: str | None
) -> None:
    """A Job runs with a ServiceAccount that writes its state: the image is the operator's
    ("img") or one its settings list; a refusal names the field, ImageNotAllowed."""
    spec = _spec(**change)
    if field is None:
        authorize_images(spec, "img", allowed)
        return
    with pytest.raises(InvalidSpecError) as error:
        authorize_images(spec, "img", allowed)
    assert (error.value.field, error.value.reason) == (field, "ImageNotAllowed")
    assert "allowedJobImages" in str(error.value)


def test_a_metrics_url_of_another_namespace_is_refused_unless_the_settings_open_it() -> None:
    """The generated policy's queue would be read (any PromQL run) in another tenant's
    namespace: TargetNotAllowed on the workflow, naming the field and metricsNamespaces."""
    url = {"type": "prometheus", "url": "http://prometheus.team-b.svc:9090"}
    spec = _spec(**{"serving.metrics": url})
    with pytest.raises(InvalidSpecError) as error:
        authorize_workflow_targets(spec, "ml", TargetAccess())
    assert (error.value.field, error.value.reason) == (
        "spec.serving.metrics.url",
        "TargetNotAllowed",
    )
    assert "metricsNamespaces" in str(error.value)
    authorize_workflow_targets(spec, "ml", TargetAccess(metrics_namespaces=("team-b",)))


def test_a_triton_of_the_workflows_own_namespace_needs_no_setting() -> None:
    authorize_workflow_targets(_spec(), "ml", TargetAccess())
    authorize_workflow_targets(_spec(**{"triton.namespace": "ml"}), "ml", TargetAccess())
    authorize_workflow_targets(_spec(**{"triton.service": "triton.ml.svc"}), "ml", TargetAccess())


def test_pareto_policy_is_owned_by_its_workflow() -> None:
    policy = build_pareto_policy(WORKFLOW, 4, {"front": []})
    assert policy["kind"] == "ParetoPolicy"
    assert policy["metadata"]["name"] == "rag"
    assert policy["metadata"]["labels"]["compass.io/generation"] == "4"
    [owner] = policy["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["controller"], owner["blockOwnerDeletion"]) == (
        "uid-1",
        True,
        True,
    )


def test_error_line_uses_the_api_servers_message() -> None:
    class FakeApiError(Exception):
        status = 404
        reason = "Not Found"
        body = json.dumps({"message": 'configmaps "x" not found'})

    assert error_line(FakeApiError("(404)\nReason: Not Found\nHTTP...")) == (
        'FakeApiError: 404 Not Found: configmaps "x" not found'
    )
    assert error_line(ValueError("a\n  b")) == "ValueError: a b"
    # Bounded like a condition message, since the operator copies it into one.
    assert len(error_line(ValueError("y" * 5000))) == MESSAGE_CHARS


def test_best_accuracy_counts_configurations_with_enough_samples(tmp_path: Path) -> None:
    from compass.evaluators.ledger import CheckpointLedger

    ledger = CheckpointLedger(tmp_path / "ledger.jsonl")
    ledger.append({"g": "a"}, [0, 1], [1.0, 0.0])
    ledger.append({"g": "b"}, [0], [1.0])
    assert best_accuracy(ledger, 2) == 0.5
    assert best_accuracy(ledger, 1) == 1.0
    assert best_accuracy(ledger, 3) is None


# ---------------------------------------------------------------------------- metrics


def test_job_progress_counts_each_jobs_start_and_end_once() -> None:
    """A workflow's life, status write by status write: what the Job counters and the samples
    counter add at each (compass_workflow_searches_total, ..._profilings_total, ...)."""
    spec, size = validate_spec(_raw())
    empty = CompoundWorkflowStatus()
    started, _ = workflow_status.start_status(empty, "rag", 1, spec, size, {LEDGER_KEY: ""}, NOW)
    assert workflow_status.job_progress(empty, started) == (("search", "started"),)
    assert workflow_status.job_progress(started, started) == ()

    def step(status: CompoundWorkflowStatus, state: dict[str, str], **jobs: Any) -> Any:
        seen = _observe(status.phase, state, **jobs)
        return decide(GenerationObservation(**{**seen.__dict__, "status": status}), LATER).status

    progress = {"configs_evaluated": 3, "sample_evals": 30, "feasible": 1}
    running = JobView("rag-search-g1", active=1)
    searching = step(started, {PROGRESS_KEY: json.dumps(progress)}, search=running)
    assert workflow_status.job_progress(started, searching) == ()
    assert workflow_status.samples_evaluated(started, searching) == 30
    done = JobView("rag-search-g1")
    profiling = step(searching, {RESULT_KEY: _result([BEST], [BEST, WORSE])}, search=done)
    assert workflow_status.job_progress(searching, profiling) == (
        ("search", "succeeded"),
        ("profiling", "started"),
    )
    assert workflow_status.samples_evaluated(searching, profiling) == 10  # 40 in the result
    failed_job = JobView("rag-profile-g1", failed=1, failed_final=True, reason="DeadlineExceeded")
    failed = step(profiling, {RESULT_KEY: _result([BEST], [BEST])}, profile=failed_job)
    assert failed.phase is Phase.FAILED
    assert workflow_status.job_progress(profiling, failed) == (("profiling", "failed"),)
    # A new generation's search is a new Job; its carried-over samples were counted before.
    again, _ = workflow_status.start_status(failed, "rag", 2, spec, size, {LEDGER_KEY: ""}, NOW)
    assert workflow_status.job_progress(failed, again) == (("search", "started"),)
    assert workflow_status.samples_evaluated(failed, again) == 0


def test_reused_results_and_profiles_count_no_job() -> None:
    spec, size = validate_spec(_raw())
    seed = seed_state(spec, 2, {1: _state(spec, **FULL)})
    status, _ = workflow_status.start_status(
        CompoundWorkflowStatus(), "rag", 2, spec, size, seed, NOW
    )
    assert workflow_status.job_progress(CompoundWorkflowStatus(), status) == ()


def _profiles_with_curves(slo_ms: float) -> str:
    """PROFILES with a capacity curve on each member whose lowest rate reads 240 ms at p95,
    measured by a ladder told ``slo_ms``."""
    document = json.loads(PROFILES)
    for entry in document["profiles"]:
        points = [(10.0, 240.0, 10.0), (20.0, 400.0, 20.0), (40.0, 5000.0, 25.0)]
        entry["capacity"] = {
            "servers": 1,
            "slo_ms": slo_ms,
            "points": [
                {
                    "offered_qps": rate,
                    "throughput_qps": served,
                    "latency_mean_ms": p95 * 0.7,
                    "latency_p50_ms": p95 * 0.6,
                    "latency_p95_ms": p95,
                    "latency_p99_ms": p95 * 1.3,
                }
                for rate, p95, served in points
            ],
        }
    return json.dumps(document)


def test_a_curve_measured_for_a_looser_slo_is_planned_with_a_warning_naming_the_fix() -> None:
    """The ladder halved each curve's low end for 250 ms (the SLO 300 ms less the 50 ms slack
    buffer): that plan and a looser one say nothing; a tighter SLO (200 ms: 150 ms) under the
    lowest rate's 240 ms names each member, both budgets and the re-profile."""
    measured = {"serving.thresholdModel": "measured", "serving.hysteresis.slackBufferMs": 50}
    profiles = _profiles_with_curves(250.0)
    routing = RoutingTarget(service="triton")
    spec = _spec(**measured)
    assert workflow_plan.ladder_budget_ms(spec) == 250.0
    for slo in (300, 400):
        outcome = workflow_plan.plan_policy(
            _spec(**measured, **{"slo.latencyMs": slo}), profiles, routing, ""
        )
        assert outcome.policy_spec is not None
        assert "warning" not in outcome.message
    tighter = workflow_plan.plan_policy(
        _spec(**measured, **{"slo.latencyMs": 200}), profiles, routing, ""
    )
    assert tighter.policy_spec is not None
    assert tighter.message.count("capacity curve was measured for 250 ms") == 2
    assert "small/5's capacity curve" in tighter.message
    assert "the plan reads it at 150 ms" in tighter.message
    assert "re-profile" in tighter.message
    # The ParetoPolicy carries the budget each curve was measured for.
    assert tighter.policy_spec["front"][0]["capacity"]["sloMs"] == 250.0
    # Curves without a budget (measured before the ladder knew the SLO) halved regardless.
    older = json.loads(profiles)
    for entry in older["profiles"]:
        del entry["capacity"]["slo_ms"]
    untold = workflow_plan.plan_policy(
        _spec(**measured, **{"slo.latencyMs": 200}), json.dumps(older), routing, ""
    )
    assert untold.policy_spec is not None
    assert "warning" not in untold.message
