"""Fixtures for the e2e tier: the k8s tier's control plane and node, and a Triton and Prometheus
of its own, started as the triton tier starts them.

The control plane's fixtures (k8s_binaries, k8s_cluster, k8s_api, k8s_node, k8s_namespace, crds)
come from tests/k8s/k8s_fixtures.py, which tests/conftest.py registers for every tier: a run of
the whole suite starts one control plane and shares it with the k8s tier (each test still has a
namespace of its own). Triton and Prometheus are this tier's, through the triton tier's helpers
(tests/triton/ragsim.py): the triton tier's tests switch and load theirs, and this tier's test
leaves its router on the most accurate configuration. Everything skips here for the same reasons
as in those tiers (or fails under COMPASS_REQUIRE_TIERS=1, tests/tiers.py): no Kubernetes control
plane, no tritonserver, no prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from ragsim import rag_sim_server, scraping

from compass_dev.local_triton import LocalPrometheus, LocalTriton
from compass_dev.scenarios import rag_sim_data as load_rag_sim_data


@pytest.fixture(scope="session")
def rag_sim_data() -> dict[str, Any]:
    """The data file rag-sim's components serve from."""
    return load_rag_sim_data()


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """This tier's tritonserver with rag-sim at ragsim.TIME_SCALE, FASTEST active."""
    with rag_sim_server(tmp_path_factory.mktemp("triton")) as server:
        yield server


@pytest.fixture(scope="session")
def prometheus(
    triton: LocalTriton, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalPrometheus]:
    """Prometheus scraping this tier's Triton every 0.5 s."""
    with scraping(triton, tmp_path_factory.mktemp("prometheus")) as server:
        yield server
