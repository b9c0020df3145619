"""An evaluator that scores a configuration by sending samples through the Triton router.

Each request carries the configuration as a per-request override, so a search runs beside
production traffic without switching it. The router's pipeline returns ``score`` in [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence

from compass.dataplane.triton import RoutingError, TritonRouter
from compass.domain.evaluation import Config, EvaluationError


class TritonEvaluator:
    """Scores samples through the router, one request per sample."""

    def __init__(self, router: TritonRouter) -> None:
        self.router = router

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """The pipeline's score of each sample under this configuration."""
        scores = []
        for index in sample_indices:
            try:
                reply = self.router.infer({"sample": int(index)}, config=config)
            except RoutingError as error:
                raise EvaluationError(f"sample {index}: {error}") from error
            score = reply.result.get("score")
            if not isinstance(score, int | float) or not 0 <= float(score) <= 1:
                raise EvaluationError(
                    f"sample {index}: the router's pipeline returned score {score!r}; it must "
                    f"return a number in [0, 1] under 'score'"
                )
            scores.append(float(score))
        return scores
