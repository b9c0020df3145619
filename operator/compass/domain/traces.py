"""Public production arrival traces as the yardstick: windows cut, stretched and enumerated.
Pure (``compass.examples.load_trace`` reads them); docs/method.md, "Real load: trace windows"."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compass.domain.arrivals import LoadPattern, PatternKind, make_pattern
from compass.domain.errors import FieldError

FloatArray = npt.NDArray[np.float64]

# The traces shipped in compass/examples/traces/ and each one's span (its last offset), s.
TRACE_SPANS: Mapping[str, float] = {
    "azure-llm-code-2023": 3435.948056,
    "azure-llm-conv-2023": 3501.721937,
    "mooncake-conversation": 3536.999,
}
TRACE_NAMES: tuple[str, ...] = tuple(TRACE_SPANS)


class TraceError(FieldError):
    """A trace window or its parameters are invalid: `<field>: <what is wrong>; <the fix>`."""


@dataclass(frozen=True)
class TraceWindow:
    """``[start_s, start_s + length_s)`` of the named trace, in the trace's own seconds."""

    trace: str
    start_s: float
    length_s: float


def _positive(field: str, value: float, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(field, f"{value!r} is not a number", f"give e.g. {example}")
    if not math.isfinite(value) or not value > 0:
        raise TraceError(field, f"{value:g} is not a finite number > 0", f"give e.g. {example}")
    return float(value)


def check_arrivals(arrivals_s: npt.ArrayLike) -> FloatArray:
    """The offsets as floats, after checking them: non-empty, finite, >= 0 and sorted."""
    times = np.asarray(arrivals_s, dtype=np.float64)
    if times.ndim != 1 or len(times) == 0:
        raise TraceError("arrivals", "not a non-empty list of offsets", "load a shipped trace")
    if not np.all(np.isfinite(times)):
        raise TraceError("arrivals", "an offset is not a finite number", "fix the trace file")
    if times[0] < 0:
        raise TraceError("arrivals", f"the first offset is {times[0]:g} < 0", "shift it to 0")
    if np.any(np.diff(times) < 0):
        where = int(np.argmax(np.diff(times) < 0)) + 1
        raise TraceError(
            "arrivals", f"offset {where + 1} ({times[where]:g}) is before the one above it", "sort"
        )
    return times


def check_window(window: TraceWindow, span_s: float) -> None:
    """Raise TraceError unless the window is a finite, positive stretch inside [0, span_s]."""
    length = _positive("length_s", window.length_s, "600")
    if isinstance(window.start_s, bool) or not isinstance(window.start_s, int | float):
        raise TraceError("start_s", f"{window.start_s!r} is not a number", "give e.g. 0")
    if not math.isfinite(window.start_s) or window.start_s < 0:
        raise TraceError("start_s", f"{window.start_s:g} is not a finite number >= 0", "give 0")
    if window.start_s + length > span_s:
        raise TraceError(
            "start_s",
            f"the window [{window.start_s:g}, {window.start_s + length:g}) s ends after "
            f"{window.trace}'s {span_s:g} s",
            f"start at most at {max(span_s - length, 0.0):g} s or shorten length_s",
        )


def cut_window(arrivals_s: npt.ArrayLike, window: TraceWindow) -> FloatArray:
    """The window's arrivals, shifted to start at 0 (``start_s <= t < start_s + length_s``)."""
    times = check_arrivals(arrivals_s)
    check_window(window, float(times[-1]))
    low, high = np.searchsorted(times, [window.start_s, window.start_s + window.length_s], "left")
    shifted: FloatArray = times[low:high] - window.start_s
    return shifted


def stretch_window(
    arrivals_s: npt.ArrayLike, window: TraceWindow, utilisation: float, capacity_qps: float
) -> FloatArray:
    """The window cut from these offsets, stretched to mean rate ``utilisation x capacity_qps``."""
    shifted = cut_window(arrivals_s, window)
    _positive("utilisation", utilisation, "0.7")
    _positive("capacity_qps", capacity_qps, "4.0")
    if len(shifted) < 1:
        raise TraceError(
            "window", "it holds no arrival, so no stretch gives it a rate", "pick another window"
        )
    factor = (len(shifted) / window.length_s) / (utilisation * capacity_qps)
    stretched: FloatArray = shifted * factor
    return stretched


def window_pattern(
    arrivals_s: npt.ArrayLike,
    window: TraceWindow,
    utilisation: float,
    fastest_mean_ms: float,
    servers: int = 1,
) -> LoadPattern:
    """The window as a trace pattern, stretched to ``utilisation`` of the fastest on ``servers``."""
    capacity = servers * 1000.0 / _positive("fastest_mean_ms", fastest_mean_ms, "100")
    stretched = stretch_window(arrivals_s, window, utilisation, capacity)
    return make_pattern(PatternKind.TRACE, 1, 1, trace_s=stretched.tolist())
