"""A discrete-event serving simulator: FIFO servers (the paper's M/G/1, one per pod), a policy, a
load.

Requests arrive by a (non-homogeneous) Poisson process shaped by a load pattern, or replay a
trace. Each request draws one uniform number when it is generated; the configuration active
when it STARTS service turns that number into a service time through the configuration's
fitted distribution. Every policy run on the same scenario therefore sees the same arrivals and
the same luck (common random numbers): comparisons between policies are paired.

The policy is asked every ``interval_s`` with the queue depth (requests waiting, not the one in
service, as Triton's pending-request count) and the cumulative count of arrivals (a counter,
as Prometheus or Triton's /metrics give it), exactly as the operator will ask it. The timeline
also records the arrival rate over the last ``rate_window_s``, for people to look at.

With ``pods`` > 1 the arrivals are split among that many servers, each request to one of them
at random (a Service balancing each request; the scenario's seeded assignment, the same for
every policy), and one decision switches them all. The policy then sees the per-pod view the
planner's thresholds are made for: the pods' queues aggregated (``QueueAggregate``) and the
arrivals counter divided among the pods. A decision takes effect ``switch_delay_s`` after it is
taken: a request that starts service before then is served by the old configuration.

A pod need not serve one request at a time (``PodModel``): its router may run several instances
(``servers``), FIFO from one queue, and a request may pass through ``stages``, components of one
instance each that can batch the requests waiting for them. A request holds its router instance
until its last stage is done, as a BLS router does. Without stages each instance serves its
requests alone (independent servers: M/G/c). The queue depth is the router's: requests that
arrived and hold no instance yet, as Triton's pending count of the router model.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np
import numpy.typing as npt

from compass.domain.admission import (
    Admission,
    AdmissionPoint,
    ServiceGrid,
    judge,
    judge_at_dispatch,
    service_quantiles_ms,
)
from compass.domain.admission import AdmissionVerdict as Verdict
from compass.domain.capacity import CapacityCurve, CurvePoint, climb_ladder, measure_point
from compass.domain.elastico import Action, Decision, Observation, PolicyState, capacity_pressure
from compass.domain.mix import Mix, SmoothWeighting, mix_weighting
from compass.domain.planner import Plan
from compass.domain.profiles import LatencyProfile

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
# The configuration recorded for a request dropped at arrival: served by none.
DROPPED = -1

DEFAULT_INTERVAL_S = 1.0
DEFAULT_RATE_WINDOW_S = 5.0
SPIKE_FACTOR = 4.0
STEP_FACTOR = 2.0
RAMP_FACTOR = 2.0
BURST_FACTORS = (2.0, 5.0)
BURST_SECONDS = (5.0, 15.0)
BURST_GAP_SECONDS = (10.0, 30.0)
# A run that has not drained this long after the last arrival is reported as it stands.
MAX_DRAIN_S = 3600.0
# Every request is simulated in Python, once per policy compared: about 10 us each, so a
# million takes minutes; beyond it a typo (1e7 s at 1e4 QPS: TiBs of arrivals) would
# exhaust memory before the first line is printed.
MAX_REQUESTS = 1_000_000


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


class SimulationError(ValueError):
    """A load pattern or trace is invalid: one line, `<field>: <what is wrong>; <the fix>`."""

    def __init__(self, field: str, what: str, fix: str) -> None:
        super().__init__(f"{field}: {what}; {fix}")
        self.field, self.what, self.fix = field, what, fix


@dataclass(frozen=True)
class Stage:
    """A component of one instance that serves ``share`` of each request's service time.

    It batches: when free it takes up to ``max_batch`` waiting requests at once, and a batch of b
    takes its longest request's time x (1 + ``batch_cost`` (b - 1)); a cost below 1 is what makes
    batching pay (an accelerator's kernel serves b requests in little more than one's time).
    """

    share: float
    max_batch: int = 1
    batch_cost: float = 1.0

    def batch_time(self, services_s: Sequence[float]) -> float:
        """How long this stage takes for a batch of requests with these whole service times."""
        return self.share * max(services_s) * (1 + self.batch_cost * (len(services_s) - 1))


@dataclass(frozen=True)
class PodModel:
    """How one pod serves: router instances, and the components a request passes through."""

    servers: int = 1
    stages: tuple[Stage, ...] = ()
    # The instances contend for the same cores (a CPU-bound pipeline): a request that starts
    # while k of the servers are busy (itself included) takes its own time x (1 + (s - 1)
    # (k - 1) / (servers - 1)), s its member's busy holding time over its mean (the capacity
    # curve measured at this many instances; 1 without one). Fixed when it starts: a cheap
    # stand-in for processor sharing that is exact where it matters, at saturation.
    contended: bool = False
    # The router's queue order (None: FIFO). A request that has waited longer than this
    # (compass.domain.admission.late_after_ms) goes behind every request that has not: it
    # misses the SLO whatever serves it, and served first it would make the requests behind it
    # miss too. What the order is worth; the routers ship FIFO (Triton's own late-last policy
    # stalls its queue: bench/triton_queue.py).
    late_after_s: float | None = None

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise SimulationError("servers", f"{self.servers} is not >= 1", "give 1 or more")
        if self.late_after_s is not None and not self.late_after_s >= 0:
            raise SimulationError(
                "late_after", f"{self.late_after_s:g} s is not >= 0", "give e.g. 0.4, or none"
            )
        if self.contended and self.stages:
            raise SimulationError(
                "contended",
                "a pod with stages models its components itself",
                "give stages or contended, not both",
            )
        if self.stages and not math.isclose(sum(s.share for s in self.stages), 1.0):
            raise SimulationError(
                "stages",
                f"the shares add up to {sum(s.share for s in self.stages):g}",
                "make them add up to 1 (a request alone takes its profiled time)",
            )
        for stage in self.stages:
            if stage.max_batch < 1 or not stage.batch_cost >= 0 or not stage.share > 0:
                raise SimulationError(
                    "stages", f"{stage} is invalid", "give share > 0, max_batch >= 1, cost >= 0"
                )


# rag-sim's pipeline as its model repository deploys it: retriever and reranker of one instance
# each, and a generator that batches up to 8 requests, a batch of b taking 1 + 0.25 (b - 1)
# times its longest request (model-images/rag-sim/component.py serves the same model).
RAG_SIM_STAGES = (Stage(0.1), Stage(0.2), Stage(0.7, max_batch=8, batch_cost=0.25))
# The pipelines `compass simulate --stages` knows, by name.
POD_STAGES: dict[str, tuple[Stage, ...]] = {"independent": (), "rag-sim": RAG_SIM_STAGES}


class PatternKind(StrEnum):
    """The shape of the offered load over time."""

    CONSTANT = "constant"
    STEP = "step"
    RAMP = "ramp"
    SPIKE = "spike"
    BURSTY = "bursty"
    TRACE = "trace"


@dataclass(frozen=True)
class Burst:
    """A stretch of time during which the load is multiplied."""

    start_s: float
    end_s: float
    factor: float


@dataclass(frozen=True)
class LoadPattern:
    """Offered load (requests per second) as a function of time."""

    kind: PatternKind
    base_qps: float
    duration_s: float
    bursts: tuple[Burst, ...] = ()
    trace_s: tuple[float, ...] = ()

    def rate(self, t: FloatArray) -> FloatArray:
        """The offered rate at these times (for a trace, its arrivals per second, binned)."""
        t = np.asarray(t, dtype=np.float64)
        base = np.full_like(t, self.base_qps)
        d = self.duration_s
        if self.kind is PatternKind.STEP:
            shaped = np.where(t >= d / 2, STEP_FACTOR * base, base)
        elif self.kind is PatternKind.RAMP:
            shaped = base * (1 + (RAMP_FACTOR - 1) * np.clip(t / d, 0.0, 1.0))
        elif self.kind is PatternKind.SPIKE:
            shaped = np.where((t >= d / 3) & (t < 2 * d / 3), SPIKE_FACTOR * base, base)
        elif self.kind is PatternKind.BURSTY:
            shaped = base.copy()
            for burst in self.bursts:
                inside = (t >= burst.start_s) & (t < burst.end_s)
                shaped = np.where(inside, burst.factor * base, shaped)
        elif self.kind is PatternKind.TRACE:
            arrivals = np.asarray(self.trace_s)
            bins = np.floor(t).astype(np.int64)
            counts = np.bincount(np.floor(arrivals).astype(np.int64), minlength=int(d) + 2)
            shaped = counts[np.clip(bins, 0, len(counts) - 1)].astype(np.float64)
        else:
            shaped = base
        result: FloatArray = np.where((t >= 0) & (t < d), shaped, 0.0)
        return result

    @property
    def peak_qps(self) -> float:
        """The highest offered rate."""
        grid = np.linspace(0, self.duration_s, 2001)[:-1]
        return float(self.rate(grid).max(initial=0.0))


def make_pattern(
    kind: PatternKind | str,
    base_qps: float,
    duration_s: float,
    seed: int = 0,
    trace_s: Sequence[float] = (),
) -> LoadPattern:
    """A load pattern; bursty draws its bursts from ``seed`` (same seed, same bursts)."""
    kind = PatternKind(kind)
    if kind is PatternKind.TRACE:
        return trace_pattern(trace_s)
    if not base_qps > 0 or not math.isfinite(base_qps):
        raise SimulationError("base_qps", f"{base_qps:g} is not > 0", "give e.g. 1.5")
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise SimulationError("duration", f"{duration_s:g} s is not > 0", "give e.g. 180")
    peak = base_qps * max(SPIKE_FACTOR, STEP_FACTOR, RAMP_FACTOR, BURST_FACTORS[1])
    requests = peak * duration_s
    if requests > MAX_REQUESTS:
        count = f"{requests:,.0f}" if requests < 1e15 else f"{requests:.3g}"
        raise SimulationError(
            "duration",
            f"{duration_s:g} s at up to {peak:g} QPS is up to {count} requests, above the "
            f"{MAX_REQUESTS:,} compass generates",
            "shorten --duration or lower --base-qps",
        )
    bursts: list[Burst] = []
    if kind is PatternKind.BURSTY:
        rng = np.random.default_rng([seed, 1])
        t = float(rng.uniform(*BURST_GAP_SECONDS))
        while t < duration_s:
            length = float(rng.uniform(*BURST_SECONDS))
            bursts.append(Burst(t, min(t + length, duration_s), float(rng.uniform(*BURST_FACTORS))))
            t += length + float(rng.uniform(*BURST_GAP_SECONDS))
    return LoadPattern(kind, base_qps, duration_s, tuple(bursts))


def trace_pattern(timestamps: Sequence[float]) -> LoadPattern:
    """A pattern that replays these arrival timestamps (seconds; shifted to start at 0)."""
    if len(timestamps) == 0:
        raise SimulationError("trace", "no timestamps", "give one arrival time (s) a line")
    if len(timestamps) > MAX_REQUESTS:
        raise SimulationError(
            "trace",
            f"{len(timestamps):,} timestamps, above the {MAX_REQUESTS:,} compass replays",
            "replay a shorter stretch",
        )
    times = np.asarray(timestamps, dtype=np.float64)
    if not np.all(np.isfinite(times)):
        raise SimulationError("trace", "a timestamp is not a finite number", "fix the file")
    if np.any(np.diff(times) < 0):
        where = int(np.argmax(np.diff(times) < 0)) + 1
        raise SimulationError(
            "trace",
            f"timestamp {where + 1} ({times[where]:g}) is before the one above it",
            "sort the trace",
        )
    times = times - times[0]
    duration = max(float(times[-1]), 1e-9) + 1e-9
    mean_rate = len(times) / duration
    return LoadPattern(PatternKind.TRACE, mean_rate, duration, trace_s=tuple(times.tolist()))


@dataclass(frozen=True)
class Scenario:
    """One realisation of the load: arrival times and each request's service-time luck."""

    pattern: LoadPattern
    seed: int
    arrivals_s: FloatArray
    luck: FloatArray

    @property
    def requests(self) -> int:
        """Number of requests."""
        return len(self.arrivals_s)

    def pods_of(self, pods: int) -> IntArray:
        """The pod (0 .. pods-1) each request goes to: uniform, seeded, the same every time."""
        if pods < 1:
            raise SimulationError("pods", f"{pods} is not >= 1", "give 1 or more")
        # The third child of the scenario's seed: the arrivals and the luck keep theirs.
        rng = np.random.default_rng(np.random.SeedSequence(self.seed).spawn(3)[2])
        assigned: IntArray = rng.integers(0, pods, self.requests, dtype=np.int64)
        return assigned


def make_scenario(pattern: LoadPattern, seed: int) -> Scenario:
    """Seeded arrivals (Poisson, thinned to the pattern's rate) and service-time luck."""
    arrival_rng, luck_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)
    )
    if pattern.kind is PatternKind.TRACE:
        arrivals = np.asarray(pattern.trace_s, dtype=np.float64)
    else:
        peak = pattern.peak_qps
        candidates = np.sort(
            arrival_rng.uniform(
                0, pattern.duration_s, arrival_rng.poisson(peak * pattern.duration_s)
            )
        )
        keep = arrival_rng.uniform(0, peak, len(candidates)) < pattern.rate(candidates)
        arrivals = candidates[keep]
    return Scenario(pattern, seed, arrivals, luck_rng.uniform(0, 1, len(arrivals)))


# What becomes of a request arriving at a pod: (arrival time, requests queued ahead of it, how
# long each busy instance has served its request, s).
AdmitFn = Callable[[float, int, list[float]], Verdict]
# (seconds the request waited, the configuration routed) -> the one that serves it, or DROPPED.
DispatchFn = Callable[[float, int], int]


class _Pod:
    """One pod's requests, started FIFO (or late-last: ``PodModel.late_after_s``) on its router
    instances as time advances.

    Without stages each instance serves a request alone: the next request starts on the instance
    that frees first, so a heap of free times is the whole queue (with one instance, the
    paper's M/G/1). Stages make it a network of queues, run event by event (``_StagedPod``).
    Each arrival is first admitted or dropped (``admit``; every one is admitted without it),
    in time order with the starts, so the decision sees the pod as it is at that arrival.
    """

    def __init__(
        self,
        model: PodModel,
        requests: IntArray,
        arrivals: FloatArray,
        service_s: FloatArray,
        choose: Callable[[float], int],
        record: tuple[FloatArray, FloatArray, IntArray],
        admit: AdmitFn | None = None,
        dispatch: DispatchFn | None = None,
        stretch: FloatArray | None = None,
    ) -> None:
        self.model = model
        # Per member: how much longer a request takes with every instance busy (contended).
        self.stretch = stretch
        self.requests = requests
        self.arrivals = arrivals
        self.service_s = service_s
        self.choose = choose
        self.admit = admit
        self.dispatch = dispatch
        self.starts, self.finishes, self.configs = record
        # Requests whose admission is decided (of ``requests``), those admitted in order, and how
        # many of those have started.
        self.decided = 0
        self.admitted: list[int] = []
        self.started = 0
        # Admitted requests that admission sent to the fastest member (the front's first).
        self.on_fastest: set[int] = set()
        # (finish, start) of each instance's last request.
        self._free = [(0.0, 0.0)] * model.servers
        # Requests holding an instance of a staged pod, and when each started.
        self._holding: dict[int, float] = {}
        # A staged pod's network of queues (empty without stages).
        self._idle_servers = model.servers
        self._waiting: list[deque[int]] = [deque() for _ in model.stages]
        self._busy = [False] * len(model.stages)
        # (time, order, stage, batch): a stage finishing a batch.
        self._events: list[tuple[float, int, int, tuple[int, ...]]] = []
        self._order = 0

    @property
    def waiting(self) -> int:
        """Requests admitted and not started: the router's queue."""
        return len(self.admitted) - self.started

    def _next_waiting(self, now: float) -> int:
        """The admitted request an instance takes up at ``now``: the oldest, or under a
        late-last order the oldest that has not waited past ``late_after_s`` (the oldest late
        one when every one has)."""
        late_after = self.model.late_after_s
        if late_after is not None and self.waiting > 1:
            for index in range(self.started, len(self.admitted)):
                if now - self.arrivals[self.admitted[index]] <= late_after:
                    # Ahead of the late ones, which keep their order behind it.
                    if index != self.started:
                        self.admitted.insert(self.started, self.admitted.pop(index))
                    break
        return self.admitted[self.started]

    @property
    def done(self) -> bool:
        """Every request decided, and every admitted one started."""
        return self.decided == len(self.requests) and self.waiting == 0

    @property
    def next_arrival(self) -> float:
        """When the next undecided request arrives (inf when none is left)."""
        if self.decided == len(self.requests):
            return math.inf
        return float(self.arrivals[self.requests[self.decided]])

    def _busy_elapsed(self, now: float) -> list[float]:
        """How long each busy instance has served its request, s."""
        return [now - start for finish, start in self._free if finish > now]

    def _decide(self, now: float) -> None:
        """Admit or drop the next arrival (at ``now``), as the pod stands at that instant."""
        request = int(self.requests[self.decided])
        self.decided += 1
        verdict = Verdict.SERVE
        if self.admit is not None:
            verdict = self.admit(now, self.waiting, self._busy_elapsed(now))
        if verdict is not Verdict.DROP:
            if verdict is Verdict.FASTEST:
                self.on_fastest.add(request)
            self.admitted.append(request)
            return
        self.starts[request] = self.finishes[request] = now
        self.configs[request] = DROPPED

    def _start(self, request: int, begin: float) -> int:
        """Record a request's start on the configuration in force then (or the fastest, where
        admission said so); returns that config, or DROPPED where admission at dispatch drops
        it (it then takes no instance)."""
        config = 0 if request in self.on_fastest else self.choose(begin)
        if self.dispatch is not None:
            config = self.dispatch(begin - float(self.arrivals[request]), config)
        self.starts[request] = begin
        self.configs[request] = config
        self.started += 1
        if config == DROPPED:
            self.finishes[request] = begin
        return config

    def advance(self, until: float) -> None:
        """Decide every arrival and start every request whose service begins by ``until``."""
        while True:
            begin = math.inf
            if self.waiting:
                request = self.admitted[self.started]
                begin = max(self.arrivals[request], self._free[0][0])
            arrival = self.next_arrival
            first = min(begin, arrival)
            if first > until or math.isinf(first):
                return
            if arrival < begin:
                self._decide(arrival)
                continue
            # At a tie the start comes first: a request starting at this instant is not queued.
            # Every admitted request has arrived by `begin` (later ones are not yet decided).
            request = self._next_waiting(begin)
            config = self._start(request, begin)
            if config == DROPPED:
                continue
            service = float(self.service_s[config, request])
            if self.stretch is not None:
                # The instance at the heap's top is the one this request takes (free by now).
                others = sum(1 for busy_until, _ in self._free if busy_until > begin)
                share = others / (self.model.servers - 1)
                service *= 1 + (float(self.stretch[config]) - 1) * share
            finish = begin + service
            heapq.heapreplace(self._free, (finish, begin))
            self.finishes[request] = finish

    def drain(self) -> None:
        """Finish what has started (every finish is known when its request starts)."""


class _StagedPod(_Pod):
    """A pod whose requests pass through stages of one batching instance each."""

    def _serve(self, stage: int, now: float) -> None:
        """Start the stage's next batch if it is free and requests wait for it."""
        if self._busy[stage] or not self._waiting[stage]:
            return
        queue = self._waiting[stage]
        batch = tuple(
            queue.popleft() for _ in range(min(len(queue), self.model.stages[stage].max_batch))
        )
        took = self.model.stages[stage].batch_time(
            [self.service_s[self.configs[r], r] for r in batch]
        )
        self._busy[stage] = True
        self._order += 1
        heapq.heappush(self._events, (now + took, self._order, stage, batch))

    def _busy_elapsed(self, now: float) -> list[float]:
        """How long each request holding an instance has been in service, s."""
        return [now - start for start in self._holding.values()]

    def _start_waiting(self, now: float) -> None:
        """Start admitted requests on idle router instances."""
        while self._idle_servers and self.waiting:
            request = self._next_waiting(now)
            if self._start(request, now) == DROPPED:
                continue
            self._holding[request] = now
            self._idle_servers -= 1
            self._waiting[0].append(request)
        # After every arrival of this instant: requests that arrive together batch together.
        self._serve(0, now)

    def advance(self, until: float, admit: bool = True) -> None:
        """Run every arrival and batch completion up to ``until``."""
        while True:
            arrival = self.next_arrival if admit else math.inf
            event = self._events[0][0] if self._events else math.inf
            now = min(arrival, event)
            if now > until or math.isinf(now):
                return
            if event <= arrival:
                _, _, stage, batch = heapq.heappop(self._events)
                self._busy[stage] = False
                last = stage == len(self.model.stages) - 1
                for request in batch:
                    if last:
                        self.finishes[request] = now
                        self._idle_servers += 1
                        del self._holding[request]
                    else:
                        self._waiting[stage + 1].append(request)
                self._serve(stage, now)
                if not last:
                    self._serve(stage + 1, now)
            if admit:
                # Every arrival of this instant is decided before any request starts, so requests
                # that arrive together batch together.
                while self.next_arrival <= now:
                    self._decide(now)
                self._start_waiting(now)

    def drain(self) -> None:
        """Finish every request that has started; start no more."""
        self.advance(math.inf, admit=False)


class Controller(Protocol):
    """A policy the simulator can run: Elastico, or a static baseline."""

    def initial_state(self, now: float) -> PolicyState:
        """The state before the first decision."""
        ...

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The configuration to serve next and the new state."""
        ...


@dataclass(frozen=True)
class StaticController:
    """A baseline that always serves one configuration."""

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
    # compass_capacity_pressure after this decision (0 when simulate() was given no plan).
    capacity_pressure: float = 0.0


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
    def waits_ms(self) -> FloatArray:
        """Each request's wait in the queue before its service started, ms."""
        wait: FloatArray = (self.starts_s - self.arrivals_s) * 1000
        return wait

    @property
    def latencies_ms(self) -> FloatArray:
        """Each request's latency (wait + service), ms."""
        latency: FloatArray = (self.finishes_s - self.arrivals_s) * 1000
        return latency

    @property
    def compliance(self) -> float:
        """Percentage of requests served within the SLO (a dropped request is a miss; 100 when
        there were none)."""
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

    @property
    def switches_per_minute(self) -> float:
        """Switches per minute of simulated time."""
        span = self.ticks[-1].time_s if self.ticks else 0.0
        return self.switches / span * 60 if span > 0 else 0.0

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
    controller: Controller,
    front: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    label: str = "policy",
    interval_s: float = DEFAULT_INTERVAL_S,
    rate_window_s: float = DEFAULT_RATE_WINDOW_S,
    *,
    pods: int = 1,
    switch_delay_s: float = 0.0,
    queue_aggregate: QueueAggregate = QueueAggregate.MEAN,
    pod_model: PodModel = PodModel(),
    admission: Admission | None = None,
    plan: Plan | None = None,
) -> RunReport:
    """Serve the scenario's requests FIFO on each pod (late-last where ``pod_model`` says so),
    the controller choosing the configuration (and, with ``admission``, dropping at arrival
    what its prediction says is already late).

    With the controller's ``plan``, each tick also records the capacity pressure the operator
    would export after that decision."""
    if not switch_delay_s >= 0 or not math.isfinite(switch_delay_s):
        raise SimulationError("switch_delay", f"{switch_delay_s:g} s is not >= 0", "give e.g. 0.01")
    names = tuple(p.name for p in front)
    index_of = {name: i for i, name in enumerate(names)}
    # Seconds of service for every (configuration, request): the common random numbers.
    service_s = np.stack([p.distribution.quantile(scenario.luck) / 1000 for p in front])
    arrivals = scenario.arrivals_s
    n = len(arrivals)
    assigned = scenario.pods_of(pods)
    # Each pod's requests in arrival order.
    queues = [np.flatnonzero(assigned == pod) for pod in range(pods)]
    starts = np.empty(n)
    finishes = np.empty(n)
    configs = np.empty(n, dtype=np.int64)
    state = controller.initial_state(0.0)
    active = _initial_mix(state, index_of)
    # Switches decided but not yet in force: (in force for services starting after, mix).
    pending: list[tuple[float, Mix]] = []
    # Each pod deals its requests to the mix in force by its own round-robin, as a router does.
    dealt: list[tuple[Mix, SmoothWeighting[int]] | None] = [None] * pods
    seen: list[tuple[float, float, int, Mix, bool, float]] = []
    reasons: list[tuple[float, str]] = []
    time_in = [0.0] * len(front)
    switches = 0
    last_arrival = float(arrivals[-1]) if n else 0.0
    horizon = max(scenario.pattern.duration_s, last_arrival) + MAX_DRAIN_S
    tick = 0
    now = 0.0

    def mix_at(when: float) -> Mix:
        chosen = active
        for effective, mix in pending:
            if when > effective:
                chosen = mix
        return chosen

    def config_at(pod: int, begin: float) -> int:
        chosen = mix_at(begin)
        if chosen.blend is None:
            return chosen.base
        current = dealt[pod]
        if current is None or current[0] != chosen:
            current = (chosen, mix_weighting(chosen))
            dealt[pod] = current
        return current[1].pick()

    admit: AdmitFn | None = None
    dispatch: DispatchFn | None = None
    if admission is not None and admission.at is AdmissionPoint.DISPATCH:
        rule_at_dispatch = admission
        own_ms = service_quantiles_ms(front, admission.quantile)

        def dispatch(waited_s: float, config: int) -> int:
            left_ms = rule_at_dispatch.slo_ms - waited_s * 1000
            verdict = judge_at_dispatch(rule_at_dispatch, left_ms, own_ms[config], own_ms[0])
            return {Verdict.SERVE: config, Verdict.FASTEST: 0}.get(verdict, DROPPED)

    elif admission is not None:
        rule = admission

        @functools.cache
        def grid_of(mix: Mix) -> ServiceGrid:
            members = [(front[member], share) for member, share in mix.shares]
            return ServiceGrid(members, pod_model.servers)

        def admit(arrival: float, queued: int, busy_s: list[float]) -> Verdict:
            busy_ms = [b * 1000 for b in busy_s]
            grid, fastest = grid_of(mix_at(arrival)), grid_of(Mix(0))
            return judge(rule, grid, fastest, queued, busy_ms, pod_model.servers)

    stretch = (
        np.array([p.busy_stretch(pod_model.servers) for p in front])
        if pod_model.contended and pod_model.servers > 1
        else None
    )
    servers = [
        (_StagedPod if pod_model.stages else _Pod)(
            pod_model,
            queue,
            arrivals,
            service_s,
            functools.partial(config_at, pod),
            (starts, finishes, configs),
            admit,
            dispatch,
            stretch,
        )
        for pod, queue in enumerate(queues)
    ]
    while True:
        # Start every request whose service begins by `now`, with the configuration in force then.
        for server in servers:
            server.advance(now)
        while pending and pending[0][0] <= now:
            active = pending.pop(0)[1]
        done = all(server.done for server in servers)
        if (done and now >= scenario.pattern.duration_s) or now > horizon:
            break
        arrived = int(np.searchsorted(arrivals, now, side="right"))
        depth = aggregate_queue([server.waiting for server in servers], queue_aggregate)
        recent = arrived - int(np.searchsorted(arrivals, now - rate_window_s, side="right"))
        observed = recent / min(rate_window_s, now) if now > 0 else 0.0
        observation = Observation(
            time=now, queue_depth=depth, arrivals_total=float(arrived) / pods, pods=pods
        )
        decision, state = controller.decide(observation, state, now)
        target = decision.mix
        in_force = pending[-1][1] if pending else active
        if decision.switched:
            switches += 1
            reasons.append(
                (now, f"{_label(in_force, names)} -> {_label(target, names)}: {decision.reason}")
            )
        if target != in_force:
            pending.append((now + switch_delay_s, target))
        pressure = 0.0 if plan is None else capacity_pressure(plan, names[target.base], depth)
        seen.append((now, observed, round(depth), target, decision.switched, pressure))
        for member, share in target.shares:
            time_in[member] += share * interval_s
        tick += 1
        now = tick * interval_s
    final = (pending[-1][1] if pending else active).base
    for server, queue in zip(servers, queues, strict=True):
        server.drain()
        if not server.done:
            # Past the drain horizon: the rest never start; count them at the horizon.
            rest = [*server.admitted[server.started :], *queue[server.decided :]]
            starts[rest] = horizon
            finishes[rest] = horizon
            configs[rest] = final
    offered = scenario.pattern.rate(np.array([t for t, *_ in seen]))
    ticks = tuple(
        Tick(t, float(rate), observed, depth, mix.base, switched, mix, pressure)
        for (t, observed, depth, mix, switched, pressure), rate in zip(seen, offered, strict=True)
    )
    return RunReport(
        label=label,
        slo_ms=slo_ms,
        names=names,
        accuracies=tuple(p.accuracy for p in front),
        arrivals_s=arrivals,
        starts_s=starts,
        finishes_s=finishes,
        configs=configs,
        ticks=ticks,
        switches=switches,
        time_in_config_s=tuple(time_in),
        reasons=tuple(reasons),
    )


def _initial_mix(state: PolicyState, index_of: Mapping[str, int]) -> Mix:
    """The mix a controller's initial state routes (the first member if it names none)."""
    base = index_of[state.active] if state.active is not None else 0
    blend = None if state.blend is None else index_of[state.blend]
    return Mix(base, blend, state.weight)


def _label(mix: Mix, names: Sequence[str]) -> str:
    """A mix as people read it: a member, or a member with a share of the next."""
    if mix.blend is None:
        return names[mix.base]
    return f"{names[mix.base]} + {mix.weight:.0%} {names[mix.blend]}"


BASELINES = ("fastest", "middle", "accurate")


def baseline_indices(front_size: int) -> dict[str, int]:
    """The static baselines' positions on the front: fastest, middle, most accurate."""
    return {"fastest": 0, "middle": front_size // 2, "accurate": front_size - 1}


def compare(
    policies: Mapping[str, Controller],
    front: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    interval_s: float = DEFAULT_INTERVAL_S,
    *,
    pods: int = 1,
    switch_delay_s: float = 0.0,
    queue_aggregate: QueueAggregate = QueueAggregate.MEAN,
    pod_model: PodModel = PodModel(),
    admission: Admission | None = None,
) -> dict[str, RunReport]:
    """The static baselines and the given policies, all on the same scenario (paired); the
    policies with ``admission``, the baselines serving everything."""
    controllers: dict[str, Controller] = {
        label: StaticController(front[i].name, i)
        for label, i in baseline_indices(len(front)).items()
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
            queue_aggregate=queue_aggregate,
            pod_model=pod_model,
            admission=admission if label in policies else None,
        )
        for label, controller in controllers.items()
    }


def measure_capacity(
    profile: LatencyProfile, pod_model: PodModel, seed: int = 0, requests: int = 400
) -> CapacityCurve:
    """A configuration's latency-throughput curve in the simulator, by the profiler's ladder.

    Each rate offers ``requests`` Poisson arrivals to one pod serving ``profile`` alone: the
    simulator plays the hardware, so plans made from the curve can be checked against it.
    """
    rates_done = itertools.count()

    def measure(rate: float) -> CurvePoint:
        pattern = make_pattern(PatternKind.CONSTANT, rate, requests / rate)
        scenario = make_scenario(pattern, seed * 1009 + next(rates_done))
        report = simulate(
            StaticController(profile.name, 0), [profile], scenario, math.inf, pod_model=pod_model
        )
        return measure_point(rate, report.arrivals_s, report.finishes_s)

    return climb_ladder(
        profile.mean_ms, pod_model.servers, measure, idle_p95_ms=profile.latency_at(95.0)
    )
