"""Capacity under concurrency: a configuration's measured latency-throughput curve, the ladder
of rates that measures it, and the Erlang-C fallback. Why: docs/method.md, "Routers of several
instances"."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtri

from compass.domain.arrays import FloatArray
from compass.domain.errors import FieldError

# A curve is measured in at most this many rates (the profiler's cost bound; the CRD's too).
MAX_CURVE_POINTS = 16
# A measured service time's range, ms: past it a unit mistake (and the planner's overflow).
MIN_LATENCY_MS = 0.001
MAX_LATENCY_MS = 3_600_000.0
# The ladder (next_rate): first rate (of one server's capacity), growth, finest ratio.
LADDER_START = 0.25
LADDER_GROWTH = 1.5
LADDER_FINEST = 1.1
# Below this fewer than 5% of one server's arrivals find it busy: the p95 is the idle one.
LADDER_FLOOR = LADDER_START / 8
# Saturated: served less than this share of the rate, or the latency at the end of the run this
# many times that after the warm-up and grown by more than this share of the time between (the
# queue of a pod 0.25% behind; below it a doubling is a fast configuration's noise).
SATURATED_SHARE = 0.95
LATENCY_GROWTH = 2.0
QUEUE_GROWTH_FLOOR = 0.0025
# Rates this close to the measured drain rate are not read for latency (see steady_points).
NEAR_CAPACITY = 0.97
# Fewer requests at a curve rate would read its p95 off the slowest one or two replies.
MIN_REQUESTS_PER_RATE = 20
# The share of a rate's requests (the first) whose latencies a point leaves out: the warm-up.
WARMUP_SHARE = 0.2
# The latency percentiles a curve point stores (a profile's own levels), by JSON field.
PERCENTILE_FIELDS = {50.0: "latency_p50_ms", 95.0: "latency_p95_ms", 99.0: "latency_p99_ms"}
CURVE_PERCENTILES = tuple(PERCENTILE_FIELDS)


class CapacityError(FieldError):
    """A capacity curve is unusable: one line, `<field>: <what is wrong>; <the fix>`."""


@dataclass(frozen=True)
class CurvePoint:
    """What the pod did at one offered rate: its throughput and latency (ms) percentiles."""

    offered_qps: float
    throughput_qps: float
    mean_ms: float
    percentiles_ms: tuple[tuple[float, float], ...]
    growing: bool = False

    @property
    def saturated(self) -> bool:
        """Whether the pod fell behind: it served less than offered, or its latency kept growing."""
        return self.growing or self.throughput_qps < SATURATED_SHARE * self.offered_qps

    def latency_at(self, percentile: float) -> float:
        """The latency at this percentile, interpolated in normal score between stored levels."""
        levels = [p for p, _ in self.percentiles_ms]
        values = [v for _, v in self.percentiles_ms]
        if percentile <= levels[0]:
            return values[0]
        if percentile >= levels[-1]:
            return values[-1]
        scores = [float(ndtri(p / 100)) for p in levels]
        return float(np.interp(float(ndtri(percentile / 100)), scores, values))

    def to_json(self) -> dict[str, float]:
        """The point as the profiles file stores it."""
        entry = {
            "offered_qps": self.offered_qps,
            "throughput_qps": self.throughput_qps,
            "latency_mean_ms": self.mean_ms,
        }
        entry.update({PERCENTILE_FIELDS[p]: v for p, v in self.percentiles_ms})
        if self.growing:
            entry["growing"] = True
        return entry


def median_point(runs: Sequence[CurvePoint]) -> CurvePoint:
    """Of repeated runs at one rate, the (lower) median by p95: a busy spell is outvoted."""
    if not runs:
        raise CapacityError("runs", "none given", "measure the rate at least once")
    ordered = sorted(runs, key=lambda point: point.latency_at(95.0))
    return ordered[(len(ordered) - 1) // 2]


def measure_point(
    offered_qps: float,
    arrivals_s: Sequence[float] | FloatArray,
    finishes_s: Sequence[float] | FloatArray,
) -> CurvePoint:
    """A curve point from one open-loop run (arrivals and finishes, s), at the realised rate (a few
    hundred Poisson arrivals stray by percents, which would read as saturation), sans warm-up."""
    arrivals = np.asarray(arrivals_s, dtype=np.float64)
    finishes = np.asarray(finishes_s, dtype=np.float64)
    if len(arrivals) < 2 or not arrivals[-1] > arrivals[0]:
        raise CapacityError(
            "points", f"the rate {offered_qps:g}/s was measured with under 2 requests", "send more"
        )
    realised = (len(arrivals) - 1) / float(arrivals[-1] - arrivals[0])
    # The same count over the span from the first arrival to the last finish.
    throughput = (len(arrivals) - 1) / float(finishes.max() - arrivals[0])
    steady = int(len(arrivals) * WARMUP_SHARE)
    measured = arrivals[steady:]
    latencies = (finishes[steady:] - measured) * 1000
    # A queue growing through the run (just over capacity, the throughput alone hides it).
    quarter = max(len(latencies) // 4, 1)
    first, last = latencies[:quarter].mean(), latencies[-quarter:].mean()
    elapsed_ms = (measured[-quarter:].mean() - measured[:quarter].mean()) * 1000
    growing = bool(last > LATENCY_GROWTH * first and last - first > QUEUE_GROWTH_FLOOR * elapsed_ms)
    return CurvePoint(
        offered_qps=realised,
        throughput_qps=throughput,
        mean_ms=float(latencies.mean()),
        percentiles_ms=tuple((p, float(np.percentile(latencies, p))) for p in CURVE_PERCENTILES),
        growing=growing,
    )


@dataclass(frozen=True)
class CapacityCurve:
    """A configuration's latency against offered load, at ``servers`` router instances per pod."""

    servers: int
    points: tuple[CurvePoint, ...]
    # The latency budget (ms) its ladder halved its low end for (None: halved regardless).
    slo_ms: float | None = None

    def low_end_resolved(
        self, budget_ms: float, percentile: float, mean_ms: float, idle_p95_ms: float
    ) -> bool:
        """Whether the ladder would not halve this curve's lowest rate again for ``budget_ms``
        (where it would, the line from the idle latency overstates the rate meeting it)."""
        if self.slo_ms is None or budget_ms >= self.slo_ms:
            return True
        lowest = min(self.points, key=lambda point: point.offered_qps)
        return not _halves_below(lowest, mean_ms, idle_p95_ms, budget_ms, percentile)

    @property
    def saturation_qps(self) -> float:
        """The highest throughput of the saturated points (of all, a lower bound, when none)."""
        drained = [point.throughput_qps for point in self.points if point.saturated]
        return max(drained or [point.throughput_qps for point in self.points])

    @property
    def saturated(self) -> bool:
        """Whether the ladder reached saturation (else the drain rate is a lower bound)."""
        return any(point.saturated for point in self.points)

    def capacity_known(self) -> bool:
        """Whether the drain rate is the capacity: saturated, no steady point served faster."""
        if not self.saturated:
            return False
        drain = self.saturation_qps
        return all(
            NEAR_CAPACITY * point.throughput_qps <= drain
            for point in self.points
            if not point.saturated
        )

    def steady_points(self) -> list[CurvePoint]:
        """The points that reached a steady state: unsaturated and below the ceiling (a run just
        short of capacity drifts like a random walk; one past a collapse that did not is luck)."""
        if self.capacity_known():
            ceiling = NEAR_CAPACITY * self.saturation_qps
        else:
            ceiling = min((p.offered_qps for p in self.points if p.saturated), default=math.inf)
        return [p for p in self.points if not p.saturated and p.offered_qps < ceiling]

    def holding_ms(self) -> float:
        """How long a request holds a router instance when all are busy (Little's law)."""
        return self.servers / self.saturation_qps * 1000

    def max_rate(self, budget_ms: float, percentile: float, idle_ms: float) -> float:
        """The highest offered rate whose latency percentile stays within ``budget_ms``: the
        monotone percentiles read linearly from ``idle_ms``, in rho / (1 - rho) where the capacity
        is known (Kingman), else in the rate (convex: on the safe side)."""
        if idle_ms > budget_ms:
            return 0.0
        measured = self.steady_points()
        rates = [0.0] + [point.offered_qps for point in measured]
        latencies = _monotone([idle_ms] + [point.latency_at(percentile) for point in measured])
        known = self.capacity_known()
        capacity = self.saturation_qps
        # Where the capacity is known, between rates the delay is linear in rho / (1 - rho).
        axis = [_congestion(r, capacity) for r in rates] if known else rates
        for i in range(1, len(rates)):
            if latencies[i] > budget_ms:
                share = (budget_ms - latencies[i - 1]) / (latencies[i] - latencies[i - 1])
                x = axis[i - 1] + share * (axis[i] - axis[i - 1])
                return _rate_at_congestion(x, capacity) if known else x
        if not known:
            return rates[-1]
        return heavy_traffic_rate(rates[-1], latencies[-1] - idle_ms, budget_ms - idle_ms, capacity)

    def to_json(self) -> dict[str, Any]:
        """The curve as the profiles file stores it (``slo_ms`` only where it has one)."""
        entry: dict[str, Any] = {
            "servers": self.servers,
            "points": [point.to_json() for point in self.points],
        }
        if self.slo_ms is not None:
            entry["slo_ms"] = self.slo_ms
        return entry


def heavy_traffic_rate(
    rate: float, queueing_ms: float, allowed_ms: float, capacity: float
) -> float:
    """The rate at which queueing grows from ``queueing_ms`` to ``allowed_ms`` (rho / (1 - rho))."""
    ceiling = NEAR_CAPACITY * capacity
    if queueing_ms <= 0 or rate >= ceiling:
        # No queueing seen to scale from: claim nothing past the rate measured.
        return min(rate, ceiling)
    grown = _congestion(rate, capacity) * allowed_ms / queueing_ms
    return min(_rate_at_congestion(grown, capacity), ceiling)


def _congestion(rate: float, capacity: float) -> float:
    """rho / (1 - rho), rho = rate / capacity: what queueing delay grows with."""
    return rate / (capacity - rate)


def _rate_at_congestion(congestion: float, capacity: float) -> float:
    """The rate whose ``_congestion`` is this."""
    return capacity * congestion / (1 + congestion)


def _monotone(values: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks: list[tuple[float, int]] = []
    for value in values:
        total, count = value, 1
        while blocks and blocks[-1][0] / blocks[-1][1] > total / count:
            previous_total, previous_count = blocks.pop()
            total, count = total + previous_total, count + previous_count
        blocks.append((total, count))
    return [total / count for total, count in blocks for _ in range(count)]


def next_rate(
    points: Sequence[CurvePoint],
    mean_ms: float,
    max_points: int = MAX_CURVE_POINTS,
    *,
    idle_p95_ms: float,
    slo_ms: float | None = None,
    percentile: float = 95.0,
) -> float | None:
    """The next rate the ladder offers, or None when the curve is complete: the lowest halved
    while its tail is steep and over the SLO (a line from rate 0 would overstate the rate), then
    up to saturation, then the steepest wide gap below it split."""
    if not points:
        return LADDER_START * 1000 / mean_ms
    if len(points) >= max_points:
        return None
    ordered = sorted(points, key=lambda point: point.offered_qps)
    lowest = ordered[0]
    if _halves_below(lowest, mean_ms, idle_p95_ms, slo_ms, percentile):
        return lowest.offered_qps / 2
    first_saturated = next((i for i, point in enumerate(ordered) if point.saturated), None)
    if first_saturated is None:
        return ordered[-1].offered_qps * LADDER_GROWTH
    readable = set(CapacityCurve(1, tuple(ordered)).steady_points())
    if first_saturated == 0 or lowest not in readable:
        # Saturated (or too near it to read) at the first rate: climb down instead.
        return lowest.offered_qps / LADDER_GROWTH
    gaps = [
        (_steepness(low, high, high in readable), low.offered_qps, high.offered_qps)
        for low, high in itertools.pairwise(ordered[: first_saturated + 1])
        # Above the last rate it reads the planner claims nothing: no gap there is worth a rate.
        if low in readable and high.offered_qps / low.offered_qps > LADDER_FINEST
    ]
    steepest = max(gaps, default=None)
    if steepest is None or steepest[0] <= LADDER_FINEST:
        return None
    return (steepest[1] + steepest[2]) / 2


def _halves_below(
    lowest: CurvePoint,
    mean_ms: float,
    idle_p95_ms: float,
    slo_ms: float | None,
    percentile: float,
) -> bool:
    """Whether the ladder halves its lowest rate (see ``next_rate``)."""
    return (
        not lowest.saturated
        and lowest.latency_at(95.0) > LADDER_FINEST * idle_p95_ms
        and (slo_ms is None or lowest.latency_at(percentile) > slo_ms)
        and lowest.offered_qps / 2 >= LADDER_FLOOR * 1000 / mean_ms
    )


def climb_ladder(
    mean_ms: float,
    servers: int,
    measure: Callable[[float], CurvePoint],
    max_points: int = MAX_CURVE_POINTS,
    progress: Callable[[CurvePoint], None] | None = None,
    *,
    idle_p95_ms: float,
    slo_ms: float | None = None,
    percentile: float = 95.0,
) -> CapacityCurve:
    """The curve of the rates ``next_rate`` offers, each point from ``measure(rate)``."""
    points: list[CurvePoint] = []
    while (
        rate := next_rate(
            points,
            mean_ms,
            max_points,
            idle_p95_ms=idle_p95_ms,
            slo_ms=slo_ms,
            percentile=percentile,
        )
    ) is not None:
        point = measure(rate)
        points.append(point)
        if progress is not None:
            progress(point)
    return CapacityCurve(servers, tuple(sorted(points, key=lambda p: p.offered_qps)), slo_ms)


def _steepness(low: CurvePoint, high: CurvePoint, readable: bool) -> float:
    """How much the p95 rises across a gap (an end the planner does not read counts as steep)."""
    if not readable:
        return math.inf
    return high.latency_at(95.0) / low.latency_at(95.0)


def parse_curve(entry: object, where: str) -> CapacityCurve:
    """A capacity curve from parsed JSON, every field checked and named."""
    if not isinstance(entry, Mapping):
        raise CapacityError(where, "expected an object with servers and points", "see the docs")
    servers = entry.get("servers")
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise CapacityError(f"{where}.servers", f"{servers!r} is not an integer >= 1", "give 1")
    raw = entry.get("points")
    if not isinstance(raw, list) or not raw:
        raise CapacityError(f"{where}.points", "expected a non-empty list", "measure the curve")
    if len(raw) > MAX_CURVE_POINTS:
        raise CapacityError(
            f"{where}.points", f"{len(raw)} points", f"keep at most {MAX_CURVE_POINTS}"
        )
    points = tuple(_parse_point(item, f"{where}.points[{i}]") for i, item in enumerate(raw))
    for i in range(1, len(points)):
        if points[i].offered_qps <= points[i - 1].offered_qps:
            raise CapacityError(
                f"{where}.points[{i}].offered_qps",
                f"{points[i].offered_qps:g} is not above the point before it",
                "list the rates in ascending order",
            )
    slo_ms = entry.get("slo_ms")
    if slo_ms is not None and (
        isinstance(slo_ms, bool)
        or not isinstance(slo_ms, (int, float))
        or not MIN_LATENCY_MS <= slo_ms <= MAX_LATENCY_MS
    ):
        raise CapacityError(
            f"{where}.slo_ms",
            f"{slo_ms!r} is not a latency in [{MIN_LATENCY_MS:g}, {MAX_LATENCY_MS:,.0f}] ms",
            "drop it (the curve then reads as measured for any SLO) or re-profile",
        )
    return CapacityCurve(servers, points, None if slo_ms is None else float(slo_ms))


def _parse_point(item: object, where: str) -> CurvePoint:
    if not isinstance(item, Mapping):
        raise CapacityError(where, "expected an object", "see the docs")

    def number(field: str) -> float:
        value = item.get(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CapacityError(f"{where}.{field}", f"{value!r} is not a number", "give one")
        if not math.isfinite(value) or value <= 0:
            raise CapacityError(f"{where}.{field}", f"{value:g} is not > 0", "give one")
        if field.startswith("latency_") and not MIN_LATENCY_MS <= value <= MAX_LATENCY_MS:
            raise CapacityError(
                f"{where}.{field}",
                f"{value:g} ms is outside [{MIN_LATENCY_MS:g}, {MAX_LATENCY_MS:,.0f}] ms",
                "check the units: times are in ms",
            )
        return float(value)

    percentiles = tuple((p, number(PERCENTILE_FIELDS[p])) for p in CURVE_PERCENTILES)
    check_rising(where, [(PERCENTILE_FIELDS[p], v) for p, v in percentiles], CapacityError)
    growing = item.get("growing", False)
    if not isinstance(growing, bool):
        raise CapacityError(f"{where}.growing", f"{growing!r} is not true or false", "drop it")
    return CurvePoint(
        number("offered_qps"),
        number("throughput_qps"),
        number("latency_mean_ms"),
        percentiles,
        growing,
    )


def check_rising(where: str, fields: Sequence[tuple[str, float]], error: type[FieldError]) -> None:
    """Raise ``error`` at the first of these percentiles (by JSON field) below the one before."""
    for (low_field, low), (high_field, high) in itertools.pairwise(fields):
        if high < low:
            raise error(
                f"{where}.{high_field}",
                f"{high:g} is below {low_field} {low:g}",
                "percentiles must not decrease",
            )


def erlang_c(servers: int, offered_load: float) -> float:
    """The probability that an arrival waits in an M/M/c queue with load a = lambda E[S] < c."""
    if offered_load <= 0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    # The Erlang-B recursion is stable for any c; Erlang C follows from it.
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered_load * blocking / (k + offered_load * blocking)
    utilisation = offered_load / servers
    return blocking / (1 - utilisation + utilisation * blocking)
