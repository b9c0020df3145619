"""Every Triton pod of a deployment, switched together and read together (docs/serving.md)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from compass.api.meta import DEFAULT_ROUTER_MODEL
from compass.dataplane.httpauth import HttpAuth
from compass.dataplane.metrics import (
    MetricsReading,
    MetricsUnavailableError,
    SharedReads,
    TritonQueueDepth,
    shared_read,
)
from compass.dataplane.triton import (
    GrpcTls,
    RouterState,
    RoutingError,
    SwitchReport,
    TritonRouter,
    routing_key,
)
from compass.domain.evaluation import Config
from compass.domain.served import ServedCounts, summed
from compass.domain.simulator import QueueAggregate, aggregate_queue
from compass_rules.protocol import GATE_WAITING_METRIC, PENDING_METRIC
from compass_rules.routing import tables_digest

# Parallel calls at once: a switch to a hundred pods takes a few rounds, not a hundred.
MAX_PARALLEL = 32
# One pool for every fleet, its threads reused every tick (no call in it submits to it again).
_POOL = ThreadPoolExecutor(max_workers=MAX_PARALLEL, thread_name_prefix="compass-fleet")


# A pod's arrivals counter below its last reading is a restart at this share of it or below, or
# this many readings in a row; else a scrape answered out of order, held.
RESET_SHARE = 0.5
RESET_READINGS = 2


@dataclass(frozen=True)
class Endpoint:
    """One Triton pod: its name and where its gRPC and metrics ports are."""

    name: str
    grpc_url: str
    metrics_url: str | None = None


@dataclass(frozen=True)
class PodSwitch:
    """What one pod serves after a switch, or why it could not be reached or refused."""

    pod: str
    config: str | None
    seconds: float
    changed: bool = False
    error: str | None = None


@dataclass(frozen=True)
class FleetSwitch(SwitchReport):
    """A switch of every pod: the slowest pod's time, and each pod's outcome."""

    pods: tuple[PodSwitch, ...] = ()

    @property
    def lagging(self) -> tuple[PodSwitch, ...]:
        """The pods that do not serve the configuration."""
        return tuple(p for p in self.pods if p.config != self.config)

    @property
    def serving(self) -> int:
        """How many pods serve the configuration."""
        return len(self.pods) - len(self.lagging)


def _parallel(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run the calls at once; their results in order."""
    if len(calls) <= 1:
        return [call() for call in calls]
    return list(_POOL.map(lambda call: call(), calls))


class RouterFleet:
    """The router model of every pod (an Actuator); endpoints may change between ticks."""

    # A router's routing has no other writer to conflict with.
    conflict: str | None = None

    def __init__(
        self,
        endpoints: Sequence[Endpoint] = (),
        model: str = DEFAULT_ROUTER_MODEL,
        timeout_s: float = 10.0,
        attempts: int = 1,
        backoff_s: float = 0.1,
        tls: GrpcTls | None = None,
    ) -> None:
        self.model = model
        self.timeout_s, self.attempts, self.backoff_s = timeout_s, attempts, backoff_s
        self.tls = tls
        self.routers: dict[Endpoint, TritonRouter] = {}
        # Pods silent at the last active_config: the switch skips them (one timeout a tick).
        self.silent: dict[str, str] = {}
        # Each pod's report at the last active_config: a switch skips a pod that serves what it
        # would set and holds its tables (a steady policy: one call a pod a tick).
        self.reported: dict[str, RouterState] = {}
        # Whether ``reported`` was read since the last switch: only then may a switch skip on it.
        self._fresh = False
        # Pods last set with no tables: only those may be skipped without reporting a digest.
        self.cleared: set[str] = set()
        # Reports shared within a tick with every fleet asking the same pod (SharedReads).
        self.shared: SharedReads | None = None
        # The admission and late-binding tables each switch sends every pod (None: off).
        self.admission: Mapping[str, Any] | None = None
        self.binding: Mapping[str, Any] | None = None
        # The tables last digested and their digest (a policy sets the same two every tick).
        self._digested: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None, str] | None = None
        self.update(endpoints)

    def tables_digest(self) -> str:
        """The digest of the tables every switch sends, as a router reports what it holds."""
        held = self._digested
        if held is None or held[0] is not self.admission or held[1] is not self.binding:
            digest = tables_digest(
                None if self.admission is None else dict(self.admission),
                None if self.binding is None else dict(self.binding),
            )
            held = self._digested = (self.admission, self.binding, digest)
        return held[2]

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """The pods now, in name order."""
        return tuple(sorted(self.routers, key=lambda e: e.name))

    def update(self, endpoints: Sequence[Endpoint]) -> None:
        """Follow the pods: open clients for new ones, close those of pods that left."""
        wanted = set(endpoints)
        for gone in set(self.routers) - wanted:
            self.routers.pop(gone).close()
            self.cleared.discard(gone.name)
        for endpoint in wanted - set(self.routers):
            self.routers[endpoint] = TritonRouter(
                endpoint.grpc_url,
                model=self.model,
                timeout_s=self.timeout_s,
                attempts=self.attempts,
                backoff_s=self.backoff_s,
                tls=self.tls,
            )

    def use_tls(self, tls: GrpcTls | None) -> None:
        """Reconnect every pod's client with this TLS (a Secret that changed)."""
        endpoints = self.endpoints
        self.close()
        self.tls = tls
        self.update(endpoints)

    def close(self) -> None:
        """Close every client."""
        self.update(())

    def _each(self, act: Callable[[Endpoint, TritonRouter], PodSwitch]) -> list[PodSwitch]:
        return _parallel([partial(act, e, self.routers[e]) for e in self.endpoints])

    def active_config(self, expected: str | None = None) -> str:
        """``expected`` if any pod serves it (a new pod's default must not outvote it), else
        what most pods serve; RoutingError if none answers."""
        if not self.routers:
            raise RoutingError(f"no ready Triton pod serves {self.model}")

        def ask(endpoint: Endpoint, router: TritonRouter) -> PodSwitch:
            key = ("router", endpoint.grpc_url, self.model, self.tls)
            try:
                state = shared_read(self.shared, key, router.serving, (RoutingError,))
                states[endpoint.name] = state
                return PodSwitch(endpoint.name, state.routing, 0.0)
            except RoutingError as error:
                return PodSwitch(endpoint.name, None, 0.0, error=str(error))

        states: dict[str, RouterState] = {}
        answers = self._each(ask)
        self.silent = {a.pod: a.error or "" for a in answers if a.config is None}
        self.reported, self._fresh = states, True
        served = Counter(a.config for a in answers if a.config is not None)
        if not served:
            raise RoutingError("; ".join(f"{a.pod}: {a.error}" for a in answers))
        if expected is not None and expected in served:
            return expected
        return served.most_common(1)[0][0]  # ties keep the first pod's: Counter is ordered

    def switch(
        self, config: Config, blend: Config | None = None, weight: float = 0.0
    ) -> FleetSwitch:
        """Make ``config`` (and its blend) active on every pod; RoutingError if none took it."""
        wanted = routing_key(config, blend, weight)
        if not self.routers:
            raise RoutingError(f"no ready Triton pod serves {self.model}: nothing to switch")

        reported = self.reported if self._fresh else {}
        cleared = set(self.cleared)
        digest = self.tables_digest()
        admission, binding = self.admission, self.binding
        sends_tables = admission is not None or binding is not None

        def settled(pod: str) -> bool:
            """The pod serves this and holds its tables (no digest: none was ever sent)."""
            state = reported.get(pod)
            if state is None or state.routing != wanted:
                return False
            if state.tables is not None:
                return state.tables == digest
            return not sends_tables and pod in cleared

        def set_one(endpoint: Endpoint, router: TritonRouter) -> PodSwitch:
            if endpoint.name in self.silent:
                return PodSwitch(endpoint.name, None, 0.0, error=self.silent[endpoint.name])
            if settled(endpoint.name):
                return PodSwitch(endpoint.name, wanted, 0.0)  # serves it: nothing to send
            router.admission, router.binding = admission, binding
            try:
                report = router.switch(config, blend, weight)
            except RoutingError as error:
                return PodSwitch(endpoint.name, None, 0.0, error=str(error))
            return PodSwitch(endpoint.name, report.config, report.seconds, report.changed)

        pods = tuple(self._each(set_one))
        self.silent, self._fresh = {}, False
        took = {p.pod for p in pods if p.error is None and p.config == wanted}
        if not sends_tables:
            self.cleared |= took
        else:
            self.cleared -= took
        report = FleetSwitch(
            config=wanted,
            attempts=1,
            seconds=max(p.seconds for p in pods),
            changed=any(p.changed for p in pods),
            pods=pods,
        )
        if not report.serving:
            raise RoutingError(
                f"switch to {wanted} failed on every pod: "
                + "; ".join(f"{p.pod}: {p.error}" for p in pods)
            )
        return report


@dataclass
class FleetQueueDepth:
    """Every pod's Triton /metrics, scraped at once, as one per-pod observation."""

    endpoints: Callable[[], Sequence[Endpoint]]
    model: str = DEFAULT_ROUTER_MODEL
    aggregate: QueueAggregate = QueueAggregate.MEAN
    timeout_s: float = 1.0
    # Credentials and headers for every pod's /metrics.
    auth: HttpAuth | None = None
    # Scrapes shared with the other sources of a round (one per pod a tick).
    shared: SharedReads | None = None
    # Whether a pod answered 401 or 403 at the last reading: the caller reads the Secret again.
    auth_rejected: bool = False
    # Each pod's scraper (it keeps that pod's counter steady), by pod name and URL.
    scrapers: dict[tuple[str, str], TritonQueueDepth] = field(default_factory=dict)
    # The arrivals counter per pod at the last reading, and the per-pod total so far.
    last: dict[str, float] = field(default_factory=dict)
    # How many readings in a row each pod's counter has read below its last (held) reading.
    low: dict[str, int] = field(default_factory=dict)
    per_pod_arrivals: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def describe(self) -> str:
        """Which pods, which series."""
        names = ", ".join(e.name for e in self.endpoints()) or "no pods"
        return (
            f"Triton metrics of {names}: {PENDING_METRIC} + {GATE_WAITING_METRIC}"
            f"{{model={self.model!r}}}, {self.aggregate.value} over pods"
        )

    def read(self) -> MetricsReading:
        """Scrape every pod; pods that cannot be read are left out (all of them: an error)."""
        pods = [(e.name, e.metrics_url) for e in self.endpoints() if e.metrics_url]
        if not pods:
            raise MetricsUnavailableError(f"no pod with a metrics URL for {self.model}")

        with self.lock:
            scrapers = {
                pod: self.scrapers.get(pod)
                or TritonQueueDepth(
                    pod[1],
                    self.model,
                    timeout_s=self.timeout_s,
                    auth=self.auth,
                    shared=self.shared,
                )
                for pod in pods
            }
            self.scrapers = scrapers

        def scrape(pod: tuple[str, str]) -> MetricsReading | str:
            source = scrapers[pod]
            try:
                return source.read()
            except MetricsUnavailableError as error:
                rejected.append(source.auth_rejected)
                return str(error)

        rejected: list[bool] = []
        results = _parallel([partial(scrape, pod) for pod in pods])
        self.auth_rejected = any(rejected)
        readings = {
            name: r for (name, _), r in zip(pods, results, strict=True) if not isinstance(r, str)
        }
        if not readings:
            raise MetricsUnavailableError("; ".join(str(r) for r in results))
        with self.lock:
            arrivals = self._advance(readings)
        depth = aggregate_queue([r.queue_depth for r in readings.values()], self.aggregate)
        return MetricsReading(depth, arrivals, pods=len(readings))

    def served(self, window_s: float) -> ServedCounts | None:
        """What every pod's router counted over about ``window_s``, together."""
        with self.lock:
            scrapers = list(self.scrapers.values())
        return summed([c for s in scrapers if (c := s.served(window_s)) is not None])

    def _advance(self, readings: Mapping[str, MetricsReading]) -> float | None:
        """Add each pod's arrivals since its last reading (a drop is a reset only when clear)."""
        if any(r.arrivals_total is None for r in readings.values()):
            return None
        increase = 0.0
        for name, reading in readings.items():
            assert reading.arrivals_total is not None
            now = reading.arrivals_total
            before = self.last.get(name)
            if before is None:
                self.last[name] = now
            elif now >= before:
                increase += now - before
                self.last[name] = now
                self.low.pop(name, None)
            elif now <= before * RESET_SHARE or self.low.get(name, 0) + 1 >= RESET_READINGS:
                increase += now  # restarted: everything it shows is new
                self.last[name] = now
                self.low.pop(name, None)
            else:
                self.low[name] = self.low.get(name, 0) + 1
        for name in set(self.last) - set(readings):
            del self.last[name]
            self.low.pop(name, None)
        self.per_pod_arrivals += increase / len(readings)
        return self.per_pod_arrivals
