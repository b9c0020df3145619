"""The Helm chart installs into a real API server, and its RBAC is least privilege there.

Helm 4 runs in-process (helm-python-sdk) against the k8s tier's kube-apiserver 1.20 with the
admin kubeconfig, in both modes: cluster-wide (ClusterRole) and namespaced (`watchNamespaces`:
a Role per watched namespace). The API server itself then answers SubjectAccessReviews for the
operator's ServiceAccount: every permission compass_dev.rbac lists is allowed (in namespaced
mode only in the watched namespaces), and representative dangerous ones are denied. The chart's
CRDs also accept every example manifest as written (nothing pruned).

The CRDs are templates of the chart: a `helm upgrade` changes the served CRD, `helm uninstall`
leaves the CRDs and every custom resource (crds.keep), and CRDs that kubectl applied pass to a
release as the chart README says. They are cluster-wide, so one release owns them: the
cluster-mode release and the CRD-upgrade test's take them over as the README says (other modules
of the tier apply them with kubectl), every other release here installs with crds.install false.

No pod runs the operator here (no node fixture is requested): these tests are about what the
chart creates and grants, not about the operator's behaviour.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import helm_python._native as helm_native
import pytest
import yaml
from cluster import Cluster, temporary_namespace, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.crds import PARETO_POLICY, RESOURCES, build_crd, crd_template, render_crds
from compass.api.meta import GROUP, POLICY_PLURAL, VERSION
from compass.controllers import kubeapi
from compass.controllers.builders import (
    build_job_role,
    build_job_role_binding,
    build_job_service_account,
)
from compass.controllers.ledgerchunks import MAX_CHUNKS
from compass_dev.rbac import DISCOVERY_RULES, Rule, operator_rules, permissions

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "compass-operator"
EXAMPLES = REPO / "examples"
ALL_NAMESPACES = ""  # a SubjectAccessReview without a namespace: cluster-wide / all namespaces
HERE = "<namespace>"  # placeholder: the namespace a check is made in

# What the operator must never be able to do, wherever it runs: (verb, group, resource, where).
FORBIDDEN: tuple[tuple[str, str, str, str], ...] = (
    ("delete", "apiextensions.k8s.io", "customresourcedefinitions", ALL_NAMESPACES),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", ALL_NAMESPACES),
    ("patch", "apiextensions.k8s.io", "customresourcedefinitions", ALL_NAMESPACES),
    # get (by name) is granted for metrics.authentication; enumerating them is not.
    ("list", "", "secrets", HERE),
    ("watch", "", "secrets", HERE),
    ("list", "", "secrets", ALL_NAMESPACES),
    ("create", "", "pods", HERE),
    ("delete", "", "pods", HERE),
    ("create", "", "pods/exec", HERE),
    ("patch", "apps", "deployments", HERE),
    ("delete", "apps", "deployments", HERE),
    ("list", "", "nodes", ALL_NAMESPACES),
    ("patch", "", "nodes", ALL_NAMESPACES),
    ("create", "", "namespaces", ALL_NAMESPACES),
    ("delete", "", "namespaces", ALL_NAMESPACES),
    ("create", "compass.io", "compoundworkflows", HERE),
    ("update", "compass.io", "compoundworkflows", HERE),
    ("delete", "compass.io", "compoundworkflows", HERE),
    # The generated policy is server-side applied, never replaced.
    ("update", "compass.io", "paretopolicies", HERE),
    ("update", "", "configmaps", HERE),
    ("patch", "batch", "jobs", HERE),
    ("delete", "", "events", HERE),
    ("delete", "", "serviceaccounts", HERE),
    ("create", "", "serviceaccounts/token", HERE),
    ("impersonate", "", "serviceaccounts", HERE),
    ("escalate", "rbac.authorization.k8s.io", "roles", HERE),
    ("bind", "rbac.authorization.k8s.io", "roles", HERE),
    ("delete", "rbac.authorization.k8s.io", "roles", HERE),
    ("patch", "rbac.authorization.k8s.io", "rolebindings", HERE),
    ("create", "rbac.authorization.k8s.io", "clusterroles", ALL_NAMESPACES),
    ("bind", "rbac.authorization.k8s.io", "clusterroles", ALL_NAMESPACES),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ALL_NAMESPACES),
    # Peering: kopf lists, watches and patches the objects the chart made, nothing more.
    ("create", "kopf.dev", "kopfpeerings", HERE),
    ("delete", "kopf.dev", "kopfpeerings", HERE),
    ("update", "kopf.dev", "kopfpeerings", HERE),
    ("create", "kopf.dev", "clusterkopfpeerings", ALL_NAMESPACES),
    ("delete", "kopf.dev", "clusterkopfpeerings", ALL_NAMESPACES),
    ("update", "kopf.dev", "clusterkopfpeerings", ALL_NAMESPACES),
    ("get", "kopf.dev", "clusterkopfpeerings", ALL_NAMESPACES),
)
PEERING_CRDS = CHART / "crds" / "kopf-peerings.yml"
CRD_NAMES = tuple(resource.name for resource in RESOURCES)
# Helm's marks of the release an object belongs to (it refuses to take over one without them).
OWNER_LABEL = "app.kubernetes.io/managed-by"
OWNER_ANNOTATIONS = ("meta.helm.sh/release-name", "meta.helm.sh/release-namespace")
# Every release here leaves the uninstall hook out: its Job needs a pod to run on and the
# cluster's credentials, which this module's releases have no use for (no operator runs here).
# The e2e tier's test_readme_install_uninstall.py runs it.
NO_UNINSTALL_HOOK: dict[str, Any] = {"uninstall": {"releaseFinalizers": False}}
# A ParetoPolicy field the "older" chart's CRD lacks (tests of the CRD upgrade).
NEW_FIELD = "switchDelayMs"


@dataclass(frozen=True)
class Installed:
    """A release of the chart and where its operator may act."""

    release: str
    namespace: str  # the release's (and the ServiceAccount's) namespace
    service_account: str
    workloads: tuple[str, ...]  # namespaces the operator must act in
    elsewhere: str  # a namespace it must not act in ("" in cluster mode: there is none)

    @property
    def user(self) -> str:
        """The ServiceAccount's user name."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def _suffix() -> str:
    return str(time.monotonic_ns() % 1_000_000)


def _helm(cluster: Cluster, namespace: str) -> helm.Config:
    """A Helm client for the test cluster's admin, releases stored in namespace."""
    return helm.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=namespace)


def _existing_crds(cluster: Cluster) -> list[str]:
    """The compass.io CRDs the API server has."""
    found = cluster.kubectl("get", "crd", "-o", "name", *CRD_NAMES, "--ignore-not-found")
    return [
        line.removeprefix("customresourcedefinition.apiextensions.k8s.io/")
        for line in (found.stdout.split())
    ]


def _hand_crds_to(cluster: Cluster, release: str, namespace: str) -> None:
    """The chart README's commands for CRDs a release did not install (kubectl applied them, or
    an uninstalled release kept them): mark them as this release's, so Helm takes them over."""
    existing = _existing_crds(cluster)
    if not existing:
        return
    cluster.kubectl("label", "crd", *existing, f"{OWNER_LABEL}=Helm", "--overwrite")
    release_name, release_namespace = OWNER_ANNOTATIONS
    cluster.kubectl(
        "annotate",
        "crd",
        *existing,
        f"{release_name}={release}",
        f"{release_namespace}={namespace}",
        "--overwrite",
    )


def _install(
    config: helm.Config, chart: Path, release: str, values: dict[str, Any], namespace: str
) -> dict[str, Any]:
    """`helm install --force-conflicts`: the library behind helm-python-sdk 0.2 takes the option,
    its Config.install does not pass it on yet."""
    options = {"namespace": namespace, "timeout_seconds": 60, "force_conflicts": True}
    no_handle = helm_native.HANDLE(0)  # no cancellation context; the chart given by path
    arguments = (config._raw(), no_handle, no_handle, str(chart), release, json.dumps(values))
    result: dict[str, Any] = json.loads(
        helm_native.call_string("helm_install", *arguments, json.dumps(options))
    )
    return result


@contextlib.contextmanager
def _release(
    cluster: Cluster, api: Any, release: str, values: dict[str, Any], workloads: tuple[str, ...]
) -> Iterator[str]:
    """Install the chart (namespaces created first; the CRDs handed to it unless crds.install is
    false), yield its namespace, uninstall."""
    namespace = f"{release}-system"
    with contextlib.ExitStack() as namespaces:
        for name in (namespace, *workloads):
            namespaces.enter_context(temporary_namespace(api, name))
        if values.get("crds", {}).get("install", True):
            _hand_crds_to(cluster, release, namespace)
        values = {**values, **NO_UNINSTALL_HOOK}
        with _helm(cluster, namespace) as config:
            result = config.install(str(CHART), release, values, namespace=namespace, timeout=60)
            assert result["status"] == "deployed", result
            try:
                yield namespace
            finally:
                config.uninstall(release, timeout=60)


@pytest.fixture(scope="module")
def cluster_mode(k8s_cluster: Cluster, k8s_api: Any) -> Iterator[Installed]:
    """The chart with default values: the operator acts in every namespace."""
    suffix = _suffix()
    release, tenant = f"cw{suffix}", f"tenant-{suffix}"
    with _release(k8s_cluster, k8s_api, release, {}, (tenant,)) as namespace:
        yield Installed(release, namespace, f"{release}-compass-operator", (tenant,), "")


@pytest.fixture(scope="module")
def namespaced_mode(k8s_cluster: Cluster, k8s_api: Any) -> Iterator[Installed]:
    """watchNamespaces [team-a, team-b]: the operator acts there only, not in team-c."""
    suffix = _suffix()
    release = f"ns{suffix}"
    watched = (f"team-a-{suffix}", f"team-b-{suffix}")
    other = f"team-c-{suffix}"
    # The cluster-mode release owns the CRDs: a second release must not install them.
    values = {"watchNamespaces": list(watched), "crds": {"install": False}}
    with _release(k8s_cluster, k8s_api, release, values, (*watched, other)) as namespace:
        yield Installed(release, namespace, f"{release}-compass-operator", watched, other)


def _allowed(api: Any, installed: Installed, verb: str, group: str, resource: str, ns: str) -> bool:
    """The API server's answer: may the operator's ServiceAccount do this?"""
    resource, _, subresource = resource.partition("/")
    attributes = {"verb": verb, "group": group, "resource": resource}
    if subresource:
        attributes["subresource"] = subresource
    if ns:
        attributes["namespace"] = ns
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": installed.user,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{installed.namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }
    authorization: Any = client.AuthorizationV1Api(api)
    response = authorization.create_subject_access_review(review, _preload_content=False)
    return bool(json.loads(response.data)["status"].get("allowed"))


def _subject_may(
    api: Any, namespace: str, account: str, verb: str, resource: str, name: str = ""
) -> bool:
    """The API server's answer: may this ServiceAccount of the namespace do this (to the object
    of this name, if given)?"""
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
    authorization: Any = client.AuthorizationV1Api(api)
    response = authorization.create_subject_access_review(review, _preload_content=False)
    return bool(json.loads(response.data)["status"].get("allowed"))


def _answers(
    api: Any, installed: Installed, checks: list[tuple[str, str, str, str]]
) -> dict[tuple[str, str, str, str], bool]:
    return {check: _allowed(api, installed, *check) for check in checks}


def _needed(
    namespaces: tuple[str, ...], rules: tuple[Rule, ...] | None = None
) -> list[tuple[str, str, str, str]]:
    """(verb, group, resource, namespace) for every operator permission in these namespaces
    (by default the namespaced mode's, with peering)."""
    chosen = rules if rules is not None else operator_rules(clusterwide=False, peering=True)
    return [
        (verb, group, resource, namespace)
        for group, resource, verb in sorted(permissions(chosen))
        for namespace in namespaces
    ]


def _cluster_peering() -> list[tuple[str, str, str, str]]:
    """list/watch/patch on the cluster-scoped ClusterKopfPeering objects."""
    return [
        (verb, group, resource, ALL_NAMESPACES)
        for group, resource, verb in sorted(
            permissions(operator_rules(clusterwide=True, peering=True))
            - permissions(operator_rules(clusterwide=True, peering=False))
        )
    ]


def _discovery() -> list[tuple[str, str, str, str]]:
    return [
        (verb, group, resource, ALL_NAMESPACES)
        for group, resource, verb in sorted(permissions(DISCOVERY_RULES))
    ]


def _forbidden(namespaces: tuple[str, ...]) -> list[tuple[str, str, str, str]]:
    return sorted(
        {
            (verb, group, resource, namespace if where == HERE else where)
            for verb, group, resource, where in FORBIDDEN
            for namespace in namespaces
        }
    )


# ------------------------------------------------------------------------------ installing


def test_chart_installs_its_objects(k8s_api: Any, cluster_mode: Installed) -> None:
    """The release's Deployment, ServiceAccount and Service exist, and its CRDs are established."""
    # Any: with _preload_content=False the client returns raw responses, not its typed models.
    apps: Any = client.AppsV1Api(k8s_api)
    core: Any = client.CoreV1Api(k8s_api)
    name = cluster_mode.service_account
    deployment = json.loads(
        apps.read_namespaced_deployment(name, cluster_mode.namespace, _preload_content=False).data
    )
    # Peering (the default): rolling, the new pod paused until the old one has exited.
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deployment["spec"]["replicas"] == 1
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["COMPASS_PEERING"]["value"] == "compass-operator"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    core.read_namespaced_service_account(name, cluster_mode.namespace, _preload_content=False)
    core.read_namespaced_service(f"{name}-metrics", cluster_mode.namespace, _preload_content=False)
    extensions: Any = client.ApiextensionsV1Api(k8s_api)
    for crd in [*render_crds(), *_peering_crds()]:
        status = json.loads(
            extensions.read_custom_resource_definition(
                crd.removesuffix(".yaml"), _preload_content=False
            ).data
        )["status"]
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        assert conditions.get("Established") == "True", crd
    for name in CRD_NAMES:
        metadata = json.loads(
            extensions.read_custom_resource_definition(name, _preload_content=False).data
        )["metadata"]
        assert metadata["annotations"]["meta.helm.sh/release-name"] == cluster_mode.release
        assert metadata["annotations"]["helm.sh/resource-policy"] == "keep"
    # The chart's peering object, which every replica joins (kopf pauses without it).
    custom: Any = client.CustomObjectsApi(k8s_api)
    custom.get_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", "compass-operator", _preload_content=False
    )


def _peering_crds() -> list[str]:
    """Names of the chart's kopf peering CRDs (crds/kopf-peerings.yml, not generated)."""
    return [d["metadata"]["name"] for d in yaml.safe_load_all(PEERING_CRDS.read_text()) if d]


def test_bad_values_fail_install_naming_the_key(k8s_cluster: Cluster, k8s_api: Any) -> None:
    """helm install with a value the schema rejects fails, names the key, creates nothing."""
    namespace = f"bad-{_suffix()}"
    with temporary_namespace(k8s_api, namespace), _helm(k8s_cluster, namespace) as config:
        with pytest.raises(helm.HelmError) as error:
            config.install(
                str(CHART), "bad", {"watchNamespaces": ["Not_A_Namespace"]}, namespace=namespace
            )
        assert "/watchNamespaces/0" in str(error.value)
        assert config.list(all_states=True) == []


def _older_chart(directory: Path) -> Path:
    """The chart as an earlier version of it: its ParetoPolicy CRD lacks spec.switchDelayMs."""
    chart = directory / "compass-operator"
    shutil.copytree(CHART, chart)
    crd = build_crd(PARETO_POLICY)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del spec["properties"][NEW_FIELD]
    (chart / "templates" / "crds" / f"{PARETO_POLICY.name}.yaml").write_text(crd_template(crd))
    return chart


def _served_policy_crd(api: Any) -> dict[str, Any]:
    extensions: Any = client.ApiextensionsV1Api(api)
    response = extensions.read_custom_resource_definition(
        PARETO_POLICY.name, _preload_content=False
    )
    crd: dict[str, Any] = json.loads(response.data)
    return crd


def _stored_spec(api: Any, namespace: str, policy: dict[str, Any], *, patch: bool) -> Any:
    """The spec the API server stores for this policy (a server-side dry run: nothing is
    written), as a create, or as a merge patch of the existing one."""
    custom: Any = client.CustomObjectsApi(api)
    if patch:
        response = custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            POLICY_PLURAL,
            policy["metadata"]["name"],
            {"spec": policy["spec"]},
            dry_run="All",
            _preload_content=False,
        )
    else:
        response = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, POLICY_PLURAL, policy, dry_run="All", _preload_content=False
        )
    return json.loads(response.data)["spec"]


def test_upgrade_changes_the_crds_and_uninstall_keeps_them(
    k8s_cluster: Cluster, k8s_api: Any, tmp_path: Path
) -> None:
    """CRDs applied with kubectl pass to a release as the README says; an upgrade to a chart
    whose CRD has a new field makes the API server keep that field (the older one pruned it);
    helm uninstall leaves both CRDs and the custom resources."""
    release = f"crd{_suffix()}"
    namespace = f"{release}-system"
    # Its own ClusterKopfPeering.
    values: dict[str, Any] = {"peering": {"name": release}, **NO_UNINSTALL_HOOK}
    # The CRDs as `kubectl apply -f crds/` leaves them (or the chart when they were in its crds/).
    k8s_cluster.kubectl("apply", "--validate=false", "-f", str(REPO / "crds"))
    k8s_cluster.kubectl("label", "crd", *CRD_NAMES, f"{OWNER_LABEL}-")
    k8s_cluster.kubectl("annotate", "crd", *CRD_NAMES, *(f"{a}-" for a in OWNER_ANNOTATIONS))
    older = _older_chart(tmp_path)
    policy = yaml.safe_load((EXAMPLES / "pareto-policy-gitops.yaml").read_text())
    policy["spec"][NEW_FIELD] = 250
    with temporary_namespace(k8s_api, namespace), _helm(k8s_cluster, namespace) as config:
        with pytest.raises(helm.HelmError) as refused:
            config.install(str(older), release, values, namespace=namespace, timeout=60)
        message = str(refused.value)
        assert 'CustomResourceDefinition "compoundworkflows.compass.io"' in message, message
        assert "invalid ownership metadata" in message, message
        assert config.list(all_states=True) == []

        _hand_crds_to(k8s_cluster, release, namespace)
        # kubectl owns the fields it applied: the first install that changes them needs
        # --force-conflicts (Helm 4 applies server-side), as the README says.
        assert _install(config, older, release, values, namespace)["status"] == "deployed"
        served = _served_policy_crd(k8s_api)["spec"]["versions"][0]["schema"]
        assert NEW_FIELD not in served["openAPIV3Schema"]["properties"]["spec"]["properties"]
        wait_for(
            lambda: NEW_FIELD not in _stored_spec(k8s_api, namespace, policy, patch=False),
            10,
            "the older CRD pruning spec.switchDelayMs",
        )
        custom: Any = client.CustomObjectsApi(k8s_api)
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, POLICY_PLURAL, policy, _preload_content=False
        )

        # The chart as it is, and replicaCount 2 (a PodDisruptionBudget): no force needed now.
        upgraded = config.upgrade(
            str(CHART), release, {**values, "replicaCount": 2}, namespace=namespace, timeout=60
        )
        assert upgraded["status"] == "deployed"
        [rendered] = [
            d
            for d in yaml.safe_load_all(upgraded["manifest"])
            if d and d["metadata"]["name"] == PARETO_POLICY.name
        ]
        served = _served_policy_crd(k8s_api)["spec"]["versions"][0]["schema"]
        assert served == rendered["spec"]["versions"][0]["schema"]
        wait_for(
            lambda: _stored_spec(k8s_api, namespace, policy, patch=True).get(NEW_FIELD) == 250,
            10,
            "the upgraded CRD keeping spec.switchDelayMs",
        )
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            POLICY_PLURAL,
            policy["metadata"]["name"],
            {"spec": {NEW_FIELD: 250}},
            _preload_content=False,
        )
        budget = json.loads(k8s_cluster.kubectl("get", "pdb", "-n", namespace, "-o", "json").stdout)
        [item] = budget["items"]
        # 1.20 serves policy/v1beta1 only: the chart chose it (policy/v1 would fail the upgrade).
        assert (item["apiVersion"], item["spec"]["maxUnavailable"]) == ("policy/v1beta1", 1)

        config.uninstall(release, timeout=60)
        rbac = client.RbacAuthorizationV1Api(k8s_api)
        assert kubeapi.read(rbac.read_cluster_role, f"{release}-compass-operator") is None
        assert sorted(_existing_crds(k8s_cluster)) == sorted(CRD_NAMES)
        kept = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, POLICY_PLURAL, policy["metadata"]["name"]
        )
        assert _contains(kept["spec"], policy["spec"]) == []  # as written, the new field too
    # kopf's peering CRDs come from the chart's crds/: installed once, never removed.
    extensions = client.ApiextensionsV1Api(k8s_api)
    for crd in _peering_crds():
        extensions.read_custom_resource_definition(crd, _preload_content=False)


def test_second_release_on_the_same_peering_fails_to_install(
    k8s_cluster: Cluster, k8s_api: Any, cluster_mode: Installed
) -> None:
    """Two cluster-wide releases would be two operators on every policy: the second one's
    ClusterKopfPeering (the same default name) belongs to the first, so Helm refuses it."""
    namespace = f"second-{_suffix()}"
    with temporary_namespace(k8s_api, namespace), _helm(k8s_cluster, namespace) as config:
        # crds.install false, as a second release must: the CRDs belong to the first.
        second = {"crds": {"install": False}, **NO_UNINSTALL_HOOK}
        with pytest.raises(helm.HelmError) as error:
            config.install(str(CHART), "second", second, namespace=namespace, timeout=60)
        message = str(error.value)
        assert 'ClusterKopfPeering "compass-operator"' in message, message
        assert cluster_mode.release in message, message
        with contextlib.suppress(helm.HelmError):
            config.uninstall("second", timeout=60)
    # Nothing of the second release was left behind.
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    assert kubeapi.read(rbac.read_cluster_role, "second-compass-operator") is None


# ------------------------------------------------------------------------------ RBAC


def test_cluster_mode_allows_what_the_operator_needs(k8s_api: Any, cluster_mode: Installed) -> None:
    """Every operator permission in any namespace (list/watch across all too), and discovery."""
    rules = operator_rules(clusterwide=True, peering=False)
    checks = _needed((*cluster_mode.workloads, "any-namespace-at-all"), rules)
    checks += [c for c in _needed((ALL_NAMESPACES,), rules) if c[0] in ("list", "watch")]
    checks += _discovery() + _cluster_peering()
    denied = [
        check for check, allowed in _answers(k8s_api, cluster_mode, checks).items() if not allowed
    ]
    assert denied == []


def test_namespaced_mode_allows_only_the_watched_namespaces(
    k8s_api: Any, namespaced_mode: Installed
) -> None:
    """Everything the operator needs in team-a and team-b (its KopfPeerings too); none of it in
    team-c or cluster-wide, nor the cluster-scoped ClusterKopfPeerings."""
    allowed = _answers(k8s_api, namespaced_mode, _needed(namespaced_mode.workloads) + _discovery())
    assert [check for check, ok in allowed.items() if not ok] == []
    elsewhere = _answers(
        k8s_api,
        namespaced_mode,
        _needed((namespaced_mode.elsewhere, ALL_NAMESPACES)) + _cluster_peering(),
    )
    assert [check for check, ok in elsewhere.items() if ok] == []


@pytest.mark.parametrize("mode", ["cluster_mode", "namespaced_mode"])
def test_each_mode_denies_the_rest(k8s_api: Any, mode: str, request: pytest.FixtureRequest) -> None:
    """Deleting CRDs, reading secrets, creating pods, patching Deployments, listing nodes... in
    the namespaces the operator acts in, in either mode."""
    installed: Installed = request.getfixturevalue(mode)
    checks = _forbidden(installed.workloads)
    granted = [c for c, allowed in _answers(k8s_api, installed, checks).items() if allowed]
    assert granted == []


@pytest.mark.parametrize("mode", ["cluster_mode", "namespaced_mode"])
def test_operator_can_set_up_the_jobs_service_account(
    k8s_cluster: Cluster, mode: str, request: pytest.FixtureRequest
) -> None:
    """As the operator: create the Jobs' ServiceAccount, a generation's Role (its state
    ConfigMaps get/patch by name, configmaps create) and binding; the Jobs may then do exactly that.

    No `escalate` or `bind` is needed because the operator holds those verbs itself; a Role that
    grants more (secrets) is refused by the API server's escalation check.
    """
    installed: Installed = request.getfixturevalue(mode)
    namespace = installed.workloads[0]
    operator = k8s_cluster.api_client(impersonate=installed.user)
    core: Any = client.CoreV1Api(operator)
    rbac: Any = client.RbacAuthorizationV1Api(operator)
    # Exactly what the workflow handler creates (compass.controllers.builders): the account,
    # a generation's state ConfigMap, then its Role and RoleBinding, owned by the state.
    # The workflow's own account (made up: the garbage collector may take the account soon,
    # which the answers below do not depend on).
    account = "compass-job-rag"
    workflow = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CompoundWorkflow",
        "metadata": {"name": "rag", "namespace": namespace, "uid": "00000000-0000-0000-0000-0"},
    }
    core.create_namespaced_service_account(
        namespace, build_job_service_account(workflow, account), _preload_content=False
    )
    state = json.loads(
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": "rag-search-g1"}}, _preload_content=False
        ).data
    )
    example = yaml.safe_load((REPO / "examples" / "rag-sim-workflow.yaml").read_text())
    example["spec"]["evaluation"]["evaluator"] = {"type": "replay", "replayConfigMap": "rag-ledger"}
    spec = CompoundWorkflowSpec.model_validate(example["spec"])
    rbac.create_namespaced_role(namespace, build_job_role(state, spec), _preload_content=False)
    rbac.create_namespaced_role_binding(
        namespace, build_job_role_binding(state, account), _preload_content=False
    )

    # What the Jobs may do, as the API server answers: their own state and its chunks, by name.
    def job_may(verb: str, name: str = "", resource: str = "configmaps") -> bool:
        return _subject_may(k8s_cluster.api_client(), namespace, account, verb, resource, name)

    for verb in ("get", "patch"):
        assert job_may(verb, "rag-search-g1")
        assert job_may(verb, f"rag-search-g1-c{MAX_CHUNKS}")
        assert not job_may(verb, f"rag-search-g1-c{MAX_CHUNKS + 1}")
        assert not job_may(verb, "rag-search-g2")  # another generation's, or workflow's
        assert not job_may(verb, "anything-else")
    # The replayed ledger (and its chunks), read-only.
    assert job_may("get", "rag-ledger")
    assert job_may("get", "rag-ledger-c1")
    assert not job_may("patch", "rag-ledger")
    assert job_may("create")  # RBAC cannot narrow create by name (the rolled-over chunks)
    assert not job_may("list")
    assert not job_may("delete", "rag-search-g1")
    assert not job_may("get", "rag-search-g1", "secrets")
    # More than the operator holds (it may get a Secret by name, for authenticated metrics, but
    # not list them): without escalate, the API server refuses the Role.
    greedy = {
        "metadata": {"name": "greedy"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}],
    }
    with pytest.raises(ApiException) as refused:
        rbac.create_namespaced_role(namespace, greedy, _preload_content=False)
    assert refused.value.status == 403
    if installed.elsewhere:
        with pytest.raises(ApiException) as outside:
            core.create_namespaced_service_account(
                installed.elsewhere,
                build_job_service_account(
                    {
                        **workflow,
                        "metadata": {**workflow["metadata"], "namespace": installed.elsewhere},
                    },
                    account,
                ),
                _preload_content=False,
            )
        assert outside.value.status == 403


# ------------------------------------------------------------------------------ examples


def _contains(stored: Any, expected: Any, path: str = "") -> list[str]:
    """Where stored lacks or changes something expected has (server defaults may add more)."""
    if isinstance(expected, dict):
        if not isinstance(stored, dict):
            return [path]
        return [
            difference
            for key, value in expected.items()
            for difference in (
                _contains(stored[key], value, f"{path}.{key}")
                if key in stored
                else [f"{path}.{key}"]
            )
        ]
    if isinstance(expected, list):
        if not isinstance(stored, list) or len(stored) != len(expected):
            return [path]
        return [
            d
            for i, (s, e) in enumerate(zip(stored, expected, strict=True))
            for d in _contains(s, e, f"{path}[{i}]")
        ]
    return [] if stored == expected else [f"{path}: {stored!r} != {expected!r}"]


@pytest.mark.parametrize(
    "example",
    [
        "rag-sim-workflow.yaml",
        "pareto-policy-gitops.yaml",
        "prometheus-scrape.yaml",
        "rag-sim-triton.yaml",
    ],
)
def test_example_applies_as_written(
    k8s_cluster: Cluster, cluster_mode: Installed, example: str
) -> None:
    """kubectl apply with the chart's CRDs: accepted, and read back with nothing pruned."""
    documents = [d for d in yaml.safe_load_all((EXAMPLES / example).read_text()) if d]
    namespace = cluster_mode.workloads[0]
    k8s_cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / example))
    for document in documents:
        kind, name = document["kind"].lower(), document["metadata"]["name"]

        def stored(kind: str = kind, name: str = name) -> Any:
            result = k8s_cluster.kubectl(
                "get", kind, name, "-n", namespace, "-o", "json", check=False
            )
            return json.loads(result.stdout) if result.returncode == 0 else None

        found = wait_for(stored, 10, f"{kind}/{name}")
        body = {k: v for k, v in document.items() if k not in ("apiVersion", "kind", "metadata")}
        assert _contains(found, body) == []
        labels = document["metadata"].get("labels", {})
        assert labels.items() <= found["metadata"].get("labels", {}).items()
