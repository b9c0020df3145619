"""The load forecasters side by side: the last window's rate, Holt's smoother and the LSTM.

Run as ``python bench/forecast.py [--seeds 5] [--seed-offset 100] [--bases 1.5,5,20]``.
Each forecaster reads the last 120 s of Poisson arrivals per second (bench/forecasters.py's
input) and says the mean rate of the next 10 s; every 2 s of each run is one forecast,
compared with the true mean rate. Two families of load: the simulator's shapes (spike, ramp,
step, bursty; the training used other seeds, from 10**6) and shapes no forecaster was fitted
on (a sine with a 2-minute period, a flash crowd decaying over 30 s, a sawtooth of 60 s
rises). Printed per family and forecaster: the mean absolute error as a share of the mean
rate, the share of forecasts below 80% of the truth (an under-forecast is what lets a queue
build), the same two in the 10 s after a rise of the load by half or more (what a forecast is
for), and the cost of one forecast. What they did for the predictive strategy, when it took
one, is in bench/README.md's row of this script. Exits 0.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from compass.domain.arrivals import make_pattern
from forecasters import (
    HISTORY_S,
    HORIZON_S,
    MIN_HISTORY_S,
    Forecaster,
    Holt,
    LastWindow,
    Lstm,
    arrival_series,
)

FloatArray = npt.NDArray[np.float64]
DURATION_S = 300.0
STEP_S = 2
# A rise: the true rate of the next HORIZON_S is this much above the last 10 s's.
RISE = 1.5
UNDER = 0.8
SEEN = ("spike", "ramp", "step", "bursty")
UNSEEN = ("sine", "flash", "sawtooth")


def unseen_rate(kind: str, base: float) -> Callable[[FloatArray], FloatArray]:
    """A load shape outside the training family, as a rate function of time (s)."""
    if kind == "sine":
        return lambda t: base * (1 + 0.8 * np.sin(2 * np.pi * t / 120))
    if kind == "flash":
        # Calm, then at 100 s a crowd of 8x decaying with a 30 s time constant.
        return lambda t: base * (1 + np.where(t >= 100, 7 * np.exp(-(t - 100) / 30), 0.0))
    if kind == "sawtooth":
        return lambda t: base * (1 + 2 * ((t % 60) / 60))
    raise ValueError(kind)


def per_second(kind: str, base: float, seed: int) -> FloatArray:
    """The true mean rate of each second of the run."""
    grid = np.arange(0, DURATION_S, 0.1)
    if kind in SEEN:
        rate = make_pattern(kind, base, DURATION_S, seed=seed).rate(grid)
    else:
        rate = unseen_rate(kind, base)(grid)
    means: FloatArray = rate.reshape(-1, 10).mean(axis=1)
    return means


def windows(kind: str, base: float, seed: int) -> list[tuple[FloatArray, int, float, bool]]:
    """(input series, known seconds, true mean of the next HORIZON_S, a rise?) every STEP_S."""
    truth = per_second(kind, base, seed)
    counts = np.random.default_rng([seed, 7]).poisson(truth).astype(np.float64)
    counter = np.concatenate([[0.0], np.cumsum(counts)])
    horizon = int(HORIZON_S)
    out = []
    for now in range(MIN_HISTORY_S, len(truth) - horizon, STEP_S):
        samples = [(float(t), float(counter[t])) for t in range(max(0, now - HISTORY_S), now + 1)]
        series = arrival_series(samples, float(now))
        if series is None:
            continue
        ahead = float(truth[now : now + horizon].mean())
        recent = float(truth[max(0, now - 10) : now].mean())
        out.append((series[0], series[1], ahead, ahead >= RISE * recent))
    return out


def score(
    forecaster: Forecaster, cases: Sequence[tuple[FloatArray, int, float, bool]]
) -> tuple[float, float, float, float, float]:
    """(MAE % of the mean, under %, MAE % after rises, under % after rises, us per forecast)."""
    started = time.perf_counter()
    guesses = np.array([forecaster.forecast(series, known) for series, known, _, _ in cases])
    cost_us = (time.perf_counter() - started) / len(cases) * 1e6
    truth = np.array([c[2] for c in cases])
    rises = np.array([c[3] for c in cases])
    error = np.abs(guesses - truth)
    under = guesses < UNDER * truth

    def pct(values: FloatArray, mask: npt.NDArray[np.bool_], of: FloatArray) -> float:
        return 100 * float(values[mask].sum() / of[mask].sum()) if mask.any() else float("nan")

    everything = np.ones_like(rises)
    return (
        pct(error, everything, truth),
        100 * float(under.mean()),
        pct(error, rises, truth),
        100 * float(under[rises].mean()) if rises.any() else float("nan"),
        cost_us,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per shape and base rate")
    parser.add_argument("--seed-offset", type=int, default=100, help="first seed")
    parser.add_argument("--bases", default="1.5,5,20", help="base rates per s, comma-separated")
    args = parser.parse_args(argv)
    bases = [float(b) for b in args.bases.split(",")]
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    forecasters: dict[str, Forecaster] = {
        "last 10 s": LastWindow(10),
        "smoother": Holt(),
        "lstm": Lstm.shipped(),
    }
    started = time.monotonic()
    print(
        f"forecast of the next {HORIZON_S:g} s from the last {HISTORY_S} s, every {STEP_S} s of "
        f"{DURATION_S:g} s runs; bases {args.bases}/s, seeds {seeds.start}-{seeds.stop - 1}"
    )
    print(
        f"  {'family':<28} {'forecaster':<10} {'MAE%':>6} {'under%':>7} "
        f"{'rise MAE%':>10} {'rise under%':>12} {'us':>7}"
    )
    every = {
        kind: [case for base in bases for seed in seeds for case in windows(kind, base, seed)]
        for kind in (*SEEN, *UNSEEN)
    }
    for family, kinds in (("simulator's shapes", SEEN), ("unseen shapes", UNSEEN)):
        for kind in (*kinds, "all"):
            chosen = kinds if kind == "all" else (kind,)
            cases = [case for k in chosen for case in every[k]]
            label = f"{family}: {kind}"
            for name, forecaster in forecasters.items():
                mae, under, rise_mae, rise_under, cost = score(forecaster, cases)
                print(
                    f"  {label:<28} {name:<10} {mae:6.1f} {under:7.1f} {rise_mae:10.1f} "
                    f"{rise_under:12.1f} {cost:7.0f}"
                )
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
