"""A configuration's capacity curve measured in the simulator instead of on pods: the simulator
plays the hardware, so plans made from the curve can be checked against it (bench/capacity.py
and the tests; the operator's profiler measures real pods)."""

from __future__ import annotations

import itertools
import math

from compass.domain.arrivals import PatternKind, make_pattern, make_scenario
from compass.domain.capacity import (
    MAX_CURVE_POINTS,
    CapacityCurve,
    CurvePoint,
    climb_ladder,
    measure_point,
)
from compass.domain.podmodel import PodModel
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import StaticController, simulate


def measure_capacity(
    profile: LatencyProfile,
    pod_model: PodModel,
    seed: int = 0,
    requests: int = 400,
    *,
    slo_ms: float | None = None,
    percentile: float = 95.0,
    max_points: int = MAX_CURVE_POINTS,
) -> CapacityCurve:
    """A configuration's latency-throughput curve in the simulator, by the profiler's ladder."""
    rates_done = itertools.count()

    def measure(rate: float) -> CurvePoint:
        pattern = make_pattern(PatternKind.CONSTANT, rate, requests / rate)
        scenario = make_scenario(pattern, seed * 1009 + next(rates_done))
        report = simulate(
            StaticController(profile.name, 0), [profile], scenario, math.inf, pod_model=pod_model
        )
        return measure_point(rate, report.arrivals_s, report.finishes_s)

    return climb_ladder(
        profile.mean_ms,
        pod_model.servers,
        measure,
        max_points,
        idle_p95_ms=profile.latency_at(95.0),
        slo_ms=slo_ms,
        percentile=percentile,
    )
