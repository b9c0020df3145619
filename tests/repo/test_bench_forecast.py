"""bench/forecast.py compares the forecasters end to end on a small run."""

from __future__ import annotations

import math

import pytest
from bench_runner import run_bench


def test_forecast_bench_prints_every_forecaster_on_every_shape(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = run_bench("forecast.py", ["--seeds", "1", "--bases", "5"], DURATION_S=150.0)
    out = capsys.readouterr().out
    assert code == 0
    # (shape, forecaster) -> MAE %, from rows "  <family> shapes: <shape> <forecaster> <5 numbers>"
    errors: dict[tuple[str, str], float] = {}
    for line in out.splitlines():
        if "shapes: " not in line:
            continue
        tokens = line.split("shapes: ", 1)[1].split()
        errors[tokens[0], " ".join(tokens[1:-5])] = float(tokens[-5])
    shapes = ("spike", "ramp", "step", "bursty", "sine", "flash", "sawtooth", "all")
    expected = {(s, f) for s in shapes for f in ("last 10 s", "smoother", "lstm")}
    assert expected <= set(errors), out
    assert all(math.isfinite(e) and e >= 0 for e in errors.values()), out
    # Bursts are what the LSTM learned to expect and the last window cannot.
    assert errors["bursty", "lstm"] < errors["bursty", "last 10 s"], out
