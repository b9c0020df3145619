"""What the handlers of one operator process share (kopf's memo): settings, client, metrics."""

from __future__ import annotations

import platform
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric

from compass import __version__
from compass.api.compoundworkflow import Phase
from compass.controllers import kubeapi
from compass.controllers.claims import OldestClaims
from compass.controllers.collector import Collector
from compass.controllers.fencing import Fence
from compass.controllers.ledgerbudget import MIB, LedgerBudget
from compass.controllers.policy_scheduler import PolicyScheduler
from compass.controllers.policy_status import STATUS_HEARTBEAT_S, PolicyGauges
from compass.controllers.settings import OperatorSettings
from compass.domain.policy import Action

RUNTIME_KEY = "compass_runtime"
# One Elastico step reads the metrics (a few ms) and sometimes reloads the router (150-300 ms).
DECISION_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# The direction label of compass_switches_total (Elastico's switching actions).
SWITCH_DIRECTIONS = tuple(a.value for a in Action if a is not Action.HOLD)
# The result label of the workflow Job counters.
JOB_RESULTS = ("started", "succeeded", "failed")
GONE_REMEMBERED = 1024


def _kopf_version() -> str:
    try:
        return metadata.version("kopf")
    except metadata.PackageNotFoundError:
        return "unknown"


class RecentUids:
    """The last ``size`` uids added (one added again counts as new); membership in O(1)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._uids: OrderedDict[str, None] = OrderedDict()

    def add(self, uid: str) -> None:
        """Remember ``uid`` as the newest; forget the oldest past ``size``."""
        self._uids[uid] = None
        self._uids.move_to_end(uid)
        if len(self._uids) > self._size:
            self._uids.popitem(last=False)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def __len__(self) -> int:
        return len(self._uids)


class OperatorMetrics:
    """The operator's own Prometheus metrics, in a registry of their own. A policy's or workflow's
    series go when it is deleted, and a policy's gauges when this process stops ticking it (a
    paused or fenced replica's stale view would otherwise alert beside the acting one's)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        # When each policy's gauges (and its fenced gauge) stop being current.
        self._expires: dict[tuple[str, str], float] = {}
        self._fenced_expires: dict[tuple[str, str], float] = {}
        # Registered first, so that a scrape drops expired series before the gauges are read.
        self.registry.register(self)
        labels = ["namespace", "policy"]
        flows = ["namespace", "workflow"]
        # The label set of each policy's active_info series, so that a change removes the old.
        self._active_info: dict[tuple[str, str], tuple[str, str]] = {}
        # Deleted policies and workflows (by uid): a tick that was in flight at the delete sets
        # nothing after. Looked up on every set_policy: a set, not a list scanned.
        self._gone = RecentUids(GONE_REMEMBERED)

        # The gauges labelled by policy alone (gauge's default): _remove_gauges takes them all.
        self._policy_gauges: list[Gauge] = []

        def gauge(name: str, documentation: str, names: Sequence[str] | None = None) -> Gauge:
            made = Gauge(name, documentation, names or labels, registry=self.registry)
            if names is None:
                self._policy_gauges.append(made)
            return made

        def counter(name: str, documentation: str, names: Sequence[str]) -> Counter:
            return Counter(name, documentation, names, registry=self.registry)

        # One lock for every change to the per-object series and the books kept on them.
        self._lock = threading.Lock()
        # Each policy's gauge series (set_policy), by (namespace, name) and gauge name.
        self._children: dict[tuple[str, str], dict[Gauge, Any]] = {}
        # The gauges each policy's series show now (set_policy): the same again sets nothing.
        self._shown: dict[tuple[str, str], PolicyGauges] = {}
        self.build_info = gauge(
            "compass_build_info",
            "Always 1; the labels say which operator runs: its version, Python's and kopf's.",
            ["version", "python", "kopf"],
        )
        self.build_info.labels(__version__, platform.python_version(), _kopf_version()).set(1)
        self.reconciles = counter(
            "compass_reconciles_total",
            "Reconciliations (ParetoPolicy decisions, CompoundWorkflow steps) by result.",
            ["kind", "result"],
        )
        self.errors = counter(
            "compass_errors_total",
            "Reconciliations that failed, by kind and reason.",
            ["kind", "reason"],
        )
        self.decision_seconds = Histogram(
            "compass_decision_seconds",
            "One Elastico step: read the queue depth, decide, switch the router if needed.",
            buckets=DECISION_BUCKETS,
            registry=self.registry,
        )
        self.switches = counter(
            "compass_switches_total",
            "Configuration switches made, by policy and direction.",
            [*labels, "direction"],
        )
        self.advisory_switches = counter(
            "compass_advisory_switches_total",
            "Switches an advisory policy would have made (nothing switched), by policy and "
            "direction.",
            [*labels, "direction"],
        )
        self.queue_depth = gauge(
            "compass_queue_depth", "The router's queue depth at the policy's last observation."
        )
        self.active_index = gauge(
            "compass_active_configuration_index",
            "Position of the active configuration on the planned front (0 = fastest).",
        )
        self.fenced = gauge(
            "compass_policy_fenced",
            "1 while this operator switches nothing for the policy: the API server has not "
            "accepted its peering keep-alive recently enough (a standby may take over).",
        )
        self.ready = gauge(
            "compass_policy_ready",
            "1 while the policy is in control of the routing (condition Ready), else 0.",
        )
        self.paused = gauge(
            "compass_policy_paused",
            "1 while spec.paused or the compass.io/paused annotation holds the policy on its "
            "active configuration, else 0.",
        )
        self.metrics_available = gauge(
            "compass_policy_metrics_available",
            "1 while the queue depth is read and fresh (condition MetricsAvailable), else 0.",
        )
        self.at_fastest = gauge(
            "compass_policy_at_fastest",
            "1 while the active configuration is the fastest eligible front entry, else 0.",
        )
        self.served_accuracy = gauge(
            "compass_served_accuracy",
            "Accuracy of what the policy serves: the active entry's (a split's blend weighted in).",
        )
        self.served_ttft = gauge(
            "compass_served_ttft_seconds",
            "Mean time to first token of the streams the policy's routers answered over the "
            "last minute (status.served.ttftMeanMs). No series where no router streams.",
        )
        self.served_stream = gauge(
            "compass_served_stream_seconds",
            "Mean end-to-end time of those streams (status.served.streamMeanMs). No series "
            "where no router streams.",
        )
        self.stay_queue_threshold = gauge(
            "compass_stay_queue_threshold",
            "The active entry's stay limit: the deepest per-pod queue it may stay on.",
        )
        self.enter_queue_threshold = gauge(
            "compass_enter_queue_threshold",
            "The active entry's entry limit: the deepest per-pod queue it may be entered with.",
        )
        self.active_info = gauge(
            "compass_active_configuration_info",
            "Always 1; the labels name the active configuration and its front index (one series "
            "per policy: a switch replaces it).",
            [*labels, "index", "name"],
        )
        self.capacity_pressure = gauge(
            "compass_capacity_pressure",
            "0 unless the fastest entry is active and its queue is over its stay limit; then "
            "(queue + 1) / (limit + 1): scale Triton replicas on it with a target of 1. No "
            "series while the queue is not known fresh.",
        )
        self.policies_scheduled = Gauge(
            "compass_policies_scheduled",
            "ParetoPolicies this process ticks now (none while peering pauses it, or while "
            "another shard owns them).",
            registry=self.registry,
        )
        self.scheduler_lag = gauge(
            "compass_policy_scheduler_lag_seconds",
            "How late the ParetoPolicy scheduler started its last tick, and the policies it "
            "found still running from the tick before (label kind: late, running).",
            ["kind"],
        )
        self.searches = counter(
            "compass_workflow_searches",
            "Search Jobs by result: started, succeeded, failed.",
            [*flows, "result"],
        )
        self.profilings = counter(
            "compass_workflow_profilings",
            "Profiling Jobs by result: started, succeeded, failed.",
            [*flows, "result"],
        )
        self.samples_evaluated = counter(
            "compass_workflow_samples_evaluated",
            "Sample evaluations the workflow's searches recorded (status.samplesUsed as it grows).",
            flows,
        )
        self.workflow_phase = gauge(
            "compass_workflow_phase",
            "1 for the workflow's status.phase (label phase: Pending, Searching, Profiling, "
            "Planning, Planned, Ready, Failed), 0 for the others.",
            [*flows, "phase"],
        )

    def touch_policy(self, namespace: str, name: str, ttl_s: float) -> None:
        """This process ticks the policy: keep its gauges for ``ttl_s`` more (then they go)."""
        with self._lock:
            self._expires[(namespace, name)] = self._clock() + ttl_s

    def set_policy(self, namespace: str, name: str, uid: str, gauges: PolicyGauges) -> None:
        """Set one policy's gauges after a tick; a value left None keeps its series as is."""
        values: tuple[tuple[Gauge, float | bool | None], ...] = (
            (self.ready, gauges.ready),
            (self.paused, gauges.paused),
            (self.metrics_available, gauges.metrics_available),
            (self.queue_depth, gauges.queue_depth),
            (self.active_index, gauges.active_index),
            (self.at_fastest, gauges.at_fastest),
            (self.served_accuracy, gauges.served_accuracy),
            (self.stay_queue_threshold, gauges.stay_queue_threshold),
            (self.enter_queue_threshold, gauges.enter_queue_threshold),
        )
        # Under the lock with the uid check: a delete between the two would leave a series
        # that neither the delete nor the expiry removes.
        with self._lock:
            if uid and uid in self._gone:
                return
            # A steady policy's gauges are those of its last tick: nothing to set (a thousand
            # policies' dozen series a second are most of a quiet tick's gauge work).
            if self._shown.get((namespace, name)) == gauges:
                return
            self._shown[namespace, name] = gauges
            # Each policy's series, looked up once (labels() is most of the cost of a tick's
            # gauges at a thousand policies); forgotten with its series.
            children = self._children.get((namespace, name))
            if children is None:
                children = self._children[namespace, name] = {}
            for gauge, value in values:
                if value is not None:
                    child = children.get(gauge)
                    if child is None:
                        child = children[gauge] = gauge.labels(namespace, name)
                    child.set(float(value))
            optional = (
                (self.capacity_pressure, gauges.capacity_pressure),
                (self.served_ttft, gauges.served_ttft_seconds),
                (self.served_stream, gauges.served_stream_seconds),
            )
            for gauge, value in optional:
                if value is None:
                    gauge.remove(namespace, name)
                else:
                    gauge.labels(namespace, name).set(value)
            if gauges.active_index is not None and gauges.active_name is not None:
                info = (str(gauges.active_index), gauges.active_name)
                old = self._active_info.get((namespace, name))
                if old is not None and old != info:
                    self.active_info.remove(namespace, name, *old)
                self._active_info[(namespace, name)] = info
                self.active_info.labels(namespace, name, *info).set(1)

    def set_fenced(self, namespace: str, name: str, uid: str, fenced: bool, ttl_s: float) -> None:
        """Whether this operator may act on the policy now (Fence); gone if unset for ``ttl_s``."""
        with self._lock:
            if not (uid and uid in self._gone):
                self._fenced_expires[(namespace, name)] = self._clock() + ttl_s
                self.fenced.labels(namespace, name).set(float(fenced))

    def collect(self) -> Iterator[Metric]:
        """A collector of no series (the registry's first): a scrape drops the expired gauges."""
        self.expire()
        return iter(())

    def expire(self) -> None:
        """Remove the gauges of every policy this process stopped ticking (its counters stay)."""
        with self._lock:
            now = self._clock()
            for key, until in list(self._expires.items()):
                if until < now:
                    del self._expires[key]
                    self._remove_gauges(*key, keep=self.fenced)
            for key, until in list(self._fenced_expires.items()):
                if until < now:
                    del self._fenced_expires[key]
                    self.fenced.remove(*key)

    def _remove_gauges(self, namespace: str, name: str, keep: Gauge | None = None) -> None:
        """Remove a policy's gauges and its info series (all but ``keep``); under the lock."""
        self._children.pop((namespace, name), None)
        self._shown.pop((namespace, name), None)
        for gauge in self._policy_gauges:
            if gauge is not keep:
                gauge.remove(namespace, name)
        old = self._active_info.pop((namespace, name), None)
        if old is not None:
            self.active_info.remove(namespace, name, *old)

    def forget_policy(self, namespace: str, name: str, uid: str = "") -> None:
        """Remove every series of a deleted ParetoPolicy (and set none for its uid again)."""
        with self._lock:
            if uid:
                self._gone.add(uid)
            self._expires.pop((namespace, name), None)
            self._fenced_expires.pop((namespace, name), None)
            self._remove_gauges(namespace, name)
            for direction in SWITCH_DIRECTIONS:
                self.switches.remove(namespace, name, direction)
                self.advisory_switches.remove(namespace, name, direction)

    def count_workflow(
        self,
        namespace: str,
        name: str,
        uid: str,
        progress: Iterable[tuple[str, str]],
        samples: int,
    ) -> None:
        """Count a workflow's Job transitions ((search|profiling, result)) and new samples."""
        with self._lock:
            if uid and uid in self._gone:
                return
            for stage, result in progress:
                counter = self.searches if stage == "search" else self.profilings
                counter.labels(namespace, name, result).inc()
            if samples > 0:
                self.samples_evaluated.labels(namespace, name).inc(samples)

    def set_workflow_phase(self, namespace: str, name: str, uid: str, phase: Phase) -> None:
        """The workflow's phase as it was last seen (a deleted workflow's stays gone)."""
        with self._lock:
            if uid and uid in self._gone:
                return
            for each in Phase:
                self.workflow_phase.labels(namespace, name, each.value).set(each == phase)

    def forget_workflow(self, namespace: str, name: str, uid: str = "") -> None:
        """Remove every series of a deleted CompoundWorkflow (and count none for its uid)."""
        with self._lock:
            if uid:
                self._gone.add(uid)
            for counter in (self.searches, self.profilings):
                for result in JOB_RESULTS:
                    counter.remove(namespace, name, result)
            self.samples_evaluated.remove(namespace, name)
            for phase in Phase:
                self.workflow_phase.remove(namespace, name, phase.value)


@dataclass
class Runtime:
    """Settings, metrics and the Kubernetes client of this operator process."""

    settings: OperatorSettings = field(default_factory=OperatorSettings)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # None when standalone: no peer can take over, so nothing to fence.
    fence: Fence | None = None
    _api: client.ApiClient | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _scheduler: PolicyScheduler | None = field(default=None, repr=False)
    _ledger_budget: LedgerBudget | None = field(default=None, repr=False)
    # The policies' claims index's oldest claim per target (policy_handlers.policy_claims).
    oldest_claims: OldestClaims = field(default_factory=OldestClaims, repr=False)

    def ledger_budget(self) -> LedgerBudget:
        """The ledger text all workflows' starts may hold inflated at once (the settings')."""
        with self._lock:
            if self._ledger_budget is None:
                self._ledger_budget = LedgerBudget(self.settings.ledger_text_budget_mib * MIB)
            return self._ledger_budget

    def policy_scheduler(self) -> PolicyScheduler:
        """The process's one ParetoPolicy scheduler, made (and started) on first use."""
        with self._lock:
            if self._scheduler is None:
                freeze_s = self.settings.gc_freeze_seconds
                scheduler = PolicyScheduler(
                    self.settings.policy_tick_seconds,
                    self.settings.policy_workers,
                    collector=Collector(freeze_s) if freeze_s > 0 else None,
                )
                self.metrics.policies_scheduled.set_function(lambda: float(len(scheduler)))
                lag = self.metrics.scheduler_lag
                lag.labels("late").set_function(lambda: scheduler.stats.lag_s)
                lag.labels("running").set_function(lambda: float(scheduler.stats.skipped_running))
                self._scheduler = scheduler.start()
            return self._scheduler

    def status_heartbeat_s(self) -> float:
        """How often each policy writes routine status: STATUS_HEARTBEAT_S, or the write rate's."""
        count = 0 if self._scheduler is None else len(self._scheduler)
        return max(STATUS_HEARTBEAT_S, count / self.settings.status_writes_per_second)

    def stop(self) -> None:
        """Stop the scheduler (the operator is exiting)."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.stop()

    def api(self) -> client.ApiClient:
        """The process's Kubernetes client (compass.controllers.kubeapi loads it on first use)."""
        with self._lock:
            if self._api is None:
                # The policy workers, and kopf's own threads beside them.
                self._api = kubeapi.load_client(self.settings.policy_workers + 8)
            return self._api


def runtime_of(memo: MutableMapping[str, Any]) -> Runtime:
    """The process's Runtime from a kopf memo (made on first use if no one put one there)."""
    runtime = memo.get(RUNTIME_KEY)
    if not isinstance(runtime, Runtime):
        runtime = Runtime()
        memo[RUNTIME_KEY] = runtime
    return runtime
