"""The one place a description of where scores come from becomes an Evaluator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compass.api.meta import DEFAULT_ROUTER_MODEL
from compass.dataplane.triton import GrpcTls, TritonRouter, router_instances
from compass.domain.evaluation import Evaluator
from compass.domain.search import MAX_CONCURRENCY, ChunkRunner, SequentialRunner
from compass.evaluators.command import CommandEvaluator
from compass.evaluators.concurrency import ThreadRunner
from compass.evaluators.ledger import Ledger, ReplayEvaluator
from compass.evaluators.triton import TritonEvaluator


@dataclass(frozen=True)
class ScoreSource:
    """Where a search's scores come from: exactly one of a replay ledger, a command or Triton."""

    replay: Ledger | None = None
    command: Sequence[str] | None = None
    # host:port of Triton's gRPC endpoint(s), comma-separated; requests go to router_model.
    triton: str | None = None
    router_model: str = DEFAULT_ROUTER_MODEL
    # TLS to Triton's gRPC port (None: plaintext).
    tls: GrpcTls | None = None

    def __post_init__(self) -> None:
        """Refuse a description that names no source, or more than one."""
        given = [self.replay is not None, self.command is not None, self.triton is not None]
        if given.count(True) != 1:
            raise ValueError("give exactly one score source: a replay ledger, a command or Triton")


def make_evaluator(source: ScoreSource) -> Evaluator:
    """The evaluator that scores samples from this source."""
    if source.replay is not None:
        return ReplayEvaluator(source.replay)
    if source.command is not None:
        return CommandEvaluator(source.command)
    assert source.triton is not None  # __post_init__ guarantees one source
    addresses = [a.strip() for a in source.triton.split(",") if a.strip()]
    return TritonEvaluator.over(addresses, source.router_model, source.tls)


def make_runner(source: ScoreSource, evaluator: Evaluator, concurrency: int) -> ChunkRunner:
    """What evaluates the search's chunks (a replay: sequential; a command: nothing ahead)."""
    if concurrency == 1 or source.replay is not None:
        return SequentialRunner(evaluator)
    if source.triton is not None:
        return ThreadRunner(evaluator, concurrency, piece=1)
    return ThreadRunner(evaluator, concurrency, piece=None, ahead=0)


def fleet_concurrency(source: ScoreSource) -> tuple[int, str]:
    """Addresses x the first one's router instances (at most MAX_CONCURRENCY), and how."""
    if source.triton is None:
        return 1, "one at a time without Triton"
    addresses = [a.strip() for a in source.triton.split(",") if a.strip()]
    router = TritonRouter(addresses[0], source.router_model, tls=source.tls)
    try:
        instances = router_instances(router.model_config())
    finally:
        router.close()
    how = f"{len(addresses)} address(es) x {instances} router instance(s)"
    return min(len(addresses) * instances, MAX_CONCURRENCY), how
