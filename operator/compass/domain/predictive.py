"""The predictive strategy: each interval, the most accurate mix whose near future looks safe.

A fixed-seed Monte Carlo forecasts the next ``HORIZON_S`` from the pod's queue; the mix may miss
at most ``risk`` more often than the fastest from idle, through a surge too. Meant to run with
admission at dispatch. Why: docs/method.md, "Predictive"."""

from __future__ import annotations

import hashlib
import json
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
from scipy.special import ndtri

from compass.domain.arrays import BoolArray, FloatArray, IntArray
from compass.domain.elastico import (
    ENTER_CONFIDENCE,
    STEADY_WINDOWS_S,
    ElasticoSettings,
    MetricsLoss,
    rate_upper_bound,
    record_arrivals,
    steady_window,
)
from compass.domain.mix import Mix, accuracy_hull, hull_mixes, mix_weighting, most_accurate
from compass.domain.planner import Plan
from compass.domain.policy import Action, Decision, Observation, PolicyState

Float32Array = npt.NDArray[np.float32]

# 10 s is several intervals and short enough that the last steady window's rate still holds; the
# risk was chosen on bench/serving_sim.py with admission (see its strategies section).
HORIZON_S = 10.0
DEFAULT_RISK = 0.08
# A mix must survive a rise in the load the past cannot show for as long as the policy takes to
# see it and move: the forecast's first SURGE_S come SURGE_FACTOR times faster.
SURGE_FACTOR = 2.5
SURGE_S = 3.0
PATHS = 64
SEED = 20261126
# The rate a stay is judged on, and the higher one a climb must fit.
STAY_CONFIDENCE = ENTER_CONFIDENCE
CLIMB_CONFIDENCE = 0.9
# Before a steady window this long the rate is not known: serve the fastest.
MIN_EVIDENCE_S = 2.0
# Requests one path holds at most (a higher forecast shortens the horizon).
MAX_PATH_REQUESTS = 2000
# Clumped arrivals (arrivals_dispersion; Poisson arrivals read as 1).
DISPERSION_WINDOW_S = 60.0
DISPERSION_CONFIDENCE = 0.9
MIN_DISPERSION_PAIRS = 10
MISS_SHARES_KEPT = 65536  # at most about 20 MB a front
# Per front: a mix's service and holding sums up to this many requests (0.5 MB each at most),
# and the arrival times of the last few (rate, surge, clump) a decision asks for every mix.
CACHED_REQUESTS = 512
ARRIVALS_KEPT = 16
# _none_late's margin below the SLO: far above the rounding of a sum of a few hundred seconds
# (about 1e-13 s), so it never answers "none late" where the full computation counts one.
NONE_LATE_MARGIN_S = 1e-9


class _Paths:
    """The forecast's random draws, fixed at construction (float32 to hold them small)."""

    def __init__(self, plan: Plan, requests: int) -> None:
        rng = np.random.default_rng(SEED)
        self.gaps: Float32Array = rng.exponential(size=(PATHS, requests)).astype(np.float32)
        # Each member's service times are drawn from this luck when first dealt (few are).
        self._luck = rng.uniform(size=(PATHS, requests))
        profiles = [t.profile for t in plan.thresholds]
        self._profiles = profiles
        self._rows: dict[int, Float32Array] = {}
        self._rows_lock = threading.Lock()
        # How much longer a request holds a busy pod's instance (None: its own time).
        stretch = np.array([p.busy_stretch(plan.servers) for p in profiles])
        self.stretch: FloatArray | None = None if np.all(stretch == 1.0) else stretch
        # Whether a request joins the clump before it (drawn last: the Poisson paths keep theirs).
        self.joins: Float32Array = rng.uniform(size=(PATHS, requests)).astype(np.float32)
        self.requests = requests
        self._dealt: dict[Mix, IntArray] = {}
        # Miss shares by every input, least recently used out first (an idle policy's repeat).
        self.miss_shares: OrderedDict[tuple[object, ...], float] = OrderedDict()
        self.miss_shares_lock = threading.Lock()
        # Each part below over more requests, cut short, is the shorter one to the bit.
        self._served: dict[Mix, tuple[FloatArray, FloatArray]] = {}
        self._reach: dict[Mix, FloatArray] = {}
        self._units: dict[float, FloatArray] = {}
        self._unit_floor: FloatArray | None = None
        self._arrivals: OrderedDict[tuple[float, ...], _Arrivals] = OrderedDict()
        self._parts_lock = threading.Lock()

    def dealt(self, mix: Mix) -> IntArray:
        """The member serving each request in turn under the mix (its router's round-robin)."""
        members = self._dealt.get(mix)
        if members is None:
            # Smooth weighted round-robin repeats itself every (sum of the weights) picks.
            weighting = mix_weighting(mix)
            period = [weighting.pick() for _ in range(weighting.total)]
            members = np.resize(np.array(period, dtype=np.int64), self.requests)
            self._dealt[mix] = members
        return members

    def service(self, mix: Mix, requests: int) -> FloatArray:
        """Each path's service times (requests x paths, so passes run over contiguous memory)."""
        if requests <= CACHED_REQUESTS:
            return self.served(mix, requests)[0]
        return self._service(mix, requests)

    def _service(self, mix: Mix, requests: int) -> FloatArray:
        """service, worked out."""
        members = self.dealt(mix)[:requests]
        dealt, position = np.unique(members, return_inverse=True)
        rows = np.stack([self.service_row(int(member)) for member in dealt])
        service: FloatArray = rows[position, :, np.arange(requests)].astype(np.float64)
        return service

    def service_row(self, member: int) -> Float32Array:
        """One member's service times (s, paths x requests), drawn once."""
        with self._rows_lock:
            row = self._rows.get(member)
            if row is None:
                quantiles = self._profiles[member].distribution.quantile(self._luck)
                row = self._rows[member] = (quantiles / 1000).astype(np.float32)
            return row

    def holding(self, mix: Mix, service: FloatArray) -> FloatArray:
        """How long each of ``service``'s requests holds an instance once the pod is busy."""
        if self.stretch is None:
            return service
        held: FloatArray = service * self.stretch[self.dealt(mix)[: service.shape[0]]][:, None]
        return held

    def served(self, mix: Mix, requests: int) -> tuple[FloatArray, FloatArray]:
        """(service times, holding times before each summed) of the first ``requests``, kept."""
        known = self._served.get(mix)
        if known is None or len(known[0]) < requests:
            length = min(max(requests, 64, 1 << (requests - 1).bit_length()), CACHED_REQUESTS)
            service = self._service(mix, length)
            holding = self.holding(mix, service)
            before = np.cumsum(holding, axis=0) - holding
            service.flags.writeable = before.flags.writeable = False
            known = self._served[mix] = (service, before)
        return known[0][:requests], known[1][:requests]

    def reach(self, mix: Mix, requests: int) -> float:
        """The longest (holding before it + service) of the first ``requests`` on any path."""
        reach = self._reach.get(mix)
        if reach is None or len(reach) < requests:
            self.served(mix, requests)
            service, before = self._served[mix]  # as many as are kept
            reach = np.maximum.accumulate(np.add(before, service).max(axis=1))
            reach.flags.writeable = False
            self._reach[mix] = reach
        return float(reach[requests - 1])

    def rows_before(self, unit: float) -> int:
        """How many leading rows arrive before unit-rate time ``unit`` on some Poisson path."""
        floor = self._unit_floor
        if floor is None:
            floor = self.unit(1.0, self.requests).min(axis=1)
            floor.flags.writeable = False
            self._unit_floor = floor
        return int(np.searchsorted(floor, unit, side="left"))

    def arrivals(
        self, rate: float, surge_s: float, clump: float, horizon_s: float, requests: int
    ) -> _Arrivals:
        """Each path's arrival times: unit-rate gaps stretched to ``rate`` (after a surge)."""
        key = (rate, surge_s, clump, horizon_s)
        with self._parts_lock:
            known = self._arrivals.get(key)
            if known is not None and len(known.times) >= requests:
                self._arrivals.move_to_end(key)
                return known
        unit = self.unit(clump, requests)
        in_surge = SURGE_FACTOR * rate * surge_s
        arrivals: FloatArray
        if surge_s == 0:
            arrivals = unit / rate  # the expression below at surge_s 0, in one pass
        else:
            arrivals = np.where(
                unit < in_surge,
                unit / (SURGE_FACTOR * rate),
                surge_s + (unit - in_surge) / rate,
            )
        inside = arrivals < horizon_s
        arrivals.flags.writeable = inside.flags.writeable = False
        # Each path's arrivals rise, so the rows with one inside the horizon come first.
        counted = np.cumsum(np.count_nonzero(inside, axis=1))
        known = _Arrivals(arrivals, inside, int(np.count_nonzero(inside.any(axis=1))), counted)
        with self._parts_lock:
            self._arrivals[key] = known
            self._arrivals.move_to_end(key)
            while len(self._arrivals) > ARRIVALS_KEPT:
                self._arrivals.popitem(last=False)
        return known

    def unit(self, clump: float, requests: int) -> FloatArray:
        """Each path's unit-rate arrival times, in clumps of mean size ``clump`` (rate still 1)."""
        known = self._units.get(clump) if clump == 1 else None
        if known is not None and len(known) >= requests:
            return known[:requests]
        # Poisson paths are kept whole; clumped ones change with the measured dispersion.
        length = self.requests if clump == 1 else requests
        gaps = self.gaps[:, :length].T
        if clump > 1:
            joins = np.greater_equal(self.joins[:, :length].T, 1 / clump)
            joins[0] = False
            gaps = np.where(joins, np.float32(0), gaps * np.float32(clump))
        unit: FloatArray = np.cumsum(gaps, axis=0, dtype=np.float64)
        if clump == 1:
            unit.flags.writeable = False
            self._units[clump] = unit
        return unit[:requests]


@dataclass(frozen=True)
class _Arrivals:
    """Each path's arrival times (requests x paths) and which are inside the horizon."""

    times: FloatArray
    inside: BoolArray
    rows_inside: int
    counted: IntArray


# Policies drawing the same share one set (1.5 MB each); weak: it goes with the last policy.
_PATHS: weakref.WeakValueDictionary[str, _Paths] = weakref.WeakValueDictionary()
_PATHS_LOCK = threading.Lock()


def shared_paths(plan: Plan, requests: int) -> _Paths:
    """The draws for this plan's members, shared by every policy whose front draws the same."""
    # What the draws are made of, as JSON: a pickle would carry what cached properties added.
    profiles = [
        {
            "config": t.profile.key,
            "accuracy": t.profile.accuracy,
            "latency_ms": [t.profile.mean_ms, t.profile.p50_ms, t.profile.p95_ms],
            "tail_ms": [t.profile.p99_ms, t.profile.std_ms],
            "capacity": None if t.profile.capacity is None else t.profile.capacity.to_json(),
        }
        for t in plan.thresholds
    ]
    drawn = json.dumps([profiles, plan.servers, requests, SEED], sort_keys=True)
    key = hashlib.sha256(drawn.encode()).hexdigest()
    with _PATHS_LOCK:
        paths = _PATHS.get(key)
        if paths is None:
            paths = _PATHS[key] = _Paths(plan, requests)
        return paths


@dataclass(frozen=True)
class Predictive:
    """The predictive strategy over one plan (see the module docstring)."""

    plan: Plan
    settings: ElasticoSettings = field(default_factory=ElasticoSettings)
    risk: float = DEFAULT_RISK
    positions: tuple[Mix, ...] = field(init=False, repr=False, compare=False)
    # The positions as a set: every decision asks whether the state's mix is one of them.
    on_hull: frozenset[Mix] = field(init=False, repr=False, compare=False)
    paths: _Paths = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.risk < 1:
            raise ValueError(f"risk: {self.risk!r} is not in [0, 1); give e.g. {DEFAULT_RISK}")
        eligible = self.plan.eligible
        hull = accuracy_hull([self.plan.thresholds[i].profile for i in eligible])
        object.__setattr__(self, "positions", tuple(hull_mixes([eligible[i] for i in hull])))
        object.__setattr__(self, "on_hull", frozenset(self.positions))
        object.__setattr__(self, "paths", shared_paths(self.plan, MAX_PATH_REQUESTS))

    @property
    def fastest(self) -> Mix:
        """The fastest eligible member alone (the safe default)."""
        return self.positions[0]

    def initial_state(self, now: float) -> PolicyState:
        """A fresh policy starts on the fastest eligible member alone."""
        name = self.plan.names[self.fastest.base]
        return PolicyState(active=name, active_since=now, last_reason="initial: fastest")

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The mix to serve after this observation, and the policy's new state."""
        current = self._mix_of(state)
        if current is None:
            reason = "active mix not on the front's hull: fastest"
            return self._route(state, self.fastest, reason, now, fallback=True)
        if self.settings.paused:
            return self._route(state, current, "paused", now)
        if observation is None or now - observation.time > self.settings.stale_after_s:
            return self._metrics_lost(state, current, observation, now)
        keep = max(STEADY_WINDOWS_S) + self.settings.stale_after_s
        state = replace(record_arrivals(state, observation, keep), observed_at=observation.time)
        pods = max(observation.pods, 1)
        dispersion = arrivals_dispersion(state.arrivals, observation.time, pods)
        rates = self._rates(state, observation, dispersion)
        if rates is None:
            return self._route(state, self.fastest, "no arrival rate known yet: fastest", now)
        stay_rate, climb_rate = rates
        depth = max(observation.queue_depth, 0.0)
        # Spread at random over the pods, a clump of all pods' arrivals reaches each in part.
        clump = clump_size(1 + (dispersion - 1) / pods)
        reference: dict[tuple[float, bool], float] = {}

        def fares(mix: Mix, rate: float, surge: bool) -> bool:
            share = self.miss_share(mix, rate, depth, current, surge, clump)
            if share <= self.risk:
                return True  # within the risk of any reference: the fastest's is not needed
            if (rate, surge) not in reference:
                reference[rate, surge] = self.miss_share(
                    self.fastest, rate, 0.0, current, surge, clump
                )
            return share <= reference[rate, surge] + self.risk

        def safe(mix: Mix) -> bool:
            rate = climb_rate if mix.position > current.position + 1e-9 else stay_rate
            return fares(mix, rate, surge=False) and fares(mix, rate, surge=True)

        target = most_accurate(self.positions, safe)
        clumped = "" if clump == 1 else f" in clumps of {clump:.1f}"
        reason = (
            f"forecast {stay_rate:.2f}/s per pod{clumped} (climb {climb_rate:.2f}/s), "
            f"queue {depth:g}: "
            f"the most accurate mix within {self.risk:.0%} more misses than the fastest over "
            f"{HORIZON_S:g} s"
        )
        return self._route(state, target, reason, now)

    def miss_share(
        self,
        mix: Mix,
        rate: float,
        queued: float,
        active: Mix,
        surge: bool = False,
        clump: float = 1.0,
    ) -> float:
        """The share of the next ``HORIZON_S`` of arrivals that miss the SLO if ``mix`` serves
        them behind the ``queued``, at ``rate`` (with ``surge``: faster first; ``clump``: compound
        Poisson), the instances busy with ``active`` (idle: as often as the rate keeps them)."""
        if rate <= 0:
            return 0.0
        clump = max(clump, 1.0)
        ahead = min(round(queued), self.paths.requests - 1)
        # Plain numbers: the collector stops tracking such tuples, so a full cache costs no GC.
        key = (
            *_mix_key(mix),
            *_mix_key(active),
            rate,
            ahead,
            surge,
            clump,
            HORIZON_S,
            self.plan.slo.latency_ms,
        )
        shares, lock = self.paths.miss_shares, self.paths.miss_shares_lock
        with lock:
            known = shares.get(key)
            if known is not None:
                shares.move_to_end(key)
                return known
        known = self._miss_share(mix, rate, ahead, active, surge, clump)
        with lock:
            shares[key] = known
            while len(shares) > MISS_SHARES_KEPT:
                shares.popitem(last=False)
        return known

    def _extent(
        self, rate: float, ahead: int, active: Mix, surge: bool, clump: float
    ) -> tuple[float, int, int, float]:
        """(surge length, arrivals drawn, arrivals the queue leaves room for, idle-start delay)."""
        servers = max(self.plan.servers, 1)
        surge_s = min(SURGE_S, HORIZON_S) if surge else 0.0
        expected = rate * (HORIZON_S + (SURGE_FACTOR - 1) * surge_s)
        # The count's spread: its variance is the dispersion (2 clump - 1) times its mean.
        spread = math.sqrt((2 * clump - 1) * expected)
        whole = min(math.ceil(expected + 4 * spread + 3), self.paths.requests)
        count = min(whole, self.paths.requests - ahead)
        active_mean_s = (
            sum(self.plan.thresholds[m].profile.mean_ms * share for m, share in active.shares)
            / 1000
        )
        busy = 1.0 if ahead else min(1.0, rate * active_mean_s / servers)
        return surge_s, whole, count, 0.5 * busy * active_mean_s  # half a service left if busy

    def _none_late(self, mix: Mix, rate: float, surge_s: float, count: int, idle_s: float) -> bool:
        """Whether no request can miss, known without drawing arrivals (one idle instance)."""
        # The horizon's end in unit-rate time (a little later: rounding never leaves a row out).
        horizon_unit = SURGE_FACTOR * rate * surge_s + rate * (HORIZON_S - surge_s)
        rows = min(count, self.paths.rows_before(horizon_unit * (1 + 1e-9) + 1e-12))
        if rows == 0:
            return True
        slo_s = self.plan.slo.latency_ms / 1000
        return idle_s + self.paths.reach(mix, rows) <= slo_s - NONE_LATE_MARGIN_S

    def _miss_share(
        self, mix: Mix, rate: float, ahead: int, active: Mix, surge: bool, clump: float
    ) -> float:
        """miss_share, worked out: ``ahead`` requests queued, ``clump`` at least 1."""
        servers = max(self.plan.servers, 1)
        surge_s, whole, count, idle_s = self._extent(rate, ahead, active, surge, clump)
        one_idle = servers == 1 and ahead == 0 and count <= CACHED_REQUESTS
        if one_idle and clump == 1 and self._none_late(mix, rate, surge_s, count, idle_s):
            return 0.0
        # Arrival times: the same for every mix judged at this rate (the whole count's, cut).
        known = self.paths.arrivals(rate, surge_s, clump, HORIZON_S, whole)
        slo_s = self.plan.slo.latency_ms / 1000
        if count == 0:
            return 0.0
        total = int(known.counted[count - 1])
        if one_idle:
            # fifo_starts' two passes with the mix's kept holding sums, up to the last arrival
            # inside the horizon (FIFO: a later one never moves an earlier one's start).
            rows = min(count, known.rows_inside)
            arrivals, inside = known.times[:rows], known.inside[:rows]
            service, before = self.paths.served(mix, rows)
            waited = np.subtract(arrivals, before)
            # The idle-start delay in the first row: the running maximum carries it (one pass).
            np.maximum(waited[0], idle_s, out=waited[0])
            np.maximum.accumulate(waited, axis=0, out=waited)
            np.add(before, waited, out=waited)  # each request's start
            np.subtract(waited, arrivals, out=waited)
            np.add(waited, service, out=waited)  # its latency
            late = np.greater(waited, slo_s)
            np.logical_and(late, inside, out=late)
            return np.count_nonzero(late) / total if total else 0.0
        arrivals, inside = known.times[:count], known.inside[:count]
        # (requests, paths): the queued ones first, then the horizon's arrivals.
        service = self.paths.service(mix, ahead + count)
        holding = self.paths.holding(mix, service)
        free = np.full((PATHS, servers), idle_s)
        starts = fifo_starts(free, holding[:ahead].T, arrivals.T, holding[ahead:].T).T
        late = (starts - arrivals + service[ahead:]) > slo_s
        return np.count_nonzero(inside & late) / total if total else 0.0

    def _rates(
        self, state: PolicyState, observation: Observation, dispersion: float
    ) -> tuple[float, float] | None:
        """(the rate a stay is judged on, the higher one a climb must fit) per pod, or None."""
        if observation.arrivals_total is None:
            measured = observation.arrival_rate_qps
            return None if measured is None else (measured, measured)
        pods = max(observation.pods, 1)
        steady = steady_window(state.arrivals, observation.time, pods, dispersion)
        if steady is None or steady[1] < MIN_EVIDENCE_S:
            return None
        count, seconds = steady
        return (
            rate_upper_bound(count, seconds, STAY_CONFIDENCE) * dispersion / pods,
            rate_upper_bound(count, seconds, CLIMB_CONFIDENCE) * dispersion / pods,
        )

    def _metrics_lost(
        self, state: PolicyState, current: Mix, observation: Observation | None, now: float
    ) -> tuple[Decision, PolicyState]:
        """Hold while the newest sample seen is within stale_after_s, then on_metrics_loss."""
        what = "missing" if observation is None else f"stale ({now - observation.time:.1f} s)"
        since = state.active_since if state.observed_at is None else state.observed_at
        seen = [since, None if observation is None else observation.time]
        newest = max((t for t in seen if t is not None), default=None)
        fresh = newest is not None and now - newest <= self.settings.stale_after_s
        if not fresh and self.settings.on_metrics_loss is MetricsLoss.FASTEST:
            return self._route(state, self.fastest, f"metrics {what}: fastest", now, fallback=True)
        return self._route(state, current, f"metrics {what}: hold", now)

    def _mix_of(self, state: PolicyState) -> Mix | None:
        """The state's routing as a position on the hull, or None when it is not one."""
        mix = state.mix(self.plan.index)
        return mix if mix in self.on_hull else None

    def _route(
        self, state: PolicyState, target: Mix, reason: str, now: float, fallback: bool = False
    ) -> tuple[Decision, PolicyState]:
        """The decision to serve ``target``, and the state that says so."""
        current = self._mix_of(state)
        if current == target:
            action = Action.HOLD
        elif current is None or fallback:
            action = Action.FALLBACK
        else:
            faster = target.position < current.position
            action = Action.FASTER if faster else Action.MORE_ACCURATE
        decision = Decision.routing(target, self.plan.names, action, reason)
        if action is Action.HOLD:
            return decision, state
        return decision, state.switched(decision, now)


def _mix_key(mix: Mix) -> tuple[int, int, float]:
    """A mix as plain numbers (its blend -1 when none)."""
    return (mix.base, -1 if mix.blend is None else mix.blend, mix.weight)


def arrivals_dispersion(samples: Sequence[tuple[float, float]], now: float, pods: int = 1) -> float:
    """All pods' arrivals' index of dispersion (its lower bound, at least 1), by Allan's factor on
    successive intervals, so a slow change of the rate is not taken for clumps."""
    if len(samples) < MIN_DISPERSION_PAIRS + 2:
        return 1.0
    readings = [total for _, total in samples]
    first = readings[0]
    if first == first and readings.count(first) == len(readings):
        # A counter that never moved (not NaN, which count matches by identity): 1 at once.
        return 1.0
    recent = [(t, total) for t, total in samples if now - DISPERSION_WINDOW_S - 1e-9 <= t <= now]
    if len(recent) < MIN_DISPERSION_PAIRS + 2:
        return 1.0
    times = np.array([t for t, _ in recent])
    totals = np.array([total for _, total in recent]) * max(pods, 1)
    lengths = np.diff(times)
    counts = np.diff(totals)
    if np.any(lengths <= 0) or counts.sum() <= 0:
        return 1.0
    rate = counts.sum() / lengths.sum()
    rates = counts / lengths
    terms = np.diff(rates) ** 2 / (1 / lengths[:-1] + 1 / lengths[1:]) / rate
    # Successive pairs share an interval: about half as many independent ones.
    error = float(np.std(terms, ddof=1)) / math.sqrt(len(terms) / 2)
    bound = float(np.mean(terms)) - float(ndtri(DISPERSION_CONFIDENCE)) * error
    return max(bound, 1.0)


def clump_size(dispersion: float) -> float:
    """The mean size of geometric clumps with this index of dispersion (2 mean - 1)."""
    return (max(dispersion, 1.0) + 1) / 2


def fifo_starts(
    free: FloatArray, queued: FloatArray, arrivals: FloatArray, holding: FloatArray
) -> FloatArray:
    """When each arrival starts on FIFO instances free at ``free``, after ``queued``, per path."""
    if free.shape[1] == 1:
        # One instance: release_j = max(arrival_j, release_j-1) + holding_j unrolls to
        # H_j + max(start, max over k <= j of (arrival_k - H_k-1)), H the running sum of the
        # holding times, so the whole recursion is two cumulative passes instead of a loop.
        start = free[:, 0] + queued.sum(axis=1)
        total = np.cumsum(holding, axis=1)
        before = total - holding
        starts: FloatArray = before + np.maximum(
            start[:, None], np.maximum.accumulate(arrivals - before, axis=1)
        )
        return starts
    free = free.copy()
    rows = np.arange(free.shape[0])
    for j in range(queued.shape[1]):
        slot = free.argmin(axis=1)
        free[rows, slot] += queued[:, j]
    starts = np.empty_like(arrivals)
    for j in range(arrivals.shape[1]):
        slot = free.argmin(axis=1)
        starts[:, j] = np.maximum(arrivals[:, j], free[rows, slot])
        free[rows, slot] = starts[:, j] + holding[:, j]
    return starts
