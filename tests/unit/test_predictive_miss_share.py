"""The predictive strategy's miss shares, worked out from parts kept across calls, equal to the
bit those of the plain computation (one gather, one cumulative pass per call) they replace."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from compass.domain.capacity import CapacityCurve, CurvePoint
from compass.domain.mix import Mix
from compass.domain.planner import Plan, Slo, ThresholdModel, plan_thresholds
from compass.domain.policy import Decision, Observation
from compass.domain.predictive import (
    HORIZON_S,
    PATHS,
    SURGE_FACTOR,
    SURGE_S,
    Predictive,
    fifo_starts,
)
from compass.domain.profiles import LatencyProfile
from compass_dev.scenarios import normal_profile as profile

FRONT = [
    profile("fast", 0.70, 100, 15),
    profile("mid", 0.80, 150, 20),
    profile("slow", 0.90, 250, 30),
]
PLAN = plan_thresholds(FRONT, Slo(1000), 50, ThresholdModel.TAIL)


def slow_pod(member: LatencyProfile) -> LatencyProfile:
    """The member on a pod whose capacity curve says a busy pod holds a request twice as long."""
    drain = 1000 / (2 * member.mean_ms)
    points = (
        CurvePoint(drain / 2, drain / 2, member.mean_ms, ((50.0, member.mean_ms),)),
        CurvePoint(2 * drain, drain, 5000.0, ((50.0, 5000.0),), growing=True),
    )
    return dataclasses.replace(member, capacity=CapacityCurve(1, points))


STRETCHED = replace(
    PLAN,
    thresholds=tuple(dataclasses.replace(t, profile=slow_pod(t.profile)) for t in PLAN.thresholds),
)


def plain_miss_share(
    policy: Predictive, mix: Mix, rate: float, ahead: int, active: Mix, surge: bool, clump: float
) -> float:
    """Predictive._miss_share as it was before its parts were kept (the reference)."""
    paths = policy.paths
    servers = max(policy.plan.servers, 1)
    surge_s = min(SURGE_S, HORIZON_S) if surge else 0.0
    expected = rate * (HORIZON_S + (SURGE_FACTOR - 1) * surge_s)
    spread = math.sqrt((2 * clump - 1) * expected)
    count = min(math.ceil(expected + 4 * spread + 3), paths.requests - ahead)
    members = paths.dealt(mix)[: ahead + count]
    requests = np.arange(ahead + count)
    drawn = np.stack([paths.service_row(m) for m in range(len(policy.plan.thresholds))])
    service = drawn[members, :, requests].T.astype(np.float64)
    stretch = paths.stretch
    holding = service if stretch is None else service * stretch[members]
    active_mean_s = (
        sum(policy.plan.thresholds[m].profile.mean_ms * share for m, share in active.shares) / 1000
    )
    busy = 1.0 if ahead else min(1.0, rate * active_mean_s / servers)
    free = np.full((PATHS, servers), 0.5 * busy * active_mean_s)
    gaps = paths.gaps[:, :count]
    if clump > 1:
        joins = paths.joins[:, :count] >= 1 / clump
        joins[:, 0] = False
        gaps = np.where(joins, np.float32(0), gaps * np.float32(clump))
    unit = np.cumsum(gaps, axis=1, dtype=np.float64)
    in_surge = SURGE_FACTOR * rate * surge_s
    arrivals = np.where(
        unit < in_surge, unit / (SURGE_FACTOR * rate), surge_s + (unit - in_surge) / rate
    )
    starts = fifo_starts(free, holding[:, :ahead], arrivals, holding[:, ahead:])
    inside = arrivals < HORIZON_S
    late = (starts - arrivals + service[:, ahead:]) > policy.plan.slo.latency_ms / 1000
    total = int(inside.sum())
    return float((inside & late).sum()) / total if total else 0.0


class PlainPredictive(Predictive):
    """The strategy with the reference computation."""

    def _miss_share(
        self, mix: Mix, rate: float, ahead: int, active: Mix, surge: bool, clump: float
    ) -> float:
        return plain_miss_share(self, mix, rate, ahead, active, surge, clump)


@pytest.mark.parametrize(
    "plan",
    [PLAN, STRETCHED, replace(PLAN, servers=2), replace(PLAN, servers=3)],
    ids=["one instance", "slow pod", "two instances", "three instances"],
)
def test_kept_parts_give_the_plain_miss_shares_to_the_bit(plan: Plan) -> None:
    """Many random inputs (rates from a trickle to past the kept requests, queues, surges,
    clumps, every mix), in an order that makes the kept parts grow and be cut again."""
    policy = Predictive(plan)
    short = Predictive(plan, risk=0.2)
    rng = np.random.default_rng(11)
    for _ in range(600):
        judged = short if rng.uniform() < 0.2 else policy
        mix = judged.positions[rng.integers(len(judged.positions))]
        active = judged.positions[rng.integers(len(judged.positions))]
        rate = float(np.exp(rng.uniform(np.log(0.02), np.log(60.0))))
        ahead = int(rng.choice([0, 0, 0, 1, 3, 17, 400, 1990]))
        surge = bool(rng.uniform() < 0.5)
        clump = 1.0 if rng.uniform() < 0.6 else float(rng.uniform(1.0, 6.0))
        kept = judged._miss_share(mix, rate, ahead, active, surge, clump)
        plain = plain_miss_share(judged, mix, rate, ahead, active, surge, clump)
        assert kept == plain, (mix, rate, ahead, active, surge, clump)


def test_decisions_are_those_of_the_plain_computation() -> None:
    """Policies on their own moving Poisson loads and queues decide exactly as with the plain
    computation (the miss shares kept per front emptied between the two)."""

    def decisions(kind: type[Predictive]) -> list[Decision]:
        rng = np.random.default_rng(3)
        policies = [kind(plan) for plan in (PLAN, STRETCHED, PLAN, PLAN)]
        for policy in policies:
            policy.paths.miss_shares.clear()
        states = [p.initial_state(0.0) for p in policies]
        qps = rng.uniform(0.3, 8.0, len(policies))
        totals = np.zeros(len(policies))
        made = []
        for t in range(1, 81):
            totals += rng.poisson(qps)
            for i, policy in enumerate(policies):
                queue = float(rng.integers(1, 6)) if rng.uniform() < 0.15 else 0.0
                seen = Observation(float(t), queue, arrivals_total=float(totals[i]))
                decision, states[i] = policy.decide(seen, states[i], float(t))
                made.append(decision)
        return made

    kept, plain = decisions(Predictive), decisions(PlainPredictive)
    assert kept == plain
    assert len({d.mix for d in kept}) > 3  # the loads move it along the hull


# Two members of a few tens of ms and an SLO a few of their requests in a row still fit (the
# operator benches' rag-sim front): the bound that no request can miss holds for a trickle and
# not for a load, so both sides of it are met.
TIGHT = plan_thresholds(
    [profile("fast", 0.83, 20.5, 1.5), profile("accurate", 0.86, 33.5, 2.5)],
    Slo(150),
    50,
    ThresholdModel.TAIL,
)


@pytest.mark.parametrize("plan", [TIGHT, PLAN, STRETCHED], ids=["tight SLO", "loose", "slow pod"])
def test_a_trickle_is_judged_without_its_arrivals_and_as_the_plain_computation(
    plan: Plan,
) -> None:
    """Idle-started miss shares from a trickle to a load: those the bound answers (no arrival
    times drawn) are 0 as the plain computation finds them, the rest are worked out in full."""
    policy = Predictive(plan)
    rng = np.random.default_rng(5)
    bounded = worked = 0
    for _ in range(400):
        mix = policy.positions[rng.integers(len(policy.positions))]
        active = policy.positions[rng.integers(len(policy.positions))]
        rate = float(np.exp(rng.uniform(np.log(0.005), np.log(20.0))))
        surge = bool(rng.uniform() < 0.5)
        policy.paths._arrivals.clear()
        share = policy._miss_share(mix, rate, 0, active, surge, 1.0)
        assert share == plain_miss_share(policy, mix, rate, 0, active, surge, 1.0), (mix, rate)
        if len(policy.paths._arrivals) == 0:
            assert share == 0.0
            bounded += 1
        else:
            worked += 1
    assert bounded > 50
    assert worked > 50


def test_the_bound_gives_way_just_below_a_trickles_longest_latency() -> None:
    """SLOs every 2 ms across a trickle's latencies: where the plain computation first counts
    a miss, the bound (within a few ms of the longest latency when only a request or two of a
    path falls inside the horizon) must already have given way."""
    positions = Predictive(TIGHT).positions
    mixes = [positions[0], positions[len(positions) // 2], positions[-1]]
    missed = 0
    for slo_ms in range(20, 122, 2):
        policy = Predictive(replace(TIGHT, slo=Slo(float(slo_ms))))
        for mix, rate, surge in itertools.product(mixes, (0.01, 0.05, 0.2, 1.0), (False, True)):
            share = policy._miss_share(mix, rate, 0, positions[-1], surge, 1.0)
            plain = plain_miss_share(policy, mix, rate, 0, positions[-1], surge, 1.0)
            assert share == plain, (slo_ms, mix, rate, surge)
            missed += plain > 0
    assert missed > 0


def test_the_bounds_parts_are_what_they_say() -> None:
    """rows_before: the leading rows with some path's unit-rate arrival before the time;
    reach: the longest holding-before-plus-service of any request up to each, on any path."""
    policy = Predictive(TIGHT)
    paths = policy.paths
    unit = np.cumsum(paths.gaps.astype(np.float64), axis=1)  # paths x requests
    for time in (0.0, 0.004, 0.02, 0.3, 1.0, 2.5, 7.0):
        rows = paths.rows_before(time)
        assert bool((unit[:, :rows] < time).any(axis=0).all())
        assert rows == paths.requests or not bool((unit[:, rows] < time).any())
    mix = policy.positions[len(policy.positions) // 2]
    service, before = paths.served(mix, 40)
    longest = np.maximum.accumulate((service + before).max(axis=1))
    assert [paths.reach(mix, r) for r in (1, 7, 40)] == [longest[0], longest[6], longest[39]]
    assert paths.reach(mix, 1) < paths.reach(mix, 40)
