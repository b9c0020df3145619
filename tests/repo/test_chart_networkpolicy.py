"""The chart's NetworkPolicy: none by default; when enabled, the operator's pods may be scraped
and reach DNS, the API server, the Triton pods and Prometheus, and nothing else."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
from test_chart_render import CHART, container, only, render


def policy(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The rendered NetworkPolicy with networkPolicy.enabled and these values."""
    return only(render({"networkPolicy": {"enabled": True, **(values or {})}}), "NetworkPolicy")


def ports(rule: dict[str, Any]) -> list[tuple[Any, str]]:
    return [(p["port"], p["protocol"]) for p in rule["ports"]]


def test_no_network_policy_unless_enabled() -> None:
    assert not [o for o in render() if o["kind"] == "NetworkPolicy"]


def test_it_selects_the_operators_pods_and_admits_only_the_metrics_scrape() -> None:
    """Same selector as the Deployment; one ingress rule, to the named metrics port."""
    objects = render({"networkPolicy": {"enabled": True}})
    deployment = only(objects, "Deployment")
    rendered = only(objects, "NetworkPolicy")["spec"]
    assert rendered["podSelector"] == deployment["spec"]["selector"]
    assert rendered["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = rendered["ingress"]
    assert ports(ingress) == [("metrics", "TCP")]
    assert "metrics" in {p["name"] for p in container(objects)["ports"]}
    assert ingress["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "prometheus"
    }


def test_egress_is_dns_the_api_server_triton_and_prometheus() -> None:
    """In that order, each to its own ports; extraEgress appended."""
    extra = {"to": [{"ipBlock": {"cidr": "203.0.113.7/32"}}], "ports": [{"port": 443}]}
    egress = policy(
        {
            "apiServer": {"cidrs": ["10.0.0.1/32"], "ports": [6443]},
            "triton": {"to": [{"namespaceSelector": {}}], "ports": ["grpc", "metrics"]},
            "extraEgress": [extra],
        }
    )["spec"]["egress"]
    dns, api, triton, prometheus, added = egress
    assert ports(dns) == [(53, "UDP"), (53, "TCP")]
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert api["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    assert ports(api) == [(6443, "TCP")]
    assert ports(triton) == [("grpc", "TCP"), ("metrics", "TCP")]
    assert ports(prometheus) == [(9090, "TCP")]
    assert added == extra


def test_the_defaults_reach_triton_on_its_default_ports_and_any_api_server_address() -> None:
    """Triton's gRPC 8001 and metrics 8002 (the CRDs' defaults); the API server on 443 and
    6443 at any address until narrowed; DNS can be left out."""
    egress = policy({"dns": {"enabled": False}})["spec"]["egress"]
    api, triton, _ = egress
    assert api["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    assert ports(api) == [(443, "TCP"), (6443, "TCP")]
    assert ports(triton) == [(8001, "TCP"), (8002, "TCP")]


def test_lint_is_clean_with_it() -> None:
    """`helm lint --strict` with the policy on: no warnings or errors."""
    report = helm.lint(CHART, {"networkPolicy": {"enabled": True}}, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"apiServer": {"cidrs": ["10.0.0.1"]}}, "/networkPolicy/apiServer/cidrs/0"),
        ({"triton": {"ports": []}}, "/networkPolicy/triton/ports"),
        ({"egress": []}, "/networkPolicy"),
    ],
)
def test_bad_values_are_refused_naming_the_key(values: dict[str, Any], path: str) -> None:
    with pytest.raises(Exception, match=path):
        policy(values)
