"""Test certificates made with the openssl CLI: a CA, a server and a client certificate."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Tls:
    """A CA, and a server and a client certificate it signed."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    def triton_args(self, mutual: bool = True) -> tuple[str, ...]:
        """tritonserver's flags to serve gRPC with TLS only (``mutual``: client certificates)."""
        server = (f"--grpc-server-cert={self.cert}", f"--grpc-server-key={self.key}")
        if not mutual:
            return ("--grpc-use-ssl=true", *server)
        return (
            "--grpc-use-ssl=true",
            "--grpc-use-ssl-mutual=true",
            *server,
            f"--grpc-root-cert={self.ca}",
        )


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_tls(directory: Path, server_san: str = "IP:127.0.0.1") -> Tls:
    """A self-signed CA, a server certificate for ``server_san`` (an openssl subjectAltName)
    and a client certificate it signed, with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl CLI is needed to make the test CA (apt-get install openssl)")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=compass test CA", "-keyout", "ca.key", "-out", "ca.crt",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", "server.key", "-out", "server.csr",
        cwd=directory,
    )  # fmt: skip
    (directory / "san.ext").write_text(f"subjectAltName={server_san}\n", encoding="utf-8")
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "san.ext", "-out", "server.crt",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=compass-operator",
        "-keyout", "client.key", "-out", "client.csr",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-out", "client.crt",
        cwd=directory,
    )  # fmt: skip
    return Tls(
        directory / "ca.crt",
        directory / "server.crt",
        directory / "server.key",
        directory / "client.crt",
        directory / "client.key",
    )
