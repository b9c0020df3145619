"""Runners keeping several evaluations in flight; neither changes the search's answer."""

from __future__ import annotations

import hashlib
import heapq
import itertools
import queue
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence, Sized
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, Protocol, TypeVar, runtime_checkable

from compass.domain.evaluation import Config, EvaluationError, Evaluator
from compass.domain.search import MAX_CONCURRENCY
from compass.domain.space import config_key

Held = TypeVar("Held", bound=Collection[int])


def check_concurrency(value: int, field_name: str) -> int:
    """The concurrency, or ValueError naming the field and the range."""
    if not 1 <= value <= MAX_CONCURRENCY:
        raise ValueError(
            f"{field_name} must be between 1 and {MAX_CONCURRENCY}, got {value}; give the "
            "number of evaluations to keep in flight (the ready endpoints x their router "
            "instances is a good start)"
        )
    return value


@runtime_checkable
class RecordingEvaluator(Protocol):
    """An evaluator that records apart from scoring: what was scored ahead, once asked for."""

    def evaluate_unrecorded(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Scores as ``evaluate`` gives them, without recording them."""
        ...

    def record(
        self, config: Config, sample_indices: Sequence[int], scores: Sequence[float]
    ) -> None:
        """Record these scores (those not recorded yet)."""
        ...


def least_ahead(
    expected: Mapping[str, Sized], held: Mapping[str, Sized], ahead: int | None
) -> str | None:
    """The configuration to score ahead next: of those under ``ahead``, the one holding fewest."""
    candidates = [
        (len(held[key]), key)
        for key, samples in expected.items()
        if samples and (ahead is None or len(held[key]) < ahead)
    ]
    return min(candidates, key=lambda c: c[0])[1] if candidates else None


class _AheadRunner(Generic[Held]):
    """What both runners share: the samples each configuration expects next and holds ahead."""

    def __init__(
        self, evaluator: Evaluator, concurrency: int, ahead: int | None, held: Callable[[], Held]
    ) -> None:
        self.evaluator = evaluator
        self.concurrency = check_concurrency(concurrency, "concurrency")
        self.ahead = ahead
        self.sent = 0
        self.wasted = 0
        self.configs: dict[str, Config] = {}
        self.expected: dict[str, deque[int]] = {}
        # Samples scored ahead (or in flight ahead) of configurations still being assessed.
        self.held: dict[str, Held] = {}
        self._new_held = held

    def _asked(self, config: Config, indices: list[int]) -> str:
        """A chunk's configuration key; its samples are expected no more."""
        key = config_key(config)
        self.configs[key] = config
        if key in self.expected:
            asked = set(indices)
            self.expected[key] = deque(i for i in self.expected[key] if i not in asked)
        return key

    def expect(self, config: Config, indices: Sequence[int]) -> None:
        """Samples to score ahead on idle workers, nearest first."""
        if self.ahead == 0:
            return
        key = config_key(config)
        self.configs[key] = config
        held = self.held.setdefault(key, self._new_held())
        self.expected[key] = deque(int(i) for i in indices if int(i) not in held)

    def forget(self, config: Config) -> None:
        """The configuration is decided: what was scored ahead of it is wasted."""
        key = config_key(config)
        self.expected.pop(key, None)
        # Those still in flight count too: they will come back to nobody.
        self.wasted += len(self.held.pop(key, self._new_held()))


@dataclass
class _Call:
    """One evaluator call in flight: a chunk's samples, or samples scored ahead."""

    key: str
    config: Config
    indices: list[int]


@dataclass
class _Chunk:
    """A submitted chunk: its samples, how many are still out, and (on threads) their scores."""

    config: Config
    indices: list[int]
    missing: int = 0
    scores: list[float] = field(default_factory=list)


class ThreadRunner(_AheadRunner[dict[int, float | None]]):
    """Up to ``concurrency`` calls at once on threads, scoring ahead; chunks recorded when whole."""

    def __init__(
        self,
        evaluator: Evaluator,
        concurrency: int,
        piece: int | None = None,
        ahead: int | None = None,
    ) -> None:
        super().__init__(evaluator, concurrency, ahead, dict)
        self.piece = piece
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="evaluate")
        self.out = 0  # calls handed to the pool and not yet taken back
        self.waiting: deque[_Call] = deque()
        self.calls: dict[int, _Call] = {}
        self.call_ids = itertools.count()
        self.chunks: dict[int, _Chunk] = {}
        self.owners: dict[tuple[str, int], tuple[int, int]] = {}
        self.ready: list[int] = []
        self.done: queue.SimpleQueue[tuple[int, list[float] | BaseException]] = queue.SimpleQueue()

    def submit(self, ticket: int, config: Config, indices: Sequence[int]) -> None:
        """Send the chunk's samples not already scored or in flight ahead."""
        chunk = _Chunk(config, [int(i) for i in indices], scores=[0.0] * len(indices))
        key = self._asked(config, chunk.indices)
        self.chunks[ticket] = chunk
        held = self.held.get(key, {})
        fresh: list[int] = []
        for position, index in enumerate(chunk.indices):
            if index not in held:
                fresh.append(index)
            score = held.pop(index, None)
            if score is not None:
                chunk.scores[position] = score
                continue
            self.owners[(key, index)] = (ticket, position)
            chunk.missing += 1
        size = self.piece or max(1, len(fresh))
        for first in range(0, len(fresh), size):
            self.waiting.append(_Call(key, config, fresh[first : first + size]))
        if chunk.missing == 0:
            self.ready.append(ticket)
        self._pump(ahead=False)

    def _pump(self, ahead: bool) -> None:
        """Hand calls to free workers: chunks' samples first, then (``ahead``) expected ones."""
        while self.out < self.concurrency:
            if self.waiting:
                self._send(self.waiting.popleft())
                continue
            if not ahead:
                return
            key = least_ahead(self.expected, self.held, self.ahead)
            if key is None:
                return
            expected, held = self.expected[key], self.held[key]
            indices = [expected.popleft() for _ in range(min(self.piece or 1, len(expected)))]
            for index in indices:
                held[index] = None
            self._send(_Call(key, self.configs[key], indices))

    def _send(self, call: _Call) -> None:
        call_id = next(self.call_ids)
        self.calls[call_id] = call
        self.out += 1
        self.sent += len(call.indices)
        future = self.pool.submit(self._score, call)
        future.add_done_callback(partial(self._report, call_id))

    def _score(self, call: _Call) -> list[float]:
        if isinstance(self.evaluator, RecordingEvaluator):
            return self.evaluator.evaluate_unrecorded(call.config, call.indices)
        return self.evaluator.evaluate(call.config, call.indices)

    def _report(self, call_id: int, future: Future[list[float]]) -> None:
        if future.cancelled():  # close() dropped it: nobody waits for it
            return
        error = future.exception()
        self.done.put((call_id, error if error is not None else future.result()))

    def finished(self) -> list[tuple[int, list[float]]]:
        """Wait for calls to come back; every chunk whose last score that brought."""
        complete = [self._complete(ticket) for ticket in self.ready]
        self.ready.clear()
        while not complete or not self.done.empty():
            if not complete:
                self._pump(ahead=True)
            call_id, result = self.done.get()
            self.out -= 1
            if isinstance(result, BaseException):
                self.close()
                raise result
            call = self.calls.pop(call_id)
            if len(result) != len(call.indices):
                self.close()
                raise EvaluationError(
                    f"evaluator returned {len(result)} scores for {len(call.indices)} samples"
                )
            for index, score in zip(call.indices, result, strict=True):
                owner = self.owners.pop((call.key, index), None)
                if owner is not None:
                    ticket, position = owner
                    chunk = self.chunks[ticket]
                    chunk.scores[position] = score
                    chunk.missing -= 1
                    if chunk.missing == 0:
                        complete.append(self._complete(ticket))
                elif index in self.held.get(call.key, {}):
                    self.held[call.key][index] = score
        return complete

    def _complete(self, ticket: int) -> tuple[int, list[float]]:
        chunk = self.chunks.pop(ticket)
        if isinstance(self.evaluator, RecordingEvaluator):
            self.evaluator.record(chunk.config, chunk.indices, chunk.scores)
        return ticket, chunk.scores

    def close(self) -> None:
        """Drop queued calls and let running ones finish in the background."""
        self.pool.shutdown(wait=False, cancel_futures=True)


def hashed_jitter(config: Config, index: int) -> float:
    """A factor in [0.5, 1.5) fixed by (configuration, sample), the same in every run."""
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
    key: str = field(compare=False)
    index: int = field(compare=False)


class VirtualRunner(_AheadRunner[set[int]]):
    """``concurrency`` FIFO servers on a virtual clock, serving ahead as ThreadRunner does."""

    def __init__(
        self,
        evaluator: Evaluator,
        concurrency: int,
        service_s: Callable[[Config, int], float],
        ahead: int | None = None,
    ) -> None:
        super().__init__(evaluator, concurrency, ahead, set)
        self.service_s = service_s
        self.clock = 0.0
        self.busy = 0.0
        self.waiting: deque[tuple[str, int]] = deque()
        self.running: list[_Running] = []
        self.chunks: dict[int, _Chunk] = {}
        self.owners: dict[tuple[str, int], int] = {}
        self.done: list[int] = []
        self.serving: set[tuple[str, int]] = set()
        self.sequence = itertools.count()

    def submit(self, ticket: int, config: Config, indices: Sequence[int]) -> None:
        """Queue the chunk's samples behind those already waiting; those served ahead count."""
        chunk = _Chunk(config, [int(i) for i in indices])
        key = self._asked(config, chunk.indices)
        held = self.held.get(key, set())
        self.chunks[ticket] = chunk
        for index in chunk.indices:
            if index in held:
                held.discard(index)
                if (key, index) in self.serving:
                    self.owners[(key, index)] = ticket
                    chunk.missing += 1
            else:
                self.owners[(key, index)] = ticket
                self.waiting.append((key, index))
                chunk.missing += 1
        if chunk.missing == 0:
            self.done.append(ticket)

    def _serve(self, key: str, index: int) -> None:
        service = self.service_s(self.configs[key], index)
        self.busy += service
        self.sent += 1
        self.serving.add((key, index))
        heapq.heappush(
            self.running, _Running(self.clock + service, next(self.sequence), key, index)
        )

    def _start(self) -> None:
        while len(self.running) < self.concurrency:
            if self.waiting:
                self._serve(*self.waiting.popleft())
                continue
            key = least_ahead(self.expected, self.held, self.ahead)
            if key is None:
                return
            index = self.expected[key].popleft()
            self.held[key].add(index)
            self._serve(key, index)

    def _complete(self, ticket: int) -> tuple[int, list[float]]:
        chunk = self.chunks.pop(ticket)
        return ticket, list(self.evaluator.evaluate(chunk.config, chunk.indices))

    def finished(self) -> list[tuple[int, list[float]]]:
        """Advance the clock to the next replies; the chunks they complete."""
        complete = [self._complete(ticket) for ticket in self.done]
        self.done.clear()
        while not complete:
            self._start()
            reply = heapq.heappop(self.running)
            self.clock = reply.ends
            self.serving.discard((reply.key, reply.index))
            ticket = self.owners.pop((reply.key, reply.index), None)
            if ticket is None:
                continue
            chunk = self.chunks[ticket]
            chunk.missing -= 1
            if chunk.missing == 0:
                complete.append(self._complete(ticket))
        return complete
