"""Fixtures for the triton tier: a real tritonserver serving rag-sim and a real Prometheus.

Both are child processes on free loopback ports, stopped by PID at the end of the session
(ragsim.rag_sim_server and ragsim.scraping, which the k8s and e2e tiers' own servers use too). A
missing binary skips the tier with the reason (pytest -ra prints it), or fails it under
COMPASS_REQUIRE_TIERS=1 (CI): tests/tiers.py decides; it never passes silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from ragsim import FASTEST, rag_sim_server, scraping

from compass.dataplane.triton import TritonRouter
from compass_dev.local_triton import LocalPrometheus, LocalTriton
from compass_dev.scenarios import rag_sim_data as load_rag_sim_data


@pytest.fixture(scope="session")
def rag_sim_data() -> dict[str, Any]:
    """The data file rag-sim's components serve from."""
    return load_rag_sim_data()


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """tritonserver with rag-sim (router + three components), FASTEST active."""
    with rag_sim_server(tmp_path_factory.mktemp("triton")) as server:
        yield server


@pytest.fixture
def router(triton: LocalTriton) -> Iterator[TritonRouter]:
    """A client of the router; the active configuration is FASTEST again afterwards."""
    client = TritonRouter(triton.grpc_url, backoff_s=0.05)
    yield client
    client.switch(FASTEST)
    client.close()


@pytest.fixture(scope="session")
def prometheus(
    triton: LocalTriton, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalPrometheus]:
    """Prometheus scraping Triton's metrics port every 0.5 s."""
    with scraping(triton, tmp_path_factory.mktemp("prometheus")) as server:
        yield server
