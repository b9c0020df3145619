"""Latency profiles: what each configuration costs to serve, validated from parsed JSON."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from scipy.special import ndtri

from compass.domain.arrays import FloatArray
from compass.domain.capacity import (
    MAX_LATENCY_MS,
    MIN_LATENCY_MS,
    PERCENTILE_FIELDS,
    CapacityCurve,
    CapacityError,
    check_rising,
    parse_curve,
)
from compass.domain.errors import FieldError
from compass.domain.evaluation import ParamValue
from compass.domain.space import config_key

# The JSON fields of the measured statistics (the percentiles': PERCENTILE_FIELDS).
MEAN_FIELD = "latency_mean_ms"
STD_FIELD = "latency_std_ms"
# Each component model's mean time (optional; profiling asks the router for it).
COMPONENT_FIELD = "component_ms"
# A streaming workflow's time to its first streamed response, ms (optional).
TTFT_FIELDS = {"mean": "ttft_mean_ms", "p50": "ttft_p50_ms", "p95": "ttft_p95_ms"}
MAX_COMPONENTS = 16
# Bisection steps when matching the standard deviation: 60 halvings reach float precision.
_BISECTION_STEPS = 60
# Cumulative probabilities are kept this far from 0 and 1, where the normal score is infinite.
_EDGE = 1e-12


class ProfileError(FieldError):
    """A profile is unusable: one line, `<field>: <what is wrong>; <the fix>`."""


@dataclass(frozen=True)
class ServiceDistribution:
    """Service times Q(Z), Z standard normal, linear in Z between the measured percentiles (a
    normal is reproduced exactly); the slopes past them carry the mean and the std."""

    z_knots: tuple[float, ...]
    values_ms: tuple[float, ...]
    low_slope: float
    high_slope: float

    def quantile(self, u: float | FloatArray) -> FloatArray:
        """Service times (ms) at these cumulative probabilities in (0, 1); never negative."""
        z = np.asarray(ndtri(np.clip(u, _EDGE, 1 - _EDGE)), dtype=np.float64)
        first, last = self.z_knots[0], self.z_knots[-1]
        times = np.interp(z, self.z_knots, self.values_ms)
        times = np.where(z < first, self.values_ms[0] + self.low_slope * (z - first), times)
        times = np.where(z > last, self.values_ms[-1] + self.high_slope * (z - last), times)
        clipped: FloatArray = np.maximum(times, 0.0)
        return clipped

    def _pieces(self) -> list[tuple[float, float, float, float]]:
        """(z from, z to, intercept, slope) of each linear piece of Q over the real line."""
        z, v = self.z_knots, self.values_ms
        pieces = [(-math.inf, z[0], v[0] - self.low_slope * z[0], self.low_slope)]
        for (z0, v0), (z1, v1) in itertools.pairwise(zip(z, v, strict=True)):
            slope = (v1 - v0) / (z1 - z0)
            pieces.append((z0, z1, v0 - slope * z0, slope))
        pieces.append((z[-1], math.inf, v[-1] - self.high_slope * z[-1], self.high_slope))
        return pieces

    def _moments(self) -> tuple[float, float]:
        """E[Q(Z)] and E[Q(Z)^2], from truncated-normal moments piece by piece."""
        first = second = 0.0
        for a, b, c, s in self._pieces():
            mass = _cdf(b) - _cdf(a)
            z_mean = _pdf(a) - _pdf(b)  # E[Z; a < Z < b]
            z_square = mass + _z_pdf(a) - _z_pdf(b)  # E[Z^2; a < Z < b]
            first += c * mass + s * z_mean
            second += c * c * mass + 2 * c * s * z_mean + s * s * z_square
        return first, second

    @property
    def mean_ms(self) -> float:
        """The mean (the clip at zero is ignored: it lies beyond 5 sigma for real profiles)."""
        return self._moments()[0]

    @property
    def std_ms(self) -> float:
        """The standard deviation (same caveat as the mean)."""
        mean, second = self._moments()
        return math.sqrt(max(second - mean * mean, 0.0))


def _pdf(z: float) -> float:
    return 0.0 if math.isinf(z) else math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def _z_pdf(z: float) -> float:
    return 0.0 if math.isinf(z) else z * _pdf(z)


def _cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def fit_distribution(
    mean_ms: float, percentiles: Mapping[float, float], std_ms: float | None
) -> ServiceDistribution:
    """The distribution through the measured percentiles whose mean (and std) match: the std
    grows with the upper slope (the lower keeps the mean), so one bisection matches it."""
    inner = sorted(percentiles.items())
    z_knots = tuple(float(ndtri(p / 100)) for p, _ in inner)
    values = tuple(v for _, v in inner)

    def build(low: float, high: float) -> ServiceDistribution:
        return ServiceDistribution(z_knots, values, max(low, 0.0), high)

    # mean(low, high) = base + high * up - low * down, with up, down > 0.
    base = build(0.0, 0.0).mean_ms
    up = build(0.0, 1.0).mean_ms - base
    down = base - build(1.0, 0.0).mean_ms

    def low_for(high: float) -> float:
        return (base + high * up - mean_ms) / down

    # A quantile function never decreases, so both slopes are >= 0: high must keep low >= 0.
    high_min = max(0.0, (mean_ms - base) / up)
    if std_ms is None:
        if len(values) > 1:
            slope = (values[-1] - values[-2]) / (z_knots[-1] - z_knots[-2])
        else:
            # One percentile and a mean: a normal (equal slopes) when the mean allows it.
            slope = (values[0] - mean_ms) / z_knots[0] if z_knots[0] > 0 else 0.0
        high = max(high_min, slope)
        return build(low_for(high), high)

    def spread(high: float) -> float:
        return build(low_for(high), high).std_ms

    if spread(high_min) >= std_ms:
        return build(low_for(high_min), high_min)
    a, b = high_min, max(high_min, 1.0)
    while spread(b) < std_ms:
        a, b = b, 2 * b
    for _ in range(_BISECTION_STEPS):
        middle = (a + b) / 2
        a, b = (middle, b) if spread(middle) < std_ms else (a, middle)
    return build(low_for((a + b) / 2), (a + b) / 2)


@dataclass(frozen=True)
class LatencyProfile:
    """One configuration's accuracy and measured service time (ms)."""

    config: Mapping[str, ParamValue]
    accuracy: float
    mean_ms: float
    p95_ms: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    std_ms: float | None = None
    capacity: CapacityCurve | None = None
    # Each component model's mean time at idle (ms): what late binding splits the time by.
    component_ms: Mapping[str, float] | None = None
    # Time to first token (a streaming workflow's first streamed response), ms, where measured.
    ttft_mean_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None

    @cached_property
    def key(self) -> str:
        """Canonical identity of the configuration (sorted-key JSON)."""
        return config_key(self.config)

    @cached_property
    def name(self) -> str:
        """A short label: the parameter values joined by '/', in the profile's own order."""
        return "/".join(str(value) for value in self.config.values())

    def measured_percentiles(self) -> dict[float, float]:
        """The percentiles that were measured, lowest first."""
        found = {50.0: self.p50_ms, 95.0: self.p95_ms, 99.0: self.p99_ms}
        return {p: v for p, v in found.items() if v is not None}

    def latency_at(self, percentile: float) -> float:
        """The service time at this percentile: measured if it was, else from the distribution."""
        measured = self.measured_percentiles()
        if percentile in measured:
            return measured[percentile]
        return float(self.distribution.quantile(percentile / 100))

    def busy_holding_ms(self, servers: int) -> float | None:
        """How long a request holds one of ``servers`` busy instances (a saturated curve's)."""
        curve = self.capacity
        if curve is None or curve.servers != servers or not curve.saturated:
            return None
        return curve.holding_ms()

    def busy_stretch(self, servers: int) -> float:
        """How many times its own time a request holds one of ``servers`` busy instances."""
        return max(1.0, (self.busy_holding_ms(servers) or self.mean_ms) / self.mean_ms)

    def slot_stretch(self, slots: int) -> float:
        """How many times its own time a request takes with ``slots`` pipelines at once."""
        if slots <= 1:
            return 1.0
        if self.busy_holding_ms(slots) is None:
            return float(slots)
        return min(self.busy_stretch(slots), float(slots))

    @cached_property
    def distribution(self) -> ServiceDistribution:
        """The service-time distribution fitted to the measurements (see fit_distribution)."""
        return fit_distribution(self.mean_ms, self.measured_percentiles(), self.std_ms)


def clearly_dominated(
    screened: Sequence[tuple[float | None, float]],
    margin: float,
    by: Collection[int] | None = None,
) -> set[int]:
    """Which screenings another (``by``) beats by ``margin``: noise never drops a front member."""
    return {
        i
        for i, (accuracy_i, mean_i) in enumerate(screened)
        if accuracy_i is not None
        and any(
            j != i
            and (by is None or j in by)
            and accuracy_j is not None
            and accuracy_j >= accuracy_i
            and mean_j * (1 + margin) <= mean_i
            for j, (accuracy_j, mean_j) in enumerate(screened)
        )
    }


def _number(
    entry: Mapping[str, Any],
    field: str,
    where: str,
    *,
    required: bool,
    positive: bool,
    time: bool = True,
) -> float | None:
    """A finite number from a profile entry, its sign and time range checked; None if absent."""
    if entry.get(field) is None:
        if required:
            raise ProfileError(f"{where}.{field}", "missing", "every profile needs it")
        return None
    value = entry[field]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{where}.{field}", f"{value!r} is not a number", "write a number")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        digits = len(str(abs(value)))
        raise ProfileError(
            f"{where}.{field}", f"an integer of {digits} digits", "re-measure it"
        ) from None
    if not math.isfinite(number):
        raise ProfileError(f"{where}.{field}", f"{value!r} is not finite", "re-measure it")
    if number < 0:
        raise ProfileError(f"{where}.{field}", f"{number:g} is negative", "times must be >= 0")
    if positive and number == 0:
        raise ProfileError(f"{where}.{field}", "0", "a service time must be > 0")
    if not time:
        return number
    if positive and number < MIN_LATENCY_MS:
        raise ProfileError(
            f"{where}.{field}",
            f"{number:g} ms is below {MIN_LATENCY_MS:g} ms",
            "check the units: times are in ms",
        )
    if number > MAX_LATENCY_MS:
        raise ProfileError(
            f"{where}.{field}",
            f"{number:g} ms is above {MAX_LATENCY_MS:,.0f} ms (an hour)",
            "check the units: times are in ms",
        )
    return number


def parse_profile(entry: object, where: str) -> LatencyProfile:
    """One profile from its parsed JSON object; ProfileError names the first bad field."""
    if not isinstance(entry, Mapping):
        raise ProfileError(
            where,
            f"expected an object with config, accuracy and latency_*_ms, got "
            f"{type(entry).__name__}",
            "fix the entry",
        )
    config = entry.get("config")
    if not isinstance(config, Mapping) or not config:
        raise ProfileError(
            f"{where}.config", "missing or empty", "give the parameter values as an object"
        )
    for name, value in config.items():
        if not isinstance(value, str | int | float | bool):
            raise ProfileError(
                f"{where}.config.{name}",
                f"{value!r} is not a string, number or boolean",
                "use scalar parameter values",
            )
    accuracy = _number(entry, "accuracy", where, required=True, positive=False, time=False)
    mean = _number(entry, MEAN_FIELD, where, required=True, positive=True)
    p95 = _number(entry, PERCENTILE_FIELDS[95.0], where, required=True, positive=True)
    p50 = _number(entry, PERCENTILE_FIELDS[50.0], where, required=False, positive=True)
    p99 = _number(entry, PERCENTILE_FIELDS[99.0], where, required=False, positive=True)
    std = _number(entry, STD_FIELD, where, required=False, positive=False)
    assert accuracy is not None
    assert mean is not None
    assert p95 is not None
    if accuracy > 1:
        raise ProfileError(f"{where}.accuracy", f"{accuracy:g} is above 1", "give a fraction")
    ordered = [(p, v) for p, v in ((50.0, p50), (95.0, p95), (99.0, p99)) if v is not None]
    check_rising(where, [(PERCENTILE_FIELDS[p], v) for p, v in ordered], ProfileError)
    if mean > ordered[-1][1]:
        raise ProfileError(
            f"{where}.{MEAN_FIELD}",
            f"{mean:g} is above the highest percentile measured ({ordered[-1][1]:g})",
            "check the units and the run",
        )
    ttft = _first_response_times(entry, where, mean, p95)
    capacity = None
    if entry.get("capacity") is not None:
        try:
            capacity = parse_curve(entry["capacity"], f"{where}.capacity")
        except CapacityError as error:
            raise ProfileError(error.field, error.what, error.fix) from None
    return LatencyProfile(
        config=dict(config),
        accuracy=accuracy,
        mean_ms=mean,
        p95_ms=p95,
        p50_ms=p50,
        p99_ms=p99,
        std_ms=std,
        capacity=capacity,
        component_ms=_component_times(entry.get(COMPONENT_FIELD), f"{where}.{COMPONENT_FIELD}"),
        ttft_mean_ms=ttft["mean"],
        ttft_p50_ms=ttft["p50"],
        ttft_p95_ms=ttft["p95"],
    )


def _first_response_times(
    entry: Mapping[str, Any], where: str, mean: float, p95: float
) -> dict[str, float | None]:
    """A profile's optional ttft_*_ms, each checked against the whole request's time."""
    found = {
        stat: _number(entry, field, where, required=False, positive=True)
        for stat, field in TTFT_FIELDS.items()
    }
    for stat, whole, whole_field in (("mean", mean, MEAN_FIELD), ("p95", p95, "latency_p95_ms")):
        value = found[stat]
        if value is not None and value > whole:
            raise ProfileError(
                f"{where}.{TTFT_FIELDS[stat]}",
                f"{value:g} is above {whole_field} {whole:g}",
                "a first token comes before the request ends: check the run",
            )
    measured = [(TTFT_FIELDS[s], v) for s in ("p50", "p95") if (v := found[s]) is not None]
    check_rising(where, measured, ProfileError)
    return found


def _component_times(value: object, where: str) -> dict[str, float] | None:
    """A profile's component times ({model: mean ms}), checked; None when absent."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise ProfileError(
            where,
            f"{value!r} is not an object of model: ms",
            'give e.g. {"retriever": 12.5, "generator": 310.0}, or leave it out',
        )
    if len(value) > MAX_COMPONENTS:
        raise ProfileError(
            where, f"{len(value)} component models", f"give at most {MAX_COMPONENTS}"
        )
    times: dict[str, float] = {}
    for model in value:
        if not isinstance(model, str) or not model:
            raise ProfileError(where, f"{model!r} is not a model name", "name each model")
        ms = _number(value, model, where, required=True, positive=False)
        assert ms is not None
        times[model] = ms
    return times


def parse_profiles(data: object, source: str = "profiles") -> tuple[LatencyProfile, ...]:
    """Every profile of a parsed profiles file: ``{"profiles": [...]}`` or a bare list."""
    entries = data.get("profiles") if isinstance(data, Mapping) else data
    if not isinstance(entries, list):
        raise ProfileError(
            source,
            "expected a list of profiles or an object with a 'profiles' list",
            "pass the profiler's JSON",
        )
    if not entries:
        raise ProfileError(
            source, "no profiles, so the Pareto front is empty", "profile at least one"
        )
    profiles: list[LatencyProfile] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"{source}[{index}]"
        profile = parse_profile(entry, where)
        if profile.key in seen:
            raise ProfileError(
                f"{where}.config",
                f"the same configuration as {source}[{seen[profile.key]}]",
                "keep one measurement per configuration",
            )
        seen[profile.key] = index
        profiles.append(profile)
    return tuple(profiles)


# The most characters a name or value takes in a status (within the API server's request limit).
MAX_SHOWN = 64


def shown(text: str) -> str:
    """``text`` cut past MAX_SHOWN, with 8 hex digits of its SHA-256 (two long names differ)."""
    if len(text) <= MAX_SHOWN:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return f"{text[: MAX_SHOWN - 10]}\u2026{digest}"
