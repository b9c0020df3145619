"""A client's compass_deadline_ns at the routers' gate (compass_rules.deadlines, and the router's
shared table it feeds): parsed once, bounded, never an OverflowError, a deadline already past
never stored as one, and no client able to move the schedule or the slack others are bound by.
(A real tritonserver runs it in tests/triton/test_router_client_deadlines.py.)"""

from __future__ import annotations

import json
import math
import time
import types
from pathlib import Path
from typing import Any

import pytest

from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_SHARES, router_table, stage_plan
from compass.domain.profiles import parse_profiles
from compass_dev.router_module import router_part
from compass_rules import binding as rules
from compass_rules.binding import check_binding
from compass_rules.deadlines import (
    DEADLINE_PARAMETER,
    MAX_DEADLINE_AHEAD_NS,
    MAX_DEADLINE_SLOS,
    arrival_ns,
    bounded_deadline,
    follower_left_ms,
    gate_deadline,
    parse_deadline,
)
from compass_rules.followers import joint_options, joint_spare_ms, slacks_behind_ms

NOW = 1_800_000_000 * 10**9
SLO_MS = 500.0
SLO_NS = int(SLO_MS * 1e6)
REACH_NS = MAX_DEADLINE_SLOS * SLO_NS
# What one client may send: past, zero, just past int64, far beyond, thousands of digits.
EXTREMES: list[int | str] = [
    -1,
    0,
    1,
    2**62,
    2**63,
    str(2**63),
    10**30,
    "1" + "0" * 30,
    "9" * 4000,
    "-" + "9" * 4000,
    "9" * 100_000,
    10**5000,
    " 00042 ",
]


@pytest.mark.parametrize("value", EXTREMES, ids=range(len(EXTREMES)))
def test_any_integer_parses_and_bounds_within_a_few_slos_of_take_up(value: int | str) -> None:
    deadline = bounded_deadline(parse_deadline(value), NOW, SLO_MS)
    assert NOW - REACH_NS <= deadline <= NOW + REACH_NS
    # What the gate's int64 table and the arrival ring hold never overflows.
    assert -(2**63) < deadline < 2**63
    assert NOW - SLO_NS <= arrival_ns(deadline, NOW, SLO_MS) <= NOW


@pytest.mark.parametrize("value", ["soon", "1e30", "0x10", "", 1.5, True, None, [1]])
def test_anything_but_an_integer_is_the_clients_error_naming_the_parameter(value: object) -> None:
    with pytest.raises(ValueError, match=DEADLINE_PARAMETER):
        parse_deadline(value)


def test_a_far_deadline_is_clamped_and_a_near_one_kept() -> None:
    assert bounded_deadline(NOW + 2 * SLO_NS, NOW, SLO_MS) == NOW + 2 * SLO_NS
    assert bounded_deadline(NOW + 100 * SLO_NS, NOW, SLO_MS) == NOW + REACH_NS
    assert bounded_deadline(parse_deadline("9" * 4000), NOW, None) == NOW + MAX_DEADLINE_AHEAD_NS
    # Past stays past (late whatever serves it), but within reach of now.
    assert bounded_deadline(1, NOW, SLO_MS) == NOW - REACH_NS


def test_a_deadline_past_at_take_up_is_long_past_at_the_gate() -> None:
    """The request ahead spares a follower's slack: a late one has none to spare, and counted
    as a deadline it would only hurry the requests ahead of it."""
    for past in (bounded_deadline(v, NOW, SLO_MS) for v in (-1, 0, 1, NOW - 1, NOW)):
        assert gate_deadline(past, NOW) == 1
        # Without an SLO it counts as a follower already late: no slack to spare.
        assert follower_left_ms(gate_deadline(past, NOW), NOW, NOW, None) < 0
    assert gate_deadline(NOW + 1, NOW) == NOW + 1
    assert gate_deadline(None, NOW) == 0


def test_the_arrival_is_the_deadline_less_the_slo_within_the_slo_before_take_up() -> None:
    assert arrival_ns(NOW + SLO_NS - 10**6, NOW, SLO_MS) == NOW - 10**6
    assert arrival_ns(NOW + REACH_NS, NOW, SLO_MS) == NOW  # never after its take-up
    assert arrival_ns(NOW - REACH_NS, NOW, SLO_MS) == NOW - SLO_NS


@pytest.fixture(scope="module")
def gate() -> types.ModuleType:
    """The router's gate module."""
    return router_part("gate")


def test_extreme_deadlines_leave_the_shared_table_as_an_ordinary_request_would(
    gate: types.ModuleType, tmp_path: Path
) -> None:
    """The router's path for each: bounded, its arrival counted, its static fastest start
    drawn, queued at the gate; the schedule and the followers' deadlines stay near now."""
    inflight = gate.Inflight(str(tmp_path / "inflight.bin"))
    fastest_ns = 100 * 10**6
    for value in EXTREMES:
        taken_up = time.time_ns()
        deadline = bounded_deadline(parse_deadline(value), taken_up, SLO_MS)
        arrived = arrival_ns(deadline, taken_up, SLO_MS)
        inflight.dispatched(arrived)
        inflight.queue_at_gate(gate_deadline(deadline, taken_up), (arrived, fastest_ns, 1))
        inflight.leave_gate()
    # Each took one fastest's turn of the schedule from at most its take-up: no client moved
    # it further (an unbounded 2**62 put it 146 years ahead, and the lag cap off for everyone).
    assert int(inflight.static_free[0]) <= time.time_ns() + len(EXTREMES) * fastest_ns
    assert int(inflight.gate_slots[inflight.slot, 3]) <= time.time_ns() + REACH_NS


PROFILES = (
    Path(__file__).resolve().parents[2] / "bench/data/compass-paper/planner_latency_profiles.json"
)
# An SLO where a follower's tight but reachable deadline, counted as its client sent it, forces
# the request ahead onto the fastest configuration.
GATE_SLO_MS = 800.0


def _victims_choice(table: dict[str, Any], behind_ms: list[float]) -> int | None:
    """The configuration a request just taken up binds at its first stage with followers whose
    deadlines have ``behind_ms`` left, as the router's gate binds it (binding.py)."""
    backlog = [0.0] * len(table["stages"])
    left = table["slo_ms"]
    slacks = slacks_behind_ms(table, {}, 0, backlog, behind_ms, 1)
    spare = min((s for s in slacks if s is not None), default=math.inf)
    if spare < math.inf:
        own, theirs = joint_options(table, {}, 0, left, backlog)
        spare = min(spare, joint_spare_ms(own, theirs, slacks, 1))
    chosen, _, _ = rules.bind_stage(table, 0, {}, left, backlog, None, 0, spare)
    return chosen


def test_a_followers_client_deadline_never_moves_the_choice_of_the_request_ahead() -> None:
    """One client's requests wait at the gate behind another's: whatever deadline it sends
    (tight but reachable, past, far, absurd), the request ahead binds what it binds behind an
    ordinary request; counted as sent, a tight one would have hurried it onto the fastest."""
    profiles = parse_profiles(json.loads(PROFILES.read_text(encoding="utf-8")))
    plan = stage_plan(profiles, quantile=0.95, prior_shares=RAG_SIM_SHARES)
    sent = router_table(plan, RAG_SIM_COMPONENTS, slo_ms=GATE_SLO_MS)
    table = check_binding(json.loads(json.dumps(sent)))
    accuracy = table["arrays"]["accuracy"]
    ordinary = _victims_choice(table, [GATE_SLO_MS, GATE_SLO_MS])
    assert ordinary is not None
    sweep = [NOW + int(ms * 1e6) for ms in range(0, int(3 * GATE_SLO_MS), 5)]
    hurried = 0
    for value in [*sweep, *EXTREMES]:
        deadline = bounded_deadline(parse_deadline(value), NOW, GATE_SLO_MS)
        held = gate_deadline(deadline, NOW)
        left = follower_left_ms(held, NOW, NOW, GATE_SLO_MS)
        assert _victims_choice(table, [GATE_SLO_MS, left]) == ordinary, value
        # What counting the client's deadline as sent did.
        as_sent = _victims_choice(table, [GATE_SLO_MS, (deadline - NOW) / 1e6])
        hurried += as_sent is not None and accuracy[as_sent] < accuracy[ordinary]
    assert hurried > 0, "no deadline in the sweep hurried the request ahead: the test shows nothing"
