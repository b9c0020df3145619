"""The benches' trace windows: each trace's non-overlapping slots, seeded per trace, dealt
alternately into the windows a bench may tune on and the held-out ones it reports on."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compass.domain.traces import TRACE_NAMES, TRACE_SPANS, TraceError, TraceWindow


@dataclass(frozen=True)
class WindowSets:
    """A bench's windows: the ones it may tune on and the ones it reports on."""

    tuning: tuple[TraceWindow, ...]
    held_out: tuple[TraceWindow, ...]


def _count(field: str, value: int, low: int, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TraceError(field, f"{value!r} is not a whole number", f"give e.g. {example}")
    if value < low:
        raise TraceError(field, f"{value} is not >= {low}", f"give e.g. {example}")
    return int(value)


def _positive(field: str, value: float, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(field, f"{value!r} is not a number", f"give e.g. {example}")
    if not math.isfinite(value) or not value > 0:
        raise TraceError(field, f"{value:g} is not a finite number > 0", f"give e.g. {example}")
    return float(value)


def _span(name: str, spans: Mapping[str, float] | None) -> float:
    table = TRACE_SPANS if spans is None else spans
    if name not in table:
        known = ", ".join(sorted(table)) or "none"
        raise TraceError("trace", f"no trace named {name!r}", f"use one of: {known}")
    return _positive(f"span of {name}", table[name], "3600")


def trace_windows(
    names: Sequence[str],
    count: int,
    length_s: float,
    seed: int,
    spans: Mapping[str, float] | None = None,
) -> WindowSets:
    """``count`` non-overlapping windows per trace, split into tuning and held-out (module doc)."""
    if isinstance(names, str) or len(names) == 0:
        raise TraceError("names", "no trace named", f"give e.g. {list(TRACE_NAMES)}")
    if len(set(names)) != len(names):
        raise TraceError("names", f"{list(names)} names a trace twice", "name each once")
    count = _count("count", count, 2, "4")
    length = _positive("length_s", length_s, "600")
    seed = _count("seed", seed, 0, "0")
    tuning: list[TraceWindow] = []
    held_out: list[TraceWindow] = []
    for name in names:
        span = _span(name, spans)
        slots = math.floor(span / length)
        if slots * length > span:  # span / length rounded up across a whole number
            slots -= 1
        if slots < count:
            raise TraceError(
                "count",
                f"{name} ({span:g} s) holds {slots} windows of {length:g} s, not {count}",
                f"ask for at most {slots} or shorten length_s to {span / count:g} s or less",
            )
        rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])
        picked = rng.permutation(slots)[:count]
        tuning.extend(TraceWindow(name, float(j * length), length) for j in sorted(picked[0::2]))
        held_out.extend(TraceWindow(name, float(j * length), length) for j in sorted(picked[1::2]))
    return WindowSets(tuple(tuning), tuple(held_out))
