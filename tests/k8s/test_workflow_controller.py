"""The CompoundWorkflow controller against a real API server, with the operator running in-process.

kopf runs compass/controllers/workflow_handlers.py (kopf.testing.KopfRunner, one namespace, a
fresh handler registry per run: stopping the runner and starting another is an operator restart
with nothing kept in memory). The node helper runs the Jobs' pods as local processes (`compass job ...` from
the venv); the profiling Job measures a real tritonserver serving rag-sim at time_scale 0.1.

Each test is one story: the happy path to a ParetoPolicy (then SLO changes re-planned without
Jobs, and garbage collection); a tau no configuration reaches; an invalid spec; a Job whose pods
fail; an operator restart in the middle of a search whose pod is killed too; and the search
Job's code, in-process, through the whole RAG grid at 1,000 samples (its ledger in chunks).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from cluster import Cluster, free_port, wait_for
from e2e_shared import Workflows
from e2e_shared import json_data as _data
from e2e_shared import phase_is as _phase
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.config import kube_config
from prometheus_client import start_http_server

# Import the handlers package now: whatever it registers goes to kopf's default registry, never
# to the fresh registries the operator runs below get (they hold the workflow handlers only).
import compass.controllers.runtime  # noqa: F401
from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.meta import GROUP, POLICY_PLURAL, VERSION, WORKFLOW_PLURAL
from compass.api.metricsource import SecretReference
from compass.commands import job, job_state, job_triton
from compass.controllers import kubeapi, metricsauth
from compass.controllers.builders import (
    GENERATION_LABEL,
    LEDGER_KEY,
    PROFILES_KEY,
    RESULT_KEY,
    build_job_role,
    build_job_role_binding,
    build_job_service_account,
    build_profile_job,
    build_search_job,
    build_state_config_maps,
    routing_target,
)
from compass.controllers.ledgerchunks import (
    CHUNK_OF_LABEL,
    FLUSH_INTERVAL_S,
    chunk_key,
    encode,
    ledger_text,
    pieces,
)
from compass.controllers.runtime import RUNTIME_KEY, Runtime
from compass.controllers.workflow_spec import validate_spec
from compass.controllers.workflow_state import stored_states
from compass.controllers.workflow_steps import job_view
from compass.domain.planner import pareto_front
from compass.domain.profiles import parse_profiles
from compass.domain.space import MAX_PARAMETERS
from compass.examples import build_replay_ledger, load_rag_paper
from compass_dev.devnode import Node
from compass_dev.scenarios import RAG_CORNER_SPACE

REPO_ROOT = Path(__file__).resolve().parents[2]
_compass = importlib.util.find_spec("compass")
assert _compass is not None
assert _compass.origin is not None
HANDLERS = Path(_compass.origin).parent / "controllers" / "workflow_handlers.py"
POLL_S = "0.5"
SAMPLES = 100  # the replayed dataset


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture
def operator_env(k8s_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment the operator (and, inherited, the node's pods) runs with."""
    env = {
        **k8s_cluster.env(),
        "COMPASS_POLL_INTERVAL_SECONDS": POLL_S,
        "COMPASS_IMAGE": "ghcr.io/compass-operator/compass-operator:test",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # kopf logs in through the kubernetes package, which read $KUBECONFIG when it was imported
    # (before this cluster existed): point it at this cluster.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", env["KUBECONFIG"])
    monkeypatch.delenv("COMPASS_TRITON_ADDRESS", raising=False)
    monkeypatch.delenv("COMPASS_TRITON_ADDRESS_OVERRIDE", raising=False)
    return env


@contextlib.contextmanager
def operator(namespace: str, runtime: Runtime | None = None) -> Iterator[KopfRunner]:
    """The operator, watching one namespace, until the block ends (a graceful stop); with
    ``runtime``, its handlers share that one (its metrics, for a test to scrape)."""
    registry = kopf.OperatorRegistry()
    # What kopf's default registry does implicitly: log in through the kubernetes package.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    if runtime is not None:

        @kopf.on.startup(registry=registry)
        def share_runtime(memo: kopf.Memo, **_: Any) -> None:
            memo[RUNTIME_KEY] = runtime

    previous = kopf.get_default_registry()
    kopf.set_default_registry(registry)  # the handlers file registers here as kopf loads it
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    args = ["run", "--standalone", "--namespace", namespace, str(HANDLERS)]
    try:
        with KopfRunner(args, registry=registry, settings=settings, timeout=60) as runner:
            yield runner
    finally:
        kopf.set_default_registry(previous)
    if runner.exception is not None:
        raise AssertionError(f"the operator failed:\n{runner.output}") from runner.exception


@contextlib.contextmanager
def served_metrics() -> Iterator[tuple[Runtime, str]]:
    """A Runtime whose metrics are served on /metrics as `compass operator` serves them (the
    same prometheus_client call, manager.py), and the URL to scrape."""
    runtime = Runtime()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=runtime.metrics.registry)
    try:
        yield runtime, f"http://127.0.0.1:{port}/metrics"
    finally:
        server.shutdown()
        thread.join(5)


def _series(url: str, namespace: str, workflow: str) -> dict[str, float]:
    """The scraped series of one workflow: {name{labels}: value}."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    labels = f'namespace="{namespace}"'
    return {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if not line.startswith("#") and labels in line and f'workflow="{workflow}"' in line
    }


# ---------------------------------------------------------------------------- helpers


def _workflow(
    name: str,
    *,
    tau: float,
    slo_ms: float = 300.0,
    evaluator: dict[str, Any] | None = None,
    samples: int = SAMPLES,
    budgets: list[int] | None = None,
    backoff_limit: int = 1,
    space: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CompoundWorkflow",
        "metadata": {"name": name},
        "spec": {
            "space": space or RAG_CORNER_SPACE,
            "evaluation": {
                "dataset": {"size": samples, "imagePath": "/data/rag.jsonl"},
                "tau": tau,
                **({"budgets": budgets} if budgets else {}),
                "evaluator": evaluator or {"type": "replay", "replayConfigMap": "rag-ledger"},
            },
            "search": {"backoffLimit": backoff_limit},
            "profiling": {
                "warmupRuns": 1,
                "measuredRuns": 8,
                "nodeSelector": {"compass.io/pool": "cpu"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "resources": {"limits": {"cpu": "1"}},
            },
            "slo": {"latencyMs": slo_ms},
            "triton": {"service": "triton", "routerModel": "router"},
        },
    }


def _replay_rows(samples: int = SAMPLES) -> list[dict[str, Any]]:
    """The recorded ledger of the subspace: the paper's accuracies replayed over samples."""
    _, rows = load_rag_paper()
    values = {p["name"]: p["values"] for p in RAG_CORNER_SPACE["parameters"]}
    chosen = [r for r in rows if all(r["config"][k] in v for k, v in values.items())]
    assert len(chosen) == 16
    return build_replay_ledger(chosen, samples, seed=7)


def _create_replay_ledger(api: Any, namespace: str) -> None:
    text = "".join(json.dumps(line) + "\n" for line in _replay_rows())
    client.CoreV1Api(api).create_namespaced_config_map(
        namespace,
        {"metadata": {"name": "rag-ledger"}, "data": {LEDGER_KEY: text}},
        _preload_content=False,
    )


def _can(api: Any, namespace: str, account: str, verb: str, resource: str, name: str = "") -> bool:
    attributes = {"namespace": namespace, "verb": verb, "resource": resource}
    if name:
        attributes["name"] = name
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{account}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
            "resourceAttributes": attributes,
        },
    }
    answer = _data(
        client.AuthorizationV1Api(api).create_subject_access_review(review, _preload_content=False)
    )
    return bool(answer["status"].get("allowed"))


def _ledger_pairs(text: str) -> list[tuple[str, int]]:
    """(configuration, sample) of every recorded score, as many times as it was recorded."""
    pairs = []
    for line in text.splitlines():
        if line.strip():
            fact = json.loads(line)
            key = json.dumps(fact["config"], sort_keys=True)
            pairs += [(key, int(i)) for i in fact["samples"]]
    return pairs


# ---------------------------------------------------------------------------- the stories


def test_invalid_spec_is_a_permanent_error_until_fixed(
    k8s_api: Any, k8s_namespace: str, k8s_node: Node, crds: None, operator_env: dict[str, str]
) -> None:
    """(d) A constraint naming an unknown parameter: Failed, SpecValid False naming the field and
    the fix, no Job; a schema-invalid spec never gets in (the API server names the field).

    A CEL rule of the CRD (the last budget within the dataset) is enforced by current API
    servers only: 1.20 drops x-kubernetes-validations and stores the spec, and the operator's
    own check of the same rule reports it, naming the field the newer server's error names.
    """
    flows = Workflows(k8s_api, k8s_namespace)
    bad = _workflow("typo", tau=0.8)
    bad["spec"]["space"] = {**RAG_CORNER_SPACE, "constraints": ["reranker_k <= retriver_k"]}
    with pytest.raises(ApiException) as rejected:
        flows.create({**_workflow("too-high", tau=1.5)})
    assert rejected.value.status == 422
    assert "spec.evaluation.tau" in json.loads(rejected.value.body)["message"]
    # The schema bounds what a resource may make the operator hold: too many parameters.
    crowded = _workflow("crowded", tau=0.8)
    crowded["spec"]["space"] = {
        "parameters": [{"name": f"p{i}", "values": [0, 1]} for i in range(MAX_PARAMETERS + 1)]
    }
    with pytest.raises(ApiException) as too_many:
        flows.create(crowded)
    assert too_many.value.status == 422
    message = json.loads(too_many.value.body)["message"]
    assert f"spec.space.parameters in body should have at most {MAX_PARAMETERS} items" in message

    generated = (REPO_ROOT / "crds" / f"{WORKFLOW_PLURAL}.{GROUP}.yaml").read_text()
    assert "x-kubernetes-validations" in generated
    served = _data(
        client.ApiextensionsV1Api(k8s_api).read_custom_resource_definition(
            f"{WORKFLOW_PLURAL}.{GROUP}", _preload_content=False
        )
    )
    # The schema as stored (kubectl apply's last-applied annotation keeps the raw text).
    schemas = json.dumps([v["schema"] for v in served["spec"]["versions"]])
    assert "x-kubernetes-validations" not in schemas, "1.20 drops the CEL rules"
    beyond = _workflow("beyond", tau=0.8, budgets=[10, 50, SAMPLES + 1])
    flows.create(beyond)  # a current server refuses it: spec.evaluation.budgets (CEL)

    with operator(k8s_namespace):
        flows.wait("beyond", _phase("Failed"), 30, "the budget beyond the dataset to be reported")
        spec_valid = flows.condition("beyond", "SpecValid")
        assert spec_valid is not None
        assert spec_valid["status"] == "False"
        assert spec_valid["reason"] == "InvalidSpec"
        assert spec_valid["message"].startswith("spec.evaluation.budgets: ")
        assert f"{SAMPLES + 1} exceeds dataset.size {SAMPLES}" in spec_valid["message"]
        assert flows.jobs("beyond") == []

        flows.create(bad)
        flows.wait("typo", _phase("Failed"), 30, "the invalid spec to be reported")
        spec_valid = flows.condition("typo", "SpecValid")
        assert spec_valid is not None
        assert spec_valid["status"] == "False"
        assert spec_valid["reason"] == "InvalidSpec"
        assert spec_valid["message"].startswith("spec.space.constraints[0]: ")
        assert "unknown parameter 'retriver_k'" in spec_valid["message"]
        assert "known parameters: generator_model, retriever_k" in spec_valid["message"]
        assert spec_valid["observedGeneration"] == 1
        assert flows.jobs("typo") == []
        assert flows.config_maps("typo") == []
        flows.wait_events("typo", ["InvalidSpec"])

        # Fixing the spec (a new generation) starts the search: the error was permanent for
        # generation 1 only.
        fixed = {**RAG_CORNER_SPACE, "constraints": ["reranker_k <= retriever_k"]}
        flows.patch_spec("typo", {"space": fixed})
        flows.wait("typo", _phase("Searching", 2), 30, "generation 2 to start")
        spec_valid = flows.condition("typo", "SpecValid")
        assert spec_valid is not None
        assert spec_valid["status"] == "True"
        assert [j["metadata"]["name"] for j in flows.jobs("typo")] == ["typo-search-g2"]

        # Another change while generation 2's Job runs (its pods fail for want of the replay
        # ConfigMap and are retried): the Job is superseded, generation 3 starts afresh.
        assert job_view(flows.jobs("typo")[0]).running
        flows.patch_spec("typo", {"evaluation": {"tau": 0.75}})
        flows.wait("typo", _phase("Searching", 3), 30, "generation 3 to start")
        status = flows.get("typo")["status"]
        assert (status["searchJob"], status["ledgerConfigMap"]) == ("typo-search-g3",) * 2
        wait_for(
            lambda: [j["metadata"]["name"] for j in flows.jobs("typo")] == ["typo-search-g3"],
            30,
            "generation 2's Job to be deleted",
        )
        assert [c["metadata"]["name"] for c in flows.config_maps("typo")] == ["typo-search-g3"]
        flows.wait_events("typo", ["InvalidSpec", "SearchStarted", "SearchStarted"])

        # Within every list bound but too many combinations to enumerate: refused once, by name.
        huge = _workflow("huge", tau=0.8)
        huge["spec"]["space"] = {
            "parameters": [{"name": f"p{i}", "values": list(range(10))} for i in range(7)]
        }
        flows.create(huge)
        flows.wait("huge", _phase("Failed"), 30, "the oversized space to be reported")
        spec_valid = flows.condition("huge", "SpecValid")
        assert spec_valid is not None
        assert spec_valid["reason"] == "InvalidSpec"
        assert spec_valid["message"].startswith("spec.space: space has 10,000,000 combinations")
        assert flows.jobs("huge") == []

        # A Job image the operator's settings do not allow: refused by name, no Job.
        foreign = _workflow("foreign", tau=0.8)
        foreign["spec"]["search"]["image"] = "registry.example/miner:1"
        flows.create(foreign)
        flows.wait("foreign", _phase("Failed"), 30, "the foreign image to be refused")
        spec_valid = flows.condition("foreign", "SpecValid")
        assert spec_valid is not None
        assert spec_valid["reason"] == "ImageNotAllowed"
        assert spec_valid["message"].startswith("spec.search.image: registry.example/miner:1 ")
        assert flows.jobs("foreign") == []


def test_jobs_past_the_charts_limits_are_refused_by_field(
    k8s_api: Any,
    k8s_namespace: str,
    crds: None,
    operator_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With jobPods limits set (as the chart passes them), a workflow asking its Jobs for a GPU
    past maxResources is Failed with SpecValid False (JobPodNotAllowed) naming the field and the
    limit, and gets no Job; one within the limits starts its search."""
    monkeypatch.setenv("COMPASS_JOB_ALLOWED_TOLERATIONS", '["dedicated"]')
    monkeypatch.setenv("COMPASS_JOB_ALLOWED_NODE_SELECTOR", '["compass.io/pool=cpu"]')
    monkeypatch.setenv("COMPASS_JOB_MAX_RESOURCES", '{"nvidia.com/gpu": 0, "cpu": "2"}')
    flows = Workflows(k8s_api, k8s_namespace)
    greedy = _workflow("greedy", tau=0.8)
    greedy["spec"]["search"]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    flows.create(greedy)
    flows.create(_workflow("modest", tau=0.8))  # its profiling pod: pool=cpu, dedicated, 1 cpu

    with operator(k8s_namespace):
        flows.wait("greedy", _phase("Failed"), 30, "the GPU request to be refused")
        spec_valid = flows.condition("greedy", "SpecValid")
        assert spec_valid is not None
        assert (spec_valid["status"], spec_valid["reason"]) == ("False", "JobPodNotAllowed")
        message = spec_valid["message"]
        assert message.startswith("spec.search.resources.limits[nvidia.com/gpu]: 1 nvidia.com")
        assert "jobPods.maxResources (Helm value)" in message
        flows.wait_events("greedy", ["JobPodNotAllowed"])
        assert flows.jobs("greedy") == []
        flows.wait("modest", _phase("Searching"), 30, "the workflow within the limits to start")
        assert [j["metadata"]["name"] for j in flows.jobs("modest")] == ["modest-search-g1"]


def test_job_resources_are_quantities_and_placement_reaches_jobs_the_server_accepts(
    k8s_api: Any, k8s_namespace: str, crds: None
) -> None:
    """The CRD takes `nvidia.com/gpu: 1` unquoted and refuses `2GB` naming the field; both Jobs
    built from the stored workflow, with every placement field, pass the API server's own
    validation of a Job (a dry run: no pod starts)."""
    flows = Workflows(k8s_api, k8s_namespace)
    bad = _workflow("bytes", tau=0.8)
    bad["spec"]["profiling"]["resources"] = {"limits": {"memory": "2GB"}}
    with pytest.raises(ApiException) as rejected:
        flows.create(bad)
    assert rejected.value.status == 422
    message = json.loads(rejected.value.body)["message"]
    assert "spec.profiling.resources.limits.memory" in message
    assert '"2GB"' in message
    for value in ("2Gi\n", -1, 0.5):
        bad["spec"]["profiling"]["resources"] = {"limits": {"memory": value}}
        with pytest.raises(ApiException) as rejected:
            flows.create(bad)
        assert rejected.value.status == 422, value

    placed = _workflow("placed", tau=0.8)
    pod_fields = {
        "nodeSelector": {"compass.io/pool": "cpu"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "triton"}},
                        },
                    }
                ]
            }
        },
        "priorityClassName": "batch-low",
        "runtimeClassName": "runc",
        "imagePullSecrets": [{"name": "team-registry"}],
    }
    placed["spec"]["search"].update(
        pod_fields, resources={"requests": {"cpu": 1, "memory": "512Mi"}}
    )
    placed["spec"]["profiling"].update(
        pod_fields, resources={"limits": {"nvidia.com/gpu": 1, "cpu": "500m"}}
    )
    flows.create(placed)
    workflow = flows.get("placed")
    assert workflow["spec"]["profiling"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert workflow["spec"]["profiling"]["affinity"] == pod_fields["affinity"]
    spec, _ = validate_spec(workflow["spec"])
    batch = client.BatchV1Api(k8s_api)
    for build in (build_search_job, build_profile_job):
        body = build(workflow, spec, "compass-operator", "compass-job", None, ["regcred"])
        created = _data(
            batch.create_namespaced_job(k8s_namespace, body, dry_run="All", _preload_content=False)
        )
        pod = created["spec"]["template"]["spec"]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "team-registry"}]
        assert pod["affinity"] == pod_fields["affinity"]
        assert (pod["priorityClassName"], pod["runtimeClassName"]) == (
            "batch-low",
            "runc",
        )
    assert created["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "cpu": "500m",
    }
    assert flows.jobs("placed") == []


def test_tau_no_configuration_reaches(
    k8s_api: Any, k8s_namespace: str, k8s_node: Node, crds: None, operator_env: dict[str, str]
) -> None:
    """(b) tau 0.95 on a grid whose best is 0.86: FeasibleSetEmpty names the best accuracy and
    a tau that would work; no profiling Job. The operator's /metrics counts one search started
    and succeeded, and every sample evaluation; deleting the workflow removes its series."""
    flows = Workflows(k8s_api, k8s_namespace)
    _create_replay_ledger(k8s_api, k8s_namespace)
    with served_metrics() as (runtime, url), operator(k8s_namespace, runtime):
        flows.create(_workflow("strict", tau=0.95))
        flows.wait("strict", _phase("Failed"), 60, "the search to end")
        flows.wait_events("strict", ["SearchStarted", "FeasibleSetEmpty"])
        workflow = flows.get("strict")
        empty = flows.condition("strict", "FeasibleSetEmpty")
        # The state, not its ledger chunks (labelled CHUNK_OF_LABEL).
        state = flows.state_config_map("strict")["data"]
        jobs = [j["metadata"]["name"] for j in flows.jobs("strict")]
        series = _series(url, k8s_namespace, "strict")
        client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
            GROUP, VERSION, k8s_namespace, WORKFLOW_PLURAL, "strict"
        )
        wait_for(lambda: not _series(url, k8s_namespace, "strict"), 30, "its series to go")
    status = workflow["status"]
    assert empty is not None
    assert empty["status"] == "True"
    result = json.loads(state[RESULT_KEY])
    best = max(e["accuracy"] for e in result["evaluated"])
    assert result["feasible"] == []
    assert f"best accuracy reached is {best:.3f}" in empty["message"]
    assert "set evaluation.tau to 0." in empty["message"]
    assert status["feasibleFound"] == 0
    assert status["bestAccuracy"] == pytest.approx(best, abs=1e-4)
    assert status["configurationsEvaluated"] == result["configs_evaluated"]
    assert jobs == ["strict-search-g1"]
    # The search Job started and succeeded (it found nothing: the search itself worked); no
    # profiling Job; every sample evaluation counted once.
    key = f'{{namespace="{k8s_namespace}",result="%s",workflow="strict"}}'
    assert series[f"compass_workflow_searches_total{key % 'started'}"] == 1.0
    assert series[f"compass_workflow_searches_total{key % 'succeeded'}"] == 1.0
    assert f"compass_workflow_searches_total{key % 'failed'}" not in series
    assert not [name for name in series if name.startswith("compass_workflow_profilings")]
    samples = (
        f'compass_workflow_samples_evaluated_total{{namespace="{k8s_namespace}",workflow="strict"}}'
    )
    assert series[samples] == status["samplesUsed"] > 0


def test_failing_job_is_retried_then_reported(
    k8s_api: Any, k8s_namespace: str, k8s_node: Node, crds: None, operator_env: dict[str, str]
) -> None:
    """(e) The replay ConfigMap does not exist: each pod fails, the Job retries up to its
    backoffLimit, then the workflow is Failed with the pod's own message."""
    flows = Workflows(k8s_api, k8s_namespace)
    evaluator = {"type": "replay", "replayConfigMap": "no-such-ledger"}
    with served_metrics() as (runtime, url), operator(k8s_namespace, runtime):
        flows.create(_workflow("broken", tau=0.8, evaluator=evaluator, backoff_limit=1))
        flows.wait("broken", _phase("Failed"), 90, "the search Job to fail")
        flows.wait_events("broken", ["SearchStarted", "SearchFailed"])
        counted = {
            name.split('result="')[1].split('"')[0]: value
            for name, value in _series(url, k8s_namespace, "broken").items()
            if name.startswith("compass_workflow_searches_total")
        }
        assert counted == {"started": 1.0, "failed": 1.0}
    searched = flows.condition("broken", "SearchSucceeded")
    assert searched is not None
    assert searched["status"] == "False"
    assert searched["reason"] == "BackoffLimitExceeded"
    [job] = flows.jobs("broken")
    assert job["status"]["failed"] >= 2  # the first pod and its retry
    message = searched["message"]
    assert message.startswith("search Job broken-search-g1 failed after ")
    # The pod's own last line: what went wrong, in the words of the program that failed.
    assert message.endswith(
        "exited 1: compass job search: NotFoundError: 404 Not Found: configmaps "
        '"no-such-ledger" not found'
    ), message


def test_happy_path_to_a_pareto_policy(
    k8s_api: Any,
    k8s_cluster: Cluster,
    k8s_namespace: str,
    k8s_node: Node,
    crds: None,
    triton: Any,
    operator_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(a) replay search -> profiling through a real Triton -> an owned ParetoPolicy, Ready.
    (c) An SLO-only change is re-planned from the stored profiles with no new Job; an SLO below
    every p95 names the closest configuration. (g) Deleting the workflow collects the rest."""
    monkeypatch.setenv("COMPASS_TRITON_ADDRESS_OVERRIDE", f"127.0.0.1:{triton.grpc_port}")
    flows = Workflows(k8s_api, k8s_namespace)
    _create_replay_ledger(k8s_api, k8s_namespace)
    with operator(k8s_namespace):
        created = flows.create(_workflow("rag", tau=0.82, slo_ms=300))
        # What a pipeline or a person runs: kubectl waits on the Ready condition.
        waited = k8s_cluster.kubectl(
            "wait", "-n", k8s_namespace, "--for=condition=Ready", "--timeout=120s",
            "compoundworkflow/rag",
        )  # fmt: skip
        assert "condition met" in waited.stdout
        flows.wait("rag", _phase("Ready"), 10, "the workflow to be Ready")
        workflow = flows.get("rag")
        status = workflow["status"]
        assert status["startTime"] <= status["completionTime"]

        # The Jobs: search then profiling, pinned and sized as the spec says, told where
        # Triton is (the operator's override), run as the Jobs' ServiceAccount.
        jobs = {j["metadata"]["name"]: j for j in flows.jobs("rag")}
        assert set(jobs) == {"rag-search-g1", "rag-profile-g1"}
        pod_spec = jobs["rag-profile-g1"]["spec"]["template"]["spec"]
        assert pod_spec["nodeSelector"] == {"compass.io/pool": "cpu"}
        assert pod_spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
        assert pod_spec["containers"][0]["resources"] == {"limits": {"cpu": "1"}}
        env = {e["name"]: e.get("value") for e in pod_spec["containers"][0]["env"]}
        assert env["COMPASS_TRITON_ADDRESS"] == f"127.0.0.1:{triton.grpc_port}"
        # The workflow's own ServiceAccount, owned by it: collected with it, shared with none.
        account = "compass-job-rag"
        assert pod_spec["serviceAccountName"] == account
        for job in jobs.values():
            assert job["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
        made = kubeapi.read(
            client.CoreV1Api(k8s_api).read_namespaced_service_account, account, k8s_namespace
        )
        assert made["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]

        # Their ServiceAccount reaches this generation's state, reads the replayed ledger, and
        # nothing else.
        def may(verb: str, name: str) -> bool:
            return _can(k8s_api, k8s_namespace, account, verb, "configmaps", name)

        assert may("get", "rag-search-g1")
        assert may("patch", "rag-search-g1")
        assert may("get", "rag-ledger")
        assert not may("patch", "rag-ledger")
        assert not may("get", "someone-elses")
        assert not _can(k8s_api, k8s_namespace, account, "list", "configmaps")
        assert not _can(k8s_api, k8s_namespace, account, "delete", "configmaps")

        # The counts come from the search's result.
        state = flows.state_config_map("rag")["data"]
        result = json.loads(state[RESULT_KEY])
        assert status["observedGeneration"] == 1
        assert status["configurationsEvaluated"] == result["configs_evaluated"]
        assert status["samplesUsed"] == result["sample_evals"] > 0
        assert status["feasibleFound"] == len(result["feasible"]) > 0
        assert status["bestAccuracy"] == pytest.approx(
            max(e["accuracy"] for e in result["evaluated"]), abs=1e-4
        )
        assert status["searchJob"] == "rag-search-g1"
        assert status["profilingJob"] == "rag-profile-g1"
        assert status["ledgerConfigMap"] == "rag-search-g1"
        assert status["policy"] == "rag"
        conditions = {c["type"]: c for c in status["conditions"]}
        for type_ in ("SpecValid", "SearchSucceeded", "Profiled", "PolicyReady"):
            assert conditions[type_]["status"] == "True", conditions[type_]
            assert conditions[type_]["observedGeneration"] == 1
        profiles = json.loads(state[PROFILES_KEY])["profiles"]
        assert len(profiles) == len(result["feasible"])

        # The ParetoPolicy: the planned front, owned by the workflow, routed to its Triton.
        policy = flows.policy("rag")
        assert policy is not None
        [owner] = policy["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "CompoundWorkflow",
            "rag",
            created["metadata"]["uid"],
            True,
        )
        front = policy["spec"]["front"]
        assert 1 <= len(front) <= len(profiles)
        assert policy["spec"]["slo"]["latencyMs"] == 300
        # The Triton Service is in the workflow's namespace: every ready pod behind it.
        assert policy["spec"]["routing"] == {
            "service": "triton",
            "grpcPort": 8001,
            "metricsPort": 8002,
            "routerModel": "router",
            "actuator": "triton",
        }
        feasible = {json.dumps(f["config"], sort_keys=True) for f in result["feasible"]}
        assert {json.dumps(e["config"], sort_keys=True) for e in front} <= feasible
        flows.wait_events("rag", ["SearchStarted", "SearchSucceeded", "PolicyReady"])

        # (c) A new SLO only: re-planned from the stored profiles, no Job for generation 2.
        flows.patch_spec("rag", {"slo": {"latencyMs": 250}})
        flows.wait("rag", _phase("Ready", 2), 30, "the re-plan of generation 2")
        assert flows.jobs("rag") == [] or all(
            j["metadata"].get("deletionTimestamp") for j in flows.jobs("rag")
        ), "the superseded Jobs of generation 1 are deleted, and generation 2 needs none"
        policy = flows.policy("rag")
        assert policy is not None
        assert policy["spec"]["slo"]["latencyMs"] == 250
        assert policy["metadata"]["labels"]["compass.io/generation"] == "2"

        # An SLO below every p95: the condition names the closest configuration and by how much;
        # the last good policy stays in place.
        flows.patch_spec("rag", {"slo": {"latencyMs": 1}})
        flows.wait("rag", _phase("Failed", 3), 30, "the plan of generation 3 to fail")
        ready = flows.condition("rag", "PolicyReady")
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("False", "SloUnreachable")
        assert ready["message"].startswith("spec.slo.latencyMs: 1 ms is below every ")
        # The closest member of the Pareto front: a configuration off the front (dominated, or
        # slower on the mean than a more accurate one) is never served, whatever its p95.
        front = pareto_front(parse_profiles(profiles), 95.0).members
        closest = min(front, key=lambda p: p.p95_ms)
        assert f"the closest, {closest.name}, has {closest.p95_ms:.1f} ms" in ready["message"]
        assert f"({closest.p95_ms - 1:.1f} ms over)" in ready["message"]
        policy = flows.policy("rag")
        assert policy is not None
        assert policy["spec"]["slo"]["latencyMs"] == 250
        flows.wait_events(
            "rag",
            [
                "SearchStarted",
                "SearchSucceeded",
                "PolicyReady",
                "PlanningStarted",  # generation 2: profiles reused
                "PolicyReady",
                "PlanningStarted",  # generation 3
                "PlanFailed",
            ],
        )

        # GitOps: a person pauses the policy (kubectl edit); with autoApply false the next plan
        # waits for review in the status and the policy is untouched; autoApply true applies it
        # (profiles reused, no Job) and the person's pause survives the operator's re-plan.
        custom = flows.custom
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, k8s_namespace, POLICY_PLURAL, "rag", {"spec": {"paused": True}},
            field_manager="kubectl-edit",
        )  # fmt: skip
        flows.patch_spec("rag", {"autoApply": False, "slo": {"latencyMs": 260}})
        flows.wait("rag", _phase("Planned", 4), 30, "the plan of generation 4 held for review")
        held = flows.get("rag")["status"]
        assert held["plannedPolicy"]["spec"]["slo"]["latencyMs"] == 260
        ready = flows.condition("rag", "Ready")
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("False", "AwaitingReview")
        policy = flows.policy("rag")
        assert policy is not None
        assert policy["spec"]["slo"]["latencyMs"] == 250
        flows.patch_spec("rag", {"autoApply": True})
        flows.wait("rag", _phase("Ready", 5), 30, "generation 5 applied")
        policy = flows.policy("rag")
        assert policy is not None
        assert policy["spec"]["slo"]["latencyMs"] == 260
        assert policy["spec"]["paused"] is True
        assert "plannedPolicy" not in flows.get("rag")["status"]
        assert all(j["metadata"].get("deletionTimestamp") for j in flows.jobs("rag"))

        # (g) Deleting the workflow (the operator running: kopf may still hold its finalizer):
        # the garbage collector removes its ConfigMap, its policy and its Jobs' ServiceAccount.
        flows.custom.delete_namespaced_custom_object(
            GROUP, VERSION, k8s_namespace, WORKFLOW_PLURAL, "rag", propagation_policy="Background"
        )
        core = client.CoreV1Api(k8s_api)
        wait_for(
            lambda: (
                not flows.config_maps("rag")
                and flows.policy("rag") is None
                and kubeapi.read(core.read_namespaced_service_account, account, k8s_namespace)
                is None
            ),
            60,
            "the state ConfigMap, the ParetoPolicy and the ServiceAccount to be garbage-collected",
        )


SCORER = textwrap.dedent(
    """
    import json, sys, time
    ledger, calls, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])
    request = json.load(sys.stdin)
    key = json.dumps(request["config"], sort_keys=True)
    with open(ledger) as rows:
        scores = next(r["scores"] for r in map(json.loads, rows)
                      if json.dumps(r["config"], sort_keys=True) == key)
    with open(calls, "a") as log:
        log.write(json.dumps({"config": key, "samples": request["samples"]}) + "\\n")
    time.sleep(pause)
    print(json.dumps([scores[i] for i in request["samples"]]))
    """
)


def test_operator_restart_mid_search_resumes(
    k8s_api: Any,
    k8s_namespace: str,
    k8s_node: Node,
    crds: None,
    operator_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """(f) The operator stops while the search runs and its pod is killed too: the Job's next
    pod resumes from the ledger in the ConfigMap, the restarted operator carries on from the
    cluster's state, and no sample is recorded twice. (g) Deleting the workflow collects its
    Jobs (with their pods) and its ConfigMap."""
    flows = Workflows(k8s_api, k8s_namespace)
    samples = 16
    ledger = tmp_path / "recorded.jsonl"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in _replay_rows(samples)))
    calls = tmp_path / "calls.jsonl"
    scorer = tmp_path / "scorer.py"
    scorer.write_text(SCORER)
    evaluator = {
        "type": "command",
        "command": [sys.executable, str(scorer), str(ledger), str(calls), "0.25"],
    }
    body = _workflow("slow", tau=0.82, evaluator=evaluator, samples=samples, budgets=[4, 8, 16])
    with operator(k8s_namespace):
        flows.create(body)
        flows.wait(
            "slow",
            lambda w: (w.get("status") or {}).get("configurationsEvaluated", 0) >= 1,
            60,
            "the search to report progress",
        )
    # The operator is gone; the search goes on. Kill its pod as a node failure would.
    [job] = flows.jobs("slow")
    assert job_view(job).running, "the search ended before its pod could be killed"
    [first] = flows.pods("job-name=slow-search-g1")
    flows.core.delete_namespaced_pod(
        first["metadata"]["name"], k8s_namespace, _preload_content=False
    )

    def second_pod() -> dict[str, Any] | None:
        pods = [
            p
            for p in flows.pods("job-name=slow-search-g1")
            if p["metadata"]["name"] != first["metadata"]["name"]
        ]
        return pods[0] if pods else None

    resumed = wait_for(second_pod, 30, "the Job to replace the killed pod")
    progress_while_down = flows.get("slow")["status"]["configurationsEvaluated"]
    # The restarted operator knows only what the cluster holds. Deleting an active workflow
    # needs it running: kopf holds a finalizer while the workflow's timer runs.
    with operator(k8s_namespace):
        flows.wait("slow", _phase("Profiling"), 90, "the restarted operator to see the result")
        status = flows.get("slow")["status"]
        maps = flows.config_maps("slow")
        [state] = [m["data"] for m in maps if m["metadata"]["name"] == "slow-search-g1"]
        result = json.loads(state[RESULT_KEY])
        recorded = _ledger_pairs(ledger_text(maps))
        assert len(recorded) == len(set(recorded)), "a sample was recorded twice in the ledger"
        assert len(recorded) == result["sample_evals"] == status["samplesUsed"]
        assert (
            status["configurationsEvaluated"] == result["configs_evaluated"] >= progress_while_down
        )
        log = k8s_node.log(k8s_namespace, resumed["metadata"]["name"])
        assert "resuming: " in log, log
        # The scorer was asked again at most the batches of the last FLUSH_INTERVAL_S before
        # the pod died (a batch takes 0.25 s here) and the batch in flight.
        asked = [json.loads(line) for line in calls.read_text().splitlines()]
        pairs = [(a["config"], i) for a in asked for i in a["samples"]]
        repeated = {p for p in pairs if pairs.count(p) > 1}
        batches = int(FLUSH_INTERVAL_S / 0.25) + 1
        assert len(repeated) <= batches * max(len(a["samples"]) for a in asked), repeated
        flows.wait_events("slow", ["SearchStarted", "SearchSucceeded"])

        # (g) Deleting the workflow collects its Jobs, their pods and its ConfigMap.
        assert {j["metadata"]["name"] for j in flows.jobs("slow")} == {
            "slow-search-g1",
            "slow-profile-g1",
        }
        flows.custom.delete_namespaced_custom_object(
            GROUP, VERSION, k8s_namespace, WORKFLOW_PLURAL, "slow", propagation_policy="Background"
        )

        def left() -> list[str]:
            return [
                f"{o['metadata']['name']} deleting={o['metadata'].get('deletionTimestamp')} "
                f"status={(o.get('status') or {}).get('phase') or (o.get('status') or {}).get('active')}"
                for o in flows.jobs("slow")
                + flows.config_maps("slow")
                + flows.pods("compass.io/workflow=slow")
            ]

        try:
            wait_for(
                lambda: not left(), 60, "the Jobs, their pods and the ConfigMap to be collected"
            )
        except TimeoutError as error:
            raise AssertionError(f"{error}: {left()}") from None


def test_a_state_deleted_mid_search_gets_its_jobs_access_back(
    k8s_api: Any,
    k8s_namespace: str,
    k8s_node: Node,
    crds: None,
    operator_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """The state ConfigMap deleted by hand while the search runs takes the Jobs' Role and
    RoleBinding with it (they are owned by it): the operator makes the state again, waits for
    the garbage collector to take the old Role (held here by a finalizer, as a slow collector
    would) with a new RoleBinding already bound to it, makes a new Role owned by the new state,
    and the search finishes instead of failing on a 403. The old Role is the operator's own: no
    ForeignJobAccount Warning."""
    flows = Workflows(k8s_api, k8s_namespace)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    samples = 16
    ledger = tmp_path / "recorded.jsonl"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in _replay_rows(samples)))
    scorer = tmp_path / "scorer.py"
    scorer.write_text(SCORER)
    # A second a call (about 35 calls): the search must outlast the state's deletion, its
    # re-making, the held Role and the operator's retry, or it completes on the state it wrote
    # before the deletion and the new one has no result (at 0.1 s it did, under a busy tier).
    evaluator = {
        "type": "command",
        "command": [sys.executable, str(scorer), str(ledger), str(tmp_path / "calls"), "1.0"],
    }
    body = _workflow("lost", tau=0.82, evaluator=evaluator, samples=samples, budgets=[4, 8, 16])
    state_name = "lost-search-g1"

    def access_owner(kind: str) -> str | None:
        read = rbac.read_namespaced_role if kind == "Role" else rbac.read_namespaced_role_binding
        made = kubeapi.read(read, state_name, k8s_namespace)
        if made is None or made["metadata"].get("deletionTimestamp"):
            return None
        return str(made["metadata"]["ownerReferences"][0]["uid"])

    with operator(k8s_namespace):
        flows.create(body)
        flows.wait(
            "lost",
            lambda w: (w.get("status") or {}).get("configurationsEvaluated", 0) >= 1,
            60,
            "the search to report progress",
        )
        first = flows.state_config_map("lost")["metadata"]["uid"]
        assert access_owner("Role") == first
        hold = {"metadata": {"finalizers": ["compass.test/hold"]}}
        rbac.patch_namespaced_role(state_name, k8s_namespace, hold, _preload_content=False)
        flows.core.delete_namespaced_config_map(
            state_name, k8s_namespace, propagation_policy="Background", _preload_content=False
        )

        def new_state() -> str | None:
            state = kubeapi.read(flows.core.read_namespaced_config_map, state_name, k8s_namespace)
            uid = None if state is None else str(state["metadata"]["uid"])
            return None if uid == first else uid

        second = wait_for(new_state, 30, "the operator to make the state again")
        # While the old Role lingers, a new RoleBinding keeps the Jobs' access through it.
        wait_for(
            lambda: access_owner("RoleBinding") == second,
            30,
            "a new RoleBinding owned by the new state while the old Role is held",
        )
        held = kubeapi.read(rbac.read_namespaced_role, state_name, k8s_namespace)
        assert held["metadata"]["ownerReferences"][0]["uid"] == first
        # A few of the operator's polls while the old Role lingers, then let it go.
        time.sleep(3 * float(POLL_S))
        rbac.patch_namespaced_role(
            state_name, k8s_namespace, {"metadata": {"finalizers": None}}, _preload_content=False
        )

        def replaced() -> str | None:
            state = kubeapi.read(flows.core.read_namespaced_config_map, state_name, k8s_namespace)
            uid = None if state is None else str(state["metadata"]["uid"])
            owners = {access_owner("Role"), access_owner("RoleBinding")}
            return uid if uid not in (None, first) and owners == {uid} else None

        wait_for(replaced, 60, "a new Role and RoleBinding owned by the new state")
        flows.wait("lost", _phase("Profiling"), 120, "the search to finish on the new state")
        assert not [e for e in flows.events("lost") if e[1] == "ForeignJobAccount"]


@pytest.mark.parametrize(
    "dataset",
    [
        {"configMap": {"name": "qa", "key": "samples.jsonl"}},
        {"volume": {"claimName": "data", "path": "sets/qa.jsonl"}},
    ],
    ids=["configMap", "volume"],
)
def test_the_api_server_accepts_the_jobs_pods_as_built(
    k8s_api: Any, k8s_namespace: str, dataset: dict[str, Any]
) -> None:
    """The search Job with its dataset mounted, the profile Job, both read-only with a /tmp
    emptyDir and resources: a server-side dry run validates every field the builders set."""
    raw = _workflow("mounted", tau=0.8)
    raw["spec"]["evaluation"]["dataset"] = {"size": SAMPLES, **dataset}
    spec = CompoundWorkflowSpec.model_validate(raw["spec"])
    workflow = {**raw, "metadata": {"name": "mounted", "namespace": k8s_namespace, "uid": "u-1"}}
    batch = client.BatchV1Api(k8s_api)
    for built in (
        build_search_job(workflow, spec, "compass:test", "compass-job-mounted"),
        build_profile_job(workflow, spec, "compass:test", "compass-job-mounted"),
    ):
        created = _data(
            batch.create_namespaced_job(k8s_namespace, built, dry_run="All", _preload_content=False)
        )
        pod = created["spec"]["template"]["spec"]
        assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        assert [v["name"] for v in pod["volumes"]] == [
            v["name"] for v in built["spec"]["template"]["spec"]["volumes"]
        ]


def test_a_foreign_job_service_account_or_role_is_refused_not_reused(
    k8s_api: Any, k8s_namespace: str, crds: None, operator_env: dict[str, str]
) -> None:
    """A ServiceAccount named like the Jobs', then a Role named like a generation's, that
    compass-operator did not make: no Job runs with them, a Warning Event says why and what to
    do; once they are gone the search starts."""
    core = client.CoreV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    someone_else = {"labels": {"team": "someone-else"}}
    foreign = {"metadata": {"name": "compass-job-borrowed", **someone_else}}
    core.create_namespaced_service_account(k8s_namespace, foreign, _preload_content=False)
    role = "borrowed-search-g1"
    foreign_role = {"metadata": {"name": role, **someone_else}, "rules": []}
    rbac.create_namespaced_role(k8s_namespace, foreign_role, _preload_content=False)
    flows = Workflows(k8s_api, k8s_namespace)

    def refused(what: str) -> bool:
        return any(
            f"{what} exists and was not made by compass-operator" in message
            for _kind, reason, message in flows.events("borrowed")
            if reason == "ForeignJobAccount"
        )

    with operator(k8s_namespace):
        flows.create(_workflow("borrowed", tau=0.8))
        wait_for(
            lambda: refused("ServiceAccount compass-job-borrowed"), 30, "the ServiceAccount refused"
        )
        assert flows.jobs("borrowed") == []
        assert kubeapi.read(rbac.read_namespaced_role_binding, role, k8s_namespace) is None
        core.delete_namespaced_service_account(
            "compass-job-borrowed", k8s_namespace, _preload_content=False
        )

        wait_for(lambda: refused(f"Role {role}"), 30, "the Role refused")
        assert flows.jobs("borrowed") == []
        assert kubeapi.read(rbac.read_namespaced_role_binding, role, k8s_namespace) is None
        rbac.delete_namespaced_role(role, k8s_namespace, _preload_content=False)
        flows.wait("borrowed", _phase("Searching"), 60, "the search to start once they are gone")
        account = _data(
            core.read_namespaced_service_account(
                "compass-job-borrowed", k8s_namespace, _preload_content=False
            )
        )
        assert account["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "compass-operator"
        made = _data(rbac.read_namespaced_role(role, k8s_namespace, _preload_content=False))
        [owner] = made["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("ConfigMap", role)


def test_a_1000_sample_search_of_the_rag_grid_completes_through_chunked_state(
    k8s_api: Any,
    k8s_cluster: Cluster,
    k8s_namespace: str,
    crds: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(h) The search Job's own code, in-process as the Jobs' ServiceAccount under the Role the
    operator gives it, searches the whole RAG grid replayed over 1,000 samples (the ledger that
    broke the 1 MiB limit): the ledger is merged out of the state into chunk ConfigMaps (their
    budget small enough that they roll over at this size), the search completes, the operator's reading of
    the state is the Job's ledger with every sample once, and the chunks go with the workflow."""
    samples = 1000
    core = client.CoreV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    account = "compass-job-big"
    # The replay is 1.2 MB as text: over the limit itself, so as gzip chunks.
    space, rows = load_rag_paper()
    replayed = "".join(json.dumps(r) + "\n" for r in build_replay_ledger(rows, samples, seed=7))
    binary = {chunk_key(i): encode(p) for i, p in enumerate(pieces(replayed))}
    core.create_namespaced_config_map(
        k8s_namespace,
        {"metadata": {"name": "rag-ledger"}, "binaryData": binary},
        _preload_content=False,
    )
    flows = Workflows(k8s_api, k8s_namespace)
    # The looks of the reference's schedule: a few hundred batches, so that the test takes a
    # minute, and a ledger of 1.3 MB, which main's single ConfigMap refused with a 422.
    body = _workflow("big", tau=0.8, samples=samples, space=space, budgets=[50, 200, 1000])
    flows.create(body)
    workflow = flows.get("big")
    core.create_namespaced_service_account(
        k8s_namespace, build_job_service_account(workflow, account), _preload_content=False
    )
    spec, _ = validate_spec(workflow["spec"])
    [state_body] = build_state_config_maps(workflow, spec)
    stored = _data(
        core.create_namespaced_config_map(k8s_namespace, state_body, _preload_content=False)
    )
    state = state_body["metadata"]["name"]
    rbac.create_namespaced_role(k8s_namespace, build_job_role(stored, spec), _preload_content=False)
    rbac.create_namespaced_role_binding(
        k8s_namespace, build_job_role_binding(stored, account), _preload_content=False
    )

    monkeypatch.setattr(job_state, "BUDGET", 48 * 1024)
    # Writes often enough, and a state small enough, that several chunk ConfigMaps are made.
    monkeypatch.setattr(job, "FLUSH_INTERVAL_S", 0.2)
    monkeypatch.setattr(job_state, "HOT_BUDGET", 8 * 1024)
    as_job = k8s_cluster.api_client(impersonate=f"system:serviceaccount:{k8s_namespace}:{account}")
    monkeypatch.setattr(kubeapi, "load_client", lambda: as_job)
    assert job.run_search(state, k8s_namespace) == 0
    print(capsys.readouterr().out)

    maps = flows.config_maps("big")
    chunks = [m for m in maps if (m["metadata"].get("labels") or {}).get(CHUNK_OF_LABEL) == state]
    assert len(chunks) >= 2, [m["metadata"]["name"] for m in maps]
    uid = workflow["metadata"]["uid"]
    assert all(c["metadata"]["ownerReferences"][0]["uid"] == uid for c in chunks)
    [(generation, stored)] = stored_states(
        maps, "big", lambda m: int(m["metadata"]["labels"][GENERATION_LABEL]), read=1
    ).states.items()
    assert generation == 1
    assert stored.names == (state, *(f"{state}-c{i}" for i in range(1, len(chunks) + 1)))
    recorded = _ledger_pairs(stored.data[LEDGER_KEY])
    assert len(recorded) == len(set(recorded)), "a sample was recorded twice in the ledger"
    result = json.loads(stored.data[RESULT_KEY])
    assert result["sample_evals"] == len(recorded)
    assert result["feasible"], "tau 0.8 has feasible configurations on the RAG grid"

    # Deleting the workflow collects the state and its chunks.
    flows.custom.delete_namespaced_custom_object(
        GROUP, VERSION, k8s_namespace, WORKFLOW_PLURAL, "big", propagation_policy="Background"
    )
    wait_for(lambda: not flows.config_maps("big"), 60, "the state and its chunks to be collected")


def test_the_jobs_get_their_triton_tls_secret_by_name_and_no_other(
    k8s_api: Any, k8s_cluster: Cluster, k8s_namespace: str, crds: None, tmp_path: Path
) -> None:
    """spec.triton.tls: the Jobs' Role lets them get that Secret, by name, and no other; the
    Job's code reads it as the Jobs' ServiceAccount under the real API server's RBAC and builds
    its TLS (the consent label checked as the operator checks it); the generated policy's
    routing carries the same TLS."""
    core = client.CoreV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    account = "compass-job-secure"
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    for name, labelled in (("triton-tls", True), ("other-tls", True), ("unlabelled", False)):
        labels = {"compass.io/metrics-credentials": "true"} if labelled else {}
        core.create_namespaced_secret(
            k8s_namespace,
            {"metadata": {"name": name, "labels": labels}, "stringData": {"ca.crt": pem}},
            _preload_content=False,
        )
    body = _workflow("secure", tau=0.8)
    body["spec"]["triton"]["tls"] = {"secretRef": {"name": "triton-tls"}, "serverName": "t.ml"}
    # A real workflow (no operator runs here): the state it owns, and the Role the state owns,
    # would be collected at once with a made-up owner.
    flows = Workflows(k8s_api, k8s_namespace)
    flows.create(body)
    workflow = flows.get("secure")
    core.create_namespaced_service_account(
        k8s_namespace, build_job_service_account(workflow, account), _preload_content=False
    )
    spec, _ = validate_spec(workflow["spec"])
    [state_body] = build_state_config_maps(workflow, spec)
    stored = _data(
        core.create_namespaced_config_map(k8s_namespace, state_body, _preload_content=False)
    )
    rbac.create_namespaced_role(k8s_namespace, build_job_role(stored, spec), _preload_content=False)
    rbac.create_namespaced_role_binding(
        k8s_namespace, build_job_role_binding(stored, account), _preload_content=False
    )
    as_job = client.CoreV1Api(
        k8s_cluster.api_client(impersonate=f"system:serviceaccount:{k8s_namespace}:{account}")
    )

    refusals: list[str] = []

    def allowed() -> bool:
        try:
            kubeapi.read(as_job.read_namespaced_secret, "triton-tls", k8s_namespace)
        except ApiException as error:
            refusals.append(f"{error.status} {error.reason}")
            return False
        return True

    try:
        wait_for(allowed, 30, "the RoleBinding to take effect")
    except TimeoutError as error:
        raise AssertionError(f"{error}: {refusals[-3:]}") from None
    tls = job_triton.triton_tls(spec, k8s_namespace, as_job)
    assert tls is not None
    assert (tls.ca_pem, tls.server_name) == (pem.encode(), "t.ml")
    with pytest.raises(ApiException) as refused:
        kubeapi.read(as_job.read_namespaced_secret, "other-tls", k8s_namespace)
    assert refused.value.status == 403
    # Another workflow's Jobs (their own ServiceAccount) may not read this workflow's Secret.
    as_other = client.CoreV1Api(
        k8s_cluster.api_client(
            impersonate=f"system:serviceaccount:{k8s_namespace}:compass-job-other"
        )
    )
    with pytest.raises(ApiException) as foreign:
        kubeapi.read(as_other.read_namespaced_secret, "triton-tls", k8s_namespace)
    assert foreign.value.status == 403
    # A Secret without the consent label is refused by the same rule, naming the label.
    assert spec.triton.tls is not None
    unlabelled = spec.triton.tls.model_copy(
        update={"secret_ref": SecretReference(name="unlabelled")}
    )
    secret = kubeapi.read(core.read_namespaced_secret, "unlabelled", k8s_namespace)
    with pytest.raises(metricsauth.CredentialsError, match=r"compass\.io/metrics-credentials"):
        metricsauth.triton_tls(unlabelled, secret, k8s_namespace, "spec.triton.tls")
    assert routing_target(workflow, spec).tls == spec.triton.tls
