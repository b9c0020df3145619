"""Configuration keys, routing keys and the mixes a router deals its requests to."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, TypeVar

# Blend weights are multiples of 1 / WEIGHT_STEPS: 5% steps, fine enough that a policy is not
# held back by the grid, coarse enough that a window of 20 requests already holds the mix.
WEIGHT_STEPS = 20
# A mix's routing key: the prefix tells it from a configuration key (a JSON object).
MIX_PREFIX = "mix:"

T = TypeVar("T", bound=Hashable)


def config_key(config: Mapping[str, object]) -> str:
    """Canonical JSON for a configuration: sorted keys, integral floats written as ints."""

    def plain(value: object) -> object:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    return json.dumps({k: plain(v) for k, v in config.items()}, sort_keys=True)


def tables_digest(admission: object, binding: object) -> str:
    """What a router reports of the admission and binding tables it holds, so that a switch
    that would send the same tables again is not sent (the same JSON, the same digest)."""
    text = json.dumps({"admission": admission, "binding": binding}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def quantize_weight(weight: float) -> float:
    """The weight rounded down to the grid, within [0, 1] (never more blend than asked)."""
    if not math.isfinite(weight):
        raise ValueError(f"weight {weight!r} is not a finite number: give one in [0, 1]")
    steps = math.floor(min(max(weight, 0.0), 1.0) * WEIGHT_STEPS + 1e-9)
    return steps / WEIGHT_STEPS


def routing_key(key: str, blend_key: str | None = None, weight: float = 0.0) -> str:
    """One string for what a router serves: configuration ``key``, or its mix with
    ``blend_key`` at ``weight`` (on the grid, strictly between 0 and 1)."""
    if not blend_key:
        return key
    return MIX_PREFIX + json.dumps([key, blend_key, weight])


class SmoothWeighting(Generic[T]):
    """Smooth weighted round-robin over integer weights: deterministic and evenly interleaved.

    Each pick adds every member's weight to its credit and takes the member with the most
    credit, which then pays the total back (nginx's algorithm; ties go to the first listed).
    """

    def __init__(self, weights: Sequence[tuple[T, int]]) -> None:
        self.weights = [(member, weight) for member, weight in weights if weight > 0]
        if not self.weights:
            raise ValueError("no member has a positive weight")
        self.total = sum(weight for _, weight in self.weights)
        self.credit = [0] * len(self.weights)

    def pick(self) -> T:
        """The member that serves the next request."""
        for i, (_, weight) in enumerate(self.weights):
            self.credit[i] += weight
        best = max(range(len(self.weights)), key=lambda i: (self.credit[i], -i))
        self.credit[best] -= self.total
        return self.weights[best][0]
