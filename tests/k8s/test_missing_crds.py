"""A bad install: `compass operator` started on a cluster without the compass.io CRDs.

Each test starts the operator before the CRDs exist, then applies them; the second deletes
them first.

The session cluster has the CRDs (other modules install them, and deleting them there would
delete every test's objects), so this module starts its own control plane, without them.
"""

from __future__ import annotations

import base64
import re
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import Binaries, Cluster, create_namespace, free_port, running_cluster, wait_for
from e2e_shared import Policies, condition
from kubernetes import client
from operator_process import Operator

from compass.controllers import kubeapi
from compass.controllers.manager import CRD_RECHECK_S, served_resources
from compass_dev.rbac import OPERATOR_RULES

REPO = Path(__file__).resolve().parents[2]
CRDS = ("compoundworkflows.compass.io", "paretopolicies.compass.io")
FIX = "kubectl apply -f crds/"
# kopf's log format: "[2024-05-01 12:00:00,123] compass.controllers.m [WARNING ] message".
LOGGED_AT = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] ")
# A logged time is cut to the millisecond.
LOG_RESOLUTION = timedelta(milliseconds=1)


@pytest.fixture(scope="module")
def bare_cluster(
    k8s_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A control plane of its own, with no compass.io CRDs."""
    with running_cluster(k8s_binaries, tmp_path_factory.mktemp("bare-k8s")) as cluster:
        yield cluster


def _healthy(operator: Operator) -> bool:
    url = f"http://127.0.0.1:{operator.health_port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(response.status == 200)


def _log(operator: Operator) -> str:
    return operator.log.read_text(encoding="utf-8", errors="replace")


def _lines(operator: Operator, needle: str) -> list[str]:
    return [line for line in _log(operator).splitlines() if needle in line]


def _logged_at(line: str) -> datetime:
    """When the operator logged a line (kopf's "[YYYY-mm-dd HH:MM:SS,mmm]" prefix, local time)."""
    stamp = LOGGED_AT.match(line)
    assert stamp, f"no timestamp on {line!r}"
    return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone()


def _scenario(cluster: Cluster, namespace: str, operator: Operator) -> None:
    """Started without the CRDs: one line, re-checks at their interval, then the CRDs served."""
    # Liveness stays up meanwhile; the CRDs, once applied, are noticed by the re-checks and a
    # ParetoPolicy is handled. A loop that dies or stalls fails: each step waits for its next line.
    api = cluster.api_client()
    policies = Policies(client.CustomObjectsApi(api), client.CoreV1Api(api), namespace)
    interval = timedelta(seconds=CRD_RECHECK_S)
    try:
        # One line names both CRDs and the fix.
        [first] = wait_for(
            lambda: _lines(operator, "are not installed") or None, 30, "the missing-CRD line"
        )
        for name in CRDS:
            assert name in first
        assert FIX in first
        assert f"every {CRD_RECHECK_S:g} s" in first
        # The loop keeps re-checking: two lines, then one more after the test has seen them, so
        # it is alive right before the CRDs are applied (each wait bounds a hang only).
        wait_for(
            lambda: len(_lines(operator, "still missing")) >= 2 or None,
            3 * CRD_RECHECK_S + 30,
            "two re-check lines",
        )
        seen = len(_lines(operator, "still missing"))
        still = wait_for(
            lambda: (len(found := _lines(operator, "still missing")) > seen and found) or None,
            CRD_RECHECK_S + 30,
            "one more re-check line",
        )
        assert all(FIX in line and CRDS[1] in line for line in still)
        # At its interval, never faster: each re-check waits a whole interval after the last
        # (so the k-th comes k intervals after the first line at the earliest; slower is fine).
        began = _logged_at(first)
        for k, line in enumerate(still, start=1):
            assert _logged_at(line) + LOG_RESOLUTION >= began + k * interval, (k, line)
        assert _healthy(operator)
        assert operator.process is not None
        assert operator.process.poll() is None

        applied = datetime.now().astimezone()
        cluster.kubectl("apply", "--validate=false", "-f", str(REPO / "crds"))
        [noticed] = wait_for(
            lambda: _lines(operator, "CRDs are installed now") or None,
            CRD_RECHECK_S + 30,
            "the re-check loop to notice the CRDs",
        )
        noticed_at = _logged_at(noticed)
        assert noticed_at + LOG_RESOLUTION >= applied, noticed
        # A ParetoPolicy is handled: its dead router gets a Ready=False condition.
        wait_for(lambda: _create(policies), 30, "the ParetoPolicy resource to be served", 1.0)
        ready = wait_for(
            lambda: condition(policies.status("late"), "Ready") or None,
            60,
            f"the operator to handle the policy\n{operator.tail()}",
        )
        assert ready["status"] == "False"
        assert ready["reason"] == "TritonUnreachable"
        wait_for(lambda: _healthy(operator), 30, "liveness after the restart", 0.5)
        # The re-checks ended with the CRDs: none logged after that line, up to a line the
        # process logged later than the next re-check would have come (the policy's ticks log).
        wait_for(
            lambda: any(
                _logged_at(line) > noticed_at + interval
                for line in _log(operator).splitlines()
                if LOGGED_AT.match(line)
            ),
            CRD_RECHECK_S + 60,
            "a log line past the next re-check's time",
            0.5,
        )
        after = _log(operator).split(noticed, 1)[1]
        assert "still missing" not in after, after
        assert operator.process.poll() is None
    finally:
        print(f"operator log:\n{operator.tail()}")
        policies.delete_all()  # while the operator runs: it removes its finalizer
        operator.stop()


def test_missing_crds_are_named_and_served_once_applied(
    bare_cluster: Cluster, tmp_path: Path
) -> None:
    namespace = create_namespace(bare_cluster.api_client(), "bad-install")
    operator = Operator(bare_cluster, namespace, tmp_path / "operator.log")
    _scenario(bare_cluster, namespace, operator.start())


def test_missing_crds_are_served_without_the_right_to_watch_crds(
    bare_cluster: Cluster, tmp_path: Path
) -> None:
    """The chart with rbac.discovery off: the operator's Role in its namespace only, so kopf
    cannot watch CRDs and would never notice them; the operator's own re-checks do."""
    bare_cluster.kubectl("delete", "--ignore-not-found", "-f", str(REPO / "crds"))
    api = bare_cluster.api_client()
    wait_for(lambda: served_resources(api) is None, 60, "the compass.io API group to go", 0.5)
    namespace = create_namespace(api, "no-discovery")
    core = client.CoreV1Api(api)
    kubeconfig = _service_account_kubeconfig(bare_cluster, core, namespace, tmp_path)
    log = tmp_path / "operator.log"
    operator = Operator(bare_cluster, namespace, log, env={"KUBECONFIG": str(kubeconfig)})
    _scenario(bare_cluster, namespace, operator.start())
    assert "Not enough permissions to watch for resources" in _log(operator)


def _service_account_kubeconfig(
    cluster: Cluster, core: client.CoreV1Api, namespace: str, where: Path
) -> Path:
    """A kubeconfig for a service account holding the operator's rules in ``namespace`` only
    (compass_dev.rbac, what the chart's Role grants), nothing cluster-wide."""
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "operator"}})
    rules = [
        {"apiGroups": [r.api_group], "resources": list(r.resources), "verbs": list(r.verbs)}
        for r in OPERATOR_RULES
    ]
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "operator"}, "rules": rules})
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operator"}
    subject = {"kind": "ServiceAccount", "name": "operator", "namespace": namespace}
    rbac.create_namespaced_role_binding(
        namespace, {"metadata": {"name": "operator"}, "roleRef": role, "subjects": [subject]}
    )
    # 1.20 keeps the service account's token in a Secret.
    secret = wait_for(
        lambda: (core.read_namespaced_service_account("operator", namespace).secrets or [None])[0],
        30,
        "the service account's token",
    )
    token = base64.b64decode(core.read_namespaced_secret(secret.name, namespace).data["token"])
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in config["users"]:
        entry["user"] = {"token": token.decode()}
    kubeconfig = where / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    return kubeconfig


def _create(policies: Policies) -> bool:
    """Create the policy once the API server serves the new resource (True when created)."""
    if "late" in policies.created:
        return True
    try:
        policies.create("late", _policy_spec())
    except kubeapi.NotFoundError:  # the CRD is not established yet
        return False
    return True


def _policy_spec() -> dict[str, Any]:
    """A valid policy whose metrics and router are dead ports: handling it sets conditions."""
    dead = f"127.0.0.1:{free_port()}"
    return {
        "front": [
            {
                "config": {"k": 1},
                "accuracy": 0.8,
                "latencyMeanMs": 20.0,
                "latencyP95Ms": 25.0,
            },
            {
                "config": {"k": 2},
                "accuracy": 0.9,
                "latencyMeanMs": 30.0,
                "latencyP95Ms": 40.0,
            },
        ],
        "slo": {"latencyMs": 150, "percentile": 95},
        "metrics": {"type": "triton", "url": f"http://{dead}/metrics"},
        "routing": {"grpcEndpoint": dead, "routerModel": "router"},
        "intervalSeconds": 1,
    }
