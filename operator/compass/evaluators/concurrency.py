"""Runners that keep several evaluations in flight for the search (domain.search.ChunkRunner).

``ThreadRunner`` runs real evaluators (Triton, a command) on worker threads; ``VirtualRunner``
simulates service times on a virtual clock, so the replay evaluator measures what a
concurrency would buy without a server. Neither changes the search's answer: a chunk's scores
are the same whoever evaluates it and whenever it comes back (docs/method.md, "Concurrent
evaluation").
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import queue
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from compass.domain.evaluation import Config, Evaluator
from compass.domain.search import MAX_CONCURRENCY
from compass.domain.space import config_key


def check_concurrency(value: int, field_name: str) -> int:
    """The concurrency, or ValueError naming the field and the range."""
    if not 1 <= value <= MAX_CONCURRENCY:
        raise ValueError(
            f"{field_name} must be between 1 and {MAX_CONCURRENCY}, got {value}; give the "
            "number of evaluations to keep in flight (the ready endpoints x their router "
            "instances is a good start)"
        )
    return value


@dataclass
class _Chunk:
    """One submitted chunk: its scores as pieces come back, and how many are still out."""

    scores: list[float]
    missing: int


class ThreadRunner:
    """Up to ``concurrency`` evaluator calls at once on worker threads.

    A chunk is split into calls of at most ``piece`` samples (None: the whole chunk in one
    call, as a command evaluator wants; 1 for Triton's one request a sample). The evaluator
    must be safe to call from several threads at once.
    """

    def __init__(self, evaluator: Evaluator, concurrency: int, piece: int | None = None) -> None:
        self.evaluator = evaluator
        self.concurrency = check_concurrency(concurrency, "concurrency")
        self.piece = piece
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="evaluate")
        self.chunks: dict[int, _Chunk] = {}
        self.done: queue.SimpleQueue[tuple[int, int, list[float] | BaseException]] = (
            queue.SimpleQueue()
        )

    def submit(self, ticket: int, config: Config, indices: Sequence[int]) -> None:
        """Queue the chunk's calls; the pool runs them first come, first served."""
        size = self.piece or max(1, len(indices))
        pieces = [list(indices[i : i + size]) for i in range(0, len(indices), size)]
        self.chunks[ticket] = _Chunk([0.0] * len(indices), len(pieces))
        for start, piece in zip(range(0, len(indices), size), pieces, strict=True):
            future = self.pool.submit(self.evaluator.evaluate, config, piece)
            future.add_done_callback(self._reporter(ticket, start))

    def _reporter(self, ticket: int, start: int) -> Callable[[Future[list[float]]], None]:
        def report(future: Future[list[float]]) -> None:
            if future.cancelled():  # close() dropped it: nobody waits for it
                return
            error = future.exception()
            self.done.put((ticket, start, error if error is not None else future.result()))

        return report

    def finished(self) -> list[tuple[int, list[float]]]:
        """Wait for a call to come back; every chunk whose last call that completed."""
        complete: list[tuple[int, list[float]]] = []
        while not complete or not self.done.empty():
            ticket, start, result = self.done.get()
            if isinstance(result, BaseException):
                self.close()
                raise result
            chunk = self.chunks[ticket]
            chunk.scores[start : start + len(result)] = result
            chunk.missing -= 1
            if chunk.missing == 0:
                del self.chunks[ticket]
                complete.append((ticket, chunk.scores))
        return complete

    def close(self) -> None:
        """Drop queued calls and let running ones finish in the background."""
        self.pool.shutdown(wait=False, cancel_futures=True)


def hashed_jitter(config: Config, index: int) -> float:
    """A factor in [0.5, 1.5) fixed by (configuration, sample): service times that vary, the
    same in every run."""
    digest = hashlib.blake2b(f"{config_key(config)}|{index}".encode(), digest_size=8).digest()
    return 0.5 + int.from_bytes(digest, "little") / 2**64


def jittered_service(mean_s: float) -> Callable[[Config, int], float]:
    """Service times with this mean, each sample's fixed by ``hashed_jitter``."""
    return lambda config, index: mean_s * hashed_jitter(config, index)


@dataclass(order=True)
class _Running:
    """A sample in service on the virtual clock, ordered by when it ends."""

    ends: float
    sequence: int
    ticket: int = field(compare=False)
    position: int = field(compare=False)
    config: Config = field(compare=False)
    index: int = field(compare=False)


class VirtualRunner:
    """``concurrency`` servers on a virtual clock: each sample takes ``service_s(config, index)``
    seconds, served first come, first served, one request a sample.

    ``clock`` is the simulated wall time so far, ``busy`` the service time spent (what one
    server would have taken). Scores come from ``evaluator`` once a chunk's last sample is
    served, one call a chunk, as the sequential search makes them.
    """

    def __init__(
        self,
        evaluator: Evaluator,
        concurrency: int,
        service_s: Callable[[Config, int], float],
    ) -> None:
        self.evaluator = evaluator
        self.concurrency = check_concurrency(concurrency, "concurrency")
        self.service_s = service_s
        self.clock = 0.0
        self.busy = 0.0
        self.waiting: deque[tuple[int, int, Config, int]] = deque()
        self.running: list[_Running] = []
        self.chunks: dict[int, _Chunk] = {}
        self.configs: dict[int, tuple[Config, list[int]]] = {}
        self.sequence = itertools.count()

    def submit(self, ticket: int, config: Config, indices: Sequence[int]) -> None:
        """Queue the chunk's samples behind those already waiting."""
        self.chunks[ticket] = _Chunk([], len(indices))
        self.configs[ticket] = (config, [int(i) for i in indices])
        self.waiting.extend((ticket, p, config, int(i)) for p, i in enumerate(indices))
        self._start()

    def _start(self) -> None:
        while self.waiting and len(self.running) < self.concurrency:
            ticket, position, config, index = self.waiting.popleft()
            service = self.service_s(config, index)
            self.busy += service
            heapq.heappush(
                self.running,
                _Running(
                    self.clock + service, next(self.sequence), ticket, position, config, index
                ),
            )

    def finished(self) -> list[tuple[int, list[float]]]:
        """Advance the clock to the next replies; the chunks they complete."""
        complete: list[tuple[int, list[float]]] = []
        while not complete:
            reply = heapq.heappop(self.running)
            self.clock = reply.ends
            chunk = self.chunks[reply.ticket]
            chunk.missing -= 1
            if chunk.missing == 0:
                del self.chunks[reply.ticket]
                config, indices = self.configs.pop(reply.ticket)
                complete.append((reply.ticket, list(self.evaluator.evaluate(config, indices))))
            self._start()
        return complete
