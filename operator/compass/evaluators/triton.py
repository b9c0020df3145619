"""Scores samples through the Triton router by per-request override, beside production."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence

from compass.dataplane.triton import GrpcTls, RoutingError, TritonRouter
from compass.domain.evaluation import Config, EvaluationError


class TritonEvaluator:
    """Scores samples through the router, one request per sample."""

    def __init__(self, make: Callable[[], TritonRouter]) -> None:
        """``make`` gives each calling thread its own router (this one's at once)."""
        self._make = make
        self.router = make()
        self._local = threading.local()
        self._local.router = self.router

    @classmethod
    def over(
        cls, addresses: Sequence[str], model: str, tls: GrpcTls | None = None
    ) -> TritonEvaluator:
        """Requests spread over these gRPC addresses: each new thread takes the next one."""
        turn = itertools.cycle(addresses)
        lock = threading.Lock()

        def make() -> TritonRouter:
            with lock:
                address = next(turn)
            return TritonRouter(address, model=model, tls=tls)

        return cls(make)

    def _router(self) -> TritonRouter:
        router: TritonRouter | None = getattr(self._local, "router", None)
        if router is None:
            router = self._local.router = self._make()
        return router

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """The pipeline's score of each sample under this configuration."""
        router = self._router()
        scores = []
        for index in sample_indices:
            try:
                reply = router.infer({"sample": int(index)}, config=config)
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
