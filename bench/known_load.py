"""The known-load oracle (bench/serving_sim.py's yardstick): what knowing the load ahead, not the
arrivals, wins; served with admission's dispatch-time degrade when asked."""

from __future__ import annotations

import math
from collections.abc import Sequence

from compass.domain.admission import (
    Admission,
    AdmissionPoint,
    AdmissionVerdict,
    judge_at_dispatch,
    service_quantiles_ms,
)
from compass.domain.arrivals import PatternKind, Scenario, SimulationError, make_scenario
from compass.domain.oracle import (
    DEFAULT_WINDOW_S,
    Dispatch,
    OracleReport,
    _check_window,
    _Draw,
    _Rules,
    _search,
)
from compass.domain.profiles import LatencyProfile

# The known-load oracle's draws of the pattern: 32 make two sets agree within 0.1 point.
KNOWN_LOAD_WORLDS = 32
# Its draws' seeds start here, far from any scenario seed a bench uses.
KNOWN_LOAD_SEED = 1_000_000_000


def degrading_dispatch(
    front: Sequence[LatencyProfile], slo_ms: float, degrade_after: float
) -> Dispatch:
    """Admission's dispatch-time degrade that refuses nothing (``refuse: false``)."""
    rule = Admission(slo_ms, at=AdmissionPoint.DISPATCH, degrade_after=degrade_after, refuse=False)
    own_ms = service_quantiles_ms(front, rule.quantile)

    def dispatch(waited_s: float, config: int) -> int:
        verdict = judge_at_dispatch(rule, slo_ms - waited_s * 1000, own_ms[config], own_ms[0])
        return config if verdict is AdmissionVerdict.SERVE else 0

    return dispatch


def known_load_oracle(
    front: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    *,
    pods: int = 1,
    window_s: float = DEFAULT_WINDOW_S,
    worlds: int = KNOWN_LOAD_WORLDS,
    degrade_after: float | None = None,
) -> OracleReport:
    """What knowing the load ahead, not the arrivals, wins (``degrade_after``: with the degrade)."""
    pattern = scenario.pattern
    if pattern.kind is PatternKind.TRACE:
        raise SimulationError(
            "pattern", "a trace has no load to draw again", "give a generated pattern"
        )
    _check_window(window_s)
    if worlds < 1:
        raise SimulationError("worlds", f"{worlds} is not >= 1", f"give e.g. {KNOWN_LOAD_WORLDS}")
    count = max(math.ceil(pattern.duration_s / window_s), 1)
    draws = [
        _Draw.of(
            front,
            make_scenario(pattern, KNOWN_LOAD_SEED + scenario.seed * worlds + world),
            pods,
            window_s,
            count,
        )
        for world in range(worlds)
    ]
    dispatch = None if degrade_after is None else degrading_dispatch(front, slo_ms, degrade_after)
    rules = _Rules(slo_ms / 1000, pods, window_s, dispatch)
    return _search(front, _Draw.of(front, scenario, pods, window_s, count), draws, rules)
