"""Per-request binding behind a gate of several slots: a request is judged at the concurrency it
runs at (each configuration's time stretched by its capacity curve, the contended pod model), in
compass_rules once and in the simulator's bound pods; one slot is unchanged; plans default the
slots from the front's curves."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from compass.api.binding import BindingSettings, RouterGate
from compass.conversion import binding_table, planned_gate, spec_for_plan
from compass.domain.arrivals import Scenario, make_pattern
from compass.domain.binding import BindingVerdict, bind_stage, router_table, stage_plan
from compass.domain.boundpod import BindingRule, bound_pods
from compass.domain.capacity import CapacityCurve, CurvePoint
from compass.domain.planner import Slo, plan_from_profiles
from compass.domain.podmodel import PodModel, planned_slots
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import StaticController, simulate
from compass_rules import binding as rules

STAGES = (("model",),)
SLOTS = 4
# With all four slots running, each configuration takes 2.5 times its own time.
STRETCH = 2.5


def batching(profile: LatencyProfile, stretch: float, slots: int = SLOTS) -> LatencyProfile:
    """The profile with a saturated curve measured at ``slots``: a request holds a slot
    ``stretch`` times its mean once all are busy."""
    drain_qps = slots / (stretch * profile.mean_ms / 1000)
    levels = tuple((p, m * profile.mean_ms) for p, m in ((50.0, 10), (95.0, 20), (99.0, 30)))
    point = CurvePoint(2 * drain_qps, drain_qps, 10 * profile.mean_ms, levels, True)
    return replace(profile, capacity=CapacityCurve(slots, (point,)))


def member(name: str, accuracy: float, mean_ms: float) -> LatencyProfile:
    return LatencyProfile({"model": name}, accuracy, mean_ms, mean_ms * 1.1, p50_ms=mean_ms)


FAST = batching(member("fast", 0.5, 100.0), STRETCH)
ACCURATE = batching(member("accurate", 0.9, 300.0), STRETCH)


def contended_table(slots: int) -> dict[str, Any]:
    """The two members' table as a router reads it, at ``slots`` slots."""
    plan = stage_plan([FAST, ACCURATE], STAGES, quantile=0.5, prior_shares=None)
    plan = replace(
        plan, slots=slots, stretch=tuple(p.slot_stretch(slots) for p in (FAST, ACCURATE))
    )
    sent = router_table(plan, [[]], slo_ms=500.0)
    return rules.check_binding(json.loads(json.dumps(sent)))


def test_the_rule_binds_faster_where_the_accurate_time_at_four_running_misses() -> None:
    """Alone the accurate member's 300 ms fits 400 ms left; with four pipelines running it
    takes 750 ms, so the request binds the fast one (250 ms); at 1 slot nothing changes."""
    table = contended_table(SLOTS)
    chosen = []
    for running in (1, 4):
        view, backlog = rules.pipeline_view(table, running, [123.0])
        # The slots' sharing is the stretch: no component queue counted besides.
        assert list(backlog) == [0.0]
        chosen.append(rules.bind_stage(view, 0, {}, 400.0, backlog))
    (alone, alone_verdict, alone_ms), (busy, busy_verdict, busy_ms) = chosen
    assert (alone, alone_verdict, alone_ms) == (1, rules.FITS, pytest.approx(300.0))
    assert (busy, busy_verdict, busy_ms) == (0, rules.FITS, pytest.approx(250.0))
    # One slot: the table is itself, and its backlog counts.
    single = contended_table(1)
    assert rules.pipeline_view(single, 4, [123.0]) == (single, [123.0])
    assert rules.at_concurrency(single, 4) is single


def test_the_factor_is_linear_from_one_alone_to_the_stretch_with_every_slot_busy() -> None:
    stretch = np.array([1.0, 2.5])
    factors = [rules.concurrency_factor(stretch, k, SLOTS).tolist() for k in (0, 1, 2, 4, 9)]
    assert factors == [[1.0, 1.0], [1.0, 1.0], [1.0, 1.5], [1.0, 2.5], [1.0, 2.5]]
    assert rules.concurrency_factor(stretch, 4, 1).tolist() == [1.0, 1.0]


def test_the_domain_plan_at_a_concurrency_is_the_routers_table_at_it() -> None:
    """Rules live once: the simulator's plan and the router's table agree at every count."""
    plan = stage_plan([FAST, ACCURATE], STAGES, quantile=0.5, prior_shares=None)
    plan = replace(plan, slots=SLOTS, stretch=(STRETCH, STRETCH))
    table = contended_table(SLOTS)
    for running in range(1, SLOTS + 1):
        domain = plan.at_concurrency(running)
        router = rules.at_concurrency(table, running)
        assert np.allclose(domain.table["arrays"]["stage_ms"], router["arrays"]["stage_ms"])
        verdict = bind_stage(domain, 0, {}, 400.0, [0.0])
        assert verdict.config == rules.bind_stage(router, 0, {}, 400.0, [0.0])[0]
        assert verdict.verdict is BindingVerdict.FITS


@pytest.mark.parametrize(
    ("change", "field"),
    [({"slots": 0}, "slots 0"), ({"slots": True}, "slots True"), ({"stretch": 0.5}, "stretch")],
)
def test_a_bad_slot_count_or_stretch_is_refused_by_name(change: dict[str, Any], field: str) -> None:
    plan = stage_plan([FAST, ACCURATE], STAGES, quantile=0.5, prior_shares=None)
    sent: dict[str, Any] = json.loads(json.dumps(router_table(plan, [[]], slo_ms=500.0)))
    if "stretch" in change:
        sent["configs"][0]["stretch"] = change["stretch"]
    else:
        sent.update(change)
    with pytest.raises(ValueError, match=f"binding: .*{field}"):
        rules.check_binding(sent)


def run_burst(slots: int, stretch: float) -> tuple[list[int], list[float]]:
    """Four requests at once on a contended pod of ``slots`` slots whose members stretch by
    ``stretch`` with all busy: each one's configuration (0 fast, 1 accurate) and latency, ms."""
    front = [batching(FAST, stretch, slots), batching(ACCURATE, stretch, slots)]
    rule = BindingRule(stages=STAGES, prior_shares=None, quantile=0.5)
    arrivals = np.zeros(4)
    service_s = np.array([[0.1] * 4, [0.3] * 4])
    record = (np.zeros(4), np.zeros(4), np.zeros(4, dtype=np.int64))
    (pod,) = bound_pods(
        rule,
        front,
        PodModel(slots, contended=slots > 1),
        500.0,
        [np.arange(4)],
        arrivals,
        service_s,
        record,
    )
    pod.drain()
    return record[2].tolist(), (record[1] * 1000).round(6).tolist()


def test_the_bound_pod_runs_four_slots_at_their_contended_times_and_binds_to_fit() -> None:
    """Four at once on four slots: the first two fit the accurate member (300, 450 ms), the
    last two would take 600 and 750 ms on it, so bind the fast one (200, 250 ms): all in time.
    Judged as if alone (no stretch) all four bind the accurate member and two end late."""
    configs, latencies = run_burst(SLOTS, STRETCH)
    assert configs == [1, 1, 0, 0]
    assert latencies == pytest.approx([300.0, 450.0, 200.0, 250.0])
    # A pod that serves four at once in one's time: nothing stretches, all accurate.
    configs, latencies = run_burst(SLOTS, 1.0)
    assert configs == [1, 1, 1, 1]
    assert max(latencies) == pytest.approx(300.0)


def test_one_slot_serves_one_at_a_time_as_before() -> None:
    configs, latencies = run_burst(1, STRETCH)
    # 300 fits the first; the next starts at 300 and only the fast one (400) fits.
    assert configs[:2] == [1, 0]
    assert latencies[:2] == pytest.approx([300.0, 400.0])


def test_the_slots_default_from_a_batching_front_and_stay_one_without_curves() -> None:
    assert planned_slots([FAST, ACCURATE]) == SLOTS
    # A curve at four where the pod serves barely more than one at a time: one slot.
    serial = [batching(member("fast", 0.5, 100.0), 3.6), ACCURATE]
    assert planned_slots(serial) == 1
    plain = [member("fast", 0.5, 100.0), member("accurate", 0.9, 300.0)]
    assert planned_slots(plain) == 1
    plan = plan_from_profiles([FAST, ACCURATE], Slo(1000.0), 50.0)
    spec = spec_for_plan(plan)
    assert (spec.binding.gate.instances, spec.binding.gate.slots) == (7 + SLOTS, SLOTS)
    # The table the routers get carries the slots and each member's stretch.
    table = binding_table(spec, plan)
    assert table is not None
    assert table["slots"] == SLOTS
    assert [c["stretch"] for c in table["configs"]] == pytest.approx([STRETCH, STRETCH])
    # A gate a person set is theirs.
    mine = BindingSettings(gate=RouterGate(instances=3, slots=2))
    assert planned_gate(mine, [FAST, ACCURATE]) is mine
    # Without curves the gate stays the shipped one, and the table one slot.
    plain_plan = plan_from_profiles(plain, Slo(1000.0), 50.0)
    plain_spec = spec_for_plan(plain_plan)
    assert plain_spec.binding.gate.slots == 1
    plain_table = binding_table(plain_spec, plain_plan)
    assert plain_table is not None
    assert plain_table["slots"] == 1


def test_without_a_curve_static_fastest_and_binding_share_the_pod_by_one_rule() -> None:
    """A contended pod of four slots whose member has no capacity curve: both the static
    baseline and binding take it to serve as one (slot_stretch: the k-th of four at once takes
    k times its time), so neither is judged on a slowdown the other is spared."""
    fast = member("fast", 0.5, 100.0)
    assert fast.slot_stretch(SLOTS) == SLOTS
    trace = make_pattern("trace", 1.0, 1.0, trace_s=[0.0] * 4)
    # Luck at the median: each request's own time is the member's 100 ms.
    scenario = Scenario(trace, 0, np.zeros(4), np.full(4, 0.5))
    pod = PodModel(SLOTS, contended=True)
    static = simulate(StaticController("fast", 0), [fast], scenario, 1000.0, pod_model=pod)
    rule = BindingRule(stages=STAGES, prior_shares=None, quantile=0.5)
    bound = simulate(rule, [fast], scenario, 1000.0, pod_model=pod)
    expected = [100.0, 200.0, 300.0, 400.0]
    assert sorted(static.latencies_ms.tolist()) == pytest.approx(expected)
    assert sorted(bound.latencies_ms.tolist()) == pytest.approx(expected)
