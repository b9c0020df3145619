"""A host:port is checked for its port (1-65535) wherever one is parsed: the gRPC client takes a
port modulo 65536, so `--triton host:99999999` connected to 57599 and a policy's
`grpcEndpoint: triton:104569` was accepted. The error names the field or flag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_inputs import PROFILES, SPACE_YAML
from pydantic import ValidationError

from compass.api.crds import PARETO_POLICY, build_crd
from compass.api.routing import RoutingTarget
from compass.api.urls import ENDPOINT_PATTERN, endpoint_problem
from compass.commands.main import main


@pytest.mark.parametrize("address", ["triton:8001", "10.0.0.1:65535", "[::1]:1", "a.b-c:80"])
def test_an_endpoint_with_a_port_in_range_is_taken(address: str) -> None:
    assert endpoint_problem(address) is None
    assert RoutingTarget.model_validate({"grpcEndpoint": address}).grpc_endpoint == address


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("triton:104569", "port 104569 is outside 1-65535"),
        ("triton:65536", "port 65536 is outside 1-65535"),
        ("triton:0", "port 0 is outside 1-65535"),
        ("triton:99999999999999999999999", "outside 1-65535"),
        ("triton:８００１", "is not a number"),
        ("triton", "is not host:port"),
        ("a b:80", "is not a DNS name"),
    ],
)
def test_a_policys_grpc_endpoint_out_of_range_is_refused_naming_the_field(
    address: str, said: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        RoutingTarget.model_validate({"grpcEndpoint": address})
    message = str(caught.value)
    assert "grpcEndpoint: " in message
    assert said in message


def test_the_crd_checks_the_port_range_too() -> None:
    """The API server refuses what pydantic refuses: the CEL rule matches ENDPOINT_PATTERN."""
    text = str(build_crd(PARETO_POLICY))
    assert "grpcEndpoint must be host:port with a port in 1-65535" in text
    pattern = re.compile(ENDPOINT_PATTERN)
    assert pattern.fullmatch("triton:65535")
    assert not pattern.fullmatch("triton:65536")
    assert not pattern.fullmatch("triton:104569")
    assert all(pattern.fullmatch(f"h:{port}") for port in (1, 9, 10, 99, 100, 8001, 59999))


@pytest.mark.parametrize(
    "argv",
    [
        ["load", "--triton", "localhost:99999999"],
        ["profile", "--triton", "localhost:99999999", "--result", "r.json", "--output", "o.json"],
        [
            "serve",
            "--policy",
            "p.yaml",
            "--triton",
            "localhost:8001,localhost:99999999",
            "--metrics",
            "http://localhost:2/m",
        ],
        [
            "search",
            "--tau",
            "0.8",
            "--space",
            "space.yaml",
            "--samples",
            "10",
            "--triton",
            "localhost:99999999",
            "--output",
            "o.jsonl",
        ],
    ],
)
def test_the_cli_refuses_a_triton_port_out_of_range_naming_the_flag(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE_YAML, encoding="utf-8")
    import json

    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": PROFILES}), encoding="utf-8")
    plan = ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--output", "p.yaml"]
    assert main(plan) == 0
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--triton: port 99999999 is outside 1-65535" in err, err
    assert "Traceback" not in err
