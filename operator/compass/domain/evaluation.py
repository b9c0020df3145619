"""The evaluator protocol: how the search scores a configuration on dataset samples."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

ParamValue = str | int | float | bool
Config = Mapping[str, ParamValue]


class EvaluationError(Exception):
    """An evaluator could not score a configuration; the message is shown to the user."""


class Evaluator(Protocol):
    """Scores one configuration on the given dataset samples."""

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Per-sample scores in [0, 1], one per index, in the order given."""
        ...
