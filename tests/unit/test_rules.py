"""compass_rules, the serving rules the router and the domain share: late binding's table as
a switch sends it (checked, and deciding as the plan it came from), the followers' slacks and
the joint plan, the lag cap, a one-stage table bound whole at take-up, admission at dispatch,
routing keys."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass.domain.binding import (
    RAG_SIM_COMPONENTS,
    RAG_SIM_SHARES,
    BindingVerdict,
    bind_stage,
    joint_options,
    remaining_ms,
    router_table,
    stage_plan,
)
from compass.domain.profiles import parse_profiles
from compass_rules import binding as rules
from compass_rules import followers
from compass_rules.admission import DROP, FASTEST, SERVE, check_admission, dispatch_verdict
from compass_rules.binding import MAX_SETTLE_MS, allowed_at, check_binding
from compass_rules.followers import follower_slacks_ms, joint_spare_ms, polled_followers_left_ms
from compass_rules.routing import (
    MIX_PREFIX,
    config_key,
    quantize_weight,
    routing_key,
    tables_digest,
)

PROFILES = (
    Path(__file__).resolve().parents[2] / "bench/data/compass-paper/planner_latency_profiles.json"
)


@pytest.fixture(scope="module")
def plan() -> Any:
    profiles = parse_profiles(json.loads(PROFILES.read_text(encoding="utf-8")))
    return stage_plan(profiles, quantile=0.95, prior_shares=RAG_SIM_SHARES)


def table(plan: Any, refuse: bool = False, **settings: Any) -> dict[str, Any]:
    """The plan as the control model stores it (JSON), checked as the router reads it."""
    sent = router_table(plan, RAG_SIM_COMPONENTS, refuse=refuse, **settings)
    return check_binding(json.loads(json.dumps(sent)))


def _random_case(
    rng: np.random.Generator, plan: Any, low_ms: float, high_ms: float
) -> tuple[int, int, dict[str, Any], float, list[float]]:
    """A random binding case on ``plan``: the stage bound, the stage reached (at or before it),
    what is bound before it (one configuration's values), the time left (uniform in
    [low_ms, high_ms]) and each component's backlog (often none)."""
    stage = int(rng.integers(0, 3))
    at = int(rng.integers(0, stage + 1))
    anchor = plan.configs[int(rng.integers(0, len(plan.configs)))].config
    bound = {n: anchor[n] for names in plan.stages[:stage] for n in names}
    left = float(rng.uniform(low_ms, high_ms))
    backlog = [float(x) for x in rng.exponential(80, 3) * rng.integers(0, 2, 3)]
    return stage, at, bound, left, backlog


def test_a_table_as_sent_decides_as_the_plan_it_came_from(plan: Any) -> None:
    """The JSON a switch sends (canonical keys, floats through JSON) binds as the domain's
    plan binds: the wire form loses nothing a decision reads."""
    rng = np.random.default_rng(7)
    checked = table(plan, refuse=True)
    limits = [None, *(float(x) for x in rng.uniform(1, 10, len(plan.configs) - 1))]
    limited = table(plan, refuse=True, max_qps=limits)
    assert limited["max_qps"] == limits
    verdicts = set()
    for _ in range(400):
        stage, at, bound, left, backlog = _random_case(rng, plan, -100, 900)
        for spare in (math.inf, 0.0):  # 0: a request that waited long, its fastest completion
            expected = bind_stage(
                plan, stage, bound, left, backlog, spare_ms=spare, refuse=stage == 0, at=at
            )
            chosen, verdict, remaining = rules.bind_stage(
                checked, stage, bound, left, backlog, None, at, spare, stage == 0
            )
            assert (chosen, verdict) == (expected.config, expected.verdict)
            assert remaining == pytest.approx(expected.remaining_ms)
            verdicts.add(verdict)
        # With the slow loop's rate limits, at a rate drawn for this request.
        allowed = allowed_at(limited["max_qps"], float(rng.uniform(0, 12)))
        expected = bind_stage(plan, stage, bound, left, backlog, allowed=allowed, at=at)
        chosen, _, _ = rules.bind_stage(limited, stage, bound, left, backlog, allowed, at)
        assert chosen == expected.config
    assert verdicts == {BindingVerdict.FITS, BindingVerdict.FASTEST, BindingVerdict.REFUSED}


def test_a_bad_table_is_refused_naming_what_is_wrong(plan: Any) -> None:
    good = router_table(plan, RAG_SIM_COMPONENTS)
    with pytest.raises(ValueError, match="one model per stage"):
        check_binding({**good, "components": ["retriever"]})
    short = dict(good["configs"][0], stage_ms=[1.0])  # type: ignore[index, call-overload]
    with pytest.raises(ValueError, match="stage_ms"):
        check_binding({**good, "configs": [short]})
    with pytest.raises(ValueError, match="configs must hold"):
        check_binding({**good, "configs": []})
    with pytest.raises(ValueError, match="slo_ms"):
        check_binding({**good, "slo_ms": -1})
    with pytest.raises(ValueError, match="degrade_after"):
        check_binding({**good, "degrade_after": 0.25})
    timed = check_binding({**good, "slo_ms": 1000.0, "degrade_after": 0.25})
    assert (timed["slo_ms"], timed["degrade_after"]) == (1000.0, 0.25)

    with pytest.raises(ValueError, match="lag_share"):
        check_binding({**good, "lag_share": 0.3})
    with pytest.raises(ValueError, match="lag_share"):
        check_binding({**good, "slo_ms": 1000.0, "lag_share": 1.5})
    with pytest.raises(ValueError, match="lag_reserve"):
        check_binding({**good, "slo_ms": 1000.0, "lag_share": 0.3, "lag_reserve": -1})
    capped = check_binding({**good, "slo_ms": 1000.0, "lag_share": 0.3, "lag_reserve": 2})
    assert (capped["lag_share"], capped["lag_reserve"]) == (0.3, 2)
    # A table from before the lag cap has none: today's binding.
    assert check_binding(good)["lag_share"] is None

    # The settle at a free pipeline: none unless the table asks, at most the domain's bound.
    assert check_binding(good)["settle_ms"] == 0.0
    assert check_binding({**good, "settle_ms": 3})["settle_ms"] == 3.0
    assert check_binding({**good, "settle_ms": MAX_SETTLE_MS})["settle_ms"] == MAX_SETTLE_MS
    for bad in (-1, MAX_SETTLE_MS + 0.5, True, "3"):
        with pytest.raises(ValueError, match="settle_ms"):
            check_binding({**good, "settle_ms": bad})


def test_the_lag_cap_on_a_table_is_the_simulators(plan: Any) -> None:
    """The lag cap on a table (its quickest likely completion now against static fastest's
    start, ns since the epoch) against the bound pods' terms (finish times on its clock from 0):
    the same spare on random cases, and decisions the uncapped rule does not make."""
    rng = np.random.default_rng(43)
    slo_ms, share, reserve = 1000.0, 0.3, 2
    sent = router_table(
        plan, RAG_SIM_COMPONENTS, slo_ms=slo_ms, lag_share=share, lag_reserve=reserve
    )
    checked = check_binding(json.loads(json.dumps(sent)))
    assert checked["lag_share"] == share
    fastest = plan.configs[plan.fastest()]
    fastest_likely = sum(fastest.stage_admit_ms or fastest.stage_ms)
    cap = share * max(slo_ms - reserve * fastest_likely, 0.0)
    base = 1_700_000_000 * 10**9
    differs = 0
    for _ in range(400):
        stage, at, bound, left, backlog = _random_case(rng, plan, 0, 1500)
        # The simulator's clock starts at 0, the router's is the epoch's.
        now_ns = base + int(rng.integers(0, 10**12))
        static_start_ns = now_ns - int(rng.uniform(-300, 600) * 1e6)
        # the bound pods' rule: its quickest likely completion from where it is, against when
        # static fastest would finish it.
        quickest_likely = min(
            remaining_ms(plan.configs[i], at, backlog, admitting=True)
            for i in plan.consistent(bound)
        )
        spare = followers.lag_room_ms(
            cap,
            (now_ns - base) / 1e6
            + quickest_likely
            - ((static_start_ns - base) / 1e6 + fastest_likely),
        )
        expected = bind_stage(plan, stage, bound, left, backlog, spare_ms=spare, at=at)
        table_spare = followers.lag_spare_ms(checked, bound, at, backlog, now_ns, static_start_ns)
        assert table_spare == pytest.approx(spare, abs=1e-6)
        chosen, _, _ = rules.bind_stage(
            checked, stage, bound, left, backlog, at=at, spare_ms=table_spare
        )
        assert chosen == expected.config
        differs += rules.bind_stage(checked, stage, bound, left, backlog, at=at)[0] != chosen
    # The cap decides: without it, the router binds otherwise in many of these cases.
    assert differs > 40
    # No cap in the table, or no schedule for the request: no limit.
    uncapped = table(plan)
    assert followers.lag_spare_ms(uncapped, {}, 0, [0.0] * 3, now_ns, static_start_ns) == math.inf
    assert followers.lag_spare_ms(checked, {}, 0, [0.0] * 3, now_ns, None) == math.inf


def _domain_slacks(
    plan: Any,
    bound: dict[str, Any],
    at: int,
    backlog: list[float],
    followers_left: list[float],
    servers: int,
) -> list[float | None]:
    """The followers' slacks as the bound pods count them for a request at stage ``at``."""
    consistent = [plan.configs[i] for i in plan.consistent(bound)]
    fastest = plan.configs[plan.fastest()]
    return follower_slacks_ms(
        min(remaining_ms(c, at, backlog) for c in consistent),
        followers_left,
        fastest.total_ms,
        servers,
        likely=(
            min(remaining_ms(c, at, backlog, admitting=True) for c in consistent),
            sum(fastest.stage_admit_ms or fastest.stage_ms),
        ),
    )


def test_a_table_spares_counted_followers_as_the_simulator_counts_them(plan: Any) -> None:
    """slacks_behind_ms on a table against the bound pods' terms on the plan, and the spare
    changes decisions."""
    rng = np.random.default_rng(11)
    checked = table(plan)
    changed = 0
    for _ in range(300):
        stage, at, bound, left, backlog = _random_case(rng, plan, 0, 2000)
        count = int(rng.integers(0, 12))
        servers = int(rng.integers(1, 4))
        # Behind a gate (half the draws): followers seen at it, each arrived after the last;
        # without one, the poller's count, each with the request's own time left.
        gate = sorted(float(x) for x in left + rng.uniform(0, 500, int(rng.integers(0, 8))))
        followers_left = gate if rng.integers(0, 2) else polled_followers_left_ms(count, left)
        slacks = _domain_slacks(plan, bound, at, backlog, followers_left, servers)
        spare = min((x for x in slacks if x is not None), default=math.inf)
        routed_slacks = followers.slacks_behind_ms(
            checked, bound, at, backlog, followers_left, servers
        )
        routed = min((x for x in routed_slacks if x is not None), default=math.inf)
        assert routed == pytest.approx(spare) if math.isfinite(spare) else math.isinf(routed)
        expected = bind_stage(plan, stage, bound, left, backlog, spare_ms=spare, at=at)
        chosen, _, _ = rules.bind_stage(
            checked, stage, bound, left, backlog, at=at, spare_ms=routed
        )
        assert chosen == expected.config
        changed += chosen != bind_stage(plan, stage, bound, left, backlog, at=at).config
    # The followers changed some decisions: the check above is not vacuous.
    assert changed > 10


def test_a_follower_met_to_the_last_bits_of_rounding_counts() -> None:
    # A follower with 240 ms left behind a request of 120 ms, its own fastest 120 ms: an exact
    # tie as the simulator reaches it (a least-squares fit of 120 ms, deadlines from float
    # seconds) counts on any machine's rounding; a microsecond short does not.
    left = (0.01 + 0.7 - (0.01 + 0.46)) * 1000  # 239.99999999999994
    fitted = 120 - 1.5e-14
    [counted] = follower_slacks_ms(fitted, [left], fitted)
    assert counted == pytest.approx(0.0, abs=1e-9)
    assert follower_slacks_ms(120.0, [left - 1e-3], 120.0) == [None]


def test_a_table_plans_with_its_followers_as_the_plan_does(plan: Any) -> None:
    """The joint plan on a table as sent against the same on the domain's plan, and it spares
    less than the greedy rule where the followers can use the slack better."""
    rng = np.random.default_rng(13)
    limits = [None, *(float(x) for x in rng.uniform(1, 10, len(plan.configs) - 1))]
    checked = table(plan, max_qps=limits)
    changed = 0
    for _ in range(300):
        _, at, bound, left, backlog = _random_case(rng, plan, 0, 2000)
        allowed = allowed_at(limits, float(rng.uniform(0, 12))) if rng.integers(0, 2) else None
        servers = int(rng.integers(1, 3))
        gate = sorted(float(x) for x in left + rng.uniform(-100, 600, int(rng.integers(1, 8))))
        budget = float(rng.choice([math.inf, float(rng.uniform(0, 400))]))
        slacks = _domain_slacks(plan, bound, at, backlog, gate, servers)
        routed_slacks = followers.slacks_behind_ms(checked, bound, at, backlog, gate, servers)
        assert routed_slacks == [None if x is None else pytest.approx(x) for x in slacks]
        own, theirs = joint_options(plan, bound, at, left, backlog, allowed)
        routed_own, routed_theirs = followers.joint_options(
            checked, bound, at, left, backlog, allowed
        )
        for routed_options, options in ((routed_own, own), (routed_theirs, theirs)):
            assert np.allclose(sorted(map(tuple, routed_options)), sorted(options))
        spare = joint_spare_ms(own, theirs, slacks, servers, budget)
        routed = followers.joint_spare_ms(routed_own, routed_theirs, routed_slacks, servers, budget)
        assert routed == pytest.approx(spare) if math.isfinite(spare) else math.isinf(routed)
        greedy = min((x for x in slacks if x is not None), default=math.inf)
        # Never more than the followers' least slack; often less where they can use it.
        assert spare <= greedy
        changed += spare < min(greedy, budget)
    assert changed > 10


def test_a_one_stage_table_with_no_component_model_binds_whole() -> None:
    """``components: [[]]``: the configuration is one stage, bound at take-up (allowed only
    where the table has one stage)."""
    sent = {
        "stages": [["a", "b"]],
        "components": [[]],
        "configs": [
            {"config": '{"a": 0, "b": 1.0}', "accuracy": 0.7, "stage_ms": [100.0]},
            {"config": '{"a": 1, "b": 1.0}', "accuracy": 0.9, "stage_ms": [400.0]},
        ],
    }
    whole = check_binding(sent)
    assert whole["whole"]
    assert whole["stage_of_model"] == {}
    assert whole["configs"][0][0] == {"a": 0, "b": 1}
    # The most accurate whose time fits what is left, else the fastest.
    assert rules.bind_stage(whole, 0, {}, 500.0, [0.0])[:2] == (1, rules.FITS)
    assert rules.bind_stage(whole, 0, {}, 500.0, [200.0])[:2] == (0, rules.FITS)
    assert rules.bind_stage(whole, 0, {}, 50.0, [0.0])[:2] == (0, rules.FASTEST)
    assert not check_binding({**sent, "components": ["m"]})["whole"]
    two = {**sent, "stages": [["a"], ["b"]], "components": [[], "m"]}
    two["configs"] = [dict(c, stage_ms=[50.0, 50.0]) for c in sent["configs"]]
    with pytest.raises(ValueError, match="empty list only where the table has one stage"):
        check_binding(two)
    with pytest.raises(ValueError, match="empty list only where the table has one stage"):
        check_binding({**two, "components": [[], []]})
    with pytest.raises(ValueError, match="one model per stage"):
        check_binding({**sent, "components": []})


def test_admission_at_dispatch_serves_degrades_or_refuses_by_what_is_left() -> None:
    # Routed 80 ms, fastest 30 ms; past 200 ms left nothing waited long.
    def verdict(left_ms: float, refuse: bool = True) -> str:
        return dispatch_verdict(left_ms, 80.0, 30.0, 200.0, refuse)

    assert verdict(300.0) == SERVE
    # It waited long: the fastest, which shortens the queue behind it.
    assert verdict(150.0) == FASTEST
    assert verdict(50.0) == FASTEST
    assert verdict(20.0) == DROP
    assert verdict(20.0, refuse=False) == FASTEST
    table = check_admission(
        {"quantiles_ms": {'{"k": 2.0}': 80, '{"k": 1}': 30}, "fastest": '{"k": 1.0}'}
    )
    assert table == {
        "quantiles_ms": {'{"k": 2}': 80.0, '{"k": 1}': 30.0},
        "fastest": '{"k": 1}',
        "degrade_below_ms": 0.0,
        "refuse": True,
        "slo_ms": None,
    }
    for bad, field in (
        ({"quantiles_ms": {'{"k": 1}': -1}, "fastest": '{"k": 1}'}, "quantile"),
        ({"quantiles_ms": {'{"k": 1}': 1}, "fastest": '{"k": 2}'}, "fastest"),
        ({"quantiles_ms": {'{"k": 1}': 1}, "fastest": '{"k": 1}', "refuse": 1}, "refuse"),
        ({"quantiles_ms": {'{"k": 1}': 1}, "fastest": '{"k": 1}', "slo_ms": 0}, "slo_ms"),
    ):
        with pytest.raises(ValueError, match=field):
            check_admission(bad)


def test_keys_are_canonical_and_a_mix_names_its_members_and_weight() -> None:
    assert config_key({"b": 2.0, "a": "x", "c": 0.5}) == '{"a": "x", "b": 2, "c": 0.5}'
    assert quantize_weight(0.37) == 0.35
    assert quantize_weight(1.2) == 1.0
    with pytest.raises(ValueError, match="finite"):
        quantize_weight(math.nan)
    assert routing_key('{"a": 1}') == '{"a": 1}'
    mixed = routing_key('{"a": 1}', '{"a": 2}', 0.25)
    assert mixed.startswith(MIX_PREFIX)
    assert json.loads(mixed.removeprefix(MIX_PREFIX)) == ['{"a": 1}', '{"a": 2}', 0.25]


def test_a_tables_digest_survives_the_trip_to_the_router() -> None:
    """The operator's digest of the tables it sends equals the router's of what it received
    (the JSON of the switch's body), and any change to a table changes it."""
    admission = {"quantiles_ms": {'{"k": 1}': 20.000000000000004, '{"k": 3}': 35.0}, "refuse": True}
    binding = {"stages": [["k"]], "components": [[]], "lag_share": 0.3, "max_qps": [None, 1.5]}
    sent = json.loads(json.dumps({"admission": admission, "binding": binding}))
    digest = tables_digest(admission, binding)
    assert digest == tables_digest(sent["admission"], sent["binding"])
    assert digest != tables_digest(admission, None)
    assert digest != tables_digest(admission, {**binding, "lag_share": 0.25})
    assert tables_digest(None, None) != tables_digest({}, None)
