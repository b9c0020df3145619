"""The split strategy's mix: weights on a grid, dealt exactly by smooth weighted round-robin, or
drawn per request by weight as llm-d's endpoint picker draws it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from compass.domain.arrivals import make_pattern, make_scenario
from compass.domain.mix import (
    WEIGHT_STEPS,
    Mix,
    SmoothWeighting,
    drawn_member,
    hull_mixes,
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
    assert Mix(1, 2, 0.4).position == pytest.approx(1.4)


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
    positions = hull_mixes(range(4))
    looked: list[Mix] = []

    def below(limit: float) -> Callable[[Mix], bool]:
        def feasible(mix: Mix) -> bool:
            looked.append(mix)
            return mix.position <= limit + 1e-9

        return feasible

    assert most_accurate(positions, below(1.35)) == Mix(1, 2, 0.35)
    assert len(looked) <= 8
    assert most_accurate(positions, below(3.0)) == positions[-1]
    assert most_accurate(positions, below(-1.0)) == positions[0]


def draws_of(mix: Mix, seed: int) -> list[int]:
    """The member each request of a seeded scenario (about 3000 requests) is drawn to."""
    scenario = make_scenario(make_pattern("constant", 30.0, 100.0), seed)
    return [drawn_member(mix, float(u)) for u in scenario.member_draws()]


@pytest.mark.parametrize("weight", [0.05, 0.3, 0.5, 0.85])
def test_a_weighted_draw_holds_the_mix_within_sampling_bounds(weight: float) -> None:
    drawn = draws_of(Mix(0, 1, weight), seed=3)
    n = len(drawn)
    share = drawn.count(1) / n
    # Four standard errors of a binomial share: a draw that ignored the weight fails.
    assert abs(share - weight) <= 4 * (weight * (1 - weight) / n) ** 0.5
    assert set(drawn) == {0, 1}


def test_a_weighted_draw_is_the_same_for_a_seed_and_another_for_another_seed() -> None:
    mix = Mix(2, 3, 0.4)
    assert draws_of(mix, seed=7) == draws_of(mix, seed=7)
    assert draws_of(mix, seed=7) != draws_of(mix, seed=8)


def test_a_weighted_draw_never_sends_a_request_to_a_member_of_share_zero() -> None:
    # 100/0 either way round: the member with no weight is never drawn, however the draws fall.
    assert set(draws_of(Mix(0, 1, 0.0), seed=1)) == {0}
    assert set(draws_of(Mix(0, 1, 1.0), seed=1)) == {1}
    assert drawn_member(Mix(0, 1, 0.05), 0.0) == 1
    assert drawn_member(Mix(0, 1, 0.05), 0.999999) == 0
    with pytest.raises(ValueError, match=r"draw 1.0 is not in \[0, 1\)"):
        drawn_member(Mix(0, 1, 0.5), 1.0)
