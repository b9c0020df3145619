"""The search and profiling Jobs' pods: where they run, what they pull with, what they hold, and
which Triton they measure; the resources they hold are Kubernetes quantities, checked alike by
the model and by the CRD's schema (apiserver_checks.py; tests/k8s asks a real API server)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from apiserver_checks import schema_errors, spec_schema

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.crds import COMPOUND_WORKFLOW
from compass.api.jobpod import MAX_AFFINITY_CHARS, Resources
from compass.controllers.builders import (
    DEFAULT_SEARCH_RESOURCES,
    build_profile_job,
    build_search_job,
    evaluated_spec,
    routing_target,
    triton_address,
)
from compass.controllers.job_pod_limits import JobPodLimits, authorize_job_pods
from compass.controllers.settings import OperatorSettings
from compass.controllers.targets import TargetAccess
from compass.controllers.workflow_spec import (
    InvalidSpecError,
    authorize_workflow_targets,
    validate_spec,
)
from compass.controllers.workflow_state import profile_key

WORKFLOW = {
    "apiVersion": "compass.io/v1alpha1",
    "kind": "CompoundWorkflow",
    "metadata": {"name": "rag", "namespace": "ml", "uid": "uid-1", "generation": 1},
}
SCHEMA = spec_schema(COMPOUND_WORKFLOW)
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]}
            ]
        }
    }
}
PLACEMENT = {
    "nodeSelector": {"pool": "cpu"},
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": AFFINITY,
    "priorityClassName": "batch-low",
    "runtimeClassName": "gvisor",
    "imagePullSecrets": [{"name": "team-registry"}, {"name": "regcred"}],
}


def _raw(**sections: Any) -> dict[str, Any]:
    return {
        "space": {"parameters": [{"name": "k", "type": "integer", "values": [1, 2]}]},
        "evaluation": {"dataset": {"size": 10}, "tau": 0.5},
        "slo": {"latencyMs": 100},
        "triton": {"service": "triton"},
        **sections,
    }


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


# ---------------------------------------------------------------------------- quantities


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (1, True),
        (0, True),
        ("1", True),
        ("500m", True),
        ("2Gi", True),
        ("2G", True),
        ("1.5", True),
        (".5", True),
        ("1e3", True),
        ("128974848", True),
        ("2GB", False),
        ("2gi", False),
        ("1K", False),
        ("-1", False),
        ("1 Gi", False),
        ("", False),
        (-1, False),
    ],
)
def test_the_model_and_the_crd_agree_on_what_a_quantity_is(value: Any, valid: bool) -> None:
    raw = _raw(profiling={"resources": {"limits": {"memory": value}}})
    server = list(schema_errors(raw, SCHEMA))
    assert (not server) is valid, server
    if valid:
        validate_spec(raw)
        return
    assert [e.field for e in server] == ["profiling.resources.limits[memory]"]
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(raw)
    assert error.value.field == "spec.profiling.resources.limits.memory"


def test_an_unquoted_gpu_count_is_accepted_and_reaches_the_job_as_a_string() -> None:
    """`nvidia.com/gpu: 1` as KServe and Katib manifests write it (YAML reads an int)."""
    section = yaml.safe_load("resources:\n  limits:\n    nvidia.com/gpu: 1\n    memory: 2Gi\n")
    raw = _raw(search=section)
    assert not list(schema_errors(raw, SCHEMA))
    spec, _ = validate_spec(raw)
    assert spec.search.resources.limits["nvidia.com/gpu"] == 1
    container = _pod(build_search_job(WORKFLOW, spec, "img", "sa"))["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1", "memory": "2Gi"}}
    # The frozen spec the Job reads back keeps the number a number.
    again = CompoundWorkflowSpec.model_validate_json(spec.model_dump_json(by_alias=True))
    assert again.search.resources == spec.search.resources


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        ("2GB", "write 2G or 2Gi"),
        ("512MiB", "write 512M or 512Mi"),
        ("64kb", "write 64k or 64Ki"),
        ("lots", "write a number with an optional suffix"),
        # Python's $ would let the newline through; the API server's RE2 does not.
        ("2Gi\n", "write a number with an optional suffix"),
        (0.5, "quote a fraction: '0.5', or write 500m"),
    ],
)
def test_a_bad_quantity_names_the_field_and_the_fix(value: Any, fix: str) -> None:
    raw = _raw(profiling={"resources": {"limits": {"memory": value}}})
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(raw)
    assert str(error.value).startswith(
        f"spec.profiling.resources.limits.memory: {value!r} is not a Kubernetes quantity; "
    )
    assert fix in str(error.value)


def test_resources_leave_out_the_maps_not_given() -> None:
    assert Resources().as_container() == {}
    assert Resources(requests={"cpu": "250m"}).as_container() == {"requests": {"cpu": "250m"}}


# ---------------------------------------------------------------------------- placement


@pytest.mark.parametrize("section", ["search", "profiling"])
def test_placement_reaches_the_jobs_pod(section: str) -> None:
    spec, _ = validate_spec(_raw(**{section: PLACEMENT}))
    build = build_search_job if section == "search" else build_profile_job
    pod = _pod(build(WORKFLOW, spec, "img", "sa"))
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["tolerations"] == PLACEMENT["tolerations"]
    assert pod["affinity"] == AFFINITY
    assert pod["priorityClassName"] == "batch-low"
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["imagePullSecrets"] == [{"name": "team-registry"}, {"name": "regcred"}]
    # The other Job's pod keeps the defaults: each section places its own Job.
    other = build_profile_job if section == "search" else build_search_job
    for field in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert field not in _pod(other(WORKFLOW, spec, "img", "sa"))


def test_the_profiling_pod_asks_for_no_gpu_and_no_node_by_default() -> None:
    """It is a client of the Triton pods, which hold the GPUs: a GPU request would wait for
    one of theirs."""
    pod = _pod(build_profile_job(WORKFLOW, validate_spec(_raw())[0], "img", "sa"))
    assert "resources" not in pod["containers"][0]
    assert not {"nodeSelector", "tolerations", "affinity"} & set(pod)


def test_the_operators_pull_secrets_come_first_and_each_once() -> None:
    """The chart's secrets (the operator's settings) on both Jobs, then the workflow's own for
    its Job; a secret named by both appears once."""
    settings = OperatorSettings(job_image_pull_secrets=["regcred", "mirror"])
    spec, _ = validate_spec(_raw(search=PLACEMENT))
    pulls = settings.job_image_pull_secrets
    search = _pod(build_search_job(WORKFLOW, spec, "img", "sa", None, pulls))
    profile = _pod(build_profile_job(WORKFLOW, spec, "img", "sa", None, pulls))
    assert [s["name"] for s in search["imagePullSecrets"]] == ["regcred", "mirror", "team-registry"]
    assert [s["name"] for s in profile["imagePullSecrets"]] == ["regcred", "mirror"]
    # Neither the operator nor the workflow names one: the pod spec has no field for it.
    plain, _ = validate_spec(_raw())
    assert "imagePullSecrets" not in _pod(build_search_job(WORKFLOW, plain, "img", "sa"))


def test_the_search_pods_default_resources_stay_unless_given() -> None:
    spec, _ = validate_spec(_raw(search={"nodeSelector": {"pool": "cpu"}}))
    container = _pod(build_search_job(WORKFLOW, spec, "img", "sa"))["containers"][0]
    assert container["resources"] == DEFAULT_SEARCH_RESOURCES


@pytest.mark.parametrize(
    ("affinity", "what"),
    [
        ({"nodeAfinity": {}}, "nodeAfinity is no kind of affinity; give nodeAffinity"),
        (
            {"podAffinity": {"x": "y" * MAX_AFFINITY_CHARS}},
            f"over {MAX_AFFINITY_CHARS:,}",
        ),
    ],
)
def test_a_bad_affinity_names_the_field(affinity: dict[str, Any], what: str) -> None:
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(_raw(profiling={"affinity": affinity}))
    assert error.value.field == "spec.profiling.affinity"
    assert what in str(error.value)


def test_a_pull_secret_or_priority_alone_does_not_profile_again() -> None:
    """They change how the profiling pod is pulled and scheduled, not what it measures."""
    plain, _ = validate_spec(_raw())
    pulled, _ = validate_spec(
        _raw(profiling={"imagePullSecrets": [{"name": "r"}], "priorityClassName": "low"})
    )
    placed, _ = validate_spec(_raw(profiling={"nodeSelector": {"pool": "cpu"}}))
    assert profile_key(pulled) == profile_key(plain)
    assert profile_key(placed) != profile_key(plain)


# ---------------------------------------------------------------------------- evaluation Service


def test_the_jobs_measure_the_evaluation_service_and_the_policy_routes_the_serving_one() -> None:
    spec, _ = validate_spec(_raw(triton={"service": "triton", "evaluationService": "staging"}))
    assert triton_address(WORKFLOW, evaluated_spec(spec)) == "staging.ml.svc:8001"
    assert routing_target(WORKFLOW, evaluated_spec(spec)).service == "staging"
    assert routing_target(WORKFLOW, spec).service == "triton"
    plain, _ = validate_spec(_raw())
    assert evaluated_spec(plain) is plain


def test_an_evaluation_service_the_settings_do_not_allow_is_refused_naming_it() -> None:
    spec, _ = validate_spec(
        _raw(triton={"service": "triton", "evaluationService": "staging.other.svc"})
    )
    with pytest.raises(InvalidSpecError) as error:
        authorize_workflow_targets(spec, "ml", TargetAccess())
    assert (error.value.field, error.value.reason) == (
        "spec.triton.evaluationService",
        "TargetNotAllowed",
    )
    authorize_workflow_targets(spec, "ml", TargetAccess((), ("other",)))


# ---------------------------------------------------------------------------- the chart's limits

GPU_POOL = JobPodLimits(
    tolerations=("nvidia.com/gpu:NoSchedule", "dedicated"),
    node_selector=("pool=eval", "topology.kubernetes.io/zone=*"),
    max_resources={"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "0"},
    priority_classes=("batch-low",),
    runtime_classes=("runc",),
)


def _asking(section: str, **pod: Any) -> CompoundWorkflowSpec:
    spec, _ = validate_spec(_raw(**{section: pod}))
    return spec


def test_job_pods_are_unrestricted_by_default() -> None:
    """Without jobPods values every placement and size the CRD admits passes."""
    anything = {**PLACEMENT, "tolerations": [{"operator": "Exists"}]}
    authorize_job_pods(_asking("search", **anything), JobPodLimits())
    big = {"limits": {"nvidia.com/gpu": 8, "cpu": "64", "memory": "1Ti"}}
    authorize_job_pods(_asking("profiling", resources=big), JobPodLimits())


@pytest.mark.parametrize(
    ("section", "pod"),
    [
        ("search", {"tolerations": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}),
        ("search", {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}),
        ("profiling", {"nodeSelector": {"pool": "eval", "topology.kubernetes.io/zone": "b"}}),
        ("profiling", {"resources": {"requests": {"cpu": "4000m", "memory": "8Gi"}}}),
        ("search", {"resources": {"limits": {"nvidia.com/gpu": 0, "ephemeral-storage": "1Ti"}}}),
        ("search", {"affinity": {"podAntiAffinity": {}}}),
        ("search", {"priorityClassName": "batch-low", "runtimeClassName": "runc"}),
    ],
)
def test_job_pods_within_the_limits_pass(section: str, pod: dict[str, Any]) -> None:
    """What the limits list (a key with any effect, a label with any value, a size at the
    maximum, a resource they do not name, an affinity that only keeps pods apart) passes."""
    authorize_job_pods(_asking(section, **pod), GPU_POOL)


@pytest.mark.parametrize(
    ("section", "pod", "field", "limit"),
    [
        (
            "search",
            {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
            "spec.search.tolerations[0]",
            "allowedTolerations",
        ),
        (
            "profiling",
            {"tolerations": [{"key": "dedicated"}, {"operator": "Exists"}]},
            "spec.profiling.tolerations[1]",
            "allowedTolerations",
        ),
        (
            "search",
            {"tolerations": [{"key": "nvidia.com/gpu", "effect": "NoExecute"}]},
            "spec.search.tolerations[0]",
            "allowedTolerations",
        ),
        (
            "search",
            {"nodeSelector": {"pool": "training"}},
            "spec.search.nodeSelector.pool",
            "allowedNodeSelector",
        ),
        (
            "profiling",
            {"affinity": AFFINITY},
            "spec.profiling.affinity.nodeAffinity",
            "allowedNodeSelector",
        ),
        (
            "search",
            {"resources": {"limits": {"nvidia.com/gpu": 1}}},
            "spec.search.resources.limits[nvidia.com/gpu]",
            "maxResources",
        ),
        (
            "profiling",
            {"resources": {"requests": {"memory": "8193Mi"}}},
            "spec.profiling.resources.requests[memory]",
            "maxResources",
        ),
        (
            "search",
            {"resources": {"requests": {"cpu": "4001m"}}},
            "spec.search.resources.requests[cpu]",
            "maxResources",
        ),
        (
            "search",
            {"priorityClassName": "tenant-critical"},
            "spec.search.priorityClassName",
            "allowedPriorityClasses",
        ),
        (
            "profiling",
            {"runtimeClassName": "nvidia"},
            "spec.profiling.runtimeClassName",
            "allowedRuntimeClasses",
        ),
    ],
)
def test_job_pods_past_the_limits_are_refused_by_field(
    section: str, pod: dict[str, Any], field: str, limit: str
) -> None:
    """A toleration, node label, node-choosing affinity or size past the limits: refused,
    JobPodNotAllowed, naming the field, the limit and the Helm value that widens it."""
    with pytest.raises(InvalidSpecError) as error:
        authorize_job_pods(_asking(section, **pod), GPU_POOL)
    assert (error.value.field, error.value.reason) == (field, "JobPodNotAllowed")
    assert f"jobPods.{limit} (Helm value)" in str(error.value)


def test_no_limits_allow_nothing() -> None:
    """[] for tolerations, node labels and classes allows none, not any."""
    closed = JobPodLimits(tolerations=(), node_selector=(), priority_classes=(), runtime_classes=())
    authorize_job_pods(_asking("search"), closed)
    with pytest.raises(InvalidSpecError, match=r"PriorityClass .*\(none\)"):
        authorize_job_pods(_asking("search", priorityClassName="low"), closed)
    with pytest.raises(InvalidSpecError, match=r"RuntimeClass .*\(none\)"):
        authorize_job_pods(_asking("profiling", runtimeClassName="gvisor"), closed)
    with pytest.raises(InvalidSpecError, match=r"\(none\)"):
        authorize_job_pods(_asking("search", tolerations=[{"key": "a"}]), closed)
    with pytest.raises(InvalidSpecError, match=r"\(none\)"):
        authorize_job_pods(_asking("search", nodeSelector={"a": "b"}), closed)


def test_the_settings_refuse_a_maximum_that_is_no_quantity(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad maxResources value stops the operator at start-up naming it, not a workflow later."""
    monkeypatch.setenv("COMPASS_JOB_MAX_RESOURCES", '{"memory": "8GB"}')
    with pytest.raises(ValueError, match=r"jobPods\.maxResources\[memory\]: '8GB'"):
        OperatorSettings()
    monkeypatch.setenv("COMPASS_JOB_MAX_RESOURCES", '{"nvidia.com/gpu": 1, "cpu": 1.5}')
    limits = OperatorSettings().job_pod_limits()
    assert limits.max_resources == {"nvidia.com/gpu": "1", "cpu": "1.5"}
