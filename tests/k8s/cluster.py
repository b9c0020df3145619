"""The k8s tier's control plane: compass_dev.devcluster, under the name the tests import.

The code moved into the package so that `compass demo --cluster` runs the same control plane
(the package may not import from tests/); `python tests/k8s/cluster.py` still starts one by hand.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from compass.controllers import kubeapi
from compass_dev.devcluster import (
    ADMIN_USER,
    BUILD_SCRIPT,
    CANNOT_BUILD,
    DEFAULT_CONTROLLERS,
    REPO_ROOT,
    SERVICE_CLUSTER_IP_RANGE,
    Binaries,
    Cluster,
    ClusterError,
    ClusterUnavailableError,
    ensure_binaries,
    main,
)
from compass_dev.processes import free_port, log_tail, wait_for

__all__ = [
    "ADMIN_USER",
    "BUILD_SCRIPT",
    "CANNOT_BUILD",
    "DEFAULT_CONTROLLERS",
    "REPO_ROOT",
    "SERVICE_CLUSTER_IP_RANGE",
    "Binaries",
    "Cluster",
    "ClusterError",
    "ClusterUnavailableError",
    "crd_established",
    "create_namespace",
    "delete_namespace",
    "ensure_binaries",
    "free_port",
    "log_tail",
    "main",
    "running_cluster",
    "temporary_namespace",
    "wait_for",
]


@contextmanager
def running_cluster(binaries: Binaries, workdir: Path) -> Iterator[Cluster]:
    """A control plane started in workdir and stopped on exit; a failed start fails the test."""
    cluster = Cluster(binaries, workdir)
    try:
        cluster.start()
    except ClusterError as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


def crd_established(api: Any, name: str) -> bool:
    """Whether the CustomResourceDefinition `name` has condition Established=True."""
    crd = kubeapi.call(client.ApiextensionsV1Api(api).read_custom_resource_definition_status, name)
    conditions = crd.get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def create_namespace(api: Any, name: str, *, admit_pods: bool = False) -> str:
    """Create the namespace ``name``; with ``admit_pods``, wait until pods can be admitted there
    (1.20's ServiceAccount admission refuses them until the default account has its token)."""
    core = client.CoreV1Api(api)
    kubeapi.call(core.create_namespace, {"metadata": {"name": name}})
    if admit_pods:
        wait_for(
            lambda: _has_token(core, name),
            30,
            f"the default service account of {name}",
        )
    return name


def delete_namespace(api: Any, name: str) -> None:
    """Start deleting the namespace and all in it (not waited for); gone already is fine."""
    kubeapi.delete(client.CoreV1Api(api).delete_namespace, name)


@contextmanager
def temporary_namespace(api: Any, name: str, *, admit_pods: bool = False) -> Iterator[str]:
    """The namespace ``name`` (create_namespace), deleted on exit."""
    create_namespace(api, name, admit_pods=admit_pods)
    try:
        yield name
    finally:
        delete_namespace(api, name)


def _has_token(core: client.CoreV1Api, namespace: str) -> bool:
    account = kubeapi.read(core.read_namespaced_service_account, "default", namespace)
    return bool(account and account.get("secrets"))


if __name__ == "__main__":
    sys.exit(main())
