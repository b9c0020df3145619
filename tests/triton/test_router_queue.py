"""Triton's own queue timeout on a real server: the load generator's ``queue_timeout_s`` reaches
the router's queue policy (here REJECT: a request past its timeout is refused, retryable), and
without one every request is served. bench/triton_queue.py measures the DELAY policy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from ragsim import ACCURATE, COMPONENTS, TIME_SCALE

from compass.dataplane.load import run_load
from compass.dataplane.triton import TritonRouter
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton, assemble_repository
from compass_rules.protocol import OVERRIDE_PARAMETER
from tiers import require_tritonserver

REJECT_POLICY = """dynamic_batching {
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 3600000000
    allow_timeout_override: true
  }
}
"""


@pytest.fixture(scope="module")
def rejecting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """rag-sim whose router refuses a request that waited past its own queue timeout."""
    workdir: Path = tmp_path_factory.mktemp("rejecting")
    repository = assemble_repository(
        "rag-sim",
        workdir / "models",
        {
            **{c: {"time_scale": str(TIME_SCALE)} for c in COMPONENTS},
            "router": {"compass_active_config": json.dumps(ACCURATE, sort_keys=True)},
        },
    )
    config = repository / "router" / "config.pbtxt"
    text = config.read_text(encoding="utf-8")
    config.write_text(text.replace("instance_group", REJECT_POLICY + "instance_group", 1))
    require_tritonserver()
    server = LocalTriton(repository=repository).start(workdir)
    yield server
    server.stop()


def test_a_request_past_its_queue_timeout_is_refused_and_none_without_one(
    rejecting: LocalTriton,
) -> None:
    router = TritonRouter(rejecting.grpc_url)
    try:
        service_s = min(router.infer({"sample": i}).latency_s for i in range(3))
    finally:
        router.close()
    arrivals = [0.1 * i * service_s for i in range(8)]

    def load(queue_timeout_s: float | None) -> list[str | None]:
        records = run_load(
            rejecting.grpc_url,
            arrivals,
            lambda i: {"sample": i},
            parameters={OVERRIDE_PARAMETER: config_key(ACCURATE)},
            queue_timeout_s=queue_timeout_s,
        )
        return [r.error for r in records]

    assert load(None) == [None] * len(arrivals)
    # Eight requests a tenth of a service apart, each allowed 1.5 services in the queue: the
    # first is taken up at once; at most the second and third start within their timeout.
    errors = load(1.5 * service_s)
    assert errors[0] is None
    refused = [e for e in errors if e is not None]
    assert len(refused) >= 5, errors
    assert all("UNAVAILABLE" in e and "timeout" in e for e in refused), refused
    with pytest.raises(ValueError, match="queue_timeout_s: 0"):
        run_load(rejecting.grpc_url, [0.0], lambda i: {"sample": i}, queue_timeout_s=0)
