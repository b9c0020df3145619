"""The planner: the Pareto front of the profiles and each member's queue-depth and rate limits.
The threshold models and why: docs/method.md, "Planning"."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cached_property

import numpy as np
from scipy.optimize import brentq

from compass.domain.arrays import FloatArray
from compass.domain.capacity import erlang_c
from compass.domain.errors import FieldError
from compass.domain.mix import WEIGHT_STEPS, Mix
from compass.domain.profiles import LatencyProfile

# Floats: a queue depth that meets the SLO exactly must not be rounded away.
_TOLERANCE = 1e-9
# A latency target past a day is a unit mistake (and its queue depths overflow).
MAX_SLO_MS = 86_400_000.0
# Probability levels at which a service distribution is tabulated for the M/G/1 tail.
_GRID = 512
# Relative precision of the Lundberg exponent and of the rate limits.
_XTOL = 1e-10
# The deepest queue limit a plan gives: finite, so its search ends in about 30 steps.
MAX_QUEUE_LIMIT = 1_000_000_000


class PlanError(FieldError):
    """The profiles and the SLO admit no plan: one line, `<field>: <what is wrong>; <the fix>`."""


class ThresholdModel(StrEnum):
    """How the tail of a request's latency behind N queued requests is estimated."""

    PAPER_MEAN = "paper-mean"
    TAIL = "tail"
    ERLANG_C = "erlang-c"
    MEASURED = "measured"

    @property
    def with_rates(self) -> bool:
        """Whether the model also limits the arrival rate (all but the paper's)."""
        return self is not ThresholdModel.PAPER_MEAN

    @property
    def concurrent(self) -> bool:
        """Whether the model serves ``servers`` requests at once (else one, as the paper)."""
        return self in (ThresholdModel.ERLANG_C, ThresholdModel.MEASURED)


@dataclass(frozen=True)
class Slo:
    """A latency target at a percentile of requests."""

    latency_ms: float
    percentile: float = 95.0

    def __post_init__(self) -> None:
        if not self.latency_ms > 0:
            raise PlanError("slo.latencyMs", f"{self.latency_ms:g} is not > 0", "give it in ms")
        if not self.latency_ms <= MAX_SLO_MS:  # NaN fails too
            raise PlanError(
                "slo.latencyMs",
                f"{self.latency_ms:g} ms is above a day",
                f"give it in ms, at most {MAX_SLO_MS:,.0f}",
            )
        if not 0 < self.percentile < 100:
            raise PlanError("slo.percentile", f"{self.percentile:g} is outside (0, 100)", "use 95")


@dataclass(frozen=True)
class Front:
    """The Pareto front, fastest first."""

    members: tuple[LatencyProfile, ...]


def pareto_front(profiles: Sequence[LatencyProfile], percentile: float = 95.0) -> Front:
    """The profiles not beaten on accuracy, tail latency and mean at once, by mean service time
    (the mean counts beside the tail because under load it is the capacity)."""
    if not profiles:
        raise PlanError("profiles", "none given, so the front is empty", "profile at least one")
    tail = {id(p): p.latency_at(percentile) for p in profiles}
    # Best first: most accurate, then lowest tail, then lowest mean, then input order.
    ranked = sorted(
        enumerate(profiles),
        key=lambda item: (-item[1].accuracy, tail[id(item[1])], item[1].mean_ms, item[0]),
    )
    kept: list[LatencyProfile] = []
    # Every kept profile is at least as accurate as the next one: one kept as fast in the tail
    # beats it if it is also as fast on the mean, or equally accurate.
    for _, profile in ranked:
        if not any(
            tail[id(k)] <= tail[id(profile)]
            and (k.mean_ms <= profile.mean_ms or k.accuracy == profile.accuracy)
            for k in kept
        ):
            kept.append(profile)
    members: list[LatencyProfile] = []
    # By speed, a member no more accurate than a faster one is better only in the tail.
    for profile in sorted(kept, key=lambda p: (p.mean_ms, tail[id(p)])):
        if not members or profile.accuracy > members[-1].accuracy:
            members.append(profile)
    return Front(tuple(members))


def _sum_tail(mean: float, tail: float, services: float) -> float:
    """The percentile of the sum of n service times: n mean + sqrt(n) (p - mean)."""
    return services * mean + math.sqrt(services) * (tail - mean)


@dataclass(frozen=True)
class _Capacity:
    """How fast a pod serving one member (or mix) drains its queue, and its rate limit."""

    holding_mean_ms: float
    holding_tail_ms: float
    servers: int
    rate_limit: Callable[[float], float] | None

    def queue_limit(self, budget_ms: float, model: ThresholdModel) -> int | None:
        """The deepest queue meeting ``budget_ms``."""
        return _queue_limit(
            self.holding_mean_ms, self.holding_tail_ms, budget_ms, model, self.servers
        )


def _member_capacity(
    profile: LatencyProfile, service: _Service, tail: float, plan: Plan
) -> _Capacity:
    """A front member's capacity under the plan's model: M/G/1, M/G/c, or its measured curve."""
    model, percentile, servers = plan.model, plan.slo.percentile, plan.servers
    curve = profile.capacity
    if model is ThresholdModel.MEASURED and curve is not None:
        holding = curve.holding_ms()
        scale = holding / profile.mean_ms
        return _Capacity(
            holding,
            tail * scale,
            curve.servers,
            functools.partial(curve.max_rate, percentile=percentile, idle_ms=tail),
        )
    if model.concurrent:
        # No curve: the analytic M/G/c fallback.
        rate: Callable[[float], float] | None = functools.partial(
            _max_rate, service, percentile=percentile, servers=servers
        )
        return _Capacity(profile.mean_ms, tail, servers, rate)
    rate = (
        functools.partial(_max_rate, service, percentile=percentile) if model.with_rates else None
    )
    return _Capacity(profile.mean_ms, tail, 1, rate)


def _queue_limit(
    mean: float, tail: float, budget_ms: float, model: ThresholdModel, servers: int = 1
) -> int | None:
    """The deepest queue meeting ``budget_ms``: with N waiting, a request waits N / servers service
    times, then takes its own (the tail of a sum of n = N / servers + 1)."""
    if tail > budget_ms + _TOLERANCE:
        return None
    if model is ThresholdModel.PAPER_MEAN:
        # Compared as a float first: the quotient of a vanishing mean is inf, which has no floor.
        paper = servers * (budget_ms - tail) / mean + _TOLERANCE
        return MAX_QUEUE_LIMIT if paper >= MAX_QUEUE_LIMIT else math.floor(paper)

    def meets(depth: int) -> bool:
        return _sum_tail(mean, tail, depth / servers + 1) <= budget_ms + _TOLERANCE

    # n mean + sqrt(n) (p - mean) <= budget is a quadratic in x = sqrt(n); its root written
    # without the cancellation of -b + sqrt(b^2 + 4ac), which loses everything for a tiny mean.
    spread = tail - mean
    discriminant = math.sqrt(spread * spread + 4 * mean * budget_ms)
    root = (
        2 * budget_ms / (spread + discriminant)
        if spread > 0
        else (discriminant - spread) / (2 * mean)
    )
    guess = (root * root - 1) * servers + _TOLERANCE
    depth = MAX_QUEUE_LIMIT if not guess < MAX_QUEUE_LIMIT else max(0, math.floor(guess))
    # The closed form can be off by a step or so in floating point: settle it on the exact
    # condition by bisection between a depth that meets it and one that does not (or the cap),
    # so the search ends within log2(MAX_QUEUE_LIMIT) steps whatever the numbers.
    if meets(depth):
        low, high = depth, min(depth + 1, MAX_QUEUE_LIMIT)
        step = 1
        while high < MAX_QUEUE_LIMIT and meets(high):
            low, step = high, 2 * step
            high = min(high + step, MAX_QUEUE_LIMIT)
        if high == MAX_QUEUE_LIMIT and meets(high):
            return MAX_QUEUE_LIMIT
    else:
        low, high = 0, depth
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low


@dataclass(frozen=True)
class _Service:
    """A service-time distribution as weighted points (s): expectations become dot products."""

    times_s: FloatArray
    weights: FloatArray

    def expect(self, values: FloatArray) -> float:
        """E[values(S)]."""
        return float(values @ self.weights)

    @property
    def mean_s(self) -> float:
        """E[S]."""
        return self.expect(self.times_s)


def _service_grid(profile: LatencyProfile) -> _Service:
    """Service times (s) at evenly spaced probabilities, equally weighted."""
    levels = (np.arange(_GRID) + 0.5) / _GRID
    return _Service(profile.distribution.quantile(levels) / 1000, np.full(_GRID, 1 / _GRID))


def _mixture(shares: Sequence[tuple[LatencyProfile, float]]) -> _Service:
    """The service time of requests dealt to these profiles in these shares."""
    grids = [(_service_grid(profile), share) for profile, share in shares if share > 0]
    return _Service(
        np.concatenate([grid.times_s for grid, _ in grids]),
        np.concatenate([grid.weights * share for grid, share in grids]),
    )


def _violation(service: _Service, rate: float, budget_s: float) -> float:
    """P(latency > budget) in steady state at this Poisson arrival rate (Cramer-Lundberg)."""
    times = service.times_s
    rho = rate * service.mean_s
    if rho >= 1:
        return 1.0
    if rate <= 0:
        return service.expect((times > budget_s).astype(np.float64))

    def excess(gamma: float) -> float:
        # Bracketing may try a gamma far past the root, where exp overflows to inf: inf is
        # the right sign there, so the overflow is no error.
        with np.errstate(over="ignore"):
            return rate * (service.expect(np.exp(gamma * times)) - 1) - gamma

    # excess(0) = 0, excess'(0) = rho - 1 < 0 and excess is convex: one positive root. The
    # heavy-traffic value 2 (1 - rho) / (lambda E[S^2]) is of its order: bracket from there.
    guess = 2 * (1 - rho) / (rate * service.expect(times * times))
    low, high = guess / 2, guess
    while excess(low) >= 0:
        low /= 2
    while excess(high) < 0:
        low, high = high, 2 * high
    gamma = float(brentq(excess, low, high, xtol=_XTOL * guess))
    constant = (1 - rho) / (rate * service.expect(times * np.exp(gamma * times)) - 1)
    slack = budget_s - times
    # exp of the clipped slack: the branch np.where discards must not overflow either.
    tail = np.where(
        slack <= 0, 1.0, np.minimum(1.0, constant * np.exp(-gamma * np.maximum(slack, 0.0)))
    )
    return service.expect(tail)


def _violation_mgc(service: _Service, rate: float, budget_s: float, servers: int) -> float:
    """P(latency > budget) in an M/G/c queue: Erlang C's exponential wait, its decay scaled by
    2 / (1 + cv^2) (Allen-Cunneen; at c = 1 the M/G/1 heavy-traffic exponent)."""
    mean = service.mean_s
    load = rate * mean
    if load >= servers:
        return 1.0
    times = service.times_s
    if rate <= 0:
        return service.expect((times > budget_s).astype(np.float64))
    variability = service.expect(times * times) / (mean * mean) - 1
    decay = (servers / mean - rate) * 2 / (1 + variability)
    waits = erlang_c(servers, load)
    slack = budget_s - times
    tail = np.where(
        slack <= 0, 1.0, np.minimum(1.0, waits * np.exp(-decay * np.maximum(slack, 0.0)))
    )
    return service.expect(tail)


def _max_rate(
    service: _Service, budget_ms: float, *, percentile: float, servers: int | None = None
) -> float:
    """The highest rate keeping the violation within 1 - P/100: M/G/1 (None) or M/G/c."""
    allowed = 1 - percentile / 100
    budget_s = budget_ms / 1000
    if _violation(service, 0.0, budget_s) > allowed:
        return 0.0
    saturation = (servers or 1) / service.mean_s

    def over(rate: float) -> float:
        if servers is None:
            return _violation(service, rate, budget_s) - allowed
        return _violation_mgc(service, rate, budget_s, servers) - allowed

    # Stop just short of saturation, where the tail formula loses precision.
    high = saturation * (1 - 1e-6)
    if over(high) <= 0:
        return high
    return float(brentq(over, 0.0, high, xtol=_XTOL * saturation))


@dataclass(frozen=True)
class Threshold:
    """One front member's slack and queue-depth limits."""

    profile: LatencyProfile
    tail_ms: float
    slack_ms: float
    stay_max_queue: int | None
    enter_max_queue: int | None
    stay_max_qps: float | None = None
    enter_max_qps: float | None = None

    @property
    def eligible(self) -> bool:
        """Whether the policy may ever switch to it (its slack is positive)."""
        return self.slack_ms > 0

    def can_stay(self, queue_depth: float, arrival_qps: float | None = None) -> bool:
        """Whether it meets the SLO with this queue and load (else: switch faster)."""
        return _within(queue_depth, self.stay_max_queue, arrival_qps, self.stay_max_qps)

    def can_enter(self, queue_depth: float, arrival_qps: float | None = None) -> bool:
        """Whether switching to it is safe with this queue and load, slack buffer included."""
        return self.eligible and _within(
            queue_depth, self.enter_max_queue, arrival_qps, self.enter_max_qps
        )


def _within(depth: float, max_depth: int | None, qps: float | None, max_qps: float | None) -> bool:
    """Queue within its limit, and load within its limit when both are known."""
    if max_depth is None or depth > max_depth:
        return False
    return qps is None or max_qps is None or qps <= max_qps


@dataclass(frozen=True)
class Plan:
    """The front with every member's thresholds, for one SLO, slack buffer and model."""

    slo: Slo
    slack_buffer_ms: float
    model: ThresholdModel
    thresholds: tuple[Threshold, ...]
    switch_delay_ms: float = 0.0
    servers: int = 1

    # Worked out once a plan (it never changes): a policy asks for them at every decision.
    @cached_property
    def names(self) -> tuple[str, ...]:
        """Front members' names, fastest first."""
        return tuple(t.profile.name for t in self.thresholds)

    @cached_property
    def eligible(self) -> tuple[int, ...]:
        """Indices of the members the policy may switch to."""
        return tuple(i for i, t in enumerate(self.thresholds) if t.eligible)

    @cached_property
    def _indices(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for i, name in enumerate(self.names):
            found.setdefault(name, i)
        return found

    def index(self, name: str) -> int | None:
        """The index of the member with this name, or None."""
        return self._indices.get(name)


def plan_thresholds(
    front: Sequence[LatencyProfile],
    slo: Slo,
    slack_buffer_ms: float = 50.0,
    model: ThresholdModel = ThresholdModel.TAIL,
    switch_delay_ms: float = 0.0,
    servers: int = 1,
) -> Plan:
    """Each front member's slack L - p_k and its stay / enter queue-depth limits (none with slack:
    PlanError); the queue waits ``switch_delay_ms`` behind the old member: out of the budget."""
    if not front:
        raise PlanError("front", "empty, nothing to switch between", "profile at least one")
    if slack_buffer_ms < 0:
        raise PlanError("slackBufferMs", f"{slack_buffer_ms:g} is negative", "use e.g. 50")
    if not switch_delay_ms >= 0 or not math.isfinite(switch_delay_ms):
        raise PlanError("switchDelayMs", f"{switch_delay_ms:g} is not >= 0", "use e.g. 10")
    if servers < 1:
        raise PlanError("servers", f"{servers} is not >= 1", "give the router's instance count")
    if model is ThresholdModel.MEASURED:
        for profile in front:
            if profile.capacity is not None and profile.capacity.servers != servers:
                raise PlanError(
                    "capacity.servers",
                    f"{profile.name}'s curve was measured at {profile.capacity.servers} router "
                    f"instance(s), the plan serves {servers}",
                    f"profile again at {servers} or plan for {profile.capacity.servers}",
                )
    # The plan's settings, under which each member's thresholds are worked out.
    plan = Plan(slo, slack_buffer_ms, model, (), switch_delay_ms, servers)
    thresholds = []
    for profile in front:
        service, tail = _service_grid(profile), profile.latency_at(slo.percentile)
        capacity = _member_capacity(profile, service, tail, plan)
        thresholds.append(_threshold(profile, capacity, tail, plan))
    if not any(t.eligible for t in thresholds):
        closest = min(thresholds, key=lambda t: t.tail_ms)
        raise PlanError(
            "slo.latencyMs",
            f"{slo.latency_ms:g} ms is below every configuration's p{slo.percentile:g}: the "
            f"closest, {closest.profile.name}, has {closest.tail_ms:.1f} ms "
            f"({closest.tail_ms - slo.latency_ms:.1f} ms over)",
            f"raise the SLO above {closest.tail_ms:.1f} ms or profile faster configurations",
        )
    return replace(plan, thresholds=tuple(thresholds))


def _threshold(profile: LatencyProfile, capacity: _Capacity, tail: float, plan: Plan) -> Threshold:
    """The plan's limits of one member (or mix) with this capacity, p at the SLO ``tail``."""
    slo, delay_ms = plan.slo, plan.switch_delay_ms
    stay_budget, enter_budget = slo.latency_ms, slo.latency_ms - plan.slack_buffer_ms
    rate_limit = capacity.rate_limit if tail < slo.latency_ms else None
    return Threshold(
        profile=profile,
        tail_ms=tail,
        slack_ms=slo.latency_ms - tail,
        stay_max_queue=capacity.queue_limit(stay_budget - delay_ms, plan.model),
        enter_max_queue=capacity.queue_limit(enter_budget - delay_ms, plan.model),
        stay_max_qps=rate_limit(stay_budget) if rate_limit else None,
        enter_max_qps=rate_limit(enter_budget) if rate_limit else None,
    )


def _quantile_ms(service: _Service, percentile: float) -> float:
    """The service time (ms) at this percentile of a weighted distribution."""
    order = np.argsort(service.times_s)
    levels = np.cumsum(service.weights[order])
    at = min(int(np.searchsorted(levels, percentile / 100)), len(order) - 1)
    return float(service.times_s[order][at] * 1000)


@dataclass(frozen=True)
class MixPlan:
    """The mixes of neighbouring eligible members on the weight grid, as a plan of their own."""

    plan: Plan
    mixes: tuple[Mix, ...]

    def index(self, mix: Mix) -> int | None:
        """The member of ``plan`` routing this mix, or None if it is not on the grid."""
        return next((i for i, known in enumerate(self.mixes) if known == mix), None)


def plan_mixes(plan: Plan) -> MixPlan:
    """Every mix of each eligible member with the next eligible one, weights on the grid."""
    eligible = plan.eligible
    mixes: list[Mix] = []
    thresholds: list[Threshold] = []
    for base, blend in itertools.pairwise(eligible):
        for step in range(WEIGHT_STEPS):
            mix = Mix(base, blend, step / WEIGHT_STEPS)
            mixes.append(mix)
            thresholds.append(
                plan.thresholds[base] if mix.blend is None else _mix_threshold(plan, mix)
            )
    mixes.append(Mix(eligible[-1]))
    thresholds.append(plan.thresholds[eligible[-1]])
    return MixPlan(replace(plan, thresholds=tuple(thresholds)), tuple(mixes))


def _mix_threshold(plan: Plan, mix: Mix) -> Threshold:
    """The thresholds of a mix: its service time is the members' in the mix's shares."""
    members = [(plan.thresholds[index].profile, share) for index, share in mix.shares]
    service = _mixture(members)
    (base, _), (blend, weight) = members
    percentiles = {p: _quantile_ms(service, p) for p in (50.0, 95.0, 99.0)}
    mean_ms = service.mean_s * 1000
    profile = LatencyProfile(
        # A label, not a configuration: the policy names its members in reasons and events.
        config={"mix": f"{base.name} + {weight:.0%} {blend.name}"},
        accuracy=sum(p.accuracy * share for p, share in members),
        mean_ms=mean_ms,
        p95_ms=percentiles[95.0],
        p50_ms=percentiles[50.0],
        p99_ms=percentiles[99.0],
        std_ms=math.sqrt(max(service.expect(service.times_s**2) * 1e6 - mean_ms**2, 0.0)),
    )
    tail = _quantile_ms(service, plan.slo.percentile)
    capacity = _member_capacity(profile, service, tail, plan)
    curves = [p.capacity for p, _ in members]
    if plan.model is ThresholdModel.MEASURED and all(curves):
        capacity = _mix_of_curves(members, tail, mean_ms, plan.slo.percentile)
    return _threshold(profile, capacity, tail, plan)


def _mix_of_curves(
    members: Sequence[tuple[LatencyProfile, float]], tail: float, mean_ms: float, percentile: float
) -> _Capacity:
    """A mix of measured members: holding times add in the shares, so rates blend harmonically
    (a mix of shares w_i has rate 1 / sum(w_i / rate_i))."""
    parts = [(p, p.capacity, share) for p, share in members if p.capacity is not None]
    holding = sum(curve.holding_ms() * share for _, curve, share in parts)

    def rate_limit(budget_ms: float) -> float:
        rates = [
            (curve.max_rate(budget_ms, percentile, p.latency_at(percentile)), share)
            for p, curve, share in parts
        ]
        if any(rate <= 0 for rate, _ in rates):
            return 0.0
        return 1 / sum(share / rate for rate, share in rates)

    return _Capacity(holding, tail * holding / mean_ms, parts[0][1].servers, rate_limit)


def plan_from_profiles(
    profiles: Sequence[LatencyProfile],
    slo: Slo,
    slack_buffer_ms: float = 50.0,
    model: ThresholdModel = ThresholdModel.TAIL,
    switch_delay_ms: float = 0.0,
    servers: int = 1,
) -> Plan:
    """The front of these profiles at the SLO's percentile, and its thresholds."""
    front = pareto_front(profiles, slo.percentile).members
    return plan_thresholds(front, slo, slack_buffer_ms, model, switch_delay_ms, servers)
