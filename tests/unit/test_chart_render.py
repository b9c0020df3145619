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
import pytest
import yaml

from compass.controllers.rbac import (
    CLUSTER_PEERING_RULES,
    DISCOVERY_RULES,
    NAMESPACED_PEERING_RULES,
    OPERATOR_RULES,
    operator_rules,
    permissions,
)
from compass.controllers.runtime import OperatorMetrics
from compass.controllers.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "compass-operator"
RELEASE, NAMESPACE = "compass", "compass-system"
FULLNAME = "compass-compass-operator"
STANDARD_LABELS = {
    "app.kubernetes.io/name": "compass-operator",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/version": "0.1.0",
    "app.kubernetes.io/managed-by": "Helm",
    "app.kubernetes.io/part-of": "compass-operator",
    "helm.sh/chart": "compass-operator-0.1.0",
}
# The series the dashboard charts, each exported by the operator (compass.controllers.runtime's
# OperatorMetrics, which also exports compass_policy_ready: the dashboard does not chart it).
OPERATOR_METRICS = (
    "compass_queue_depth",
    "compass_active_configuration_index",
    "compass_switches_total",
    "compass_decision_seconds",
    "compass_reconciles_total",
    "compass_errors_total",
)


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's objects for these values (NOTES.txt left out)."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return [
        document
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for document in yaml.safe_load_all(text)
        if document
    ]


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


@pytest.mark.parametrize(
    "values",
    [
        None,
        {
            "watchNamespaces": ["team-a", "team-b"],
            "replicaCount": 2,
            "metrics": {"serviceMonitor": {"enabled": True}},
            "grafanaDashboard": {"enabled": True},
        },
        {"peering": {"enabled": False}},
    ],
    ids=["defaults", "everything-on", "standalone"],
)
def test_lint_is_clean(values: dict[str, Any] | None) -> None:
    """`helm lint --strict`: no warnings or errors (only the icon suggestion, an info)."""
    report = helm.lint(CHART, values, strict=True)
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
    """Defaults: ServiceAccount, ClusterRoles and bindings, the ClusterKopfPeering, Deployment,
    metrics Service."""
    objects = render()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == [
        "ClusterKopfPeering",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert STANDARD_LABELS.items() <= labels.items(), obj["metadata"]["name"]
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"):
            assert obj["metadata"]["namespace"] == NAMESPACE
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
            "allowedJobImages": ["registry.local/eval/*"],
            "metrics": {"port": 9090},
            "health": {"port": 9091},
        }
    )
    variables = env(objects)
    assert set(variables) == {
        "COMPASS_IMAGE",
        "COMPASS_JOB_SERVICE_ACCOUNT",
        "COMPASS_NAMESPACES",
        "COMPASS_ALLOWED_HOSTS",
        "COMPASS_ALLOWED_TARGET_NAMESPACES",
        "COMPASS_ALLOWED_JOB_IMAGES",
        "COMPASS_METRICS_PORT",
        "COMPASS_HEALTH_PORT",
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
    assert settings.allowed_job_images == ["registry.local/eval/*"]
    assert (settings.metrics_port, settings.health_port) == (9090, 9091)
    assert settings.peering == "compass-operator"
    assert settings.peering_priority is None  # each replica its own, from its start time
    assert settings.peering_lifetime_seconds == 60
    # kopf names a replica in the peering object by POD_ID: the pod's name.
    [pod_id] = [e for e in container(objects)["env"] if e["name"] == "POD_ID"]
    assert pod_id["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    assert ports == {"metrics": 9090, "health": 9091}


def test_digest_pins_the_operator_and_the_jobs_image() -> None:
    """With image.digest set, the container and COMPASS_IMAGE both use repository@digest."""
    digest = "sha256:" + "ab" * 32
    objects = render({"image": {"digest": digest}})
    expected = f"ghcr.io/compass-operator/compass-operator@{digest}"
    assert container(objects)["image"] == env(objects)["COMPASS_IMAGE"] == expected


def test_cluster_rbac_is_exactly_what_the_operator_needs() -> None:
    """The ClusterRole grants compass.controllers.rbac's rules and nothing more; bound to the SA."""
    objects = render()
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    assert granted(roles[FULLNAME]["rules"]) == permissions(
        operator_rules(clusterwide=True, peering=True)
    )
    standalone = render({"peering": {"enabled": False}})
    [plain] = [
        o for o in standalone if o["metadata"]["name"] == FULLNAME and o["kind"] == "ClusterRole"
    ]
    assert granted(plain["rules"]) == permissions(OPERATOR_RULES)
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
    assert "compass_queue_depth" in exprs["Queue depth vs switch threshold"]
    assert "$queue_threshold" in exprs["Queue depth vs switch threshold"]
    assert "compass_active_configuration_index" in exprs["Active configuration"]
    assert "rate(compass_switches_total" in exprs["Configuration switches"]
    assert "$slo_ms" in exprs["SLO compliance"]
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
    ],
)
def test_bad_values_fail_naming_the_key(values: dict[str, Any], key: str) -> None:
    """values.schema.json rejects the value, and the message says which key (as helm install)."""
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as error:
        chart.validate_schema(values)
    assert key in str(error.value)
    with pytest.raises(helm.HelmValuesError, match=re.escape(key)):
        render(values)
