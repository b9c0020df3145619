"""Capacity under concurrency: a configuration's measured latency-throughput curve, the ladder
of rates that measures it, and the Erlang-C fallback when only one-at-a-time profiles exist.

A pod whose router runs ``servers`` instances serves several requests at once, and its
components may batch or contend for the same cores, so its capacity is neither ``servers / mean``
(ideal parallel servers) nor ``1 / mean`` (the paper's single server). It is measured: requests
are offered open loop (Poisson) at a ladder of rates up to saturation, as Triton's
perf_analyzer does, and each rate's achieved throughput and latency percentiles make one point
of the curve. The planner reads off it the highest rate whose latency percentile stays within
the SLO, and the rate at which a saturated pod drains its queue.

The JSON form (a profile's ``capacity``; at most ``MAX_CURVE_POINTS`` points, rates ascending)::

    {"servers": 4, "points": [{"offered_qps": 2.0, "throughput_qps": 1.98,
                               "latency_mean_ms": 140.2, "latency_p50_ms": 131.0,
                               "latency_p95_ms": 210.5, "latency_p99_ms": 260.1}, ...]}
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import ndtri

FloatArray = npt.NDArray[np.float64]

# A curve is measured in at most this many rates (the profiler's cost bound; the CRD's too).
MAX_CURVE_POINTS = 16
# The ladder's first rate, as a fraction of one server's capacity (1 / mean service time).
LADDER_START = 0.25
# Each rung offers this much more than the one below until the pod saturates.
LADDER_GROWTH = 1.5
# The ladder stops filling in once neighbouring rates are within this ratio.
LADDER_FINEST = 1.1
# A rate is past saturation when the pod achieves less than this share of it.
SATURATED_SHARE = 0.95
# The share of a rate's requests (the first) whose latencies a point leaves out: the warm-up.
WARMUP_SHARE = 0.2
# The latency percentiles a curve point stores (a profile's own levels).
CURVE_PERCENTILES = (50.0, 95.0, 99.0)
_FIELDS = {50.0: "latency_p50_ms", 95.0: "latency_p95_ms", 99.0: "latency_p99_ms"}


class CapacityError(ValueError):
    """A capacity curve is unusable: one line, `<field>: <what is wrong>; <the fix>`."""

    def __init__(self, field: str, what: str, fix: str) -> None:
        super().__init__(f"{field}: {what}; {fix}")
        self.field, self.what, self.fix = field, what, fix


@dataclass(frozen=True)
class CurvePoint:
    """What the pod did at one offered rate: its throughput and latency (ms) percentiles."""

    offered_qps: float
    throughput_qps: float
    mean_ms: float
    percentiles_ms: tuple[tuple[float, float], ...]

    @property
    def saturated(self) -> bool:
        """Whether the pod fell behind the offered rate (its queue grew without bound)."""
        return self.throughput_qps < SATURATED_SHARE * self.offered_qps

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
        entry.update({_FIELDS[p]: v for p, v in self.percentiles_ms})
        return entry


def measure_point(
    offered_qps: float,
    arrivals_s: Sequence[float] | FloatArray,
    finishes_s: Sequence[float] | FloatArray,
) -> CurvePoint:
    """A curve point from one open-loop run: each request's arrival and finish (s), in order.

    The first ``WARMUP_SHARE`` of the requests found the pod emptier than it stays: their
    latencies are left out (the throughput counts them all).
    """
    arrivals = np.asarray(arrivals_s, dtype=np.float64)
    finishes = np.asarray(finishes_s, dtype=np.float64)
    if len(arrivals) < 2:
        raise CapacityError("points", "a rate was measured with fewer than 2 requests", "send more")
    span = float(finishes.max() - arrivals.min())
    steady = int(len(arrivals) * WARMUP_SHARE)
    latencies = (finishes[steady:] - arrivals[steady:]) * 1000
    return CurvePoint(
        offered_qps=offered_qps,
        throughput_qps=len(arrivals) / span if span > 0 else math.inf,
        mean_ms=float(latencies.mean()),
        percentiles_ms=tuple((p, float(np.percentile(latencies, p))) for p in CURVE_PERCENTILES),
    )


@dataclass(frozen=True)
class CapacityCurve:
    """A configuration's latency against offered load, at ``servers`` router instances per pod."""

    servers: int
    points: tuple[CurvePoint, ...]

    @property
    def saturation_qps(self) -> float:
        """The highest throughput the pod achieved: the rate at which it drains a queue."""
        return max(point.throughput_qps for point in self.points)

    @property
    def saturated(self) -> bool:
        """Whether the ladder reached saturation (else the drain rate is a lower bound)."""
        return any(point.saturated for point in self.points)

    def holding_ms(self) -> float:
        """How long a request holds a router instance when all are busy (Little: servers / rate)."""
        return self.servers / self.saturation_qps * 1000

    def max_rate(self, budget_ms: float, percentile: float, idle_ms: float) -> float:
        """The highest offered rate whose latency percentile stays within ``budget_ms``.

        Latency rises with the load, so the measured percentiles are first made monotone (pool
        adjacent violators: a few hundred requests per rate leave noise that would otherwise
        end the curve early). Then linear between measured rates, from the one-at-a-time
        percentile ``idle_ms`` at rate 0: latency is convex in the rate, so the line
        overestimates it and the rate is on the safe side. Past the last unsaturated rate
        nothing is claimed.
        """
        if idle_ms > budget_ms:
            return 0.0
        measured = [point for point in self.points if not point.saturated]
        rates = [0.0] + [point.offered_qps for point in measured]
        latencies = _monotone([idle_ms] + [point.latency_at(percentile) for point in measured])
        for i in range(1, len(rates)):
            if latencies[i] > budget_ms:
                share = (budget_ms - latencies[i - 1]) / (latencies[i] - latencies[i - 1])
                return rates[i - 1] + share * (rates[i] - rates[i - 1])
        return rates[-1]

    def scaled(self, factor: float) -> CapacityCurve:
        """The same curve with times multiplied by ``factor`` and so rates divided by it."""
        return CapacityCurve(
            self.servers,
            tuple(
                CurvePoint(
                    point.offered_qps / factor,
                    point.throughput_qps / factor,
                    point.mean_ms * factor,
                    tuple((p, v * factor) for p, v in point.percentiles_ms),
                )
                for point in self.points
            ),
        )

    def to_json(self) -> dict[str, Any]:
        """The curve as the profiles file stores it."""
        return {"servers": self.servers, "points": [point.to_json() for point in self.points]}


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
    points: Sequence[CurvePoint], mean_ms: float, max_points: int = MAX_CURVE_POINTS
) -> float | None:
    """The next rate the ladder offers, or None when the curve is complete.

    First it climbs: from a quarter of one server's capacity, each rate ``LADDER_GROWTH`` times
    the last, until one saturates the pod. Then it fills in: the midpoint of the widest gap
    (by ratio) below saturation, until every gap is within ``LADDER_FINEST`` or the budget of
    ``max_points`` rates is spent. The SLO's rate may lie anywhere below saturation (a tight
    SLO crosses early), so the whole range gets the same relative resolution.
    """
    if not points:
        return LADDER_START * 1000 / mean_ms
    if len(points) >= max_points:
        return None
    rates = sorted(point.offered_qps for point in points)
    saturated = [point.offered_qps for point in points if point.saturated]
    if not saturated:
        return rates[-1] * LADDER_GROWTH
    below = [rate for rate in rates if rate <= min(saturated)]
    if len(below) < 2:
        # Saturated at the first rate: climb down instead.
        return rates[0] / LADDER_GROWTH
    ratio, low, high = max((high / low, low, high) for low, high in itertools.pairwise(below))
    return None if ratio <= LADDER_FINEST else (low + high) / 2


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
    return CapacityCurve(servers, points)


def _parse_point(item: object, where: str) -> CurvePoint:
    if not isinstance(item, Mapping):
        raise CapacityError(where, "expected an object", "see the docs")

    def number(field: str) -> float:
        value = item.get(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CapacityError(f"{where}.{field}", f"{value!r} is not a number", "give one")
        if not math.isfinite(value) or value <= 0:
            raise CapacityError(f"{where}.{field}", f"{value:g} is not > 0", "give one")
        return float(value)

    percentiles = tuple((p, number(_FIELDS[p])) for p in CURVE_PERCENTILES)
    for (low_p, low), (high_p, high) in itertools.pairwise(percentiles):
        if high < low:
            raise CapacityError(
                f"{where}.{_FIELDS[high_p]}",
                f"{high:g} is below {_FIELDS[low_p]} {low:g}",
                "percentiles must not decrease",
            )
    return CurvePoint(
        number("offered_qps"), number("throughput_qps"), number("latency_mean_ms"), percentiles
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
