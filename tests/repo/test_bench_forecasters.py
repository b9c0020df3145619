"""bench/forecasters.py: the load forecasters' input, Holt's smoother and the LSTM (the
forecasters bench/forecast.py compares; the operator does not run them)."""

from __future__ import annotations

import numpy as np
import pytest
from bench_runner import bench_module

from compass.domain.arrivals import make_pattern

forecasters = bench_module("forecasters")
HISTORY_S, HORIZON_S = forecasters.HISTORY_S, forecasters.HORIZON_S
Holt, LastWindow, Lstm = forecasters.Holt, forecasters.LastWindow, forecasters.Lstm
arrival_series, lstm_inputs = forecasters.arrival_series, forecasters.lstm_inputs


def counter_samples(per_second: np.ndarray, every_s: float = 1.0) -> list[tuple[float, float]]:
    """(time, arrivals so far) every ``every_s`` for these arrivals per second."""
    cumulative = np.concatenate([[0.0], np.cumsum(per_second)])
    times = np.arange(0, len(per_second) + 1e-9, every_s)
    return [(float(t), float(np.interp(t, np.arange(len(cumulative)), cumulative))) for t in times]


def test_the_series_is_the_arrivals_of_each_second_padded_before_the_first_sample() -> None:
    per_second = np.array([1.0, 2, 3, 4, 5, 6])
    result = arrival_series(counter_samples(per_second), now=6.0, history_s=10)
    assert result is not None
    series, known = result
    assert known == 6
    assert series.tolist() == [1, 1, 1, 1, 1, 2, 3, 4, 5, 6]


def test_the_series_interpolates_samples_taken_every_few_seconds() -> None:
    per_second = np.full(40, 3.0)
    result = arrival_series(counter_samples(per_second, every_s=2.5), now=40.0, history_s=30)
    assert result is not None
    np.testing.assert_allclose(result[0], 3.0)
    assert result[1] == 30


def test_no_series_before_two_seconds_are_known() -> None:
    assert arrival_series([(0.0, 0.0), (1.0, 4.0)], now=1.0) is None
    assert arrival_series([(0.0, 0.0)], now=5.0) is None
    assert arrival_series([(0.0, 0.0), (1.0, 4.0), (2.0, 6.0)], now=2.0) is not None


def test_holt_follows_a_trend_that_the_last_window_lags() -> None:
    rising = np.linspace(1.0, 13.0, HISTORY_S)  # +0.1/s each second
    truth = 13.0 + 0.1 * (HORIZON_S + 1) / 2
    holt = Holt(level=0.3, trend=0.1).forecast(rising, HISTORY_S)
    last = LastWindow(10).forecast(rising, HISTORY_S)
    assert abs(holt - truth) < abs(last - truth)
    assert holt > 13.0 > last
    flat = np.full(HISTORY_S, 4.0)
    assert Holt().forecast(flat, HISTORY_S) == pytest.approx(4.0)


def test_holt_never_forecasts_a_negative_rate() -> None:
    falling = np.concatenate([np.full(60, 20.0), np.zeros(60)])
    assert Holt(level=0.5, trend=0.5).forecast(falling, HISTORY_S) >= 0.0


def test_holt_settings_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="trend"):
        Holt(trend=0.0)


def random_weights(hidden: int, seed: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    return {
        "weight_ih": rng.normal(0, 0.5, (4 * hidden, 2)).tolist(),
        "weight_hh": rng.normal(0, 0.5, (4 * hidden, hidden)).tolist(),
        "bias_ih": rng.normal(0, 0.5, 4 * hidden).tolist(),
        "bias_hh": rng.normal(0, 0.5, 4 * hidden).tolist(),
        "head_weight": rng.normal(0, 0.5, (1, hidden)).tolist(),
        "head_bias": [0.3],
    }


def test_the_numpy_lstm_computes_what_torch_does_with_the_same_weights() -> None:
    torch = pytest.importorskip("torch")
    weights = random_weights(8, seed=3)
    layer = torch.nn.LSTM(2, 8, batch_first=True, dtype=torch.float64)
    head = torch.nn.Linear(8, 1, dtype=torch.float64)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(layer, f"{name}_l0").copy_(torch.tensor(weights[name], dtype=torch.float64))
        head.weight.copy_(torch.tensor(weights["head_weight"], dtype=torch.float64))
        head.bias.copy_(torch.tensor(weights["head_bias"], dtype=torch.float64))
    series = np.random.default_rng(4).poisson(5.0, HISTORY_S).astype(np.float64)
    ours = Lstm.from_json(weights)
    inputs, scale = lstm_inputs(series, 90)
    with torch.no_grad():
        out, _ = layer(torch.tensor(inputs)[None])
        theirs = scale * torch.nn.functional.softplus(head(out[:, -1])).item()
    assert ours.forecast(series, 90) == pytest.approx(theirs, rel=1e-9)


def test_weights_of_the_wrong_shape_are_refused_with_the_fix() -> None:
    weights = random_weights(8, seed=3)
    weights["weight_hh"] = weights["weight_hh"][:-1]
    with pytest.raises(ValueError, match=r"rerun bench/train_forecaster\.py"):
        Lstm.from_json(weights)
    with pytest.raises(ValueError, match=r"rerun bench/train_forecaster\.py"):
        Lstm.from_json({"weight_ih": []})


def mean_abs_error(forecaster: object, kind: str, seeds: range) -> float:
    """The forecaster's mean absolute error (share of the truth) on a simulator shape."""
    errors, truths = [], []
    for seed in seeds:
        grid = np.arange(0, 300, 0.1)
        truth = make_pattern(kind, 5.0, 300, seed=seed).rate(grid).reshape(-1, 10).mean(axis=1)
        counts = np.random.default_rng(seed).poisson(truth).astype(np.float64)
        samples = counter_samples(counts)
        for now in range(20, 290, 5):
            made = arrival_series(samples[: now + 1], float(now))
            assert made is not None
            guess = forecaster.forecast(*made)  # type: ignore[attr-defined]
            ahead = truth[now : now + int(HORIZON_S)].mean()
            errors.append(abs(guess - ahead))
            truths.append(ahead)
    return float(np.sum(errors) / np.sum(truths))


@pytest.mark.parametrize("kind", ["ramp", "bursty"])
def test_the_shipped_lstm_forecasts_better_than_the_last_window(kind: str) -> None:
    # Seeds the training did not use (it starts at 10**6).
    seeds = range(200, 203)
    lstm = mean_abs_error(Lstm.shipped(), kind, seeds)
    last = mean_abs_error(LastWindow(10), kind, seeds)
    assert lstm < last


def test_the_weights_in_bench_data_load() -> None:
    lstm = Lstm.shipped()
    assert lstm.weight_hh.shape[0] == 4 * lstm.weight_hh.shape[1]
