"""The Helm chart renders, lints and validates its values without a cluster (helm-python-sdk).

What it installs into a real API server, and what its RBAC really allows there, is
tests/k8s/test_chart.py.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import helm_python._native as helm_native
import pytest
import yaml

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.crds import RESOURCES, build_crd
from compass.api.rules import VALIDATIONS
from compass.controllers.builders import build_profile_job, build_search_job
from compass.controllers.job_pod_limits import JobPodLimits
from compass.controllers.runtime import OperatorMetrics
from compass.controllers.settings import OperatorSettings
from compass_dev.rbac import (
    CLUSTER_PEERING_RULES,
    DISCOVERY_RULES,
    NAMESPACED_PEERING_RULES,
    RELEASE_POD_RULES,
    RELEASE_RULES,
    operator_rules,
    permissions,
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "compass-operator"
RELEASE, NAMESPACE = "compass", "compass-system"
HOOK = "helm.sh/hook"
FULLNAME = "compass-compass-operator"
STANDARD_LABELS = {
    "app.kubernetes.io/name": "compass-operator",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/version": "0.1.0",
    "app.kubernetes.io/managed-by": "Helm",
    "app.kubernetes.io/part-of": "compass-operator",
    "helm.sh/chart": "compass-operator-0.1.0",
}
# Series the dashboard charts, each exported by the operator (compass.controllers.runtime's
# OperatorMetrics).
OPERATOR_METRICS = (
    "compass_queue_depth",
    "compass_stay_queue_threshold",
    "compass_enter_queue_threshold",
    "compass_active_configuration_info",
    "compass_served_accuracy",
    "compass_capacity_pressure",
    "compass_policy_ready",
    "compass_workflow_searches_total",
    "compass_workflow_profilings_total",
    "compass_workflow_samples_evaluated_total",
    "compass_switches_total",
    "compass_decision_seconds",
    "compass_reconciles_total",
    "compass_errors_total",
)


def render(
    values: dict[str, Any] | None = None,
    kube_version: str | None = None,
    *,
    hooks: bool = False,
) -> list[dict[str, Any]]:
    """The chart's objects for these values (NOTES.txt left out), as `helm template
    --kube-version` renders them for that API server (default: Helm's own, a current one);
    the hooks' objects (the uninstall hook's) only with ``hooks``: they are not the release's."""
    with helm.Chart.load(CHART) as chart:
        if kube_version is None:
            manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
        else:
            manifests = _render_for(chart, values, kube_version)
    return [
        document
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for document in yaml.safe_load_all(text)
        if document and (hooks or HOOK not in (document["metadata"].get("annotations") or {}))
    ]


def _render_for(chart: helm.Chart, values: dict[str, Any] | None, kube_version: str) -> Any:
    """chart.render for an API server version: the library's render takes `kube_version` (it
    refuses an option it does not know), which helm-python-sdk 0.2's Chart.render does not
    pass on yet; helm.lint does, through the same library."""
    options = {"name": RELEASE, "namespace": NAMESPACE, "kube_version": kube_version}
    arguments = (chart._raw(), json.dumps(values) if values else None, json.dumps(options))
    return json.loads(helm_native.call_string("helm_render", *arguments))


def notes(values: dict[str, Any] | None = None) -> str:
    """The rendered NOTES.txt."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return manifests["compass-operator/templates/NOTES.txt"]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The single object of this kind."""
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's container."""
    containers = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def env(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The operator container's environment (plain values; not those from valueFrom)."""
    return {e["name"]: e["value"] for e in container(objects)["env"] if "value" in e}


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (api group, resource, verb) a rendered rule list grants."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# ------------------------------------------------------------------------------ the chart itself


def test_chart_metadata_matches_the_project() -> None:
    """apiVersion v2, version 0.1.0, appVersion = the package version (the default image tag)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "compass-operator"
    assert chart["version"] == "0.1.0"
    assert chart["appVersion"] == project["version"] == "0.1.0"
    assert OperatorSettings.model_fields["image"].default.endswith(f":{chart['appVersion']}")


EVERYTHING_ON = {
    "watchNamespaces": ["team-a", "team-b"],
    "replicaCount": 2,
    "metrics": {"serviceMonitor": {"enabled": True}},
    "grafanaDashboard": {"enabled": True},
    "logging": {"level": "debug", "format": "json"},
}


@pytest.mark.parametrize(
    ("values", "kube_version"),
    [
        (None, None),
        (EVERYTHING_ON, None),
        (EVERYTHING_ON, "v1.20.2"),
        (EVERYTHING_ON, "v1.26.0"),
        ({"peering": {"enabled": False}}, None),
    ],
    ids=["defaults", "everything-on", "everything-on-1.20", "everything-on-1.26", "standalone"],
)
def test_lint_is_clean(values: dict[str, Any] | None, kube_version: str | None) -> None:
    """`helm lint --strict`: no warnings or errors (only the icon suggestion, an info), also
    for the oldest server the chart supports (its PodDisruptionBudget API, no CEL)."""
    report = helm.lint(CHART, values, strict=True, kube_version=kube_version)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _documented_keys(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted paths of the keys values.schema.json declares (free-form maps not descended)."""
    for name, child in schema.get("properties", {}).items():
        assert child.get("description"), f"values.schema.json: {prefix}{name} has no description"
        yield f"{prefix}{name}"
        yield from _documented_keys(child, f"{prefix}{name}.")


def test_every_values_key_is_commented_and_in_the_schema() -> None:
    """Each chart-owned key of values.yaml has a comment line right above it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    declared = set(_documented_keys(schema))
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []
    seen = set()
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][\w-]*):", line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(k for _, k in stack), key])
        stack.append((indent, key))
        if path in declared:
            seen.add(path)
            assert lines[number - 1].strip().startswith("#"), f"values.yaml: {path} has no comment"
    assert seen >= {k for k in declared if k != "global"}
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(chart.values)


# ------------------------------------------------------------------------------ what it renders


def test_default_render_is_cluster_mode() -> None:
    """Defaults: the CRDs, ServiceAccount, ClusterRoles and bindings, the ClusterKopfPeering,
    Deployment, metrics Service."""
    objects = render()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == [
        "ClusterKopfPeering",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]
    cluster_scoped = (
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterKopfPeering",
        "CustomResourceDefinition",
    )
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert STANDARD_LABELS.items() <= labels.items(), obj["metadata"]["name"]
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"]["namespace"] == NAMESPACE
        else:
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
    assert "COMPASS_NAMESPACES" not in env(objects)
    assert "cluster-wide" in notes()


def test_deployment_is_one_locked_down_operator() -> None:
    """One replica, rolling (peering), `compass operator`, probes, resources, non-root,
    read-only root."""
    objects = render()
    deployment = only(objects, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    # Peering: the new pod starts before the old one goes, and waits (paused) for it to exit.
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    selector = spec["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": "compass-operator",
        "app.kubernetes.io/instance": RELEASE,
    }
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == FULLNAME
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    main = container(objects)
    assert main["command"] == ["compass", "operator"]
    assert main["image"] == "ghcr.io/compass-operator/compass-operator:0.1.0"
    security = main["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert main["resources"]["requests"]
    assert main["resources"]["limits"]["memory"]
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    for probe in ("livenessProbe", "readinessProbe"):
        assert main[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    assert mounts == {"/tmp": "tmp"}
    assert next(v for v in pod["volumes"] if v["name"] == "tmp")["emptyDir"]


def test_environment_is_what_operator_settings_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The container's COMPASS_* variables load into OperatorSettings as the chart means them."""
    objects = render(
        {
            "image": {"repository": "registry.local/compass", "tag": "dev"},
            "jobServiceAccount": "runner",
            "watchNamespaces": ["team-a", "team-b"],
            "allowedHosts": ["prometheus.example.com", "*.corp.example"],
            "allowedTargetNamespaces": ["serving"],
            "metricsNamespaces": ["monitoring"],
            "allowedJobImages": ["registry.local/eval/*"],
            "metrics": {"port": 9090},
            "health": {"port": 9091},
            "logging": {"level": "warning", "format": "json"},
            "ledger": {"textLimitMiB": 16, "textBudgetMiB": 48},
        }
    )
    variables = env(objects)
    assert set(variables) == {
        "COMPASS_IMAGE",
        "COMPASS_JOB_SERVICE_ACCOUNT",
        "COMPASS_NAMESPACES",
        "COMPASS_ALLOWED_HOSTS",
        "COMPASS_ALLOWED_TARGET_NAMESPACES",
        "COMPASS_METRICS_NAMESPACES",
        "COMPASS_ALLOWED_JOB_IMAGES",
        "COMPASS_METRICS_PORT",
        "COMPASS_HEALTH_PORT",
        "COMPASS_LOG_LEVEL",
        "COMPASS_LOG_FORMAT",
        "COMPASS_LEDGER_TEXT_LIMIT_MIB",
        "COMPASS_LEDGER_TEXT_BUDGET_MIB",
        "COMPASS_JOB_ALLOWED_TOLERATIONS",
        "COMPASS_JOB_ALLOWED_NODE_SELECTOR",
        "COMPASS_JOB_ALLOWED_PRIORITY_CLASSES",
        "COMPASS_JOB_ALLOWED_RUNTIME_CLASSES",
        "COMPASS_PEERING",
        "COMPASS_PEERING_LIFETIME_SECONDS",
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = OperatorSettings()
    assert settings.image == container(objects)["image"] == "registry.local/compass:dev"
    assert settings.job_service_account == "runner"
    assert settings.namespaces == ["team-a", "team-b"]
    assert settings.allowed_hosts == ["prometheus.example.com", "*.corp.example"]
    assert settings.allowed_target_namespaces == ["serving"]
    assert settings.metrics_namespaces == ["monitoring"]
    assert settings.allowed_job_images == ["registry.local/eval/*"]
    assert (settings.metrics_port, settings.health_port) == (9090, 9091)
    assert (settings.log_level, settings.log_format) == ("warning", "json")
    assert (settings.ledger_text_limit_mib, settings.ledger_text_budget_mib) == (16, 48)
    assert settings.peering == "compass-operator"
    assert settings.peering_priority is None  # each replica its own, from its start time
    assert settings.peering_lifetime_seconds == 60
    # kopf names a replica in the peering object by POD_ID: the pod's name.
    [pod_id] = [e for e in container(objects)["env"] if e["name"] == "POD_ID"]
    assert pod_id["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    assert ports == {"metrics": 9090, "health": 9091}


def test_job_pod_limits_reach_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """jobPods is unrestricted by default; set, its tolerations, node labels and maximum
    resources load into OperatorSettings as the limits the workflow check applies."""
    defaults = env(render())
    assert "COMPASS_JOB_MAX_RESOURCES" not in defaults
    for name, value in defaults.items():
        monkeypatch.setenv(name, value)
    assert OperatorSettings().job_pod_limits() == JobPodLimits()
    limited = {
        "allowedTolerations": ["nvidia.com/gpu:NoSchedule", "dedicated"],
        "allowedNodeSelector": ["pool=eval", "topology.kubernetes.io/zone=*"],
        "maxResources": {"cpu": 4, "memory": "8Gi", "nvidia.com/gpu": 0},
        "allowedPriorityClasses": ["batch-low"],
        "allowedRuntimeClasses": [],
    }
    for name, value in env(render({"jobPods": limited})).items():
        monkeypatch.setenv(name, value)
    limits = OperatorSettings().job_pod_limits()
    assert limits.tolerations == ("nvidia.com/gpu:NoSchedule", "dedicated")
    assert limits.node_selector == ("pool=eval", "topology.kubernetes.io/zone=*")
    assert limits.max_resources == {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "0"}
    assert (limits.priority_classes, limits.runtime_classes) == (("batch-low",), ())


def test_digest_pins_the_operator_and_the_jobs_image() -> None:
    """With image.digest set, the container and COMPASS_IMAGE both use repository@digest."""
    digest = "sha256:" + "ab" * 32
    objects = render({"image": {"digest": digest}})
    expected = f"ghcr.io/compass-operator/compass-operator@{digest}"
    assert container(objects)["image"] == env(objects)["COMPASS_IMAGE"] == expected


def test_the_jobs_pull_with_the_charts_image_pull_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """imagePullSecrets reaches the operator's pod and, through its settings, both Jobs' pods."""
    secrets = [{"name": "regcred"}, {"name": "mirror"}]
    objects = render({"imagePullSecrets": secrets})
    assert only(objects, "Deployment")["spec"]["template"]["spec"]["imagePullSecrets"] == secrets
    monkeypatch.setenv(
        "COMPASS_JOB_IMAGE_PULL_SECRETS", env(objects)["COMPASS_JOB_IMAGE_PULL_SECRETS"]
    )
    settings = OperatorSettings()
    assert settings.job_image_pull_secrets == ["regcred", "mirror"]
    spec = CompoundWorkflowSpec.model_validate(
        {
            "space": {"parameters": [{"name": "k", "type": "integer", "values": [1, 2]}]},
            "evaluation": {"dataset": {"size": 10}, "tau": 0.5},
            "slo": {"latencyMs": 100},
            "triton": {"service": "triton"},
        }
    )
    workflow = {
        "kind": "CompoundWorkflow",
        "metadata": {"name": "w", "namespace": "ml", "uid": "u"},
    }
    for build in (build_search_job, build_profile_job):
        job = build(workflow, spec, settings.image, "sa", None, settings.job_image_pull_secrets)
        assert job["spec"]["template"]["spec"]["imagePullSecrets"] == secrets
    # Without the value the operator's settings hold none, and the Jobs' pods name none.
    assert "COMPASS_JOB_IMAGE_PULL_SECRETS" not in env(render())


def test_cluster_rbac_is_exactly_what_the_operator_needs() -> None:
    """The ClusterRole grants compass_dev.rbac's rules and nothing more; bound to the SA."""
    objects = render()
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    assert granted(roles[FULLNAME]["rules"]) == permissions(
        operator_rules(clusterwide=True, peering=True)
    )
    standalone = render({"peering": {"enabled": False}})
    [plain] = [
        o for o in standalone if o["metadata"]["name"] == FULLNAME and o["kind"] == "ClusterRole"
    ]
    assert granted(plain["rules"]) == permissions(operator_rules(clusterwide=True, peering=False))
    assert granted(roles[f"{FULLNAME}-discovery"]["rules"]) == permissions(DISCOVERY_RULES)
    for rule in [*roles[FULLNAME]["rules"], *roles[f"{FULLNAME}-discovery"]["rules"]]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        assert "resourceNames" not in rule
        assert "nonResourceURLs" not in rule
    for binding in (o for o in objects if o["kind"] == "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] in roles
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
        ]


def test_namespaced_mode_grants_a_role_per_watched_namespace() -> None:
    """watchNamespaces: a Role + RoleBinding in each, no operator ClusterRole, the env set."""
    watched = ["team-a", "team-b"]
    objects = render({"watchNamespaces": watched})
    roles = [o for o in objects if o["kind"] == "Role"]
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == watched
    assert sorted(b["metadata"]["namespace"] for b in bindings) == watched
    for role in roles:
        assert granted(role["rules"]) == permissions(
            operator_rules(clusterwide=False, peering=True)
        )
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": FULLNAME,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
        ]
    cluster_roles = [o for o in objects if o["kind"] == "ClusterRole"]
    assert [r["metadata"]["name"] for r in cluster_roles] == [f"{FULLNAME}-discovery"]
    assert granted(cluster_roles[0]["rules"]) == permissions(DISCOVERY_RULES)
    assert json.loads(env(objects)["COMPASS_NAMESPACES"]) == watched
    assert "team-a, team-b" in notes({"watchNamespaces": watched})


@pytest.mark.parametrize("watched", [[], ["team-a"]])
def test_reading_secrets_is_a_value(watched: list[str]) -> None:
    """metricsAuthentication.readSecrets: get on Secrets (never list or watch) by default, in
    the operator's (Cluster)Role; false: nothing on Secrets at all."""
    for read in (True, False):
        objects = render(
            {"watchNamespaces": watched, "metricsAuthentication": {"readSecrets": read}}
        )
        [role] = [
            o
            for o in objects
            if o["kind"] in ("Role", "ClusterRole") and o["metadata"]["name"] == FULLNAME
        ]
        secrets = {(g, r, v) for g, r, v in granted(role["rules"]) if r == "secrets"}
        assert secrets == ({("", "secrets", "get")} if read else set())
        assert granted(role["rules"]) == permissions(
            operator_rules(clusterwide=not watched, peering=True, read_secrets=read)
        )


@pytest.mark.parametrize("watched", [[], ["team-a"]])
def test_the_gateway_actuators_rules_only_when_it_is_enabled(watched: list[str]) -> None:
    """actuators.inferenceModelRewrite: get, create and patch on llm-d's InferenceModelRewrites
    in the operator's (Cluster)Role when true; off by default, nothing of llm-d.ai at all."""
    for enabled in (None, False, True):
        values: dict[str, Any] = {"watchNamespaces": watched}
        if enabled is not None:
            values["actuators"] = {"inferenceModelRewrite": enabled}
        objects = render(values)
        [role] = [
            o
            for o in objects
            if o["kind"] in ("Role", "ClusterRole") and o["metadata"]["name"] == FULLNAME
        ]
        llmd = {(g, r, v) for g, r, v in granted(role["rules"]) if g == "llm-d.ai"}
        wanted = {("llm-d.ai", "inferencemodelrewrites", v) for v in ("get", "create", "patch")}
        assert llmd == (wanted if enabled else set())
        assert granted(role["rules"]) == permissions(
            operator_rules(clusterwide=not watched, peering=True, model_rewrites=bool(enabled))
        )


@pytest.mark.parametrize("watched", [[], ["team-a"]])
def test_the_http_route_actuators_rules_only_when_it_is_enabled(watched: list[str]) -> None:
    """actuators.httpRoute: get, create and patch on the Gateway API's HTTPRoutes in the
    operator's (Cluster)Role when true; off by default, nothing of gateway.networking.k8s.io."""
    group = "gateway.networking.k8s.io"
    for enabled in (None, False, True):
        values: dict[str, Any] = {"watchNamespaces": watched}
        if enabled is not None:
            values["actuators"] = {"httpRoute": enabled}
        objects = render(values)
        [role] = [
            o
            for o in objects
            if o["kind"] in ("Role", "ClusterRole") and o["metadata"]["name"] == FULLNAME
        ]
        routes = {(g, r, v) for g, r, v in granted(role["rules"]) if g == group}
        wanted = {(group, "httproutes", v) for v in ("get", "create", "patch")}
        assert routes == (wanted if enabled else set())
        assert granted(role["rules"]) == permissions(
            operator_rules(clusterwide=not watched, peering=True, http_routes=bool(enabled))
        )


def test_rbac_can_be_left_to_the_platform_team() -> None:
    """rbac.create false: no RBAC; rbac.discovery false: no cluster-scoped RBAC when namespaced."""
    kinds = {o["kind"] for o in render({"rbac": {"create": False}})}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    namespaced = render({"watchNamespaces": ["a"], "rbac": {"discovery": False}})
    assert not {o["kind"] for o in namespaced} & {"ClusterRole", "ClusterRoleBinding"}


def test_own_service_account_must_be_named() -> None:
    """serviceAccount.create false without a name fails with a message naming the key."""
    with pytest.raises(helm.HelmRenderError, match=r"serviceAccount\.name is required"):
        render({"serviceAccount": {"create": False}})
    objects = render({"serviceAccount": {"create": False, "name": "ops-sa"}})
    assert "ServiceAccount" not in {o["kind"] for o in objects}
    assert only(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops-sa"


def test_service_monitor_scrapes_the_metrics_service() -> None:
    """Off by default; when on, it selects the metrics Service and its `metrics` port."""
    assert "ServiceMonitor" not in {o["kind"] for o in render()}
    objects = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "p"}}}})
    monitor = only(objects, "ServiceMonitor")
    service = only(objects, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "p"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    # The operator's series have their own `namespace` label (the policy's): keep it.
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"].items() <= (
        only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )


def test_grafana_dashboard_configmap() -> None:
    """Off by default; when on, a labelled ConfigMap whose dashboard queries the compass_* series."""
    assert "ConfigMap" not in {o["kind"] for o in render()}
    objects = render(
        {"grafanaDashboard": {"enabled": True, "namespace": "grafana", "sloLatencyMs": 750}}
    )
    config_map = only(objects, "ConfigMap")
    assert config_map["metadata"]["namespace"] == "grafana"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["compass-operator.json"])
    text = json.dumps(dashboard)
    assert "__" not in text.replace("$__", ""), "a placeholder was not substituted"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["slo_ms"]["query"] == "750"
    assert variables["router_model"]["query"] == "router"
    titles = {p["title"]: p for p in dashboard["panels"]}
    exprs = {title: " ".join(t["expr"] for t in p["targets"]) for title, p in titles.items()}
    # Namespace and policy variables from the operator's own series; every policy panel uses both.
    assert (
        variables["namespace"]["query"]["query"] == "label_values(compass_policy_ready, namespace)"
    )
    assert "$namespace" in variables["policy"]["query"]["query"]
    assert "queue_threshold" not in variables  # the thresholds come from the metrics
    queue = exprs["Queue depth vs the active entry's thresholds"]
    for series in (
        "compass_queue_depth",
        "compass_stay_queue_threshold",
        "compass_enter_queue_threshold",
    ):
        assert f'{series}{{namespace=~"$namespace", policy=~"$policy"}}' in queue
    active = titles["Active configuration"]
    assert active["type"] == "state-timeline"
    assert "compass_active_configuration_info" in exprs["Active configuration"]
    assert "{{name}}" in active["targets"][0]["legendFormat"]
    assert "compass_served_accuracy" in exprs["Accuracy served"]
    assert "compass_capacity_pressure" in exprs["Capacity pressure"]
    assert "compass_workflow_searches_total" in exprs["Workflow Jobs and samples"]
    assert "rate(compass_switches_total" in exprs["Configuration switches"]
    assert "$slo_ms" in exprs["SLO compliance"]
    # What the routers served, from their own counters (model-images/router/model.py).
    served = exprs["Requests the routers served, by configuration"]
    assert 'compass_router_served_total{model="$router_model"}' in served
    assert 'compass_router_refused_total{model="$router_model"}' in served
    exported = _exported_series()
    for metric in OPERATOR_METRICS:
        assert metric in exported, metric
        assert metric in text, metric
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def _exported_series() -> set[str]:
    """The series names OperatorMetrics exports (a counter's with its _total)."""
    families = OperatorMetrics().registry.collect()
    return {f.name + "_total" if f.type == "counter" else f.name for f in families}


def test_default_log_is_info_text_as_the_operators_own_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chart's logging defaults are what the operator does without them."""
    variables = env(render())
    assert (variables["COMPASS_LOG_LEVEL"], variables["COMPASS_LOG_FORMAT"]) == ("info", "text")
    defaults = OperatorSettings()
    assert (defaults.log_level, defaults.log_format) == ("info", "text")


# ------------------------------------------------------------------------------ CRDs


def _crds(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rendered CRDs by name."""
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "CustomResourceDefinition"}


def test_crds_are_installed_and_kept_unless_told_otherwise() -> None:
    """Both CRDs by default, with Helm's keep policy; crds.keep false drops the policy;
    crds.install false renders none (a second release, or CRDs applied by hand)."""
    names = {resource.name for resource in RESOURCES}
    kept = _crds(render())
    assert set(kept) == names
    for crd in kept.values():
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    for crd in _crds(render({"crds": {"keep": False}})).values():
        assert "annotations" not in crd["metadata"]
    assert _crds(render({"crds": {"install": False}})) == {}
    assert _crds(render({"crds": {"install": False}}, kube_version="1.30.0")) == {}
    assert "helm uninstall leaves them" in notes()
    assert "helm uninstall DELETES them" in notes({"crds": {"keep": False}})
    assert "come from elsewhere" in notes({"crds": {"install": False}})


def _without(fields: tuple[str, ...], value: Any) -> Any:
    """value (a CRD or part of it) without its CEL rules (VALIDATIONS in fields), or without
    these fields of each rule."""
    if isinstance(value, dict):
        return {
            k: (
                [{f: x for f, x in rule.items() if f not in fields} for rule in v]
                if k == VALIDATIONS
                else _without(fields, v)
            )
            for k, v in value.items()
            if not (k == VALIDATIONS and VALIDATIONS in fields)
        }
    if isinstance(value, list):
        return [_without(fields, item) for item in value]
    return value


def _rules(value: Any) -> list[dict[str, Any]]:
    """Every CEL rule in value (a CRD or part of it)."""
    if isinstance(value, dict):
        return list(value.get(VALIDATIONS, [])) + [
            rule for k, v in value.items() if k != VALIDATIONS for rule in _rules(v)
        ]
    if isinstance(value, list):
        return [rule for item in value for rule in _rules(item)]
    return []


@pytest.mark.parametrize(
    ("kube_version", "left_out"),
    [
        ("1.20.2", (VALIDATIONS,)),  # the k8s tier's server: no CEL
        ("1.24.17", (VALIDATIONS,)),  # alpha, off by default: the server would drop them
        ("1.25.0", ("fieldPath", "reason")),  # rules enforced; their reason and fieldPath unknown
        ("v1.27.16-eks-a18cd3a", ("fieldPath", "reason")),
        ("1.28.0", ()),
        ("v1.30.4+k3s1", ()),
        (None, ()),  # helm template without --kube-version: Helm's own, a current one
    ],
)
def test_cel_rules_only_where_the_api_server_knows_them(
    kube_version: str | None, left_out: tuple[str, ...]
) -> None:
    """Each CRD is the generated one (crds/), less the CEL parts the server does not know:
    server-side apply (Helm 4) refuses a field the server's CRD schema lacks."""
    rendered = _crds(render(kube_version=kube_version))
    for resource in RESOURCES:
        crd = rendered[resource.name]
        generated = build_crd(resource)
        assert crd["spec"] == _without(left_out, generated["spec"])
        assert generated["metadata"]["labels"].items() <= crd["metadata"]["labels"].items()
        rules = _rules(crd)
        if VALIDATIONS in left_out:
            assert rules == []
        else:
            assert len(rules) == len(_rules(generated)) > 0
            has_field_paths = any("fieldPath" in rule for rule in rules)
            assert has_field_paths == ("fieldPath" not in left_out)


# ------------------------------------------------------------------------------ disruptions


def test_a_disruption_budget_only_for_more_than_one_replica() -> None:
    """replicaCount 2: a PodDisruptionBudget with maxUnavailable 1 over the operator's pods
    (policy/v1, or v1beta1 on 1.20, which has no policy/v1); none for one replica, whose budget
    would block every drain, and none when switched off."""
    assert "PodDisruptionBudget" not in {o["kind"] for o in render()}
    objects = render({"replicaCount": 2})
    budget = only(objects, "PodDisruptionBudget")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["metadata"]["namespace"] == NAMESPACE
    assert budget["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in budget["spec"]
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    old = render({"replicaCount": 2}, kube_version="1.20.2")
    assert only(old, "PodDisruptionBudget")["apiVersion"] == "policy/v1beta1"
    assert only(render({"replicaCount": 2}, kube_version="1.21.0"), "PodDisruptionBudget")[
        "apiVersion"
    ] == ("policy/v1")
    switched_off = render({"replicaCount": 3, "podDisruptionBudget": {"enabled": False}})
    assert "PodDisruptionBudget" not in {o["kind"] for o in switched_off}


# ------------------------------------------------------------------------------ peering


def _peering_crds() -> dict[str, dict[str, Any]]:
    """The chart's kopf peering CRDs by kind."""
    documents = yaml.safe_load_all((CHART / "crds" / "kopf-peerings.yml").read_text())
    return {d["spec"]["names"]["kind"]: d for d in documents if d}


def test_peering_crds_are_what_kopf_watches() -> None:
    """kopf.dev/v1 ClusterKopfPeering (Cluster) and KopfPeering (Namespaced), no status
    subresource (kopf merge-patches the object), and the RBAC names their plurals."""
    from kopf._cogs.structs import references

    crds = _peering_crds()
    assert set(crds) == {"ClusterKopfPeering", "KopfPeering"}
    expected = {
        "ClusterKopfPeering": ("Cluster", references.CLUSTER_PEERINGS_K, CLUSTER_PEERING_RULES),
        "KopfPeering": ("Namespaced", references.NAMESPACED_PEERINGS_K, NAMESPACED_PEERING_RULES),
    }
    for kind, (scope, selector, rules) in expected.items():
        spec = crds[kind]["spec"]
        assert spec["scope"] == scope
        assert (spec["group"], spec["versions"][0]["name"]) == (selector.group, selector.version)
        assert spec["names"]["plural"] == selector.any_name
        assert crds[kind]["metadata"]["name"] == f"{selector.any_name}.{spec['group']}"
        assert "subresources" not in spec["versions"][0]
        assert {(r.api_group, r.resources) for r in rules} == {
            (spec["group"], (selector.any_name,))
        }


def test_peering_objects_follow_the_mode() -> None:
    """One ClusterKopfPeering (cluster mode) or a KopfPeering per watched namespace, named as
    COMPASS_PEERING says; none (and Recreate, one replica) without peering."""
    cluster = render({"peering": {"name": "ops-peering"}})
    peering = only(cluster, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert "namespace" not in peering["metadata"]
    assert peering["metadata"]["name"] == env(cluster)["COMPASS_PEERING"] == "ops-peering"
    watched = ["team-a", "team-b"]
    namespaced = render({"watchNamespaces": watched, "replicaCount": 2})
    peerings = [o for o in namespaced if o["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == watched
    assert {p["metadata"]["name"] for p in peerings} == {"compass-operator"}
    assert not [o for o in namespaced if o["kind"] == "ClusterKopfPeering"]
    assert only(namespaced, "Deployment")["spec"]["replicas"] == 2

    standalone = render({"peering": {"enabled": False}})
    assert not {o["kind"] for o in standalone} & {"ClusterKopfPeering", "KopfPeering"}
    assert "COMPASS_PEERING" not in env(standalone)
    assert "POD_ID" not in {e["name"] for e in container(standalone)["env"]}
    spec = only(standalone, "Deployment")["spec"]
    assert (spec["replicas"], spec["strategy"]) == (1, {"type": "Recreate"})
    assert "Peering is off" in notes({"peering": {"enabled": False}})
    assert "kubectl get clusterkopfpeering compass-operator" in notes()


# ------------------------------------------------------------------------------ bad values


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
        ({"watchNamespaces": ["a", "a"]}, "/watchNamespaces"),
        ({"watchNamespaces": "team-a"}, "/watchNamespaces"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"metrics": {"port": 0}}, "/metrics/port"),
        ({"health": {"port": 70000}}, "/health/port"),
        ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
        ({"metrics": {"serviceMonitor": {"interval": "30"}}}, "/metrics/serviceMonitor/interval"),
        ({"metrics": {"serviceMonitor": {"enable": True}}}, "enable"),
        ({"rbac": {"create": "yes"}}, "/rbac/create"),
        ({"replicaCount": 2, "peering": {"enabled": False}}, "replicaCount"),
        ({"replicaCount": 0}, "/replicaCount"),
        ({"peering": {"name": "Not_A_Name"}}, "/peering/name"),
        ({"peering": {"lifetimeSeconds": 1}}, "/peering/lifetimeSeconds"),
        ({"peering": {"enable": True}}, "enable"),
        ({"grafanaDashboard": {"sloLatencyMs": 0}}, "/grafanaDashboard/sloLatencyMs"),
        ({"crds": {"install": "yes"}}, "/crds/install"),
        ({"crds": {"keepp": True}}, "keepp"),
        ({"podDisruptionBudget": {"minAvailable": 1}}, "minAvailable"),
        ({"logging": {"level": "verbose"}}, "/logging/level"),
        ({"logging": {"format": "logfmt"}}, "/logging/format"),
        ({"jobPods": {"allowedTolerations": ["gpu:NoWhere"]}}, "/jobPods/allowedTolerations/0"),
        ({"jobPods": {"allowedNodeSelector": ["pool"]}}, "/jobPods/allowedNodeSelector/0"),
        ({"jobPods": {"maxResources": {"memory": "8GB"}}}, "/jobPods/maxResources/memory"),
        ({"jobPods": {"allowedPriorityClasses": ["High"]}}, "/jobPods/allowedPriorityClasses/0"),
        ({"jobPods": {"maxGpus": 1}}, "maxGpus"),
    ],
)
def test_bad_values_fail_naming_the_key(values: dict[str, Any], key: str) -> None:
    """values.schema.json rejects the value, and the message says which key (as helm install)."""
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as error:
        chart.validate_schema(values)
    assert key in str(error.value)
    with pytest.raises(helm.HelmValuesError, match=re.escape(key)):
        render(values)


# ------------------------------------------------------------------------------ the uninstall hook


def _hook(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The uninstall hook's objects."""
    return [
        o for o in render(values, hooks=True) if HOOK in (o["metadata"].get("annotations") or {})
    ]


@pytest.mark.parametrize("watched", [[], ["team-a", "team-b"]])
def test_uninstall_releases_kopfs_finalizers_with_only_the_rights_it_needs(
    watched: list[str],
) -> None:
    """After the release's objects are deleted, a Job of the operator's image waits for the
    operator's pods to go, then takes kopf's finalizer off the workflows and policies: its own
    ServiceAccount, granted RELEASE_RULES where the operator acted and RELEASE_POD_RULES in the
    release's namespace, and nothing else; everything of it is deleted once it succeeded."""
    objects = _hook({"watchNamespaces": watched})
    name = f"{FULLNAME}-uninstall"
    for obj in objects:
        annotations = obj["metadata"]["annotations"]
        assert annotations[HOOK] == "post-delete", obj["metadata"]["name"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        # The account and its rules are made before the Job.
        weight = int(annotations["helm.sh/hook-weight"])
        assert weight == (0 if obj["kind"] == "Job" else -5), obj["kind"]
    job = only(objects, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name
    [run] = pod["containers"]
    assert run["image"] == "ghcr.io/compass-operator/compass-operator:0.1.0"
    selector = f"app.kubernetes.io/name=compass-operator,app.kubernetes.io/instance={RELEASE}"
    assert run["command"] == [
        "compass",
        "operator",
        "release-finalizers",
        *(f"--namespace={n}" for n in watched),
        f"--wait-for-pods={selector}",
        f"--pods-namespace={NAMESPACE}",
        "--timeout=120",
    ]
    # The hook's own pod does not match what it waits for.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in (p.split("=") for p in selector.split(",")))
    assert run["securityContext"]["readOnlyRootFilesystem"] is True
    # Its rules: RELEASE_RULES where the operator acts (a ClusterRole in cluster mode, a Role
    # in each watched namespace), pods list in the release's namespace.
    rules = {
        (o["kind"], o["metadata"].get("namespace")): o
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    scopes = [("Role", n) for n in watched] or [("ClusterRole", None)]
    assert set(rules) == {*scopes, ("Role", NAMESPACE)}
    for scope in scopes:
        assert granted(rules[scope]["rules"]) == permissions(RELEASE_RULES)
    assert granted(rules[("Role", NAMESPACE)]["rules"]) == permissions(RELEASE_POD_RULES)
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}
        ]
    assert only(objects, "ServiceAccount")["metadata"]["name"] == name


def test_the_uninstall_hook_can_be_left_out() -> None:
    assert _hook({"uninstall": {"releaseFinalizers": False}}) == []
    assert {o["kind"] for o in _hook({"rbac": {"create": False}})} == {"ServiceAccount", "Job"}
