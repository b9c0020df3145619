"""kopf handlers of CompoundWorkflow: thin adapters to the pure workflow_* decisions."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes import client

from compass.api.compoundworkflow import CompoundWorkflowSpec, CompoundWorkflowStatus, Phase
from compass.api.meta import GROUP, POLICY_PLURAL, VERSION, WORKFLOW_KIND, WORKFLOW_PLURAL
from compass.api.schema import without_empty_strings
from compass.controllers import kubeapi
from compass.controllers.builders import (
    WORKFLOW_LABEL,
    build_pareto_policy,
    build_profile_job,
    build_search_job,
    job_env,
    metrics_url,
    policy_name,
    profile_name,
    routing_target,
    search_name,
)
from compass.controllers.conditions import Event
from compass.controllers.job_pod_limits import authorize_job_pods
from compass.controllers.ledgerbudget import MIB, LedgerBudgetBusyError
from compass.controllers.ledgerchunks import text_limit
from compass.controllers.runtime import OperatorMetrics, runtime_of
from compass.controllers.settings import OperatorSettings
from compass.controllers.workflow_access import (
    ACCESS_KEY,
    FOREIGN_RBAC_RETRY_S,
    ForeignJobAccessError,
    ensure_job_access,
    ensure_service_account,
    job_account,
    keep_job_access,
)
from compass.controllers.workflow_configmaps import (
    create_state,
    created_states,
    delete_states,
    generation_of,
    owned,
    read_states,
)
from compass.controllers.workflow_plan import (
    PolicyAction,
    PolicyApply,
    decide_policy_apply,
    policy_crd_missing,
)
from compass.controllers.workflow_spec import (
    InvalidSpecError,
    authorize_images,
    authorize_workflow_targets,
    parse_spec,
    validate_spec,
)
from compass.controllers.workflow_state import (
    StateNameTakenError,
    StoredState,
    refusal_message,
    seed_state,
    seedable,
    state_recogniser,
)
from compass.controllers.workflow_status import (
    ACTIVE_PHASES,
    invalid_status,
    job_progress,
    ledger_unread_status,
    samples_evaluated,
    start_status,
)
from compass.controllers.workflow_steps import (
    Create,
    GenerationObservation,
    decide,
    job_view,
    pod_failure_message,
    policy_blocked,
)

# kopf fixes a timer's interval when the handler is registered (at import): the one setting
# read here; everything else comes from the process's Runtime (kopf's memo).
POLL_INTERVAL_S = OperatorSettings().poll_interval_seconds
# Attempts of a read-decide-write cycle that lost to a concurrent write before giving up
# (kopf then retries the handler).
_WRITE_ATTEMPTS = 5
# How often a generation whose state's name another ConfigMap holds looks again.
STATE_TAKEN_RETRY_S = 10

LOG = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- operator set-up


# The policies' too (handlers.py loads both): a 1 s timer would post 'Timer succeeded' each second.
@kopf.on.startup(id="workflow-startup")
def configure_workflows(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Events on transitions only (kopf.event), never kopf's log lines ('Handler succeeded')."""
    settings.posting.loggers = False
    runtime_of(memo)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write_status(
    api: client.ApiClient, workflow: Mapping[str, Any], status: CompoundWorkflowStatus
) -> bool:
    """Merge-patch the status if the workflow is unchanged since read (False: decide again)."""
    metadata = workflow["metadata"]
    wire = without_empty_strings(status.model_dump(mode="json", by_alias=True))
    return kubeapi.patch_status(
        client.CustomObjectsApi(api).patch_namespaced_custom_object_status,
        GROUP,
        VERSION,
        metadata["namespace"],
        WORKFLOW_PLURAL,
        metadata["name"],
        body={"metadata": {"resourceVersion": metadata["resourceVersion"]}, "status": wire},
    )


def _read_workflow(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = kubeapi.read(
        client.CustomObjectsApi(api).get_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        WORKFLOW_PLURAL,
        name,
    )
    return found


def _status_of(body: Mapping[str, Any]) -> CompoundWorkflowStatus:
    known = set(CompoundWorkflowStatus.model_fields) | {
        f.alias for f in CompoundWorkflowStatus.model_fields.values() if f.alias
    }
    raw = {k: v for k, v in dict(body.get("status") or {}).items() if k in known}
    return CompoundWorkflowStatus.model_validate(raw)


def _post(body: Mapping[str, Any], event: Event | None) -> None:
    if event is not None:
        kopf.event(
            kopf.Body(cast(kopf.RawBody, dict(body))),
            type=event.type,
            reason=event.reason,
            message=event.message,
        )


def _count(
    metrics: OperatorMetrics,
    workflow: Mapping[str, Any],
    before: CompoundWorkflowStatus,
    after: CompoundWorkflowStatus,
) -> None:
    """Count the Jobs started and ended, and the samples evaluated, by a written status."""
    metadata = workflow["metadata"]
    metrics.count_workflow(
        metadata["namespace"],
        metadata["name"],
        str(metadata.get("uid", "")),
        job_progress(before, after),
        samples_evaluated(before, after),
    )


@kopf.on.event(GROUP, VERSION, WORKFLOW_PLURAL, id="forget-workflow-series")
def forget_deleted_workflow(
    type: str,
    namespace: str | None,
    name: str | None,
    uid: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A deleted workflow's series go (watched: no finalizer blocks the delete); any other event
    exports its phase, so an alert on a Failed workflow outlives a restart."""
    if not name:
        return
    metrics = runtime_of(memo).metrics
    if type == "DELETED":
        metrics.forget_workflow(namespace or "", name, uid or "")
        return
    phase = str(dict(body.get("status") or {}).get("phase") or Phase.PENDING.value)
    if phase in {each.value for each in Phase}:
        metrics.set_workflow_phase(namespace or "", name, uid or "", Phase(phase))


def _jobs(api: client.ApiClient, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
    """This workflow's Jobs, of every generation."""
    jobs = kubeapi.list_items(
        client.BatchV1Api(api).list_namespaced_job,
        namespace,
        label_selector=f"{WORKFLOW_LABEL}={name}",
    )
    return owned(jobs, uid)


def _supersede(api: client.ApiClient, namespace: str, name: str, uid: str, generation: int) -> None:
    """Delete this workflow's Jobs of other generations (their pods with them)."""
    batch = client.BatchV1Api(api)
    for job in _jobs(api, namespace, name, uid):
        if generation_of(job) != generation and not job["metadata"].get("deletionTimestamp"):
            kubeapi.delete(
                batch.delete_namespaced_job,
                job["metadata"]["name"],
                namespace,
                propagation_policy="Background",
            )


def _create_job(
    api: client.ApiClient,
    body: Mapping[str, Any],
    spec: CompoundWorkflowSpec,
    which: Create,
    settings: OperatorSettings,
    memo: MutableMapping[str, Any],
) -> None:
    # Every Job starts with its access: an account, or a Role, lost or refused earlier is made
    # (or refused) now.
    account = job_account(settings, body)
    ensure_service_account(api, body, account)
    memo[ACCESS_KEY] = ensure_job_access(api, body, spec, account)
    build = build_search_job if which is Create.SEARCH_JOB else build_profile_job
    job = build(
        body,
        spec,
        settings.image,
        account,
        job_env(settings.triton_address_override),
        settings.job_image_pull_secrets,
    )
    batch = client.BatchV1Api(api)
    metadata = body["metadata"]
    kubeapi.create_or_adopt(
        batch.create_namespaced_job,
        batch.read_namespaced_job,
        metadata["namespace"],
        job,
        metadata["uid"],
    )


@contextlib.contextmanager
def _waiting_on_others(workflow: Mapping[str, Any]) -> Iterator[None]:
    """Retry later while another's Job account or Role (a Warning Event naming it and the fix),
    or an earlier owner of a name, being collected, holds what the workflow needs."""
    try:
        yield
    except ForeignJobAccessError as error:
        message = (
            f"{error} in namespace {workflow['metadata']['namespace']}: the Jobs will not run "
            "with it; delete it (for the ServiceAccount, or set the operator's "
            "jobServiceAccount (Helm value) to a free prefix)"
        )
        _post(workflow, Event("Warning", "ForeignJobAccount", message))
        raise kopf.TemporaryError(message, delay=FOREIGN_RBAC_RETRY_S) from None
    except kubeapi.OwnedByAnotherError as error:
        raise kopf.TemporaryError(
            f"{error}, an earlier owner of this name: waiting for the garbage collector to "
            "delete it",
            delay=5,
        ) from None


def _refuse_taken(
    api: client.ApiClient,
    workflow: Mapping[str, Any],
    status: CompoundWorkflowStatus,
    generation: int,
    error: StateNameTakenError,
    now: str,
) -> kopf.TemporaryError:
    """Retry later, with LedgerRead False and a Warning naming the ConfigMap holding the name."""
    message = str(error)
    refused = ledger_unread_status(status, message, generation, now, taken=True)
    if refused != status:
        _write_status(api, workflow, refused)
        _post(workflow, Event("Warning", "StateNameTaken", message))
    return kopf.TemporaryError(message, delay=STATE_TAKEN_RETRY_S)


# ---------------------------------------------------------------------------- starting a generation


@kopf.on.resume(GROUP, VERSION, WORKFLOW_PLURAL)
@kopf.on.create(GROUP, VERSION, WORKFLOW_PLURAL)
@kopf.on.update(GROUP, VERSION, WORKFLOW_PLURAL, field="spec")
def start_generation(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Make the current spec generation run: idempotent, so a restart may call it again."""
    assert namespace is not None  # a namespaced resource
    runtime = runtime_of(memo)
    metrics = runtime.metrics
    count = metrics.reconciles
    try:
        for _attempt in range(_WRITE_ATTEMPTS):
            # A fresh read each attempt: the decision must rest on what the write will check.
            current = _read_workflow(runtime.api(), namespace, name)
            if current is None or _start(runtime.api(), current, runtime.settings, memo, metrics):
                count.labels(WORKFLOW_KIND, "ok").inc()
                return
    except kopf.PermanentError:
        count.labels(WORKFLOW_KIND, "permanent").inc()
        runtime.metrics.errors.labels(WORKFLOW_KIND, "InvalidSpec").inc()
        raise
    count.labels(WORKFLOW_KIND, "retry").inc()
    raise kopf.TemporaryError("the workflow kept changing while its status was written", delay=2)


def _authorize(spec: CompoundWorkflowSpec, namespace: str, settings: OperatorSettings) -> None:
    """InvalidSpecError naming the field if the settings refuse a target, an image or the pods."""
    authorize_workflow_targets(spec, namespace, settings.target_access())
    authorize_images(spec, settings.image, settings.allowed_job_images)
    authorize_job_pods(spec, settings.job_pod_limits())


def _start(
    api: client.ApiClient,
    workflow: dict[str, Any],
    settings: OperatorSettings,
    memo: MutableMapping[str, Any],
    metrics: OperatorMetrics,
) -> bool:
    """One read-decide-write attempt; False when the status write lost a race."""
    metadata = workflow["metadata"]
    name, namespace, uid = metadata["name"], metadata["namespace"], metadata["uid"]
    generation = int(metadata.get("generation", 1))
    status = _status_of(workflow)
    now = _now()
    try:
        spec, space_size = validate_spec(workflow.get("spec") or {})
        _authorize(spec, namespace, settings)
    except InvalidSpecError as error:
        _supersede(api, namespace, name, uid, generation)
        new = invalid_status(status, generation, error, now)
        if new != status:
            if not _write_status(api, workflow, new):
                return False
            _post(workflow, Event("Warning", error.reason, str(error)))
        raise kopf.PermanentError(str(error)) from None
    with _waiting_on_others(workflow):
        ensure_service_account(api, workflow, job_account(settings, workflow))
    if status.observed_generation == generation and status.phase is not Phase.PENDING:
        return True  # already started; the timer carries it on
    # Older generations' Jobs go first, so that they stop writing to the ledgers seeded from.
    _supersede(api, namespace, name, uid, generation)
    # The bound is the operator's as well as the workflow's, and every start's together hold
    # no more than the budget: no tenant's ConfigMaps can grow the operator past them.
    limit = min(
        text_limit(space_size, spec.evaluation.dataset.size),
        settings.ledger_text_limit_mib * MIB,
    )
    try:
        with _waiting_on_others(workflow), runtime_of(memo).ledger_budget().reserve(limit):
            new, event, states = _start_state(
                api, workflow, spec, space_size, status, memo, limit, now
            )
            if new.search_job is not None:
                _create_job(api, workflow, spec, Create.SEARCH_JOB, settings, memo)
    except LedgerBudgetBusyError as error:
        raise kopf.TemporaryError(f"waiting to read the ledger: {error}", delay=5) from None
    except StateNameTakenError as error:
        raise _refuse_taken(api, workflow, status, generation, error, now) from None
    if not _write_status(api, workflow, new):
        return False
    _count(metrics, workflow, status, new)
    delete_states(api, namespace, generation, states)
    _post(workflow, event)
    return True


def _start_state(
    api: client.ApiClient,
    workflow: dict[str, Any],
    spec: CompoundWorkflowSpec,
    space_size: int,
    status: CompoundWorkflowStatus,
    memo: MutableMapping[str, Any],
    limit: int,
    now: str,
) -> tuple[CompoundWorkflowStatus, Event, dict[int, StoredState]]:
    """The generation's (seeded) state and starting status; the states found, to delete."""
    name = workflow["metadata"]["name"]
    generation = int(workflow["metadata"].get("generation", 1))
    listing = read_states(api, workflow, status, memo, limit)
    if search_name(name, generation) in listing.taken:
        # Refused before anything is reported: the condition names it, every retry alike.
        raise StateNameTakenError(search_name(name, generation))
    refused = refusal_message(name, listing)
    if refused is not None:  # what a start refused of the states (not carried over)
        LOG.warning(refused)
        _post(workflow, Event("Warning", "LedgerRefused", refused))
    states = listing.states
    if generation not in states:
        seed = seed_state(spec, generation, seedable(states))
        create_state(api, workflow, spec, memo, seed)
        del seed  # its ledger is in the ConfigMap now: not held twice while re-reading
        # Re-read: if a racing start made it first, its ledger is what counts.
        states = read_states(api, workflow, status, memo, limit).states
    own = states.get(generation)
    state = own.data if own is not None else {}
    new, event = start_status(status, name, generation, spec, space_size, state, now)
    new = new.model_copy(update={"ledger_config_map_uid": own.uid if own else None})
    if refused is not None:
        new = ledger_unread_status(new, refused, generation, now)
    return new, event, states


# ---------------------------------------------------------------------------- progress and transitions

_SPEC_KEY = "compass_workflow_spec"


def _spec_of(
    memo: MutableMapping[str, Any], generation: int, raw: Mapping[str, Any]
) -> CompoundWorkflowSpec:
    """The generation's spec, parsed once in the memo (start_generation validated it already)."""
    cached = memo.get(_SPEC_KEY)
    if cached is None or cached[0] != generation:
        cached = memo[_SPEC_KEY] = (generation, parse_spec(raw))
    spec: CompoundWorkflowSpec = cached[1]
    return spec


def _is_active(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") in {p.value for p in ACTIVE_PHASES}


@kopf.timer(
    GROUP, VERSION, WORKFLOW_PLURAL, id="advance", interval=POLL_INTERVAL_S, when=_is_active
)
def advance(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Read the generation's state and Jobs; take the step decide returns."""
    assert namespace is not None  # a namespaced resource
    runtime = runtime_of(memo)
    try:
        result = _advance(runtime.api(), namespace, name, runtime.settings, memo, runtime.metrics)
    except Exception as error:
        runtime.metrics.errors.labels(WORKFLOW_KIND, type(error).__name__).inc()
        raise
    runtime.metrics.reconciles.labels(WORKFLOW_KIND, result).inc()


def _advance(
    api: client.ApiClient,
    namespace: str,
    name: str,
    settings: OperatorSettings,
    memo: MutableMapping[str, Any],
    metrics: OperatorMetrics,
) -> str:
    """One read-decide-act cycle: "ok", "idle" (nothing to do) or "conflict" (decide again)."""
    workflow = _read_workflow(api, namespace, name)
    if workflow is None:
        return "idle"
    metadata = workflow["metadata"]
    generation = int(metadata.get("generation", 1))
    status = _status_of(workflow)
    if status.observed_generation != generation:
        return "idle"  # start_generation has not taken this generation yet
    spec = _spec_of(memo, generation, workflow.get("spec") or {})
    # Started under these settings already; checked again so that none reaches a Job or policy.
    _authorize(spec, namespace, settings)
    uid = metadata["uid"]
    core = client.CoreV1Api(api)
    state_map = kubeapi.read(
        core.read_namespaced_config_map, search_name(name, generation), namespace
    )
    mine = state_recogniser(
        status.ledger_config_map, status.ledger_config_map_uid, created_states(memo)
    )
    if state_map is not None and not mine(state_map):
        state_map = None  # another's under the state's name: never read (creating it refuses)
    jobs = {
        job["metadata"]["name"]: job_view(job)
        for job in _jobs(api, namespace, name, uid)
        if generation_of(job) == generation
    }
    search_job = jobs.get(search_name(name, generation))
    profile_job = jobs.get(profile_name(name, generation))
    current = search_job if status.phase is Phase.SEARCHING else profile_job
    pod_message = None
    if current is not None and current.failed_final:
        pods = kubeapi.list_items(
            core.list_namespaced_pod, namespace, label_selector=f"job-name={current.name}"
        )
        pod_message = pod_failure_message(pods)
    observation = GenerationObservation(
        workflow=name,
        generation=generation,
        spec=spec,
        status=status,
        state=None if state_map is None else dict(state_map.get("data") or {}),
        search_job=search_job,
        profile_job=profile_job,
        pod_message=pod_message,
        routing=routing_target(workflow, spec),
        metrics_url=metrics_url(workflow, spec),
        namespace=namespace,
    )
    now = _now()
    step = decide(observation, now)
    new, event = step.status, step.event
    try:
        with _waiting_on_others(workflow):
            for which in step.create:
                if which is Create.STATE:
                    made = create_state(api, workflow, spec, memo)
                    if new is not None:
                        new = new.model_copy(update={"ledger_config_map_uid": made})
                else:
                    _create_job(api, workflow, spec, which, settings, memo)
            if not step.create and current is not None and current.running and state_map:
                keep_job_access(api, workflow, spec, settings, memo, state_map)
    except StateNameTakenError as error:
        raise _refuse_taken(api, workflow, status, generation, error, _now()) from None
    if step.policy_spec is not None:
        applied = _apply_policy(api, workflow, generation, step.policy_spec)
        if applied.action is PolicyAction.BLOCKED:
            new, event = policy_blocked(observation, applied.reason, applied.message, now)
            if new == status:
                return "idle"
    if new is None:
        return "ok" if step.create else "idle"
    if not _write_status(api, workflow, new):
        return "conflict"
    _count(metrics, workflow, status, new)
    _post(workflow, event)
    return "ok"


def _apply_policy(
    api: client.ApiClient,
    workflow: Mapping[str, Any],
    generation: int,
    policy_spec: Mapping[str, Any],
) -> PolicyApply:
    """Server-side apply the ParetoPolicy as decide_policy_apply says; what was done."""
    custom = client.CustomObjectsApi(api)
    metadata = workflow["metadata"]
    namespace, name = metadata["namespace"], policy_name(metadata["name"])
    wanted = build_pareto_policy(workflow, generation, policy_spec)
    where = (GROUP, VERSION, namespace, POLICY_PLURAL, name)
    # None also when the API server does not serve ParetoPolicies: the apply then says so.
    existing = kubeapi.read(custom.get_namespaced_custom_object, *where)
    apply = decide_policy_apply(existing, wanted, metadata["uid"])
    if apply.action is PolicyAction.BLOCKED:
        return apply
    assert apply.body is not None
    patch = custom.patch_namespaced_custom_object
    # A patch the server refuses as invalid raises PatchRefusedError: an error kopf logs and
    # retries on its own backoff, not every second.
    if apply.adopt and not kubeapi.json_patch(patch, *where, ops=apply.adopt):
        assert existing is not None  # adopt is only given for an existing policy
        now = kubeapi.read(custom.get_namespaced_custom_object, *where)
        tested = existing["metadata"]["resourceVersion"]
        if now is not None and now["metadata"]["resourceVersion"] == tested:
            # Unchanged, yet refused: the patch itself cannot apply, and never will.
            raise kubeapi.PatchRefusedError(
                status=422,
                reason=f"ParetoPolicy {name}: taking over the fields an older operator wrote "
                "was refused though the policy is unchanged",
            )
        # Changed (or deleted) since it was read: decide again on a fresh read.
        raise kopf.TemporaryError(
            f"ParetoPolicy {name}: taking over the fields an older operator wrote was refused "
            "(changed since it was read); trying again",
            delay=1,
        )
    try:
        kubeapi.apply(patch, *where, body=apply.body)
    except kubeapi.NotFoundError:  # the resource type itself is unknown
        return policy_crd_missing()
    return apply
