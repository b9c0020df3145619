"""Every manifest in examples/ is valid for the models it is meant for, and they fit together.

tests/k8s/test_chart.py applies the same files to a real API server with the chart's CRDs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.paretopolicy import ParetoPolicySpec
from compass.conversion import policy_plan
from compass.domain.space import config_key
from tiers import unavailable

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PAPER_FRONT = REPO / "bench" / "data" / "compass-paper" / "planner_pareto_frontier.json"
COVERED = {
    "rag-sim-workflow.yaml",
    "pareto-policy-gitops.yaml",
    "prometheus-scrape.yaml",
    "rag-sim-triton.yaml",
    "keda-scaledobject.yaml",
}


def load(name: str) -> dict[str, Any]:
    """The single YAML document of an example."""
    documents = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    assert len(documents) == 1, f"{name}: {len(documents)} documents"
    document: dict[str, Any] = documents[0]
    return document


def scrape_config() -> dict[str, Any]:
    """The prometheus.yml inside examples/prometheus-scrape.yaml."""
    config: dict[str, Any] = yaml.safe_load(
        load("prometheus-scrape.yaml")["data"]["prometheus.yml"]
    )
    return config


def jobs() -> dict[str, dict[str, Any]]:
    """The scrape configs by job name."""
    return {job["job_name"]: job for job in scrape_config()["scrape_configs"]}


def keeps(job: dict[str, Any], label: str) -> str:
    """The regex of the job's `keep` relabelling on one source label."""
    for rule in job["relabel_configs"]:
        if rule.get("action") == "keep" and rule["source_labels"] == [label]:
            return str(rule["regex"])
    raise AssertionError(f"{job['job_name']} keeps nothing by {label}")


def test_every_example_is_checked_here() -> None:
    """A new example must be added to this file (and to tests/k8s/test_chart.py, except the
    KEDA ScaledObject: KEDA's CRDs are not part of the k8s tier)."""
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == COVERED


def test_workflow_example_is_a_compound_workflow() -> None:
    """examples/rag-sim-workflow.yaml: the CompoundWorkflow spec model accepts it."""
    document = load("rag-sim-workflow.yaml")
    assert (document["apiVersion"], document["kind"]) == ("compass.io/v1alpha1", "CompoundWorkflow")
    spec = CompoundWorkflowSpec.model_validate(document["spec"])
    assert spec.slo.latency_ms == 1000
    # Served as the operator serves by default: per-request binding of the whole configuration
    # at take-up, with admission (docs/serving.md).
    binding = spec.serving.binding
    assert binding.mode.value == "per-request"
    assert binding.stages == []
    assert spec.serving.admits


def test_policy_example_is_a_plannable_pareto_policy() -> None:
    """examples/pareto-policy-gitops.yaml: valid spec, fastest first, every member usable."""
    document = load("pareto-policy-gitops.yaml")
    assert (document["apiVersion"], document["kind"]) == ("compass.io/v1alpha1", "ParetoPolicy")
    spec = ParetoPolicySpec.model_validate(document["spec"])
    assert 3 <= len(spec.front) <= 4
    assert spec.slo.latency_ms == 1000
    means = [entry.latency_mean_ms for entry in spec.front]
    accuracies = [entry.accuracy for entry in spec.front]
    assert means == sorted(means)
    assert accuracies == sorted(accuracies)
    plan = policy_plan(spec)
    assert all(t.eligible and t.slack_ms > 0 for t in plan.thresholds)
    assert spec.metrics is not None
    assert spec.metrics.query
    assert spec.routing is not None
    # The spec round-trips: what GitOps stores is what the operator reads back.
    dumped = spec.model_dump(by_alias=True, exclude_unset=True, mode="json")
    assert ParetoPolicySpec.model_validate(dumped) == spec


def test_triton_example_is_what_the_workflow_and_the_policy_target() -> None:
    """examples/rag-sim-triton.yaml: 2 ready-probed replicas behind the Service both name, with
    the named ports the policy's routing uses."""
    deployment, service = yaml.safe_load_all((EXAMPLES / "rag-sim-triton.yaml").read_text())
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    workflow = CompoundWorkflowSpec.model_validate(load("rag-sim-workflow.yaml")["spec"])
    policy = ParetoPolicySpec.model_validate(load("pareto-policy-gitops.yaml")["spec"])
    assert policy.routing is not None
    assert service["metadata"]["name"] == workflow.triton.service == policy.routing.service
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    selector = service["spec"]["selector"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    for name, number in [
        (policy.routing.grpc_port, workflow.triton.grpc_port),
        (policy.routing.metrics_port, workflow.triton.metrics_port),
    ]:
        assert ports[str(name)] == number
        assert service_ports[str(name)]["targetPort"] == name
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/v2/health/ready"
    assert ports[probe["port"]] == workflow.triton.http_port
    # The router behind its gate, as the workflow's late binding needs: the image's command
    # with its gated config (tests/triton/test_router_pipeline_gate.py serves that config).
    dockerfile = (REPO / "model-images" / "rag-sim" / "Dockerfile").read_text()
    command = json.loads(dockerfile.split("CMD ", 1)[1].replace("\\\n", " "))
    assert container["args"] == [*command, "--model-config-name=gated"]
    # The dashboard's SLO panel reads Triton's latency summaries, off unless asked for.
    assert "--metrics-config=summary_latencies=true" in container["args"]
    assert (REPO / "model-images/rag-sim/models/router/configs/gated.pbtxt").is_file()


def test_policy_example_is_the_papers_front() -> None:
    """The front is the paper's measured front, rounded (accuracy 4 places, latencies 2)."""
    paper = json.loads(PAPER_FRONT.read_text())["pareto_frontier"]
    spec = ParetoPolicySpec.model_validate(load("pareto-policy-gitops.yaml")["spec"])
    by_config = {config_key(p["config"]): p for p in paper}
    assert {config_key(e.config) for e in spec.front} <= set(by_config)
    for entry in spec.front:
        measured = by_config[config_key(entry.config)]
        assert entry.accuracy == pytest.approx(measured["accuracy"], abs=5e-5)
        for field in ("mean", "p50", "p95", "p99", "std"):
            ours = getattr(entry, f"latency_{field}_ms")
            assert ours == pytest.approx(measured[f"latency_{field}_ms"], abs=5e-3), field


def test_prometheus_example_scrapes_triton_and_the_operator() -> None:
    """Triton's metrics port of the workflow's Service, and the chart's metrics Service port."""
    document = load("prometheus-scrape.yaml")
    assert (document["apiVersion"], document["kind"]) == ("v1", "ConfigMap")
    scraped = jobs()
    assert set(scraped) == {"triton", "compass-operator"}

    triton = scraped["triton"]
    workflow = CompoundWorkflowSpec.model_validate(load("rag-sim-workflow.yaml")["spec"])
    assert re.fullmatch(keeps(triton, "__meta_kubernetes_service_name"), workflow.triton.service)
    port = keeps(triton, "__meta_kubernetes_endpoint_port_number")
    assert port == str(workflow.triton.metrics_port) == "8002"
    # Elastico reads the queue depth every second or so: a 15 s scrape would be too stale.
    assert triton["scrape_interval"] == "1s"

    operator = scraped["compass-operator"]
    name = keeps(operator, "__meta_kubernetes_service_label_app_kubernetes_io_name")
    chart_values = yaml.safe_load((REPO / "charts/compass-operator/values.yaml").read_text())
    assert name == "compass-operator"  # the chart's app.kubernetes.io/name (no nameOverride)
    assert keeps(operator, "__meta_kubernetes_endpoint_port_name") == "metrics"
    # compass_* series carry the policy's namespace; the target's must not overwrite it.
    assert operator["honor_labels"] is True
    assert "namespace" not in {r.get("target_label") for r in operator["relabel_configs"]}
    assert chart_values["metrics"]["port"] == 8080


def test_policy_example_reads_what_prometheus_scrapes() -> None:
    """The ParetoPolicy's query selects the triton job and the workflow's Service."""
    spec = ParetoPolicySpec.model_validate(load("pareto-policy-gitops.yaml")["spec"])
    assert spec.metrics is not None
    assert spec.metrics.query is not None
    query = spec.metrics.query
    assert "nv_inference_pending_request_count" in query
    assert 'job="triton"' in query
    service = re.search(r'service="([^"]+)"', query)
    assert service
    assert re.fullmatch(keeps(jobs()["triton"], "__meta_kubernetes_service_name"), service.group(1))


def test_promtool_accepts_the_scrape_config(tmp_path: Path) -> None:
    """`promtool check config`, with static targets in place of Kubernetes discovery.

    Debian's Prometheus is built without Kubernetes service discovery, so its promtool rejects
    kubernetes_sd_configs; everything else (intervals, relabelling, regexes) is checked.
    """
    promtool = shutil.which("promtool")
    if promtool is None:
        unavailable("promtool not on PATH (Debian: apt-get install prometheus)")
    config = scrape_config()
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "endpoints"}]
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_keda_example_scales_the_triton_deployment_on_the_capacity_pressure() -> None:
    """examples/keda-scaledobject.yaml: a ScaledObject for the example Deployment whose
    prometheus trigger queries a metric the operator really exports, for the example policy,
    as a Value against 1 (replicas x pressure), from the Prometheus the policy reads."""
    from compass.controllers.runtime import OperatorMetrics

    document = load("keda-scaledobject.yaml")
    assert (document["apiVersion"], document["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = document["spec"]
    triton = next(
        d for d in yaml.safe_load_all((EXAMPLES / "rag-sim-triton.yaml").read_text()) if d
    )
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": triton["metadata"]["name"],
    }
    assert spec["minReplicaCount"] == triton["spec"]["replicas"]
    assert spec["maxReplicaCount"] > spec["minReplicaCount"]
    [trigger] = spec["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "Value")
    metadata = trigger["metadata"]
    assert metadata["threshold"] == "1"
    # No series while the operator is blind: an error, so the HPA holds instead of scaling in.
    assert metadata["ignoreNullValues"] == "false"
    query = metadata["query"]
    exported = {f.name for f in OperatorMetrics().registry.collect()}
    named = set(re.findall(r"[a-z_]+(?=\{)", query))
    assert named == {"compass_capacity_pressure"}
    assert named <= exported
    policy = load("pareto-policy-gitops.yaml")
    assert f'policy="{policy["metadata"]["name"]}"' in query
    assert metadata["serverAddress"] == policy["spec"]["metrics"]["url"]
