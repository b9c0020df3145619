"""A metrics URL is held to the policy's namespace like its routers, on a real API server: the
operator runs with metricsNamespaces [monitoring] (the chart's value), so a Prometheus there is
read, and any other namespace's Service is refused before anything is fetched."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cluster import Cluster, wait_for
from e2e_shared import Policies, condition, policy_spec
from operator_process import Operator

from compass.dataplane.triton import TritonRouter
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import FASTEST


@pytest.fixture(scope="module")
def operator(
    k8s_cluster: Cluster, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    """The module's operator, with a shared Prometheus's namespace open to metrics reads."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    env = {"COMPASS_METRICS_NAMESPACES": '["monitoring"]'}
    running = Operator(k8s_cluster, namespace, log, env=env).start()
    yield running
    running.stop()


def condition_of(policies: Policies, name: str, type_: str) -> dict[str, Any] | None:
    """The policy's condition of this type, once it has one."""
    return condition(policies.status(name), type_) or None


def prometheus_at(triton: LocalTriton, host: str) -> dict[str, Any]:
    """A spec whose queue depth is read from a Prometheus at this host."""
    return policy_spec(triton, metrics={"type": "prometheus", "url": f"http://{host}:9090"})


def test_a_metrics_url_of_another_namespace_is_refused_naming_the_field(
    triton: LocalTriton, router: TritonRouter, policies: Policies
) -> None:
    """Another tenant's Prometheus: TargetNotAllowed, nothing read, nothing switched."""
    policies.create("peek", prometheus_at(triton, "prometheus.team-b.svc"))
    ready = wait_for(lambda: condition_of(policies, "peek", "Ready"), 15, "a Ready condition")
    assert (ready["status"], ready["reason"]) == ("False", "TargetNotAllowed")
    assert ready["message"].startswith(
        "spec.metrics.url: prometheus.team-b.svc is a Service in namespace team-b"
    )
    assert "metricsNamespaces" in ready["message"]
    [event] = policies.wait_events("peek", "TargetNotAllowed")
    assert (event["type"], event["message"]) == ("Warning", ready["message"])
    assert condition_of(policies, "peek", "MetricsAvailable") is None  # never tried
    assert router.active_config() == config_key(FASTEST)


def test_a_metrics_url_in_a_listed_namespace_is_read(
    triton: LocalTriton, policies: Policies
) -> None:
    """monitoring is listed: the policy is accepted and the operator reads the URL (no DNS for
    Services here, so the read fails as an unreachable Prometheus would, not as a refusal)."""
    policies.create("shared", prometheus_at(triton, "prometheus.monitoring.svc"))
    metrics = wait_for(
        lambda: condition_of(policies, "shared", "MetricsAvailable"),
        30,
        "a MetricsAvailable condition",
    )
    assert (metrics["status"], metrics["reason"]) == ("False", "MetricsUnavailable")
    ready = condition_of(policies, "shared", "Ready")
    assert ready is not None
    assert ready["reason"] != "TargetNotAllowed"
