"""What arrives at the simulator: load patterns and their seeded realisations (every policy run
on a scenario sees the same arrivals and the same service-time luck)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from compass.domain.arrays import FloatArray, IntArray
from compass.domain.errors import FieldError

SPIKE_FACTOR = 4.0
STEP_FACTOR = 2.0
RAMP_FACTOR = 2.0
BURST_FACTORS = (2.0, 5.0)
BURST_SECONDS = (5.0, 15.0)
BURST_GAP_SECONDS = (10.0, 30.0)
# A million simulated requests take minutes; beyond, a typo would exhaust memory first.
MAX_REQUESTS = 1_000_000


class SimulationError(FieldError):
    """A load pattern or trace is invalid: one line, `<field>: <what is wrong>; <the fix>`."""


class PatternKind(StrEnum):
    """The shape of the offered load over time."""

    CONSTANT = "constant"
    STEP = "step"
    RAMP = "ramp"
    SPIKE = "spike"
    BURSTY = "bursty"
    TRACE = "trace"


@dataclass(frozen=True)
class Burst:
    """A stretch of time during which the load is multiplied."""

    start_s: float
    end_s: float
    factor: float


@dataclass(frozen=True)
class LoadPattern:
    """Offered load (requests per second) as a function of time."""

    kind: PatternKind
    base_qps: float
    duration_s: float
    bursts: tuple[Burst, ...] = ()
    trace_s: tuple[float, ...] = ()

    def rate(self, t: FloatArray) -> FloatArray:
        """The offered rate at these times (for a trace, its arrivals per second, binned)."""
        t = np.asarray(t, dtype=np.float64)
        base = np.full_like(t, self.base_qps)
        d = self.duration_s
        if self.kind is PatternKind.STEP:
            shaped = np.where(t >= d / 2, STEP_FACTOR * base, base)
        elif self.kind is PatternKind.RAMP:
            shaped = base * (1 + (RAMP_FACTOR - 1) * np.clip(t / d, 0.0, 1.0))
        elif self.kind is PatternKind.SPIKE:
            shaped = np.where((t >= d / 3) & (t < 2 * d / 3), SPIKE_FACTOR * base, base)
        elif self.kind is PatternKind.BURSTY:
            shaped = base.copy()
            for burst in self.bursts:
                inside = (t >= burst.start_s) & (t < burst.end_s)
                shaped = np.where(inside, burst.factor * base, shaped)
        elif self.kind is PatternKind.TRACE:
            arrivals = np.asarray(self.trace_s)
            bins = np.floor(t).astype(np.int64)
            counts = np.bincount(np.floor(arrivals).astype(np.int64), minlength=int(d) + 2)
            shaped = counts[np.clip(bins, 0, len(counts) - 1)].astype(np.float64)
        else:
            shaped = base
        result: FloatArray = np.where((t >= 0) & (t < d), shaped, 0.0)
        return result

    @property
    def peak_qps(self) -> float:
        """The highest offered rate."""
        grid = np.linspace(0, self.duration_s, 2001)[:-1]
        return float(self.rate(grid).max(initial=0.0))


def make_pattern(
    kind: PatternKind | str,
    base_qps: float,
    duration_s: float,
    seed: int = 0,
    trace_s: Sequence[float] = (),
) -> LoadPattern:
    """A load pattern; bursty draws its bursts from ``seed`` (same seed, same bursts)."""
    kind = PatternKind(kind)
    if kind is PatternKind.TRACE:
        return trace_pattern(trace_s)
    if not base_qps > 0 or not math.isfinite(base_qps):
        raise SimulationError("base_qps", f"{base_qps:g} is not > 0", "give e.g. 1.5")
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise SimulationError("duration", f"{duration_s:g} s is not > 0", "give e.g. 180")
    peak = base_qps * max(SPIKE_FACTOR, STEP_FACTOR, RAMP_FACTOR, BURST_FACTORS[1])
    requests = peak * duration_s
    if requests > MAX_REQUESTS:
        count = f"{requests:,.0f}" if requests < 1e15 else f"{requests:.3g}"
        raise SimulationError(
            "duration",
            f"{duration_s:g} s at up to {peak:g} QPS is up to {count} requests, above the "
            f"{MAX_REQUESTS:,} compass generates",
            "shorten --duration or lower --base-qps",
        )
    bursts: list[Burst] = []
    if kind is PatternKind.BURSTY:
        rng = np.random.default_rng([seed, 1])
        t = float(rng.uniform(*BURST_GAP_SECONDS))
        while t < duration_s:
            length = float(rng.uniform(*BURST_SECONDS))
            bursts.append(Burst(t, min(t + length, duration_s), float(rng.uniform(*BURST_FACTORS))))
            t += length + float(rng.uniform(*BURST_GAP_SECONDS))
    return LoadPattern(kind, base_qps, duration_s, tuple(bursts))


def trace_pattern(timestamps: Sequence[float]) -> LoadPattern:
    """A pattern that replays these arrival timestamps (seconds; shifted to start at 0)."""
    if len(timestamps) == 0:
        raise SimulationError("trace", "no timestamps", "give one arrival time (s) a line")
    if len(timestamps) > MAX_REQUESTS:
        raise SimulationError(
            "trace",
            f"{len(timestamps):,} timestamps, above the {MAX_REQUESTS:,} compass replays",
            "replay a shorter stretch",
        )
    times = np.asarray(timestamps, dtype=np.float64)
    if not np.all(np.isfinite(times)):
        raise SimulationError("trace", "a timestamp is not a finite number", "fix the file")
    if np.any(np.diff(times) < 0):
        where = int(np.argmax(np.diff(times) < 0)) + 1
        raise SimulationError(
            "trace",
            f"timestamp {where + 1} ({times[where]:g}) is before the one above it",
            "sort the trace",
        )
    times = times - times[0]
    duration = max(float(times[-1]), 1e-9) + 1e-9
    mean_rate = len(times) / duration
    return LoadPattern(PatternKind.TRACE, mean_rate, duration, trace_s=tuple(times.tolist()))


@dataclass(frozen=True)
class Scenario:
    """One realisation of the load: arrival times and each request's service-time luck."""

    pattern: LoadPattern
    seed: int
    arrivals_s: FloatArray
    luck: FloatArray

    @property
    def requests(self) -> int:
        """Number of requests."""
        return len(self.arrivals_s)

    def pods_of(self, pods: int) -> IntArray:
        """The pod (0 .. pods-1) each request goes to: uniform, seeded, the same every time."""
        if pods < 1:
            raise SimulationError("pods", f"{pods} is not >= 1", "give 1 or more")
        # The third child of the scenario's seed: the arrivals and the luck keep theirs.
        rng = np.random.default_rng(np.random.SeedSequence(self.seed).spawn(3)[2])
        assigned: IntArray = rng.integers(0, pods, self.requests, dtype=np.int64)
        return assigned

    def member_draws(self) -> FloatArray:
        """Each request's seeded uniform draw for the gateway's weighted pick of its member."""
        # The fourth child of the scenario's seed: the first three keep theirs.
        rng = np.random.default_rng(np.random.SeedSequence(self.seed).spawn(4)[3])
        draws: FloatArray = rng.uniform(0, 1, self.requests)
        return draws


def make_scenario(pattern: LoadPattern, seed: int) -> Scenario:
    """Seeded arrivals (Poisson, thinned to the pattern's rate) and service-time luck."""
    arrival_rng, luck_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)
    )
    if pattern.kind is PatternKind.TRACE:
        arrivals = np.asarray(pattern.trace_s, dtype=np.float64)
    else:
        peak = pattern.peak_qps
        candidates = np.sort(
            arrival_rng.uniform(
                0, pattern.duration_s, arrival_rng.poisson(peak * pattern.duration_s)
            )
        )
        keep = arrival_rng.uniform(0, peak, len(candidates)) < pattern.rate(candidates)
        arrivals = candidates[keep]
    return Scenario(pattern, seed, arrivals, luck_rng.uniform(0, 1, len(arrivals)))
