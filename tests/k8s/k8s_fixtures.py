"""The control plane's fixtures: a real etcd, kube-apiserver and kube-controller-manager, a node.

A plugin module (tests/conftest.py names it in pytest_plugins), not a conftest: the k8s and e2e
tiers both use these fixtures, and share the one session-wide control plane and node. The k8s
tier's own fixtures (a namespace per module, the operator process, Triton) are in
tests/k8s/conftest.py.

    def test_something(k8s_cluster, k8s_namespace, k8s_node):
        batch = kubernetes.client.BatchV1Api(k8s_cluster.api_client())
        batch.create_namespaced_job(k8s_namespace, {...})   # k8s_node runs its pods

The binaries are built once by hack/k8s/build.sh (hack/test.sh runs it first, so its progress
shows) and cached. Where they cannot be built (not root, no apt-get) every test here SKIPS with
the reason, which `pytest -ra` prints, or FAILS with it under COMPASS_REQUIRE_TIERS=1 (CI; the
rule is tests/tiers.py). A build that fails where it should work is an error, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import (
    Binaries,
    Cluster,
    ClusterError,
    ClusterUnavailableError,
    ensure_binaries,
    running_cluster,
    temporary_namespace,
)
from e2e_shared import install_crds

from compass_dev.devnode import Node
from compass_dev.podenv import LocalImage
from compass_dev.processes import venv_executable
from tiers import unavailable


@pytest.fixture(scope="session")
def k8s_binaries(request: pytest.FixtureRequest) -> Binaries:
    """kube-apiserver, kube-controller-manager, kubectl (built and cached), etcd, openssl."""
    rc = os.environ.get("COMPASS_K8S_BUILD_RC", "")
    if rc not in ("", "0", "3"):
        pytest.fail(
            f"hack/k8s/build.sh failed in hack/test.sh (exit {rc}); its output is above",
            pytrace=False,
        )
    if rc == "3":
        # hack/test.sh ran the build already and it said it cannot build here: no second run.
        # Its reason is build.sh's last line, which names the script itself.
        reason = os.environ.get("COMPASS_K8S_BUILD_REASON") or (
            "hack/k8s/build.sh exited 3 in hack/test.sh; its reason is in the output above"
        )
        unavailable(f"no Kubernetes control plane here: {reason}")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    try:
        # A cold build takes minutes: let its progress reach the terminal.
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            return ensure_binaries(stream=sys.stderr)
    except ClusterUnavailableError as error:
        unavailable(f"no Kubernetes control plane here: {error}")
    except ClusterError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="session")
def k8s_cluster(
    k8s_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A running control plane for the whole session; admin kubeconfig at .kubeconfig."""
    with running_cluster(k8s_binaries, tmp_path_factory.mktemp("k8s")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def k8s_api(k8s_cluster: Cluster) -> Any:
    """An admin kubernetes.client.ApiClient."""
    return k8s_cluster.api_client()


@pytest.fixture(scope="session")
def k8s_node(k8s_api: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The node for every namespace; the image `compass-operator` runs the venv's `compass`."""
    compass = venv_executable("compass")
    images = {
        "compass-operator": LocalImage(entrypoint=[compass], executables={"compass": compass})
    }
    with Node(k8s_api, tmp_path_factory.mktemp("node"), images=images) as node:
        yield node
    assert not node.errors, f"the node helper itself failed: {node.errors}"


@pytest.fixture
def k8s_namespace(k8s_api: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test (pods can be admitted: its default service account is ready)."""
    base = request.node.name.lower().replace("_", "-")
    name = "".join(c for c in base if c.isalnum() or c == "-")[:50].strip("-")
    name = f"{name}-{time.monotonic_ns() % 100000}"
    with temporary_namespace(k8s_api, name, admit_pods=True):
        yield name


@pytest.fixture(scope="module")
def crds(k8s_cluster: Cluster) -> None:
    """The compass.io CRDs from crds/ (what `compass crds` generates), established.

    CRDs are cluster-wide: they stay installed for the modules after this one.
    """
    install_crds(k8s_cluster)
