#!/usr/bin/env python3
"""Train the LSTM load forecaster and fit Holt's smoother on synthetic arrival series.

Writes bench/data/forecast-lstm.json (what bench/forecasters.py's Lstm loads) and prints
the Holt constants that fit best (bench/forecasters.py holds them). The training series
are the simulator's load shapes (step, ramp, spike, bursty, constant) at random durations and
rates, and random piecewise-linear loads (rises and falls of up to 6x over 0-60 s); each is
Poisson arrivals per second, cut into (last 120 s, mean rate of the next 10 s) windows. Seeds
start at 10**6, away from the benches' (0-199). Takes 2-4 minutes on 2 CPU cores.

    .venv/bin/python bench/train_forecaster.py [--series 3000] [--epochs 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from compass.domain.arrivals import PatternKind, make_pattern
from forecasters import (
    HISTORY_S,
    HORIZON_S,
    LSTM_WEIGHTS,
    MIN_HISTORY_S,
    Holt,
    lstm_inputs,
)

SEED = 10**6
HIDDEN = 16
WINDOWS_PER_SERIES = 24
STEP_S = 0.1


def piecewise_rate(rng: np.random.Generator, duration: float) -> np.ndarray:
    """A random piecewise-linear load on the STEP_S grid: knots every 5-60 s, each a jump or
    a ramp to 0.25-6x the base."""
    grid = np.arange(0, duration, STEP_S)
    base = float(np.exp(rng.uniform(np.log(0.2), np.log(20))))
    knots_t, knots_v = [0.0], [base]
    t = 0.0
    while t < duration:
        t += float(rng.uniform(5, 60))
        level = base * float(np.exp(rng.uniform(np.log(0.25), np.log(6))))
        if rng.uniform() < 0.5:  # a jump: hold the old level up to just before the knot
            knots_t.append(t - 1e-3)
            knots_v.append(knots_v[-1])
        knots_t.append(t)
        knots_v.append(level)
    return np.interp(grid, knots_t, knots_v)


def simulator_rate(rng: np.random.Generator, duration: float, seed: int) -> np.ndarray:
    """One of the simulator's shapes at a random base rate, on the STEP_S grid."""
    kinds = [k for k in PatternKind if k is not PatternKind.TRACE]
    kind = kinds[int(rng.integers(len(kinds)))]
    base = float(np.exp(rng.uniform(np.log(0.2), np.log(20))))
    pattern = make_pattern(kind, base, duration, seed=seed)
    return pattern.rate(np.arange(0, duration, STEP_S))


def windows(series_count: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(series: windows x HISTORY_S arrivals per second, known seconds, target mean rate)."""
    rng = np.random.default_rng(seed)
    per_second = round(1 / STEP_S)
    horizon = int(HORIZON_S)
    inputs, knowns, targets = [], [], []
    for index in range(series_count):
        duration = float(rng.uniform(150, 600))
        if index % 2:
            rate = piecewise_rate(rng, duration)
        else:
            rate = simulator_rate(rng, duration, seed + index)
        seconds = len(rate) // per_second
        mean_per_second = rate[: seconds * per_second].reshape(seconds, per_second).mean(axis=1)
        counts = rng.poisson(mean_per_second).astype(np.float64)
        for now in rng.integers(MIN_HISTORY_S, seconds - horizon, WINDOWS_PER_SERIES):
            known = min(int(now), HISTORY_S)
            history = np.empty(HISTORY_S)
            history[HISTORY_S - known :] = counts[now - known : now]
            history[: HISTORY_S - known] = counts[now - known]
            inputs.append(history)
            knowns.append(known)
            targets.append(mean_per_second[now : now + horizon].mean())
    return np.array(inputs), np.array(knowns), np.array(targets)


class Model(torch.nn.Module):
    """One LSTM layer over (rate / scale, measured) and a softplus head: forecasters.Lstm's."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(2, HIDDEN, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return torch.nn.functional.softplus(self.head(out[:, -1])).squeeze(-1)


def normalised(series: np.ndarray, knowns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The LSTM's inputs and each window's scale, exactly as forecasters.Lstm builds them."""
    pairs = [lstm_inputs(s, int(k)) for s, k in zip(series, knowns, strict=True)]
    return np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def fit_holt(
    series: np.ndarray, knowns: np.ndarray, targets: np.ndarray, scales: np.ndarray
) -> None:
    """Print the (level, trend) of the grid with the least normalised squared error."""
    best = None
    for level in (0.05, 0.1, 0.15, 0.2, 0.3, 0.5):
        for trend in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05):
            holt = Holt(level, trend)
            guesses = np.array(
                [holt.forecast(s, int(k)) for s, k in zip(series, knowns, strict=True)]
            )
            error = float(np.mean(((guesses - targets) / scales) ** 2))
            if best is None or error < best[0]:
                best = (error, level, trend)
    assert best is not None
    print(f"holt: best level {best[1]}, trend {best[2]} (normalised MSE {best[0]:.4f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=3000, help="training series")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", type=Path, default=LSTM_WEIGHTS)
    args = parser.parse_args(argv)
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    started = time.monotonic()
    series, knowns, targets = windows(args.series, SEED)
    x, scales = normalised(series, knowns)
    y = targets / scales
    print(f"{len(x)} windows from {args.series} series ({time.monotonic() - started:.0f} s)")
    # The last tenth is for validation only.
    cut = len(x) * 9 // 10
    x_train, y_train = (
        torch.tensor(x[:cut], dtype=torch.float32),
        torch.tensor(y[:cut], dtype=torch.float32),
    )
    x_val, y_val = (
        torch.tensor(x[cut:], dtype=torch.float32),
        torch.tensor(y[cut:], dtype=torch.float32),
    )
    model = Model()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, args.epochs)
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x_train))
        for batch in order.split(256):
            optimiser.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x_train[batch]), y_train[batch])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimiser.step()
        schedule.step()
        model.eval()
        with torch.no_grad():
            validation = torch.nn.functional.mse_loss(model(x_val), y_val).item()
        print(
            f"epoch {epoch + 1}/{args.epochs}: validation MSE {validation:.4f} "
            f"({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    sample = slice(cut, min(cut + 4000, len(x)))
    fit_holt(series[sample], knowns[sample], targets[sample], scales[sample])
    state = {name: value.detach().numpy() for name, value in model.state_dict().items()}
    weights = {
        "about": "bench/forecasters.py's Lstm, trained by bench/train_forecaster.py",
        "hidden": HIDDEN,
        "weight_ih": state["lstm.weight_ih_l0"],
        "weight_hh": state["lstm.weight_hh_l0"],
        "bias_ih": state["lstm.bias_ih_l0"],
        "bias_hh": state["lstm.bias_hh_l0"],
        "head_weight": state["head.weight"],
        "head_bias": state["head.bias"],
    }
    text = json.dumps(
        {
            k: np.round(v.astype(np.float64), 6).tolist() if isinstance(v, np.ndarray) else v
            for k, v in weights.items()
        }
    )
    args.out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(text):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
