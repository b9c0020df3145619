"""A mix of two front members: the split strategy's routing, and how requests are dealt to it.

Smooth weighted round-robin holds the mix exactly in every ``WEIGHT_STEPS`` requests, where a
draw is exact only on average; llm-d's endpoint picker draws, though (``Dealing.DRAW``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from compass.domain.profiles import LatencyProfile
from compass_rules.routing import WEIGHT_STEPS as WEIGHT_STEPS
from compass_rules.routing import SmoothWeighting as SmoothWeighting
from compass_rules.routing import quantize_weight as quantize_weight


@dataclass(frozen=True)
class Mix:
    """Front members by index: ``weight`` of the requests to ``blend``, the rest to ``base``."""

    base: int
    blend: int | None = None
    weight: float = 0.0

    def __post_init__(self) -> None:
        weight = quantize_weight(self.weight) if self.blend is not None else 0.0
        blend = self.blend if weight > 0 else None
        if weight >= 1.0 and blend is not None:
            # All of the requests to blend: that is serving blend alone.
            object.__setattr__(self, "base", blend)
            blend, weight = None, 0.0
        object.__setattr__(self, "blend", blend)
        object.__setattr__(self, "weight", weight)

    @property
    def shares(self) -> tuple[tuple[int, float], ...]:
        """(member, share of requests), base first; one entry when it is not a mix."""
        if self.blend is None:
            return ((self.base, 1.0),)
        return ((self.base, 1.0 - self.weight), (self.blend, self.weight))

    @property
    def position(self) -> float:
        """Where the mix sits between its members: base + weight when blend is base + 1."""
        if self.blend is None:
            return float(self.base)
        return self.base + self.weight * (self.blend - self.base)


def mix_weighting(mix: Mix) -> SmoothWeighting[int]:
    """The round-robin that deals a mix's requests to its members."""
    return SmoothWeighting([(member, round(share * WEIGHT_STEPS)) for member, share in mix.shares])


class Dealing(StrEnum):
    """How a mix's requests are dealt to its members: by the data plane that serves it."""

    # Each Triton router's smooth weighted round-robin, its own requests in turn.
    ROUND_ROBIN = "roundRobin"
    # llm-d's endpoint picker: each request's member drawn at random by weight, pool-wide.
    DRAW = "draw"


def drawn_member(mix: Mix, draw: float) -> int:
    """The member a request with uniform ``draw`` goes to: the blend below its weight, else base."""
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"draw {draw!r} is not in [0, 1): give a uniform draw")
    return mix.blend if mix.blend is not None and draw < mix.weight else mix.base


def accuracy_hull(front: Sequence[LatencyProfile]) -> tuple[int, ...]:
    """Front indices on the upper concave hull of (mean service time, accuracy), fastest first."""
    if not front:
        raise ValueError("front: empty; give at least one profile")
    hull = [0]
    for index in range(1, len(front)):
        point = front[index]
        if point.accuracy <= front[hull[-1]].accuracy or point.mean_ms <= front[hull[-1]].mean_ms:
            continue
        while len(hull) >= 2:
            a, b = front[hull[-2]], front[hull[-1]]
            # b is under the chord from a to the new point: a mix of those two beats it.
            left = (b.accuracy - a.accuracy) * (point.mean_ms - a.mean_ms)
            right = (point.accuracy - a.accuracy) * (b.mean_ms - a.mean_ms)
            if left > right:
                break
            hull.pop()
        hull.append(index)
    return tuple(hull)


def hull_mixes(hull: Sequence[int]) -> list[Mix]:
    """Every mix of neighbours along the hull in weight steps, fastest first."""
    return [Mix(hull[0])] + [
        Mix(base, blend, step / WEIGHT_STEPS)
        for base, blend in itertools.pairwise(hull)
        for step in range(1, WEIGHT_STEPS + 1)
    ]


def most_accurate(positions: Sequence[Mix], feasible: Callable[[Mix], bool]) -> Mix:
    """The most accurate feasible of ``positions`` by bisection (else the first, the fastest)."""
    low, high = 0, len(positions) - 1
    if feasible(positions[high]):
        return positions[high]
    while low < high - 1:
        middle = (low + high) // 2
        low, high = (middle, high) if feasible(positions[middle]) else (low, middle)
    return positions[low]
