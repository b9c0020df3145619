"""The split strategy's mix: weights on a grid, dealt exactly by smooth weighted round-robin."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from compass.domain.mix import (
    WEIGHT_STEPS,
    Mix,
    SmoothWeighting,
    mix_weighting,
    most_accurate,
    quantize_weight,
)


def test_weights_are_rounded_down_to_the_grid_and_clipped() -> None:
    assert quantize_weight(0.37) == pytest.approx(0.35)
    assert quantize_weight(0.35) == pytest.approx(0.35)
    assert quantize_weight(-0.2) == 0.0
    assert quantize_weight(1.7) == 1.0
    with pytest.raises(ValueError, match="finite"):
        quantize_weight(float("nan"))


def test_a_mix_normalises_its_degenerate_forms() -> None:
    assert Mix(1, 2, 0.0) == Mix(1)
    assert Mix(1, 2, 0.01).blend is None
    assert Mix(1, 2, 1.0) == Mix(2)
    assert Mix(1, None, 0.5).weight == 0.0
    assert Mix(1, 2, 0.25).shares == ((1, 0.75), (2, 0.25))
    assert Mix.at(1.4) == Mix(1, 2, 0.4)
    assert Mix.at(2.0) == Mix(2)
    assert Mix.at(1.4).position == pytest.approx(1.4)


@pytest.mark.parametrize("steps", range(WEIGHT_STEPS + 1))
def test_every_window_of_the_grid_holds_the_mix_exactly(steps: int) -> None:
    weighting = mix_weighting(Mix(0, 1, steps / WEIGHT_STEPS))
    picks = [weighting.pick() for _ in range(WEIGHT_STEPS * 5)]
    for start in range(len(picks) - WEIGHT_STEPS + 1):
        window = Counter(picks[start : start + WEIGHT_STEPS])
        assert window[1] == steps, (start, picks)


def test_members_interleave_instead_of_running_in_blocks() -> None:
    weighting = SmoothWeighting([("fast", 14), ("accurate", 6)])
    picks = [weighting.pick() for _ in range(40)]
    longest = max(
        len(run) for run in "".join("a" if p == "accurate" else "f" for p in picks).split("f")
    )
    assert longest == 1


def test_a_weighting_needs_a_positive_weight() -> None:
    with pytest.raises(ValueError, match="positive"):
        SmoothWeighting([("a", 0)])


def test_most_accurate_bisects_to_the_last_feasible_position() -> None:
    """Among 61 positions it finds the last feasible one in a handful of looks, the most
    accurate when all are, and the fastest when none is."""
    positions = [Mix.at(step / WEIGHT_STEPS) for step in range(3 * WEIGHT_STEPS + 1)]
    looked: list[Mix] = []

    def below(limit: float) -> Callable[[Mix], bool]:
        def feasible(mix: Mix) -> bool:
            looked.append(mix)
            return mix.position <= limit + 1e-9

        return feasible

    assert most_accurate(positions, below(1.35)) == Mix.at(1.35)
    assert len(looked) <= 8
    assert most_accurate(positions, below(3.0)) == positions[-1]
    assert most_accurate(positions, below(-1.0)) == positions[0]
