"""What the handlers of one operator process share: the settings and the operator's own metrics.

`compass operator` puts a Runtime into kopf's memo; each resource's memo is a shallow copy of
it, so every handler sees the same one. Under a bare `kopf run`, a startup handler makes one.
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from compass.controllers import kubeapi
from compass.controllers.fencing import Fence
from compass.controllers.settings import OperatorSettings

RUNTIME_KEY = "compass_runtime"
# One Elastico step reads the metrics (a few ms) and sometimes reloads the router (150-300 ms).
DECISION_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class OperatorMetrics:
    """The operator's own Prometheus metrics, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["namespace", "policy"]
        self.reconciles = Counter(
            "compass_reconciles_total",
            "Reconciliations (ParetoPolicy decisions, CompoundWorkflow steps) by result.",
            ["kind", "result"],
            registry=self.registry,
        )
        self.errors = Counter(
            "compass_errors_total",
            "Reconciliations that failed, by kind and reason.",
            ["kind", "reason"],
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "compass_decision_seconds",
            "One Elastico step: read the queue depth, decide, switch the router if needed.",
            buckets=DECISION_BUCKETS,
            registry=self.registry,
        )
        self.switches = Counter(
            "compass_switches_total",
            "Configuration switches made, by policy and direction.",
            [*labels, "direction"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "compass_queue_depth",
            "The router's queue depth at the policy's last observation.",
            labels,
            registry=self.registry,
        )
        self.active_index = Gauge(
            "compass_active_configuration_index",
            "Position of the active configuration on the planned front (0 = fastest).",
            labels,
            registry=self.registry,
        )
        self.fenced = Gauge(
            "compass_policy_fenced",
            "1 while this operator switches nothing for the policy: the API server has not "
            "accepted its peering keep-alive recently enough (a standby may take over).",
            labels,
            registry=self.registry,
        )
        self.ready = Gauge(
            "compass_policy_ready",
            "1 while the policy is in control of the routing (condition Ready), else 0.",
            labels,
            registry=self.registry,
        )


@dataclass
class Runtime:
    """Settings, metrics and the Kubernetes client of this operator process."""

    settings: OperatorSettings = field(default_factory=OperatorSettings)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # None when standalone: no peer can take over, so nothing to fence.
    fence: Fence | None = None
    _api: client.ApiClient | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def api(self) -> client.ApiClient:
        """The process's Kubernetes client (compass.controllers.kubeapi loads it on first use)."""
        with self._lock:
            if self._api is None:
                self._api = kubeapi.load_client()
            return self._api


def runtime_of(memo: MutableMapping[str, Any]) -> Runtime:
    """The process's Runtime from a kopf memo (made on first use if no one put one there)."""
    runtime = memo.get(RUNTIME_KEY)
    if not isinstance(runtime, Runtime):
        runtime = Runtime()
        memo[RUNTIME_KEY] = runtime
    return runtime
