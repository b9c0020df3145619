"""Fixtures for the triton tier: a real tritonserver serving rag-sim and a real Prometheus.

Both are child processes on free loopback ports, stopped by PID at the end of the session. A
missing binary skips the tier with the reason (pytest -ra prints it), or fails it under
COMPASS_REQUIRE_TIERS=1 (CI): tests/tiers.py decides; it never passes silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from ragsim import COMPONENTS, FASTEST, TIME_SCALE

from compass.dataplane.triton import TritonRouter
from compass.lab.local_triton import (
    LocalPrometheus,
    LocalTriton,
    assemble_repository,
    model_images,
)
from tiers import require_prometheus, require_tritonserver


@pytest.fixture(scope="session")
def rag_sim_data() -> dict[str, object]:
    """The data file rag-sim's components serve from."""
    path = model_images() / "rag-sim" / "models" / "rag_sim.json"
    data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """tritonserver with rag-sim (router + three components), FASTEST active."""
    workdir = tmp_path_factory.mktemp("triton")
    repository = assemble_repository(
        "rag-sim",
        workdir / "models",
        {
            **{c: {"time_scale": str(TIME_SCALE)} for c in COMPONENTS},
            "router": {"compass_active_config": json.dumps(FASTEST, sort_keys=True)},
        },
    )
    require_tritonserver()
    server = LocalTriton(repository=repository).start(workdir)
    yield server
    server.stop()


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
    require_prometheus()
    server = LocalPrometheus(targets=[f"127.0.0.1:{triton.metrics_port}"], interval_s=0.5)
    server.start(tmp_path_factory.mktemp("prometheus"))
    yield server
    server.stop()
