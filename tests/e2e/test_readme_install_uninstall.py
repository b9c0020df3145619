"""README.md's "Install with Helm" and "Uninstall" sections, run as written, on the k8s tier's
control plane: nothing is left waiting for an operator that is gone.

The commands are read from the README's shell blocks (so the README cannot drift from what is
tested) and run: `helm` in-process (helm-python-sdk, Helm 4), `kubectl` as the tier's kubectl
1.20. The chart's post-delete hook Job runs on the node helper as a local process
(`compass operator release-finalizers`, the chart's command line as rendered).

What the test changes, and why (each is done where it says so):
- the README's namespaces (`default`, `compass-system`) are fresh ones: the control plane is
  shared by the whole session;
- the chart installs with `crds.install: false`: the session's CRDs are applied with kubectl for
  every module, and one release may own them;
- the operator runs as a local process (`compass operator`, as in test_rag_sim_workflow.py), not
  as the chart's Deployment: the Deployment is scaled to 0 right after the install, and the
  operator is "gone" when that process is stopped, before the uninstall's commands;
- `examples/rag-sim-triton.yaml` (an image this machine does not have) is the tier's local
  tritonserver serving rag-sim, which the operator reaches through its Triton address override;
- `examples/rag-sim-workflow.yaml` is applied with compass_dev.clusterdemo_setup's adaptations
  (replayed scores, the time scale, fewer profiling requests, the local Triton's /metrics, no
  late binding), as test_rag_sim_workflow.py and `compass demo --cluster` apply it;
- the README's commented-out CRD removal is not run (the session's other modules need them).
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from cluster import Cluster, wait_for
from e2e_shared import REPO, Policies, Workflows, condition
from kubernetes import client
from operator_process import Operator
from ragsim import TIME_SCALE

from compass.api.meta import GROUP, POLICY_PLURAL, VERSION, WORKFLOW_PLURAL
from compass.controllers import kubeapi
from compass.controllers.builders import LEDGER_KEY, MANAGED_BY, MANAGED_BY_LABEL
from compass.controllers.finalizers import KOPF_FINALIZER
from compass_dev.clusterdemo_setup import ClusterDemoSettings, adaptations, replay_ledger
from compass_dev.devnode import Node
from compass_dev.local_triton import LocalTriton

README = REPO / "README.md"
WORKFLOW_EXAMPLE = "examples/rag-sim-workflow.yaml"
TRITON_EXAMPLE = "examples/rag-sim-triton.yaml"
LEDGER_CONFIG_MAP = "rag-sim-ledger"
# The README's install and uninstall must leave nothing hanging: the floors of issue 60.
GONE_WITHIN_S = 60
# The chart's values the test adds (see the module's docstring).
TEST_VALUES = {"crds": {"install": False}}


def readme_commands(section: str) -> list[list[str]]:
    """The commands of a README section's shell block, as words (comments and commented-out
    lines left out, continued lines joined)."""
    text = README.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```sh\n(.*?)```", body, re.S)
    assert found, f"README.md's {section} section has no ```sh block"
    lines = found.group(1).replace("\\\n", " ").splitlines()
    return [words for line in lines if (words := shlex.split(line, comments=True))]


def helm_values(settings: list[str], renamed: dict[str, str]) -> dict[str, Any]:
    """`--set` values as Helm reads the README's (key=value, key={a,b}; dotted keys nest), the
    namespaces renamed."""
    values: dict[str, Any] = {}
    for setting in settings:
        key, _, raw = setting.partition("=")
        value: Any = raw
        if raw.startswith("{") and raw.endswith("}"):
            value = [renamed.get(v, v) for v in raw[1:-1].split(",") if v]
        *parents, leaf = key.split(".")
        node = values
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return values


def test_readme_commands_are_what_this_test_runs() -> None:
    """Every README install and uninstall command is one the runner below knows (a new kind of
    command must be taught to the test, so the README cannot outgrow it unnoticed)."""
    install = readme_commands("Install with Helm")
    uninstall = readme_commands("Uninstall")
    assert [w[:2] for w in install] == [
        ["helm", "install"],
        ["kubectl", "apply"],
        ["kubectl", "apply"],
        ["kubectl", "wait"],
        ["kubectl", "get"],
    ]
    assert [w[:2] for w in uninstall] == [
        ["helm", "uninstall"],
        ["kubectl", "delete"],
        ["kubectl", "delete"],
    ]
    assert helm_values(["watchNamespaces={default}"], {"default": "ns-1"}) == {
        "watchNamespaces": ["ns-1"]
    }


@dataclass
class ReadmeRun:
    """Runs README commands against the test cluster (the module's docstring says what is
    changed, and why)."""

    cluster: Cluster
    namespace: str  # the README's `default`
    release_namespace: str  # the README's `compass-system`
    workflow_file: Path  # the adapted examples/rag-sim-workflow.yaml
    after_install: Callable[[str, str], None]  # (release, its namespace): the test's steps
    outputs: list[str] = field(default_factory=list)
    releases: list[tuple[str, str]] = field(default_factory=list)  # installed, not uninstalled

    @property
    def renamed(self) -> dict[str, str]:
        return {"default": self.namespace, "compass-system": self.release_namespace}

    def run(self, words: list[str]) -> None:
        """One README command."""
        if words[0] == "helm":
            self._helm(words[1:])
        else:
            assert words[0] == "kubectl", words
            self._kubectl(words[1:])

    def _helm(self, args: list[str]) -> None:
        verb, release, *rest = args
        namespace = self.renamed[rest[rest.index("-n") + 1]]
        config = helm.Config(kubeconfig_path=str(self.cluster.kubeconfig), namespace=namespace)
        with config:
            if verb == "install":
                chart, *options = rest
                settings = [options[i + 1] for i, o in enumerate(options) if o == "--set"]
                values = {**helm_values(settings, self.renamed), **TEST_VALUES}
                result = config.install(
                    str(REPO / chart),
                    release,
                    values,
                    namespace=namespace,
                    create_namespace="--create-namespace" in options,
                    timeout=120,
                )
                assert result["status"] == "deployed", result
                self.releases.append((release, namespace))
                self.after_install(release, namespace)
            else:
                assert verb == "uninstall", args
                # Helm runs the post-delete hook Job and waits for it.
                config.uninstall(release, timeout=300)
                self.releases.remove((release, namespace))

    def _kubectl(self, args: list[str]) -> None:
        words: list[str] = []
        files: list[str] = []
        it = iter(args)
        for word in it:
            if word == "-f":
                files.append(next(it))
            elif word.startswith("--timeout="):
                words.append("--timeout=300s")  # the README's hour, bounded for a test
            else:
                words.append(self.renamed.get(word, word))
        # The example's Triton is the tier's local tritonserver (see the docstring).
        files = [f for f in files if f != TRITON_EXAMPLE]
        if not files and "-f" in args:
            return
        for name in files:
            assert name == WORKFLOW_EXAMPLE, name
            words += ["-f", str(self.workflow_file)]
        namespaced = words[0] != "delete" or words[1] != "namespace"
        command = [*words, *(["-n", self.namespace] if namespaced else [])]
        result = self.cluster.kubectl(*command, timeout_s=330 if words[0] == "wait" else 90)
        self.outputs.append(result.stdout)


@pytest.fixture
def workflow_file(
    k8s_api: Any,
    k8s_namespace: str,
    triton: LocalTriton,
    rag_sim_data: dict[str, Any],
    tmp_path: Path,
) -> Path:
    """The example workflow adapted to this machine, and the ledger its replay reads."""
    client.CoreV1Api(k8s_api).create_namespaced_config_map(
        k8s_namespace,
        {
            "metadata": {"name": LEDGER_CONFIG_MAP},
            "data": {LEDGER_KEY: replay_ledger(rag_sim_data)},
        },
        _preload_content=False,
    )
    example = yaml.safe_load((REPO / WORKFLOW_EXAMPLE).read_text(encoding="utf-8"))
    manifest, _ = adaptations(
        example,
        ClusterDemoSettings(output_dir=Path("."), late_binding=False, time_scale=TIME_SCALE),
        LEDGER_CONFIG_MAP,
        {"type": "triton", "url": triton.metrics_url},
    )
    path = tmp_path / "rag-sim-workflow.yaml"
    path.write_text(yaml.safe_dump(manifest), encoding="utf-8")
    return path


def _compass_rbac(api: Any, namespace: str) -> list[str]:
    """The Jobs' ServiceAccounts, Roles and RoleBindings compass-operator made in namespace."""
    selector = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    accounts = kubeapi.list_items(core.list_namespaced_service_account, namespace)
    roles = kubeapi.list_items(rbac.list_namespaced_role, namespace, label_selector=selector)
    bindings = kubeapi.list_items(
        rbac.list_namespaced_role_binding, namespace, label_selector=selector
    )
    return [
        *(f"ServiceAccount {a['metadata']['name']}" for a in accounts
          if a["metadata"]["name"].startswith("compass-job")),
        *(f"Role {r['metadata']['name']}" for r in roles),
        *(f"RoleBinding {b['metadata']['name']}" for b in bindings),
    ]  # fmt: skip


def test_the_readmes_install_serves_and_its_uninstall_leaves_nothing_waiting(
    k8s_cluster: Cluster,
    k8s_api: Any,
    k8s_namespace: str,
    k8s_node: Node,
    crds: None,
    triton: LocalTriton,
    workflow_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = k8s_namespace
    release_namespace = f"compass-system-{time.monotonic_ns() % 100000}"
    core = client.CoreV1Api(k8s_api)
    apps = client.AppsV1Api(k8s_api)
    custom = client.CustomObjectsApi(k8s_api)
    operator = Operator(
        k8s_cluster,
        namespace,
        tmp_path / "operator.log",
        env={
            # The Service the example names does not exist here: the local tritonserver.
            "COMPASS_TRITON_ADDRESS_OVERRIDE": triton.grpc_url,
            "COMPASS_POLL_INTERVAL_SECONDS": "0.5",
        },
    )

    def run_operator_locally(release: str, release_ns: str) -> None:
        """The chart's Deployment off (the operator runs as a local process here), then the
        local operator on; the node runs the Jobs' and the hook's pods with the cluster's
        kubeconfig from then on (before, the Deployment's pod had none, so did nothing)."""
        [deployment] = kubeapi.list_items(
            apps.list_namespaced_deployment,
            release_ns,
            label_selector=f"app.kubernetes.io/instance={release}",
        )
        name = deployment["metadata"]["name"]
        apps.patch_namespaced_deployment_scale(name, release_ns, {"spec": {"replicas": 0}})
        selector = f"app.kubernetes.io/name=compass-operator,app.kubernetes.io/instance={release}"
        wait_for(
            lambda: (
                not kubeapi.list_items(
                    core.list_namespaced_pod, release_ns, label_selector=selector
                )
            ),
            GONE_WITHIN_S,
            "the chart's operator pods to go",
        )
        for key, value in k8s_cluster.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("COMPASS_TRITON_ADDRESS", raising=False)
        operator.start()

    readme = ReadmeRun(
        k8s_cluster, namespace, release_namespace, workflow_file, run_operator_locally
    )
    name = yaml.safe_load(workflow_file.read_text(encoding="utf-8"))["metadata"]["name"]
    try:
        # ---- Install with Helm, as written
        for words in readme_commands("Install with Helm"):
            readme.run(words)
        install = readme_commands("Install with Helm")
        assert "condition met" in readme.outputs[-2], readme.outputs[-2]
        # The policy's first decision follows the workflow's Ready within a tick or two: the
        # README's last command again once it is in.
        policies = Policies(custom, core, namespace)
        wait_for(
            lambda: condition(policies.status(name), "Ready").get("status") == "True",
            30,
            "the generated policy to be Ready",
        )
        readme.run(install[-1])
        shown = readme.outputs[-1]
        print(f"$ kubectl get cwf,pp\n{shown}")
        rows = {line.split()[0]: line.split() for line in shown.splitlines() if "/" in line}
        assert rows[f"compoundworkflow.compass.io/{name}"][1] == "Ready", shown
        assert rows[f"paretopolicy.compass.io/{name}"][-2] == "True", shown  # the policy Ready
        # It serves: the policy switched the router to an entry of its front.
        status = policies.status(name)
        assert condition(status, "Ready")["status"] == "True", status.get("conditions")
        assert status["active"]["config"] in [
            e["config"] for e in policies.get(name)["spec"]["front"]
        ]
        # The Jobs ran as the workflow's own ServiceAccount, which the workflow owns.
        flows = Workflows(k8s_api, namespace)
        account = f"compass-job-{name}"
        jobs = flows.jobs(name)
        assert jobs
        assert all(j["spec"]["template"]["spec"]["serviceAccountName"] == account for j in jobs)
        made = kubeapi.read(core.read_namespaced_service_account, account, namespace)
        owner = made["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("CompoundWorkflow", name)

        # ---- the operator is gone: kopf's finalizer stays on the policy (its daemon's)
        print(f"operator log:\n{operator.tail()}")
        operator.stop()
        policy = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, name)
        assert KOPF_FINALIZER in policy["metadata"].get("finalizers", []), policy["metadata"]

        # ---- Uninstall, as written
        started = time.monotonic()
        for words in readme_commands("Uninstall"):
            readme.run(words)
            if words[:2] == ["helm", "uninstall"]:
                # The hook ran: nothing of compass's holds kopf's finalizer any more.
                for plural in (WORKFLOW_PLURAL, POLICY_PLURAL):
                    held = custom.get_namespaced_custom_object(
                        GROUP, VERSION, namespace, plural, name
                    )
                    assert KOPF_FINALIZER not in held["metadata"].get("finalizers", []), plural
        print(f"uninstall commands: {time.monotonic() - started:.1f} s")

        def gone(read: Callable[..., Any], *where: Any) -> bool:
            return kubeapi.read(read, *where) is None

        wait_for(
            lambda: gone(core.read_namespace, release_namespace),
            GONE_WITHIN_S,
            "the release's namespace to go",
        )
        for plural in (WORKFLOW_PLURAL, POLICY_PLURAL):
            wait_for(
                lambda plural=plural: gone(
                    custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name
                ),
                GONE_WITHIN_S,
                f"the {plural} to go",
            )
        wait_for(
            lambda: not _compass_rbac(k8s_api, namespace),
            GONE_WITHIN_S,
            "the Jobs' ServiceAccount and Roles to be collected",
        )
        # Nothing of compass's holds the namespace: it goes within the floor.
        core.delete_namespace(namespace)
        deleting = time.monotonic()
        wait_for(
            lambda: gone(core.read_namespace, namespace),
            GONE_WITHIN_S,
            "the workflow's namespace to go",
        )
        print(f"the workflow's namespace went in {time.monotonic() - deleting:.1f} s")
    finally:
        if operator.process is not None:
            operator.stop()
        for release, release_ns in readme.releases:
            with helm.Config(
                kubeconfig_path=str(k8s_cluster.kubeconfig), namespace=release_ns
            ) as config:
                config.uninstall(release, timeout=120)
        kubeapi.delete(core.delete_namespace, release_namespace)
