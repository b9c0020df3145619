"""The k8s tier's own fixtures: a namespace per module, the `compass operator` process watching
it, the policies a test creates, and a rag-sim Triton per module.

The control plane's (k8s_binaries, k8s_cluster, k8s_api, k8s_node, k8s_namespace, crds) are in
k8s_fixtures.py, a plugin that tests/conftest.py registers: the e2e tier uses them too.

    def test_something(k8s_cluster, k8s_namespace, k8s_node):
        batch = kubernetes.client.BatchV1Api(k8s_cluster.api_client())
        batch.create_namespaced_job(k8s_namespace, {...})   # k8s_node runs its pods

The binaries are built once by hack/k8s/build.sh (hack/test.sh runs it first, so its progress
shows) and cached. Where they cannot be built (not root, no apt-get) every test here SKIPS with
the reason, which `pytest -ra` prints, or FAILS with it under COMPASS_REQUIRE_TIERS=1 (CI; the
rule is tests/tiers.py). A build that fails where it should work is an error, never a skip.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import Cluster, temporary_namespace
from e2e_shared import Policies
from kubernetes import client
from operator_process import Operator
from ragsim import FASTEST, rag_sim_server

from compass.dataplane.triton import TritonRouter
from compass_dev.local_triton import LocalTriton


@pytest.fixture(scope="module")
def namespace(k8s_api: Any, crds: None, request: pytest.FixtureRequest) -> Iterator[str]:
    """One namespace for the module, named after it (pods admitted, the CRDs installed): the
    ``operator`` fixture watches only it."""
    module = request.module.__name__.removeprefix("test_").replace("_", "-")
    name = f"{module}-{time.monotonic_ns() % 100000}"
    with temporary_namespace(k8s_api, name, admit_pods=True):
        yield name


@pytest.fixture(scope="module")
def operator(
    k8s_cluster: Cluster, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    """One `compass operator` process for the module, watching its ``namespace`` fixture's."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    running = Operator(k8s_cluster, namespace, log).start()
    yield running
    running.stop()


@pytest.fixture
def policies(k8s_api: Any, namespace: str, operator: Operator) -> Iterator[Policies]:
    """Create policies; each is deleted after the test, so no two switch the same routers."""
    made = Policies(client.CustomObjectsApi(k8s_api), client.CoreV1Api(k8s_api), namespace)
    yield made
    print(f"operator log:\n{operator.tail()}")  # pytest shows it when the test failed
    made.delete_all()


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """tritonserver with rag-sim (router + three components), FASTEST active: one per module
    that asks (each module's switches and load stay its own, as when each defined it)."""
    with rag_sim_server(tmp_path_factory.mktemp("triton")) as server:
        yield server


@pytest.fixture
def router(triton: LocalTriton) -> Iterator[TritonRouter]:
    """The router, serving FASTEST at the start of each test."""
    client_ = TritonRouter(triton.grpc_url, backoff_s=0.05)
    client_.switch(FASTEST)
    yield client_
    client_.close()
