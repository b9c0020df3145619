"""What a resource may point the operator at (compass.controllers.targets), and how a refusal
reaches a ParetoPolicy's conditions and Events."""

from __future__ import annotations

import pytest

from compass.controllers import policy_compile, policy_conditions
from compass.controllers.settings import OperatorSettings
from compass.controllers.targets import (
    TargetAccess,
    TargetRefusedError,
    resolve_host,
    resolve_url,
    service_namespace,
)

NONE_ALLOWED = TargetAccess()
FRONT = [
    {"config": {"k": 1}, "accuracy": 0.83, "latencyMeanMs": 20, "latencyP95Ms": 23},
    {"config": {"k": 2}, "accuracy": 0.86, "latencyMeanMs": 33, "latencyP95Ms": 37},
]


def compiled(**fields: object) -> policy_compile.CompiledPolicy:
    """A policy of namespace team-a's, compiled (the spec checks passed)."""
    spec = {"front": FRONT, "slo": {"latencyMs": 150}, **fields}
    return policy_compile.compile_policy(spec, 1, address_override=None)


@pytest.mark.parametrize(
    ("host", "namespace"),
    [
        ("prometheus.monitoring.svc", "monitoring"),
        ("prometheus.monitoring.svc.cluster.local", "monitoring"),
        ("Triton.Team-A.svc.cluster.local.", "team-a"),
        ("prometheus", None),
        ("prometheus.monitoring", None),  # also a public name's shape (example.com)
        ("a.b.svc.example.com", None),
        ("169.254.169.254", None),
        ("x.y.z.svc", None),
    ],
)
def test_an_in_cluster_service_name_gives_its_namespace(host: str, namespace: str | None) -> None:
    assert service_namespace(host) == namespace


def test_the_cluster_domain_is_a_setting() -> None:
    assert service_namespace("p.mon.svc.k8s.internal", "k8s.internal") == "mon"
    assert service_namespace("p.mon.svc.cluster.local", "k8s.internal") is None


@pytest.mark.parametrize(
    ("url", "read"),
    [
        ("http://prometheus:9090", "http://prometheus.team-a.svc:9090"),
        ("http://localhost:9090/x", "http://localhost.team-a.svc:9090/x"),
        ("http://metadata/computeMetadata", "http://metadata.team-a.svc/computeMetadata"),
        ("https://prometheus.team-a.svc:9090/p", "https://prometheus.team-a.svc:9090/p"),
        ("http://p.team-a.svc.cluster.local", "http://p.team-a.svc.cluster.local"),
    ],
)
def test_by_default_a_metrics_url_reads_in_cluster_services_only(url: str, read: str) -> None:
    """A bare name is a Service of the resource's namespace: never the operator's own, nor
    what the node's resolver makes of it."""
    assert resolve_url(url, "metrics.url", "team-a", NONE_ALLOWED) == read


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://prometheus.example.com:9090",
        "http://prometheus.monitoring:9090",
        "http://[::1]:9090",
        "http://10.0.0.7:9090",
    ],
)
def test_any_other_host_is_refused_by_default(url: str) -> None:
    with pytest.raises(TargetRefusedError) as error:
        resolve_url(url, "metrics.url", "team-a", NONE_ALLOWED)
    assert str(error.value).startswith("metrics.url: host ")
    assert "allowedHosts" in error.value.fix


def test_the_settings_allow_hosts_exactly_by_domain_or_all() -> None:
    listed = TargetAccess(allowed_hosts=("10.0.0.7", "*.example.com", "[::1]"))
    for url in ("http://10.0.0.7:9090", "http://p.example.com", "http://[::1]:9090"):
        assert resolve_url(url, "metrics.url", "a", listed) == url
    with pytest.raises(TargetRefusedError):
        resolve_url("http://example.com.evil.io", "metrics.url", "a", listed)
    anything = TargetAccess(allowed_hosts=("*",))
    # Outside a cluster names resolve where the operator runs: read as given.
    assert resolve_url("http://localhost:9090", "metrics.url", "a", anything) == (
        "http://localhost:9090"
    )


def test_a_router_in_another_namespace_needs_the_setting() -> None:
    with pytest.raises(TargetRefusedError) as error:
        resolve_host(
            "triton.payments.svc", "routing.grpcEndpoint", "team-a", NONE_ALLOWED, router=True
        )
    assert "payments" in str(error.value)
    assert "allowedTargetNamespaces" in str(error.value)
    # Any host allowed is no licence to switch another namespace's routers.
    anything = TargetAccess(allowed_hosts=("*",))
    with pytest.raises(TargetRefusedError):
        resolve_host("triton.payments.svc", "f", "team-a", anything, router=True)
    for namespaces in (("payments",), ("*",)):
        access = TargetAccess(allowed_target_namespaces=namespaces)
        assert resolve_host("triton.payments.svc", "f", "team-a", access, router=True)


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus.team-b.svc:9090",
        "http://x.team-b.svc.cluster.local:8002/metrics",
        "http://X.Team-B.svc.cluster.local.:8002/metrics",
        "https://prometheus.monitoring.svc/prom",
    ],
)
def test_a_metrics_url_in_another_namespace_is_refused_by_default(url: str) -> None:
    """Another tenant's Service or Prometheus: the operator would GET it (or run any PromQL
    there) for a resource whose author cannot, and show the number in its status."""
    with pytest.raises(TargetRefusedError) as error:
        resolve_url(url, "metrics.url", "team-a", NONE_ALLOWED)
    assert str(error.value).startswith("metrics.url: ")
    assert "metrics in its own (team-a)" in error.value.what
    assert "metricsNamespaces" in error.value.fix
    # Any host allowed is no licence to read another namespace's Services either.
    with pytest.raises(TargetRefusedError):
        resolve_url(url, "metrics.url", "team-a", TargetAccess(allowed_hosts=("*",)))


def test_the_settings_open_namespaces_to_metrics_reads() -> None:
    url = "http://prometheus.monitoring.svc:9090"
    for access in (
        TargetAccess(metrics_namespaces=("monitoring",)),
        TargetAccess(metrics_namespaces=("*",)),
        TargetAccess(allowed_target_namespaces=("monitoring",)),  # its routers, so their metrics
        TargetAccess(allowed_hosts=("prometheus.monitoring.svc",)),  # this very host
    ):
        assert resolve_url(url, "metrics.url", "team-a", access) == url
    listed = TargetAccess(metrics_namespaces=("monitoring",))
    with pytest.raises(TargetRefusedError):
        resolve_url("http://prometheus.team-b.svc", "metrics.url", "team-a", listed)
    # Reading metrics is no licence to switch a router there.
    with pytest.raises(TargetRefusedError):
        resolve_host("triton.monitoring.svc", "f", "team-a", listed, router=True)


def test_a_policy_reaches_only_what_the_settings_allow() -> None:
    own = policy_compile.authorize_policy_targets(
        compiled(routing={"grpcEndpoint": "triton:8001"}), "team-a", NONE_ALLOWED
    )
    assert own.grpc_address == "triton.team-a.svc:8001"
    assert own.metrics.url == "http://triton.team-a.svc:8002/metrics"
    for fields, field in [
        ({"routing": {"grpcEndpoint": "triton.payments.svc:8001"}}, "spec.routing.grpcEndpoint"),
        ({"routing": {"grpcEndpoint": "triton.example.com:8001"}}, "spec.routing.grpcEndpoint"),
        (
            {
                "routing": {"service": "triton"},
                "metrics": {"type": "prometheus", "url": "http://169.254.169.254"},
            },
            "spec.metrics.url",
        ),
        (
            {
                "routing": {"service": "triton"},
                "metrics": {"type": "prometheus", "url": "http://prometheus.team-b.svc:9090"},
            },
            "spec.metrics.url",
        ),
    ]:
        with pytest.raises(policy_compile.SpecError) as error:
            policy_compile.authorize_policy_targets(compiled(**fields), "team-a", NONE_ALLOWED)
        assert str(error.value).startswith(f"{field}: "), str(error.value)
        assert error.value.reason == "TargetNotAllowed"


def test_the_address_override_is_the_operators_own_setting() -> None:
    spec = {"front": FRONT, "slo": {"latencyMs": 150}}
    policy = policy_compile.compile_policy(spec, 1, address_override="127.0.0.1:9001")
    authorized = policy_compile.authorize_policy_targets(
        policy, "team-a", NONE_ALLOWED, "127.0.0.1:9001"
    )
    assert authorized.grpc_address == "127.0.0.1:9001"


def test_a_refused_target_is_a_condition_and_an_event_naming_the_field() -> None:
    with pytest.raises(policy_compile.SpecError) as error:
        policy_compile.authorize_policy_targets(
            compiled(routing={"grpcEndpoint": "triton.payments.svc:8001"}), "team-a", NONE_ALLOWED
        )
    health = policy_conditions.Health(spec_error=str(error.value), spec_reason=error.value.reason)
    conditions = policy_conditions.merge_conditions(
        [], policy_conditions.health_conditions(health), "2026-01-01T00:00:00Z", 1
    )
    [ready] = [c for c in conditions if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "TargetNotAllowed")
    assert ready["message"].startswith("spec.routing.grpcEndpoint: ")
    [event] = policy_conditions.transition_events([], conditions)
    assert (event.type, event.reason) == ("Warning", "TargetNotAllowed")


def test_the_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPASS_ALLOWED_HOSTS", '["prom.example.com"]')
    monkeypatch.setenv("COMPASS_ALLOWED_TARGET_NAMESPACES", '["serving"]')
    monkeypatch.setenv("COMPASS_METRICS_NAMESPACES", '["monitoring"]')
    access = OperatorSettings().target_access()
    assert access == TargetAccess(
        ("prom.example.com",), ("serving",), "cluster.local", ("monitoring",)
    )
    monkeypatch.delenv("COMPASS_ALLOWED_HOSTS")
    monkeypatch.delenv("COMPASS_ALLOWED_TARGET_NAMESPACES")
    monkeypatch.delenv("COMPASS_METRICS_NAMESPACES")
    assert OperatorSettings().target_access() == NONE_ALLOWED
