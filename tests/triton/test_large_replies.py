"""A reply past gRPC's default 4 MiB limit, on a real Triton over TLS: every client the operator
builds (the router's, the load generator's) receives it, as a pipeline returning a long text
needs. Over TLS because tritonclient lifts the limit itself only for a channel given no options."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from ragsim import FASTEST
from tls_certs import make_tls

from compass.dataplane.load import run_load
from compass.dataplane.triton import GrpcTls, TritonRouter
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import rag_sim_triton
from tiers import require_tritonserver

PADDING = 6 << 20  # bytes; gRPC's default receive limit is 4 MiB
LARGE_PIPELINE = f"""

_answer = run


def run(request, config, call):
    return {{**_answer(request, config, call), "padding": "x" * {PADDING}}}
"""


@dataclass(frozen=True)
class Large:
    """rag-sim (no latency) padding every answer past 4 MiB, its gRPC port TLS only."""

    triton: LocalTriton
    tls: GrpcTls


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Large]:
    require_tritonserver()
    workdir = tmp_path_factory.mktemp("triton-large")
    certificates = workdir / "certificates"
    certificates.mkdir()
    tls = make_tls(certificates)
    server = rag_sim_triton(workdir, 0.0, FASTEST)
    pipeline = server.repository / "router" / "1" / "pipeline.py"
    pipeline.write_text(pipeline.read_text(encoding="utf-8") + LARGE_PIPELINE, encoding="utf-8")
    server.extra_args = tls.triton_args(mutual=False)
    server.start(workdir)
    try:
        yield Large(server, GrpcTls(ca_pem=tls.ca.read_bytes()))
    finally:
        server.stop()


def test_the_router_client_receives_a_reply_past_4_mib(large: Large) -> None:
    router = TritonRouter(large.triton.grpc_url, tls=large.tls)
    try:
        reply = router.infer({"sample": 0})
    finally:
        router.close()
    assert len(reply.result["padding"]) == PADDING
    assert reply.config


def test_the_load_generator_receives_replies_past_4_mib(large: Large) -> None:
    records = run_load(
        large.triton.grpc_url, [0.0, 0.05, 0.1], lambda i: {"sample": i}, tls=large.tls
    )
    assert [record.error for record in records] == [None, None, None]
    assert all(record.config for record in records)
