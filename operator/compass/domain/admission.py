"""Proactive admission (PARD's idea): refuse or degrade a request that would be late, since
serving it costs those behind it. Why: docs/method.md, "Admission"."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from compass.domain.arrays import FloatArray
from compass.domain.profiles import LatencyProfile
from compass_rules.admission import dispatch_verdict, late_verdict

# Quantile points per member: the residual-time estimate is a mean over them.
GRID_POINTS = 256
# Past this share of its SLO waited, a request is served on the fastest even where its routed
# member would fit: a long wait means a queue stands behind it, which the fastest shortens now.
DEFAULT_DEGRADE_AFTER = 0.25


class AdmissionPoint(StrEnum):
    """Where the rule runs: at arrival on a predicted wait, or at dispatch on the real one."""

    ARRIVAL = "arrival"
    DISPATCH = "dispatch"


class AdmissionError(ValueError):
    """An admission setting is invalid: one line, `<field>: <what is wrong>; <the fix>`."""


@dataclass(frozen=True)
class Admission:
    """When to refuse a request: its predicted latency (wait plus own time) exceeds the SLO."""

    slo_ms: float
    quantile: float = 0.5
    at: AdmissionPoint = AdmissionPoint.ARRIVAL
    # At dispatch: past this share of the SLO waited, served on the fastest (1: never).
    degrade_after: float = DEFAULT_DEGRADE_AFTER
    # A request late whatever serves it: refused (True), or served on the fastest member.
    refuse: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.degrade_after <= 1:
            raise AdmissionError(
                f"admission degradeAfter: {self.degrade_after!r} is not in (0, 1]; give e.g. "
                f"{DEFAULT_DEGRADE_AFTER} (1: only what would be late)"
            )
        if not self.slo_ms > 0 or not math.isfinite(self.slo_ms):
            raise AdmissionError(f"slo_ms: {self.slo_ms!r} is not > 0; give the SLO in ms")
        if not 0 < self.quantile < 1:
            raise AdmissionError(
                f"admission quantile: {self.quantile!r} is not in (0, 1); give e.g. 0.5"
            )


class ServiceGrid:
    """A mix's service time as equally likely points: mean, quantiles, expected residual time."""

    def __init__(self, members: Sequence[tuple[LatencyProfile, float]], servers: int = 1) -> None:
        if not members:
            raise AdmissionError("members: none given; give at least one (profile, share)")
        u = (np.arange(GRID_POINTS) + 0.5) / GRID_POINTS
        values = [member.distribution.quantile(u) for member, _ in members]
        weights = [np.full(GRID_POINTS, share / GRID_POINTS) for _, share in members]
        order = np.argsort(np.concatenate(values), kind="stable")
        self.values_ms: FloatArray = np.concatenate(values)[order]
        self.weights: FloatArray = np.concatenate(weights)[order]
        self.weights /= self.weights.sum()
        self.mean_ms = float(self.values_ms @ self.weights)
        self._cumulative = np.cumsum(self.weights)
        holding = [
            (ms, share)
            for member, share in members
            if (ms := member.busy_holding_ms(servers)) is not None
        ]
        # How much longer than its profile a request holds an instance when the pod is busy.
        self.load_factor = 1.0
        if len(holding) == len(members):
            held = sum(ms * share for ms, share in holding) / sum(share for _, share in holding)
            self.load_factor = max(1.0, held / self.mean_ms)

    def quantile_ms(self, q: float) -> float:
        """The service time at quantile ``q`` (the first point whose cumulative weight reaches it)."""
        index = int(np.searchsorted(self._cumulative, q, side="left"))
        return float(self.values_ms[min(index, len(self.values_ms) - 1)])

    def residual_ms(self, elapsed_ms: float) -> float:
        """The expected service time left of a request that has run ``elapsed_ms``."""
        longer = self.values_ms > elapsed_ms
        weight = float(self.weights[longer].sum())
        if weight <= 0:
            # Past every point of the profile: it is about to end, as far as the profile knows.
            return 0.0
        return float((self.values_ms[longer] - elapsed_ms) @ self.weights[longer] / weight)


def predicted_latency_ms(
    grid: ServiceGrid,
    queued_ahead: int,
    busy_elapsed_ms: Sequence[float],
    servers: int,
    own_ms: float,
) -> float:
    """A request's expected wait for one of ``servers`` instances plus ``own_ms`` of service."""
    if queued_ahead < servers - len(busy_elapsed_ms):
        return own_ms
    ahead = sum(grid.residual_ms(e) for e in busy_elapsed_ms) + queued_ahead * grid.mean_ms
    return ahead * grid.load_factor / servers + own_ms


class AdmissionVerdict(StrEnum):
    """What becomes of a request at arrival."""

    SERVE = "serve"
    FASTEST = "fastest"
    DROP = "drop"


def judge(
    admission: Admission,
    grid: ServiceGrid,
    fastest: ServiceGrid,
    queued_ahead: int,
    busy_elapsed_ms: Sequence[float],
    servers: int,
) -> AdmissionVerdict:
    """Serve a request arriving now as routed if it fits the SLO, else on the fastest, else drop."""
    wait_plus = functools.partial(
        predicted_latency_ms, grid, queued_ahead, busy_elapsed_ms, servers
    )
    if wait_plus(grid.quantile_ms(admission.quantile)) <= admission.slo_ms:
        return AdmissionVerdict.SERVE
    if wait_plus(fastest.quantile_ms(admission.quantile)) <= admission.slo_ms:
        return AdmissionVerdict.FASTEST
    # Late whatever serves it: refused, or served on the fastest.
    return AdmissionVerdict(late_verdict(admission.refuse))


def judge_at_dispatch(
    admission: Admission, left_ms: float, routed_ms: float, fastest_ms: float
) -> AdmissionVerdict:
    """The verdict on a request an instance takes up now (compass_rules.admission's rule)."""
    return AdmissionVerdict(
        dispatch_verdict(
            left_ms,
            routed_ms,
            fastest_ms,
            degrade_below_ms(admission),
            admission.refuse,
        )
    )


def degrade_below_ms(admission: Admission) -> float:
    """What is left of a request's budget once it has waited ``degrade_after`` of the SLO."""
    return admission.slo_ms * (1 - admission.degrade_after)


def service_quantiles_ms(members: Sequence[LatencyProfile], quantile: float) -> list[float]:
    """Each member's service time (ms) at ``quantile``: what a router judges a request on."""
    return [float(m.distribution.quantile(np.array([quantile]))[0]) for m in members]


def router_admission(front: Sequence[LatencyProfile], admission: Admission) -> dict[str, Any]:
    """What the router is sent to judge requests at dispatch (compass_rules.admission reads it)."""
    if not front:
        raise AdmissionError("front: empty; give the plan's members, fastest first")
    own = service_quantiles_ms(front, admission.quantile)
    return {
        "quantiles_ms": {m.key: ms for m, ms in zip(front, own, strict=True)},
        "fastest": front[0].key,
        "degrade_below_ms": degrade_below_ms(admission),
        "refuse": admission.refuse,
        "slo_ms": admission.slo_ms,
    }
