"""How one simulated pod serves its requests: router instances and the stages of a pipeline."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from compass.domain.admission import AdmissionVerdict
from compass.domain.arrays import FloatArray, IntArray
from compass.domain.arrivals import SimulationError
from compass.domain.profiles import LatencyProfile

# The configuration recorded for a request dropped at arrival: served by none.
DROPPED = -1


@dataclass(frozen=True)
class Stage:
    """A component of one instance serving ``share`` of each request's time, a batch of b taking
    its longest x (1 + ``batch_cost`` (b - 1)): a cost below 1 is what makes batching pay."""

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
    # The instances contend for the same cores: a request starting with k busy (itself
    # included) takes its time x (1 + (s - 1) (k - 1) / (servers - 1)), s its member's
    # ``slot_stretch``, fixed when it starts (a cheap stand-in for processor sharing).
    contended: bool = False
    # Late-last (None: FIFO, as the routers ship): a request that waited longer than this goes
    # behind every request that has not (it misses whatever serves it; served first it would
    # make those behind it miss too). What the order is worth: bench/serving_sim.py.
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


# rag-sim's pipeline as deployed (model-images/rag-sim/component.py serves the same model).
RAG_SIM_STAGES = (Stage(0.1), Stage(0.2), Stage(0.7, max_batch=8, batch_cost=0.25))
# The pipelines `compass simulate --stages` knows, by name.
POD_STAGES: dict[str, tuple[Stage, ...]] = {"independent": (), "rag-sim": RAG_SIM_STAGES}


# Below this many requests' worth at once, a curve's gain is the noise of a one-at-a-time pod.
MIN_SLOT_GAIN = 1.25


def planned_slots(front: Sequence[LatencyProfile]) -> int:
    """The gate slots a plan defaults to: the fastest's saturated curve's concurrency where every
    member measured there served ``MIN_SLOT_GAIN`` at once (a curve's only trusted one), else 1."""
    curve = front[0].capacity if front else None
    if curve is None or curve.servers < 2 or not curve.saturated:
        return 1
    measured = [p for p in front if p.busy_holding_ms(curve.servers) is not None]
    gains = [curve.servers / p.busy_stretch(curve.servers) for p in measured]
    return curve.servers if min(gains) >= MIN_SLOT_GAIN else 1


# (arrival time, requests queued ahead, how long each busy instance has served, s) -> verdict.
AdmitFn = Callable[[float, int, list[float]], AdmissionVerdict]
# (seconds the request waited, the configuration routed) -> the one that serves it, or DROPPED.
DispatchFn = Callable[[float, int], int]


@dataclass(eq=False)
class SimulatedPod:
    """One pod's requests, started FIFO (or late-last) on its router instances as time advances,
    each arrival admitted or dropped in time order with the starts (M/G/c without stages)."""

    model: PodModel
    requests: IntArray
    arrivals: FloatArray
    service_s: FloatArray
    # (when the service begins, the request) -> the member that serves it.
    choose: Callable[[float, int], int]
    record: tuple[FloatArray, FloatArray, IntArray]
    admit: AdmitFn | None = None
    dispatch: DispatchFn | None = None
    # Per member: how much longer a request takes with every instance busy (contended).
    stretch: FloatArray | None = None

    def __post_init__(self) -> None:
        self.starts, self.finishes, self.configs = self.record
        # Requests decided, those admitted in order, and how many of those have started.
        self.decided = 0
        self.admitted: list[int] = []
        self.started = 0
        # Admitted requests that admission sent to the fastest member (the front's first).
        self.on_fastest: set[int] = set()
        # (finish, start) of each instance's last request.
        self._free = [(0.0, 0.0)] * self.model.servers
        # Requests holding an instance of a staged pod, and when each started.
        self._holding: dict[int, float] = {}
        # A staged pod's network of queues (empty without stages).
        self._idle_servers = self.model.servers
        self._waiting: list[deque[int]] = [deque() for _ in self.model.stages]
        self._busy = [False] * len(self.model.stages)
        # (time, order, stage, batch): a stage finishing a batch.
        self._events: list[tuple[float, int, int, tuple[int, ...]]] = []
        self._order = 0

    @property
    def waiting(self) -> int:
        """Requests admitted and not started: the router's queue."""
        return len(self.admitted) - self.started

    def _next_waiting(self, now: float) -> int:
        """The request an instance takes up now: the oldest (late-last: the oldest not late)."""
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
        verdict = AdmissionVerdict.SERVE
        if self.admit is not None:
            verdict = self.admit(now, self.waiting, self._busy_elapsed(now))
        if verdict is not AdmissionVerdict.DROP:
            if verdict is AdmissionVerdict.FASTEST:
                self.on_fastest.add(request)
            self.admitted.append(request)
            return
        self.starts[request] = self.finishes[request] = now
        self.configs[request] = DROPPED

    def _start(self, request: int, begin: float) -> int:
        """Start a request on its configuration; returns it, or DROPPED (it holds no instance)."""
        config = 0 if request in self.on_fastest else self.choose(begin, request)
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


class StagedPod(SimulatedPod):
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
                # This instant's arrivals are decided before any starts: they batch together.
                while self.next_arrival <= now:
                    self._decide(now)
                self._start_waiting(now)

    def drain(self) -> None:
        """Finish every request that has started; start no more."""
        self.advance(math.inf, admit=False)
