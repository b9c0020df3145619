"""Pods whose routers bind each request (late binding): the simulator's per-request rule.

A request's time at a stage is its configuration's share of that stage of its time for its
luck, so a request that keeps one configuration takes exactly what the static run gives it."""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from itertools import islice

import numpy as np

from compass.domain.arrays import FloatArray, IntArray
from compass.domain.arrivals import SimulationError
from compass.domain.binding import (
    RAG_SIM_SHARES,
    RAG_SIM_STAGE_PARAMS,
    Binding,
    BindingVerdict,
    StagePlan,
    bind_stage,
    joint_options,
    remaining_ms,
    stage_plan,
)
from compass.domain.evaluation import ParamValue
from compass.domain.podmodel import DROPPED, PodModel, Stage
from compass.domain.profiles import LatencyProfile
from compass_rules.binding import RATE_WINDOW_S, allowed_at, concurrency_factor, waited_long
from compass_rules.followers import (
    follower_slacks_ms,
    joint_spare_ms,
    lag_cap_ms,
    lag_room_ms,
    polled_followers_left_ms,
    static_schedule,
)

# How often the router image polls Triton's pending count by default (its DEFAULT_POLL_MS).
ROUTER_POLL_S = 0.025


class RateView(StrEnum):
    """Which arrivals the slow loop's rate counts: what a router can know of its pod's load."""

    # Every arrival as it comes: a router that held its own queue (Triton's router does not).
    ARRIVALS = "arrivals"
    # The requests taken up over the window: once a queue grows, the rate the pod serves.
    DISPATCHES = "dispatches"
    # The arrival times of those taken up, to its own arrival (late by its wait): the live router.
    TAKEN_ARRIVALS = "taken-arrivals"
    # Behind a gate: the arrival times of those taken up, to now (less Triton's queue behind it).
    GATE_ARRIVALS = "gate-arrivals"


@dataclass(frozen=True)
class BindingRule:
    """How the routers bind each request."""

    # The parameters each stage binds, in order, and roughly each one's share of the time.
    stages: Sequence[Sequence[str]] = RAG_SIM_STAGE_PARAMS
    prior_shares: Sequence[float] | None = RAG_SIM_SHARES
    # Each stage's predicted time is the configuration's time at this quantile, split by stage.
    quantile: float = 0.5
    # Refuse a request late whatever serves it (admission's rule), judged at this quantile.
    refuse: bool = False
    admission_quantile: float = 0.5
    # Spare the requests waiting behind for an instance (compass_rules.followers): a router that
    # held its own queue would see them; the live router, behind Triton's scheduler, does not.
    spare_followers: bool = False
    # The followers as a poller of Triton's pending count sees them, every this many s: the
    # queue at the last poll less those taken up since, each deadline taken as the request's own
    # (None: every follower and its deadline as it is now).
    followers_poll_s: float | None = None
    # A gate: up to this many followers wait at it, seen with deadlines (None: no gate).
    visible_followers: int | None = None
    rate_view: RateView = RateView.TAKEN_ARRIVALS
    # A request that waited for an instance longer than this share of the SLO binds the fastest
    # (admission's degradeAfter; None: never): its wait says a queue stands behind it.
    degrade_after: float | None = None
    # Per configuration, the rate (per pod) above which the slow loop disallows it (empty: none).
    max_qps: tuple[float | None, ...] = ()
    # Extra time may leave a request at most this share of the SLO behind static fastest's
    # schedule (``lag_room_ms``; None: no cap), of the SLO less ``lag_reserve`` of the
    # fastest's likely services (a short SLO, whose clumps leave little slack, allows less).
    lag_share: float | None = None
    lag_reserve: int = 0
    # The router's own binding work per request, s (live ~1 ms: bench/serving_triton.py).
    decision_s: float = 0.0
    # Behind a gate: how long a request at a free pipeline waits before it binds (settle_ms), s.
    settle_s: float = 0.0

    def __post_init__(self) -> None:
        gated, polled = self.visible_followers is not None, self.followers_poll_s is not None
        checks = (
            ("degrade_after", self.degrade_after is None or 0 < self.degrade_after <= 1,
             "is not in (0, 1]", "give a share of the SLO, e.g. 0.25"),
            ("followers_poll_s", not polled or 0 < (self.followers_poll_s or 0) < math.inf,
             "is not a period > 0", "give the poll period in s, e.g. 0.05, or None"),
            ("visible_followers", not gated or (self.visible_followers or 0) >= 0,
             "is not >= 0", "give the router instances less the pipeline's slots, e.g. 7"),
            ("followers_poll_s", not (gated and polled),
             "is set behind a gate: a gated router polls nothing, it sees its waiters",
             "give followers_poll_s None with visible_followers, or no gate"),
            ("rate_view", gated or self.rate_view is not RateView.GATE_ARRIVALS,
             "counts the requests at a gate, and there is none",
             "give visible_followers, or another rate view"),
            ("settle_s", 0 <= self.settle_s < math.inf,
             "is not a time >= 0", "give the router's settle, e.g. 0.003 s, or 0"),
            ("decision_s", 0 <= self.decision_s < math.inf,
             "is not a time >= 0", "give the router's binding work a request, e.g. 0.001 s"),
            ("lag_reserve", self.lag_reserve >= 0, "is not >= 0", "give a count, e.g. 2"),
            ("lag_share", self.lag_share is None or 0 < self.lag_share <= 1,
             "is not in (0, 1]", "give a share, e.g. 0.25"),
        )  # fmt: skip
        for field, ok, problem, fix in checks:
            if not ok:
                raise SimulationError(field, f"{getattr(self, field)!r} {problem}", fix)


# The event that ends a settle (BindingRule.settle_s), in the stage's place.
_SETTLED = -1


@dataclass(eq=False)
class BoundPod:
    """One pod's requests through router instances and batching components, event by event."""

    plan: StagePlan
    shares: Sequence[tuple[float, ...]]
    components: Sequence[Stage]
    servers: int
    rule: BindingRule
    slo_s: float
    arrivals: FloatArray
    service_s: FloatArray
    record: tuple[FloatArray, FloatArray, IntArray]
    requests: IntArray

    def __post_init__(self) -> None:
        # The pod's requests not yet arrived, in arrival order.
        self.pending = deque(int(r) for r in self.requests)
        self.starts, self.finishes, self.configs = self.record
        self.idle = self.servers
        # Several slots share the pod: bound and served at the concurrency it starts at.
        self.contended = self.plan.slots > 1
        self.plans: dict[int, StagePlan] = {}
        self.follower_ms, self.follower_likely_ms = self.fastest_ms(self.plan)
        # Static fastest's schedule keeps every slot busy on the fastest.
        self.static_likely_ms = self.fastest_ms(self.plan_at(self.servers))[1]
        self.router: deque[int] = deque()
        stages = len(self.plan.stages)
        # Per component: requests waiting (request, predicted ms, actual s), and its batch's end.
        self.queued: list[deque[tuple[int, float, float]]] = [deque() for _ in range(stages)]
        self.busy_until = [-math.inf] * stages
        self.target: dict[int, int] = {}
        self.events: list[tuple[float, int, int, tuple[int, ...]]] = []
        self.order = 0
        # The times the rate counts (``rate_view``), ascending.
        self.arrived_at: list[float] = []
        # With ``RateView.GATE_ARRIVALS``: the requests that have held a router instance.
        self.entered: set[int] = set()
        # Static fastest's schedule: when each request would start there, and its queue free.
        self.static_start: dict[int, float] = {}
        self.static_free = -math.inf
        # Until when a request that found the pipeline free waits before it starts.
        self.settling_until = -math.inf

    @staticmethod
    def fastest_ms(plan: StagePlan) -> tuple[float, float]:
        """The plan's fastest configuration's time and likely time (admission's quantile)."""
        fastest = plan.configs[plan.fastest()]
        return fastest.total_ms, sum(fastest.stage_admit_ms or fastest.stage_ms)

    def plan_at(self, running: int) -> StagePlan:
        """The plan as a request starting with ``running`` pipelines in the pod judges it."""
        if not self.contended:
            return self.plan
        if running not in self.plans:
            self.plans[running] = self.plan.at_concurrency(running)
        return self.plans[running]

    def backlog_ms(self, now: float) -> list[float]:
        """The work queued at each component (its batch's rest, then the waiting batches), ms."""
        backlog = []
        for stage, (component, queue) in enumerate(zip(self.components, self.queued, strict=True)):
            work = max((self.busy_until[stage] - now) * 1000, 0.0)
            times = [predicted for _, predicted, _ in queue]
            for first in range(0, len(times), component.max_batch):
                chunk = times[first : first + component.max_batch]
                work += max(chunk) * (1 + component.batch_cost * (len(chunk) - 1))
            backlog.append(work)
        return backlog

    def rate_per_ms(self, end: float) -> float:
        """The pod's rate (per ms) over the ``RATE_WINDOW_S`` to ``end``, as the router counts."""
        if end <= 0:
            return 0.0
        span = min(RATE_WINDOW_S, end)
        seen = bisect.bisect_right(self.arrived_at, end) - bisect.bisect_right(
            self.arrived_at, end - span
        )
        return seen / (span * 1000)

    def allowed(self, request: int, now: float) -> list[int] | None:
        """The configurations whose rate limit the pod's rate is within (None: all)."""
        limits = self.rule.max_qps
        if not limits:
            return None
        taken = self.rule.rate_view is RateView.TAKEN_ARRIVALS
        end = float(self.arrivals[request]) if taken else now
        return allowed_at(limits, self.rate_per_ms(end) * 1000)

    def enter(self, request: int, stage: int, now: float) -> bool:
        """Bind every stage at the first (rag-sim's router reads the whole configuration first)
        and queue the request there; False where refused."""
        # The pipelines running once it starts, itself included (its slot not yet counted).
        running = self.servers - self.idle + 1
        if stage == 0:
            backlog = self.backlog_ms(now)
            for binding_stage in range(len(self.plan.stages)):
                binding = self.bind(request, binding_stage, stage, now, backlog, running)
                if binding.config is None or binding.verdict is BindingVerdict.REFUSED:
                    return False
                self.target[request] = binding.config
        config = self.target[request]
        if self.contended:
            # Its whole time at the concurrency it starts at; the slot is the only queue.
            stretch = np.array([(self.plan.stretch or (1.0,) * len(self.plan.configs))[config]])
            factor = float(concurrency_factor(stretch, running, self.plan.slots)[0])
            took = float(self.service_s[config, request]) * factor + self.rule.decision_s
            self.order += 1
            last = len(self.plan.stages) - 1
            heapq.heappush(self.events, (now + took, self.order, last, (request,)))
            return True
        took = self.shares[config][stage] * float(self.service_s[config, request])
        if stage == 0:
            took += self.rule.decision_s
        self.queued[stage].append((request, self.plan.configs[config].stage_ms[stage], took))
        self.serve(stage, now)
        return True

    def bind(
        self,
        request: int,
        stage: int,
        at: int,
        now: float,
        backlog: Sequence[float],
        running: int = 1,
    ) -> Binding:
        """The binding of the request's ``stage`` now, at stage ``at``, ``running`` in the pod."""
        plan = self.plan_at(running)
        follower_ms, follower_likely_ms = (
            (self.follower_ms, self.follower_likely_ms)
            if plan is self.plan
            else self.fastest_ms(plan)
        )
        target = self.target.get(request)
        bound: Mapping[str, ParamValue] = {}
        if target is not None:
            chosen = plan.configs[target].config
            bound = {n: chosen[n] for names in plan.stages[:stage] for n in names}
        left_ms = (self.arrivals[request] + self.slo_s - now) * 1000
        consistent = [plan.configs[i] for i in plan.consistent(bound)]
        # Its quickest likely completion from here: what the lag cap and its followers judge.
        quickest_likely = min(remaining_ms(c, at, backlog, admitting=True) for c in consistent)
        allowed = self.allowed(request, now)
        lag_ms = math.inf
        if self.rule.lag_share is not None:
            static_finish_ms = self.static_start[request] * 1000 + follower_likely_ms
            cap_ms = lag_cap_ms(
                self.rule.lag_share, self.slo_s * 1000, self.rule.lag_reserve, follower_likely_ms
            )
            lag_ms = lag_room_ms(cap_ms, now * 1000 + quickest_likely - static_finish_ms)
        spare = math.inf
        if self.rule.spare_followers:
            own = min(remaining_ms(c, at, backlog) for c in consistent)
            followers = self.followers_left_ms(left_ms, now)
            slacks = follower_slacks_ms(
                own,
                followers,
                follower_ms,
                self.servers,
                likely=(quickest_likely, follower_likely_ms),
            )
            spare = min((s for s in slacks if s is not None), default=math.inf)
            # The best plan for it and its followers together (Aragog's choice over the queue).
            if math.isfinite(spare):
                mine, theirs = joint_options(plan, bound, at, left_ms, backlog, allowed)
                spare = min(spare, joint_spare_ms(mine, theirs, slacks, self.servers, lag_ms))
        degrade_after = self.rule.degrade_after
        if degrade_after is not None and waited_long(
            (self.starts[request] - self.arrivals[request]) * 1000, self.slo_s * 1000, degrade_after
        ):
            spare = 0.0
        spare = min(spare, lag_ms)
        return bind_stage(
            plan,
            stage,
            bound,
            left_ms,
            backlog,
            spare_ms=spare,
            refuse=self.rule.refuse and stage == 0,
            allowed=allowed,
            at=at,
        )

    def followers_left_ms(self, left_ms: float, now: float) -> list[float]:
        """The deadlines left of the followers the router knows: at its gate, polled, or all."""
        poll_s = self.rule.followers_poll_s
        visible = self.rule.visible_followers
        if poll_s is None:
            waiting = self.router if visible is None else islice(self.router, visible)
            return [(self.arrivals[r] + self.slo_s - now) * 1000 for r in waiting]
        polled_at = math.floor(now / poll_s) * poll_s
        seen = sum(1 for r in self.router if self.arrivals[r] <= polled_at)
        return polled_followers_left_ms(seen, left_ms)

    def take_up(self, started: int | None = None) -> None:
        """Count the arrival of each request first held at the gate (``GATE_ARRIVALS``)."""
        held = islice(self.router, self.rule.visible_followers or 0)
        for request in held if started is None else (started, *held):
            if request not in self.entered:
                self.entered.add(request)
                bisect.insort(self.arrived_at, float(self.arrivals[request]))

    def serve(self, stage: int, now: float) -> None:
        """Start the component's next batch if it is idle and requests wait for it."""
        queue = self.queued[stage]
        if self.busy_until[stage] > now or not queue:
            return
        component = self.components[stage]
        batch = [queue.popleft() for _ in range(min(len(queue), component.max_batch))]
        took = max(t for _, _, t in batch) * (1 + component.batch_cost * (len(batch) - 1))
        self.busy_until[stage] = now + took
        self.order += 1
        heapq.heappush(self.events, (now + took, self.order, stage, tuple(r for r, _, _ in batch)))

    def start_waiting(self, now: float) -> None:
        """Give idle router instances to the requests waiting for one, oldest first."""
        while self.idle and self.router:
            request = self.router.popleft()
            self.starts[request] = now
            view = self.rule.rate_view
            if view is RateView.GATE_ARRIVALS:
                self.take_up(request)  # the gate takes up the next in Triton's queue
            elif view is not RateView.ARRIVALS:
                taken = now if view is RateView.DISPATCHES else float(self.arrivals[request])
                bisect.insort(self.arrived_at, taken)
            if not self.enter(request, 0, now):
                self.finishes[request] = now
                self.configs[request] = DROPPED
                continue
            self.idle -= 1
        if self.rule.rate_view is RateView.GATE_ARRIVALS:
            self.take_up()

    @property
    def waiting(self) -> int:
        """Requests arrived and not taken up: the queue in front of the router instances."""
        return len(self.router)

    @property
    def done(self) -> bool:
        """Every request arrived and taken up."""
        return not self.pending and not self.router

    def advance(self, until: float) -> None:
        """Run every arrival and batch completion up to ``until``."""
        pending = self.pending
        last = len(self.plan.stages) - 1
        while True:
            arrival = float(self.arrivals[pending[0]]) if pending else math.inf
            event = self.events[0][0] if self.events else math.inf
            if min(arrival, event) > until or not (pending or self.events):
                return
            if event <= arrival:
                now, _, stage, batch = heapq.heappop(self.events)
                if stage == _SETTLED:
                    self.start_waiting(now)
                    continue
                for request in batch:
                    if stage == last:
                        self.finishes[request] = now
                        self.configs[request] = self.target[request]
                        self.idle += 1
                    else:
                        self.enter(request, stage + 1, now)
                self.serve(stage, now)
            else:
                now = arrival
                # The pipeline free and nobody waiting: the first of a burst, which settles.
                leads = self.rule.settle_s > 0 and self.idle > 0 and not self.router
                # Requests that arrive together are queued together before any starts.
                while pending and self.arrivals[pending[0]] <= now:
                    request = pending.popleft()
                    self.static_start[request], self.static_free = static_schedule(
                        now, self.static_free, self.static_likely_ms / 1000 / self.servers
                    )
                    self.router.append(request)
                    if self.rule.rate_view is RateView.ARRIVALS:
                        self.arrived_at.append(now)
                if leads:
                    self.settling_until = now + self.rule.settle_s
                    self.order += 1
                    heapq.heappush(self.events, (self.settling_until, self.order, _SETTLED, ()))
            if now >= self.settling_until:
                self.start_waiting(now)

    def drain(self) -> None:
        """Serve every request to its end."""
        self.advance(math.inf)


def bound_pods(
    rule: BindingRule,
    profiles: Sequence[LatencyProfile],
    pod_model: PodModel,
    slo_ms: float,
    queues: Sequence[IntArray],
    arrivals: FloatArray,
    service_s: FloatArray,
    record: tuple[FloatArray, FloatArray, IntArray],
) -> list[BoundPod]:
    """One pod per queue, binding among ``profiles`` on ``pod_model``'s instances and components."""
    if not slo_ms > 0 or not math.isfinite(slo_ms):
        raise SimulationError("slo", f"{slo_ms!r} ms is not > 0", "give the SLO in ms")
    if pod_model.late_after_s is not None:
        raise SimulationError(
            "pod_model",
            "late binding serves FIFO components, not late-last pods",
            "give servers and stages, or contended, only",
        )
    components: Sequence[Stage] = pod_model.stages or tuple(Stage(1.0) for _ in rule.stages)
    if len(components) != len(rule.stages):
        raise SimulationError(
            "pod_model.stages",
            f"{len(components)} components for {len(rule.stages)} binding stages",
            "give one component per stage",
        )
    plan = stage_plan(
        profiles, rule.stages, rule.quantile, rule.prior_shares, rule.admission_quantile
    )
    if pod_model.contended and pod_model.servers > 1:
        # Its slots share the pod: each configuration's stretch with all of them running.
        servers = pod_model.servers
        plan = replace(
            plan, slots=servers, stretch=tuple(p.slot_stretch(servers) for p in profiles)
        )
    # Each configuration's share of its time at each stage (the plan's split).
    shares = [tuple(t / c.total_ms for t in c.stage_ms) for c in plan.configs]
    return [
        BoundPod(
            plan,
            shares,
            components,
            pod_model.servers,
            rule,
            slo_ms / 1000,
            arrivals,
            service_s,
            record,
            queue,
        )
        for queue in queues
    ]
