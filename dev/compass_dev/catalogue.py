"""What the operator tells the world, in one place: its Events and its conditions' reasons
(hack/gen_observability.py documents them; tests/repo/test_observability.py checks both ways)."""

from __future__ import annotations

from dataclasses import dataclass

from compass.api.compoundworkflow import WorkflowConditionType
from compass.api.meta import POLICY_KIND, WORKFLOW_KIND
from compass.api.paretopolicy_status import ConditionType
from compass.controllers.job_pod_limits import REASON as JOB_POD_REFUSED
from compass.controllers.metricsauth import REASON as METRICS_CREDENTIALS


@dataclass(frozen=True)
class EventEntry:
    """One Event reason: on which kind, Normal or Warning, and when it is posted."""

    kind: str
    reason: str
    type: str
    when: str


@dataclass(frozen=True)
class ConditionEntry:
    """One reason a condition type is set with, and what it means."""

    kind: str
    type: str
    status: str
    reason: str
    meaning: str


P, W = POLICY_KIND, WORKFLOW_KIND

EVENTS: tuple[EventEntry, ...] = (
    EventEntry(P, "ConfigurationSwitched", "Normal", "Elastico switched: `FROM -> TO: why`"),
    EventEntry(P, "MetricsLost", "Warning", "MetricsAvailable turned False (missing or stale)"),
    EventEntry(P, "MetricsRestored", "Normal", "MetricsAvailable turned True again"),
    EventEntry(P, "TritonUnreachable", "Warning", "Ready turned False: no router answered"),
    EventEntry(P, "TritonReachable", "Normal", "Ready turned True after TritonUnreachable"),
    EventEntry(P, "SwitchFailed", "Warning", "Ready turned False: a decided switch failed"),
    EventEntry(P, "InvalidSpec", "Warning", "the spec can never work: the field and the fix"),
    EventEntry(P, "TargetNotAllowed", "Warning", "a host or namespace the settings refuse"),
    EventEntry(P, "EndpointsRefused", "Warning", "slice addresses not this namespace's Pods"),
    EventEntry(P, "TargetClaimed", "Warning", "Ready turned False: an older policy has it"),
    EventEntry(P, "PodsLagging", "Warning", "pods do not serve the active configuration"),
    EventEntry(P, "WouldSwitch", "Normal", "advisory: the switch it would make, not made"),
    EventEntry(P, "PodsServing", "Normal", "every ready pod serves it again"),
    EventEntry(P, "InvalidPauseAnnotation", "Warning", "compass.io/paused is not true/false"),
    EventEntry(W, "SearchStarted", "Normal", "a generation's search Job starts (or is reused)"),
    EventEntry(W, "SearchStarted", "Warning", "the state ConfigMap was lost: searching again"),
    EventEntry(W, "SearchSucceeded", "Normal", "the search ended with a feasible set: profiling"),
    EventEntry(W, "SearchFailed", "Warning", "the search Job failed, or wrote no result"),
    EventEntry(W, "FeasibleSetEmpty", "Warning", "no configuration reaches tau: the best one"),
    EventEntry(W, "ProfilingFailed", "Warning", "the profiling Job failed, or wrote no profiles"),
    EventEntry(W, "PlanningStarted", "Normal", "a generation reuses the profiles: planning"),
    EventEntry(W, "PlanFailed", "Warning", "no plan from the profiles (e.g. SLO unreachable)"),
    EventEntry(W, "PolicyReady", "Normal", "the ParetoPolicy is written"),
    EventEntry(W, "PolicyPlanned", "Normal", "autoApply false: the plan in status, how to apply"),
    EventEntry(W, "PolicyConflict", "Warning", "a ParetoPolicy of that name is not this one's"),
    EventEntry(W, "PolicyCrdMissing", "Warning", "the API server does not serve ParetoPolicies"),
    EventEntry(W, "InvalidSpec", "Warning", "the spec can never work: the field and the fix"),
    EventEntry(W, "TargetNotAllowed", "Warning", "a host or namespace the settings refuse"),
    EventEntry(W, "ImageNotAllowed", "Warning", "a Job image the settings do not allow"),
    EventEntry(W, JOB_POD_REFUSED, "Warning", "a Job pod's placement or size the settings refuse"),
    EventEntry(W, "ForeignJobAccount", "Warning", "the Jobs' ServiceAccount or Role is another's"),
    EventEntry(
        W, "LedgerRefused", "Warning", "a state's ledger passes what it can record: dropped"
    ),
    EventEntry(W, "StateNameTaken", "Warning", "another's ConfigMap holds the state's name"),
)

_PR, _PM, _PD, _PP, _PS, _PB = (
    ConditionType.READY.value,
    ConditionType.METRICS_AVAILABLE.value,
    ConditionType.DEGRADED.value,
    ConditionType.PAUSED.value,
    ConditionType.PODS_SERVING.value,
    ConditionType.PER_REQUEST_BINDING.value,
)
_WR, _WV, _WS, _WE, _WP, _WY, _WL = (
    WorkflowConditionType.READY.value,
    WorkflowConditionType.SPEC_VALID.value,
    WorkflowConditionType.SEARCH_SUCCEEDED.value,
    WorkflowConditionType.FEASIBLE_SET_EMPTY.value,
    WorkflowConditionType.PROFILED.value,
    WorkflowConditionType.POLICY_READY.value,
    WorkflowConditionType.LEDGER_READ.value,
)

CONDITIONS: tuple[ConditionEntry, ...] = (
    ConditionEntry(P, _PR, "True", "Serving", "in control of the routing"),
    ConditionEntry(P, _PR, "True", "Paused", "spec.paused or the annotation: holding it"),
    ConditionEntry(P, _PR, "True", "Advisory", "spec.mode advisory: deciding, switching nothing"),
    ConditionEntry(P, _PR, "False", "MetricsUnavailable", "the queue depth is missing or stale"),
    ConditionEntry(P, _PR, "False", METRICS_CREDENTIALS, "the metrics Secret cannot be read"),
    ConditionEntry(P, _PR, "False", "TargetClaimed", "an older policy switches this target"),
    ConditionEntry(P, _PR, "False", "TritonUnreachable", "no router answered; retrying"),
    ConditionEntry(P, _PR, "False", "SwitchFailed", "a decided switch failed"),
    ConditionEntry(P, _PR, "False", "InvalidSpec", "the spec can never work"),
    ConditionEntry(P, _PR, "False", "TargetNotAllowed", "the operator's settings refuse a target"),
    ConditionEntry(P, _PM, "True", "MetricsRead", "the queue depth is read and fresh"),
    ConditionEntry(P, _PM, "False", "MetricsUnavailable", "missing, or older than staleAfter"),
    ConditionEntry(P, _PM, "False", METRICS_CREDENTIALS, "the metrics Secret cannot be read"),
    ConditionEntry(P, _PD, "False", "AsPlanned", "nothing keeps the plan from being served"),
    ConditionEntry(P, _PD, "True", "(Ready's reason)", "as Ready=False says"),
    ConditionEntry(P, _PP, "True", "PausedBySpec", "spec.paused"),
    ConditionEntry(P, _PP, "True", "PausedByAnnotation", "the compass.io/paused annotation"),
    ConditionEntry(P, _PP, "False", "InvalidPauseAnnotation", "neither true nor false: not paused"),
    ConditionEntry(P, _PP, "False", "Active", "deciding every interval"),
    ConditionEntry(P, _PS, "True", "AllPodsServing", "every ready pod serves the active one"),
    ConditionEntry(P, _PS, "False", "PodsLagging", "the pods that do not, and why"),
    ConditionEntry(P, _PB, "True", "BindingPerRequest", "every pod binds each request, gated"),
    ConditionEntry(P, _PB, "False", "RoutersNotGated", "pods bind only requests with deadlines"),
    ConditionEntry(P, _PB, "False", "RoutersDoNotBind", "an older router: whole workflow there"),
    ConditionEntry(P, _PB, "False", "GateSlotsDiffer", "routers run other slots than the plan"),
    ConditionEntry(P, _PB, "False", "WholeWorkflow", "binding.mode workflow"),
    ConditionEntry(W, _WR, "True", "PolicyReady", "the ParetoPolicy serves the planned front"),
    ConditionEntry(W, _WR, "False", "(the phase)", "Searching, Profiling, Planning: working"),
    ConditionEntry(W, _WR, "False", "AwaitingReview", "Planned: status.plannedPolicy waits"),
    ConditionEntry(W, _WR, "False", "(the failing reason)", "the failed condition's reason"),
    ConditionEntry(W, _WV, "True", "Valid", "the spec is valid"),
    ConditionEntry(W, _WV, "False", "InvalidSpec", "the field and the fix"),
    ConditionEntry(W, _WV, "False", "TargetNotAllowed", "a target the settings refuse"),
    ConditionEntry(W, _WV, "False", "ImageNotAllowed", "a Job image the settings refuse"),
    ConditionEntry(W, _WV, "False", JOB_POD_REFUSED, "a toleration, node or size past jobPods"),
    ConditionEntry(W, _WS, "Unknown", "Searching", "the search Job runs"),
    ConditionEntry(W, _WS, "True", "FeasibleFound", "searched; the feasible set is not empty"),
    ConditionEntry(W, _WS, "True", "Completed", "searched; nothing reaches tau"),
    ConditionEntry(W, _WS, "True", "Reused", "the result of an earlier generation"),
    ConditionEntry(W, _WS, "False", "(the Job's reason)", "e.g. BackoffLimitExceeded; JobFailed"),
    ConditionEntry(W, _WS, "False", "NoResult", "the Job completed without a result"),
    ConditionEntry(W, _WE, "True", "NoConfigurationReachesTau", "the best accuracy, a tau"),
    ConditionEntry(W, _WE, "False", "FeasibleFound", "some configuration reaches tau"),
    ConditionEntry(W, _WP, "Unknown", "Profiling", "the profiling Job runs (curve progress)"),
    ConditionEntry(W, _WP, "True", "Profiled", "latency measured on the Triton pods"),
    ConditionEntry(W, _WP, "True", "Reused", "the profiles of an earlier generation"),
    ConditionEntry(W, _WP, "False", "(the Job's reason)", "e.g. DeadlineExceeded; JobFailed"),
    ConditionEntry(W, _WP, "False", "NoProfiles", "the Job completed without profiles"),
    ConditionEntry(W, _WP, "False", "InvalidProfiles", "the profiles could not be read"),
    ConditionEntry(W, _WY, "True", "PolicyReady", "the ParetoPolicy is written"),
    ConditionEntry(W, _WY, "False", "FeasibleSetEmpty", "nothing to plan"),
    ConditionEntry(W, _WY, "False", "ProfilingFailed", "no profiles to plan from"),
    ConditionEntry(W, _WY, "False", "SloUnreachable", "no configuration meets the SLO"),
    ConditionEntry(W, _WY, "False", "InvalidProfiles", "the profiles could not be read"),
    ConditionEntry(W, _WY, "False", "PolicyConflict", "a ParetoPolicy of that name is another's"),
    ConditionEntry(W, _WY, "False", "PolicyCrdMissing", "the ParetoPolicy CRD is not installed"),
    ConditionEntry(W, _WY, "False", "AwaitingReview", "autoApply false: not applied"),
    ConditionEntry(W, _WL, "False", "StateRefused", "state ConfigMaps not read, named; not kept"),
    ConditionEntry(W, _WL, "False", "StateNameTaken", "another's ConfigMap holds the state's name"),
)
