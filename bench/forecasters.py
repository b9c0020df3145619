"""Short-horizon forecasts of a pod's arrival rate from an arrivals counter: bench/forecast.py's.

Two forecasters over the last ``HISTORY_S`` seconds of per-second arrivals: Holt's trend-aware
smoother and a small LSTM trained offline by ``bench/train_forecaster.py`` (its weights in
``bench/data/forecast-lstm.json``), run in numpy. Each says the mean rate over the next
``HORIZON_S`` seconds. They left the operator because none served predictive better than its
own steady window of the arrivals (bench/README.md, the ``forecast.py`` row).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# The input: per-second arrivals over the last two minutes; the output: the mean rate over
# the next 10 s (the predictive strategy's horizon).
HISTORY_S = 120
HORIZON_S = 10.0
# Fewer known seconds than this: no forecast.
MIN_HISTORY_S = 2
# Holt's smoothing of the level and of the trend, fitted by bench/train_forecaster.py on its
# training series (a grid over both; the mean squared error of the 10 s mean rate).
HOLT_LEVEL = 0.15
HOLT_TREND = 0.001
LSTM_WEIGHTS = Path(__file__).resolve().parent / "data" / "forecast-lstm.json"


def arrival_series(
    samples: Sequence[tuple[float, float]], now: float, history_s: int = HISTORY_S
) -> tuple[FloatArray, int] | None:
    """(arrivals in each of the last ``history_s`` seconds up to ``now``, oldest first; how many
    of those seconds the samples cover), from (time, counter) samples in time order. The
    counter is interpolated linearly between samples; the seconds before the first sample
    repeat the earliest known second's rate. None when under ``MIN_HISTORY_S`` are known."""
    if len(samples) < 2:
        return None
    times = np.array([t for t, _ in samples], dtype=np.float64)
    totals = np.array([c for _, c in samples], dtype=np.float64)
    grid = now - history_s + np.arange(history_s + 1, dtype=np.float64)
    first = int(np.searchsorted(grid, times[0] - 1e-9))
    known = history_s - first
    if known < MIN_HISTORY_S:
        return None
    counter = np.interp(grid, times, totals)
    rates = np.diff(counter)
    rates[:first] = rates[first]
    return np.maximum(rates, 0.0), known


class Forecaster(Protocol):
    """Says the mean arrival rate over the next ``HORIZON_S`` seconds from the last seconds."""

    def forecast(self, series: FloatArray, known: int) -> float:
        """The mean rate (per s) over the next ``HORIZON_S`` s; ``series`` as arrival_series
        gives it, ``known`` of its newest seconds measured."""
        ...


@dataclass(frozen=True)
class LastWindow:
    """The mean rate of the last ``window_s`` seconds: what holds if nothing changes."""

    window_s: int = 10

    def forecast(self, series: FloatArray, known: int) -> float:
        """The mean of the newest ``window_s`` known seconds."""
        return float(series[-min(self.window_s, known) :].mean())


@dataclass(frozen=True)
class Holt:
    """Holt's linear exponential smoothing: a level and a trend, extrapolated over the
    horizon (its mean is the level plus the trend at the horizon's midpoint)."""

    level: float = HOLT_LEVEL
    trend: float = HOLT_TREND

    def __post_init__(self) -> None:
        for name in ("level", "trend"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name}: {value!r} is not in (0, 1]; give e.g. 0.1")

    def forecast(self, series: FloatArray, known: int) -> float:
        """Smooth the known seconds, then extrapolate the trend."""
        observed = series[-known:]
        level, trend = float(observed[0]), 0.0
        for value in observed[1:]:
            previous = level
            level = self.level * float(value) + (1 - self.level) * (level + trend)
            trend = self.trend * (level - previous) + (1 - self.trend) * trend
        return max(level + trend * (HORIZON_S + 1) / 2, 0.0)


def _sigmoid(x: FloatArray) -> FloatArray:
    result: FloatArray = 1.0 / (1.0 + np.exp(-x))
    return result


def lstm_inputs(series: FloatArray, known: int) -> tuple[FloatArray, float]:
    """(the LSTM's input, a (seconds, 2) array: each second's arrivals over the scale and
    whether it was measured; the scale: the known seconds' mean rate, at least 0.1/s)."""
    scale = max(float(series[-known:].mean()), 0.1)
    flags = np.zeros_like(series)
    flags[len(series) - known :] = 1.0
    return np.stack([series / scale, flags], axis=1), scale


@dataclass(frozen=True)
class Lstm:
    """One LSTM layer over the normalised series and a linear head (softplus, times the
    scale): PyTorch's layout (gates i, f, g, o), run in numpy."""

    weight_ih: FloatArray
    weight_hh: FloatArray
    bias: FloatArray
    head_weight: FloatArray
    head_bias: float

    @classmethod
    def from_json(cls, weights: dict[str, Any]) -> Lstm:
        """The forecaster from bench/train_forecaster.py's JSON (checked for shape)."""
        try:
            weight_ih = np.asarray(weights["weight_ih"], dtype=np.float64)
            weight_hh = np.asarray(weights["weight_hh"], dtype=np.float64)
            bias = np.asarray(weights["bias_ih"], dtype=np.float64) + np.asarray(
                weights["bias_hh"], dtype=np.float64
            )
            head = np.asarray(weights["head_weight"], dtype=np.float64).reshape(-1)
            head_bias = float(np.asarray(weights["head_bias"], dtype=np.float64).reshape(-1)[0])
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise ValueError(f"LSTM weights: {error!r}; rerun bench/train_forecaster.py") from error
        hidden = weight_hh.shape[1] if weight_hh.ndim == 2 else 0
        shapes_fit = (
            hidden > 0
            and weight_ih.shape == (4 * hidden, 2)
            and weight_hh.shape == (4 * hidden, hidden)
            and bias.shape == (4 * hidden,)
            and head.shape == (hidden,)
        )
        if not shapes_fit:
            raise ValueError(
                f"LSTM weights: shapes {weight_ih.shape}, {weight_hh.shape}, {bias.shape}, "
                f"{head.shape} do not make one layer over 2 inputs; rerun "
                "bench/train_forecaster.py"
            )
        return cls(weight_ih, weight_hh, bias, head, head_bias)

    @classmethod
    def shipped(cls) -> Lstm:
        """The forecaster bench/train_forecaster.py trained, from bench/data."""
        return _shipped_lstm()

    def forecast(self, series: FloatArray, known: int) -> float:
        """Run the layer over the series, the head over its last state."""
        inputs, scale = lstm_inputs(series, known)
        hidden = self.weight_hh.shape[1]
        # The input's share of every step's gates at once; the recurrence is what loops.
        driven = inputs @ self.weight_ih.T + self.bias
        state = np.zeros(hidden)
        cell = np.zeros(hidden)
        # Few numpy calls a step (each costs more than its arithmetic at this size): one
        # sigmoid over all four gates, of which the cell's input (g) is not used.
        cell_input = slice(2 * hidden, 3 * hidden)
        for step in driven:
            gates = step + self.weight_hh @ state
            opened = _sigmoid(gates)
            cell = opened[hidden : 2 * hidden] * cell + opened[:hidden] * np.tanh(gates[cell_input])
            state = opened[3 * hidden :] * np.tanh(cell)
        out = float(self.head_weight @ state) + self.head_bias
        # softplus, written to stay finite for large outputs
        return scale * (max(out, 0.0) + math.log1p(math.exp(-abs(out))))


@lru_cache(maxsize=1)
def _shipped_lstm() -> Lstm:
    """The shipped weights, read once per process."""
    text = LSTM_WEIGHTS.read_text("utf-8")
    return Lstm.from_json(json.loads(text))
