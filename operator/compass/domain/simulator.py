"""The serving simulator: a policy or the routers' binding rule run over a scenario on
simulated pods, and the comparisons (paired: the same arrivals and luck)."""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from compass.domain.admission import (
    Admission,
    AdmissionPoint,
    AdmissionVerdict,
    ServiceGrid,
    judge,
    judge_at_dispatch,
    service_quantiles_ms,
)
from compass.domain.arrays import BoolArray, FloatArray, IntArray
from compass.domain.arrivals import Scenario, SimulationError
from compass.domain.boundpod import BindingRule, BoundPod, bound_pods
from compass.domain.elastico import DEFAULT_INTERVAL_S
from compass.domain.mix import Dealing, Mix, SmoothWeighting, drawn_member, mix_weighting
from compass.domain.podmodel import DROPPED, AdmitFn, DispatchFn, PodModel, SimulatedPod, StagedPod
from compass.domain.policy import Action, Decision, Observation, Policy, PolicyState
from compass.domain.profiles import LatencyProfile

# The window a tick's observed rate (Tick.observed_qps) is counted over, s.
RATE_WINDOW_S = 5.0
# A run that has not drained this long after the last arrival is reported as it stands.
MAX_DRAIN_S = 3600.0


class QueueAggregate(StrEnum):
    """How the pods' queues make the one queue depth the policy sees."""

    MEAN = "mean"
    MAX = "max"


def aggregate_queue(depths: Sequence[float], aggregate: QueueAggregate) -> float:
    """The pods' queue depths as one per-pod depth: their mean or their maximum."""
    if not depths:
        return 0.0
    if aggregate is QueueAggregate.MAX:
        return float(max(depths))
    return float(sum(depths)) / len(depths)


@dataclass(frozen=True)
class MetricsView:
    """How old the queue depth and arrivals counter the policy reads are: Prometheus' newest
    scrape, each ``lag_s`` behind (a delay no timestamp shows). Both 0: a direct read."""

    scrape_interval_s: float = 0.0
    lag_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("scrape_interval", self.scrape_interval_s), ("lag", self.lag_s)):
            if not value >= 0 or not math.isfinite(value):
                raise SimulationError(name, f"{value:g} s is not >= 0", "give e.g. 10 (or 0)")

    @property
    def fresh(self) -> bool:
        """Whether the policy reads the pods as they are at the tick."""
        return self.scrape_interval_s == 0 and self.lag_s == 0

    def scrape_of(self, tick: int, interval_s: float) -> int:
        """The newest scrape by the tick's time (its number; the tick's own without scrapes)."""
        if self.scrape_interval_s == 0:
            return tick
        # The tolerance keeps a scrape that falls on the tick (0.3 / 0.1) from rounding away.
        return math.floor(tick * interval_s / self.scrape_interval_s + 1e-9)

    def taken_at(self, scrape: int, interval_s: float) -> float:
        """When that scrape was taken (without scrapes: the tick's time)."""
        return scrape * (self.scrape_interval_s or interval_s)

    def holds(self, scrape: int, interval_s: float) -> float:
        """The instant whose pods that scrape shows: ``lag_s`` before it, never before 0."""
        return max(self.taken_at(scrape, interval_s) - self.lag_s, 0.0)


FRESH = MetricsView()


@dataclass(frozen=True)
class StaticController:
    """A baseline policy that always serves one configuration."""

    name: str
    index: int

    def initial_state(self, now: float) -> PolicyState:
        """Always on its configuration."""
        return PolicyState(active=self.name, active_since=now, last_reason="static")

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """Never switch."""
        return Decision(self.name, self.index, Action.HOLD, "static"), state


@dataclass(frozen=True)
class Tick:
    """What the policy saw and chose at one decision time."""

    time_s: float
    offered_qps: float
    observed_qps: float
    queue_depth: int
    active: int
    switched: bool
    mix: Mix | None = None


@dataclass(frozen=True)
class RunReport:
    """One policy's run over one scenario."""

    label: str
    slo_ms: float
    names: tuple[str, ...]
    accuracies: tuple[float, ...]
    arrivals_s: FloatArray
    starts_s: FloatArray
    finishes_s: FloatArray
    # The front member that served each request; DROPPED where it was dropped at arrival.
    configs: IntArray
    ticks: tuple[Tick, ...]
    switches: int
    time_in_config_s: tuple[float, ...]
    reasons: tuple[tuple[float, str], ...] = field(default=())

    @property
    def requests(self) -> int:
        """Number of requests that arrived (served or dropped)."""
        return len(self.arrivals_s)

    @property
    def dropped(self) -> BoolArray:
        """Which requests were dropped at arrival."""
        dropped: BoolArray = self.configs == DROPPED
        return dropped

    @property
    def dropped_pct(self) -> float:
        """Percentage of requests dropped at arrival (0 when there were none)."""
        return float(np.mean(self.dropped) * 100) if self.requests else 0.0

    @property
    def latencies_ms(self) -> FloatArray:
        """Each request's latency (wait + service), ms."""
        latency: FloatArray = (self.finishes_s - self.arrivals_s) * 1000
        return latency

    @property
    def compliance(self) -> float:
        """Percentage of requests served within the SLO (dropped ones miss; 100 with none)."""
        if not self.requests:
            return 100.0
        return float(np.mean((self.latencies_ms <= self.slo_ms) & ~self.dropped) * 100)

    @property
    def mean_accuracy(self) -> float:
        """Mean accuracy per served request: the accuracy of the configuration that served it."""
        served = self.configs[~self.dropped]
        if not len(served):
            return math.nan
        return float(np.asarray(self.accuracies)[served].mean())

    def latency_percentile(self, percentile: float) -> float:
        """A latency percentile over all requests, ms."""
        if not self.requests:
            return math.nan
        return float(np.percentile(self.latencies_ms, percentile))

    def summary(self) -> dict[str, float | int | str | dict[str, float]]:
        """The headline figures as plain data."""
        return {
            "policy": self.label,
            "requests": self.requests,
            "slo_compliance_pct": self.compliance,
            "dropped_pct": self.dropped_pct,
            "mean_accuracy": self.mean_accuracy,
            "p50_ms": self.latency_percentile(50),
            "p95_ms": self.latency_percentile(95),
            "p99_ms": self.latency_percentile(99),
            "switches": self.switches,
            "time_in_config_s": dict(zip(self.names, self.time_in_config_s, strict=True)),
        }


def simulate(
    serving: Policy | BindingRule,
    front: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    label: str = "policy",
    interval_s: float = DEFAULT_INTERVAL_S,
    *,
    pods: int = 1,
    switch_delay_s: float = 0.0,
    queue_aggregate: QueueAggregate = QueueAggregate.MEAN,
    pod_model: PodModel = PodModel(),
    admission: Admission | None = None,
    metrics_view: MetricsView = FRESH,
    dealing: Dealing = Dealing.ROUND_ROBIN,
) -> RunReport:
    """Serve the scenario, ``serving`` choosing each request's configuration: a policy's mix
    every tick, or the routers' binding rule per request."""
    if not switch_delay_s >= 0 or not math.isfinite(switch_delay_s):
        raise SimulationError("switch_delay", f"{switch_delay_s:g} s is not >= 0", "give e.g. 0.01")
    if isinstance(serving, BindingRule) and admission is not None:
        raise SimulationError(
            "admission",
            "a binding rule refuses by itself, at take-up",
            "give the rule refuse=True, or no binding rule",
        )
    if isinstance(serving, BindingRule) and dealing is not Dealing.ROUND_ROBIN:
        raise SimulationError(
            "dealing",
            f"{dealing.value} deals a policy's mix, and a binding rule binds each request itself",
            "give a policy, or the default dealing",
        )
    run = _Run(
        serving,
        front,
        scenario,
        interval_s=interval_s,
        pods=pods,
        switch_delay_s=switch_delay_s,
        queue_aggregate=queue_aggregate,
        pod_model=pod_model,
        admission=admission,
        view=metrics_view,
        slo_ms=slo_ms,
        dealing=dealing,
    )
    run.serve()
    return run.report(label)


@dataclass(eq=False)
class _Run:
    """One policy's run over one scenario, tick by tick (``simulate``)."""

    serving: Policy | BindingRule
    front: Sequence[LatencyProfile]
    scenario: Scenario
    interval_s: float
    pods: int
    switch_delay_s: float
    queue_aggregate: QueueAggregate
    pod_model: PodModel
    admission: Admission | None
    view: MetricsView
    slo_ms: float
    dealing: Dealing

    def __post_init__(self) -> None:
        serving, front, pod_model = self.serving, self.front, self.pod_model
        scenario, pods, admission, slo_ms = self.scenario, self.pods, self.admission, self.slo_ms
        # The policy asked every tick (None: the routers' binding rule serves every request).
        self.controller = None if isinstance(serving, BindingRule) else serving
        # What each scrape still to be read saw, by number: (pods' queue depths, arrivals).
        self.scrapes: dict[int, tuple[list[int], int]] = {}
        self.next_scrape = 0
        self.names = tuple(p.name for p in front)
        index_of = {name: i for i, name in enumerate(self.names)}
        # Seconds of service for every (configuration, request): the common random numbers.
        service_s = np.stack([p.distribution.quantile(scenario.luck) / 1000 for p in front])
        self.arrivals = scenario.arrivals_s
        n = len(self.arrivals)
        assigned = scenario.pods_of(pods)
        # Each pod's requests in arrival order.
        self.queues = [np.flatnonzero(assigned == pod) for pod in range(pods)]
        self.starts = np.empty(n)
        self.finishes = np.empty(n)
        self.configs = np.empty(n, dtype=np.int64)
        self.state = (
            PolicyState() if self.controller is None else self.controller.initial_state(0.0)
        )
        # The mix the initial state routes (the first member if it names none).
        base = 0 if self.state.active is None else index_of[self.state.active]
        blend = None if self.state.blend is None else index_of[self.state.blend]
        self.active = Mix(base, blend, self.state.weight)
        # Switches decided but not yet in force: (in force for services starting after, mix).
        self.pending: list[tuple[float, Mix]] = []
        # Each pod deals its requests to the mix in force by its own round-robin, as a router does.
        self.dealt: list[tuple[Mix, SmoothWeighting[int]] | None] = [None] * pods
        # Or each request's own draw, as the gateway deals them (None: round-robin).
        self.draws = scenario.member_draws() if self.dealing is Dealing.DRAW else None
        # Every mix decided and when it takes effect: what an early arrival was drawn under.
        self.effective: list[float] = [-math.inf]
        self.decided_mixes: list[Mix] = [self.active]
        self.seen: list[tuple[float, float, int, Mix, bool]] = []
        self.reasons: list[tuple[float, str]] = []
        self.time_in = [0.0] * len(front)
        self.switches = 0
        last_arrival = float(self.arrivals[-1]) if n else 0.0
        self.horizon = max(scenario.pattern.duration_s, last_arrival) + MAX_DRAIN_S
        admit: AdmitFn | None = None
        dispatch: DispatchFn | None = None
        # Admission's service quantiles (at dispatch) and grids (at arrival), made once.
        self.own_ms: list[float] = []
        self.grids: dict[Mix, ServiceGrid] = {}
        if admission is not None and admission.at is AdmissionPoint.DISPATCH:
            self.own_ms = service_quantiles_ms(front, admission.quantile)
            dispatch = functools.partial(self.dispatch, admission)
        elif admission is not None:
            admit = functools.partial(self.admit, admission)
        # The stretch binding judges its slots on (slot_stretch).
        stretch = (
            np.array([p.slot_stretch(pod_model.servers) for p in front])
            if pod_model.contended and pod_model.servers > 1
            else None
        )
        record = (self.starts, self.finishes, self.configs)
        self.servers: Sequence[SimulatedPod | BoundPod]
        if isinstance(serving, BindingRule):
            # The rule hook: the routers bind each request as an instance takes it up.
            self.servers = bound_pods(
                serving, front, pod_model, slo_ms, self.queues, self.arrivals, service_s, record
            )
        else:
            self.servers = [
                (StagedPod if pod_model.stages else SimulatedPod)(
                    pod_model,
                    queue,
                    self.arrivals,
                    service_s,
                    functools.partial(self.config_at, pod),
                    record,
                    admit,
                    dispatch,
                    stretch,
                )
                for pod, queue in enumerate(self.queues)
            ]

    def mix_at(self, when: float) -> Mix:
        """The mix in force for a service starting at ``when``."""
        chosen = self.active
        for effective, mix in self.pending:
            if when > effective:
                chosen = mix
        return chosen

    def config_at(self, pod: int, begin: float, request: int) -> int:
        """The member serving the pod's next request: by its round-robin, or the gateway's draw."""
        if self.draws is not None:
            # The last mix in effect strictly before the arrival, as mix_at counts a switch.
            at = bisect.bisect_left(self.effective, float(self.arrivals[request])) - 1
            return drawn_member(self.decided_mixes[at], float(self.draws[request]))
        chosen = self.mix_at(begin)
        if chosen.blend is None:
            return chosen.base
        current = self.dealt[pod]
        if current is None or current[0] != chosen:
            current = (chosen, mix_weighting(chosen))
            self.dealt[pod] = current
        return current[1].pick()

    def dispatch(self, rule: Admission, waited_s: float, config: int) -> int:
        """Admission at dispatch: the member serving a request routed to ``config``, or DROPPED."""
        left_ms = rule.slo_ms - waited_s * 1000
        verdict = judge_at_dispatch(rule, left_ms, self.own_ms[config], self.own_ms[0])
        return {AdmissionVerdict.SERVE: config, AdmissionVerdict.FASTEST: 0}.get(verdict, DROPPED)

    def grid_of(self, mix: Mix) -> ServiceGrid:
        """The mix's service grid (made on first use)."""
        grid = self.grids.get(mix)
        if grid is None:
            members = [(self.front[member], share) for member, share in mix.shares]
            grid = self.grids[mix] = ServiceGrid(members, self.pod_model.servers)
        return grid

    def admit(
        self, rule: Admission, arrival: float, queued: int, busy_s: list[float]
    ) -> AdmissionVerdict:
        """Admission at arrival by ``rule``: the verdict on a request arriving at a pod."""
        busy_ms = [b * 1000 for b in busy_s]
        grid, fastest = self.grid_of(self.mix_at(arrival)), self.grid_of(Mix(0))
        return judge(rule, grid, fastest, queued, busy_ms, self.pod_model.servers)

    def serve(self) -> None:
        """Tick until every request has started and the pattern is over, then drain the pods."""
        tick = 0
        now = 0.0
        while True:
            if not self.view.fresh:
                self.scrape(tick, now)
            # Start every request whose service begins by `now`, on the mix in force then.
            for server in self.servers:
                server.advance(now)
            while self.pending and self.pending[0][0] <= now:
                self.active = self.pending.pop(0)[1]
            done = all(server.done for server in self.servers)
            if (done and now >= self.scenario.pattern.duration_s) or now > self.horizon:
                break
            self.decide(now, tick)
            tick += 1
            now = tick * self.interval_s
        final = (self.pending[-1][1] if self.pending else self.active).base
        for server, queue in zip(self.servers, self.queues, strict=True):
            server.drain()
            if isinstance(server, SimulatedPod) and not server.done:
                # Past the drain horizon: the rest never start; count them at the horizon.
                rest = [*server.admitted[server.started :], *queue[server.decided :]]
                self.starts[rest] = self.horizon
                self.finishes[rest] = self.horizon
                self.configs[rest] = final

    def scrape(self, tick: int, now: float) -> None:
        """Take every scrape a tick from ``now`` on may read (advancing the pods is harmless)."""
        interval_s, view = self.interval_s, self.view
        last = view.scrape_of(tick, interval_s)
        # Older scrapes no tick will read again.
        for old in [k for k in self.scrapes if k < last]:
            del self.scrapes[old]
        while True:
            at = view.holds(self.next_scrape, interval_s)
            if at > now and self.next_scrape > last:
                break
            # A scrape this tick reads is never past it (a float's rounding aside).
            at = min(at, now)
            for server in self.servers:
                server.advance(at)
            arrived = int(np.searchsorted(self.arrivals, at, side="right"))
            if self.next_scrape >= last:
                self.scrapes[self.next_scrape] = ([s.waiting for s in self.servers], arrived)
            self.next_scrape += 1

    def decide(self, now: float, tick: int) -> None:
        """Ask the policy at ``now``, as the operator would, and record what it saw."""
        if self.controller is None:
            return
        arrivals, rate_window_s, names = self.arrivals, RATE_WINDOW_S, self.names
        # The instant the policy's reading shows (``now`` when fresh), and when it was taken.
        seen, taken = now, now
        if self.view.fresh:
            arrived = int(np.searchsorted(arrivals, now, side="right"))
            waiting = [server.waiting for server in self.servers]
        else:
            scrape = self.view.scrape_of(tick, self.interval_s)
            waiting, arrived = self.scrapes[scrape]
            seen = self.view.holds(scrape, self.interval_s)
            taken = self.view.taken_at(scrape, self.interval_s)
        depth = aggregate_queue(waiting, self.queue_aggregate)
        recent = arrived - int(np.searchsorted(arrivals, seen - rate_window_s, side="right"))
        observed = recent / min(rate_window_s, seen) if seen > 0 else 0.0
        observation = Observation(
            time=taken, queue_depth=depth, arrivals_total=float(arrived) / self.pods, pods=self.pods
        )
        decision, self.state = self.controller.decide(observation, self.state, now)
        target = decision.mix
        in_force = self.pending[-1][1] if self.pending else self.active
        if decision.switched:
            self.switches += 1
            self.reasons.append(
                (now, f"{_label(in_force, names)} -> {_label(target, names)}: {decision.reason}")
            )
        if target != in_force:
            self.pending.append((now + self.switch_delay_s, target))
            self.effective.append(now + self.switch_delay_s)
            self.decided_mixes.append(target)
        self.seen.append((now, observed, round(depth), target, decision.switched))
        for member, share in target.shares:
            self.time_in[member] += share * self.interval_s

    def report(self, label: str) -> RunReport:
        """The run as served."""
        offered = self.scenario.pattern.rate(np.array([t for t, *_ in self.seen]))
        ticks = tuple(
            Tick(t, float(rate), observed, depth, mix.base, switched, mix)
            for (t, observed, depth, mix, switched), rate in zip(self.seen, offered, strict=True)
        )
        return RunReport(
            label=label,
            slo_ms=self.slo_ms,
            names=self.names,
            accuracies=tuple(p.accuracy for p in self.front),
            arrivals_s=self.arrivals,
            starts_s=self.starts,
            finishes_s=self.finishes,
            configs=self.configs,
            ticks=ticks,
            switches=self.switches,
            time_in_config_s=tuple(self.time_in),
            reasons=tuple(self.reasons),
        )


def _label(mix: Mix, names: Sequence[str]) -> str:
    """A mix as people read it: a member, or a member with a share of the next."""
    if mix.blend is None:
        return names[mix.base]
    return f"{names[mix.base]} + {mix.weight:.0%} {names[mix.blend]}"


def compare(
    policies: Mapping[str, Policy],
    front: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    interval_s: float = DEFAULT_INTERVAL_S,
    *,
    pods: int = 1,
    switch_delay_s: float = 0.0,
    pod_model: PodModel = PodModel(),
    admission: Admission | None = None,
    metrics_view: MetricsView = FRESH,
) -> dict[str, RunReport]:
    """The static baselines and the given policies on the same scenario (paired)."""
    baselines = {"fastest": 0, "middle": len(front) // 2, "accurate": len(front) - 1}
    controllers: dict[str, Policy] = {
        label: StaticController(front[i].name, i) for label, i in baselines.items()
    }
    controllers.update(policies)
    return {
        label: simulate(
            controller,
            front,
            scenario,
            slo_ms,
            label,
            interval_s,
            pods=pods,
            switch_delay_s=switch_delay_s,
            pod_model=pod_model,
            admission=admission if label in policies else None,
            metrics_view=metrics_view if label in policies else FRESH,
        )
        for label, controller in controllers.items()
    }
