"""The router client over TLS to a real tritonserver serving gRPC with TLS only, mutual TLS
required, its certificate naming a Service (not the pod's IP the client dials): with the CA,
the client certificate and the server name, switches and requests go through; without the
client certificate, with another CA, with no server name or in plaintext, they fail with a
RoutingError and change nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ragsim import ACCURATE, FASTEST, TIME_SCALE
from tls_certs import Tls, make_tls

from compass.dataplane.fleet import Endpoint, RouterFleet
from compass.dataplane.triton import GrpcTls, RoutingError, TritonRouter
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import rag_sim_triton
from tiers import require_tritonserver

# The name in the server's certificate: a Service's, as pods are dialled by IP.
SERVICE_NAME = "rag-sim-triton.ml.svc"


@dataclass(frozen=True)
class Secured:
    """A tritonserver whose gRPC port takes only mutual TLS, and the certificates."""

    triton: LocalTriton
    tls: Tls


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    require_tritonserver()
    workdir = tmp_path_factory.mktemp("tls-triton")
    certificates = workdir / "certificates"
    certificates.mkdir()
    tls = make_tls(certificates, server_san=f"DNS:{SERVICE_NAME}")
    server = rag_sim_triton(workdir, TIME_SCALE, FASTEST)
    server.extra_args = tls.triton_args()
    server.start(workdir)
    try:
        yield Secured(server, tls)
    finally:
        server.stop()


def _tls(tls: Tls, client: bool = True, server_name: str | None = SERVICE_NAME) -> GrpcTls:
    return GrpcTls(
        ca_pem=tls.ca.read_bytes(),
        cert_pem=tls.client_cert.read_bytes() if client else None,
        key_pem=tls.client_key.read_bytes() if client else None,
        server_name=server_name,
    )


def test_switches_and_requests_go_through_with_the_ca_client_certificate_and_name(
    secured: Secured,
) -> None:
    router = TritonRouter(secured.triton.grpc_url, backoff_s=0.05, tls=_tls(secured.tls))
    try:
        assert router.switch(ACCURATE).config == config_key(ACCURATE)
        assert router.infer({"sample": 3}).config == config_key(ACCURATE)
        assert router.active_config() == config_key(ACCURATE)
        router.switch(FASTEST)
    finally:
        router.close()
    # A fleet's routers take the same TLS.
    fleet = RouterFleet(
        [Endpoint("pod0", secured.triton.grpc_url)], tls=_tls(secured.tls), attempts=2
    )
    try:
        assert [p.config for p in fleet.switch(ACCURATE).pods] == [config_key(ACCURATE)]
        fleet.switch(FASTEST)
    finally:
        fleet.close()


@pytest.mark.parametrize(
    "which",
    ["no client certificate", "another CA", "no server name", "plaintext"],
)
def test_without_each_part_nothing_goes_through(
    secured: Secured, tmp_path: Path, which: str
) -> None:
    tls: GrpcTls | None
    if which == "no client certificate":
        tls = _tls(secured.tls, client=False)
    elif which == "another CA":
        other = make_tls(tmp_path, server_san=f"DNS:{SERVICE_NAME}")
        tls = GrpcTls(
            ca_pem=other.ca.read_bytes(),
            cert_pem=secured.tls.client_cert.read_bytes(),
            key_pem=secured.tls.client_key.read_bytes(),
            server_name=SERVICE_NAME,
        )
    elif which == "no server name":
        tls = _tls(secured.tls, server_name=None)
    else:
        tls = None
    router = TritonRouter(
        secured.triton.grpc_url, timeout_s=5.0, attempts=1, backoff_s=0.05, tls=tls
    )
    try:
        with pytest.raises(RoutingError, match=f"Triton at {secured.triton.grpc_url}"):
            router.switch(ACCURATE)
    finally:
        router.close()
    # Nothing changed: the router serves what it served.
    check = TritonRouter(secured.triton.grpc_url, tls=_tls(secured.tls))
    try:
        assert check.active_config() == config_key(FASTEST)
    finally:
        check.close()


def test_a_client_certificate_without_its_key_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="both the client certificate and its key"):
        GrpcTls(cert_pem=b"-----BEGIN CERTIFICATE-----")


def test_compass_load_and_profile_go_through_with_the_tls_flags(
    secured: Secured, tmp_path: Path
) -> None:
    """The CLI's --triton-* flags: `compass load` is served over mutual TLS; without the
    client certificate every request fails, and says why."""
    tls = secured.tls
    flags = [
        *("--triton-ca", str(tls.ca), "--triton-server-name", SERVICE_NAME),
        *("--triton-cert", str(tls.client_cert), "--triton-key", str(tls.client_key)),
    ]
    base = [
        *(sys.executable, "-m", "compass.commands.main", "load"),
        *("--triton", secured.triton.grpc_url, "--pattern", "constant"),
        *("--duration", "2", "--base-qps", "4", "--seed", "1"),
    ]
    served = subprocess.run(
        [*base, *flags, "--output", str(tmp_path / "ok.jsonl")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr
    records = [json.loads(line) for line in (tmp_path / "ok.jsonl").read_text().splitlines()]
    assert records
    assert all(r["error"] is None for r in records)
    refused = subprocess.run(
        [*base, *flags[:4], "--output", str(tmp_path / "refused.jsonl")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    failed = [json.loads(line) for line in (tmp_path / "refused.jsonl").read_text().splitlines()]
    assert failed, refused.stderr
    assert all(r["error"] for r in failed), refused.stderr
