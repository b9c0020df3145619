"""Measurements spread over a Service's pods, one at a time each (not another's queueing)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from compass.dataplane.triton import RoutingError, TritonRouter

Item = TypeVar("Item")
Result = TypeVar("Result")


class ProfilingTimeLimitError(RuntimeError):
    """The profiling ran past its bound on wall time."""


@dataclass
class TimeLimit:
    """A bound on wall time from ``started``, named by ``field`` (what sets it) in its error."""

    max_seconds: float | None
    field: str
    started: float = 0.0
    clock: Callable[[], float] = time.monotonic
    # What the error message counts: the work done and all of it (the caller keeps them).
    done: int = 0
    total: int = 0

    def elapsed(self) -> float:
        """Seconds since ``started``."""
        return self.clock() - self.started

    def passed(self) -> bool:
        """Whether the bound is passed."""
        return self.max_seconds is not None and self.elapsed() > self.max_seconds

    def check(self) -> None:
        """ProfilingTimeLimitError once the bound is passed."""
        if self.passed():
            raise self.error()

    def error(self) -> ProfilingTimeLimitError:
        """The error that says the bound was passed, how far the profiling got and the fix."""
        return ProfilingTimeLimitError(
            f"profiling stopped at its bound of {self.max_seconds:g} s ({self.field}) with "
            f"{self.done} of {self.total} measurements done: raise {self.field}, measure fewer "
            "requests per configuration, or profile on more replicas (each ready pod measures "
            "one configuration at a time)"
        )


@dataclass
class PodPool(Generic[Item, Result]):
    """One router per pod, by pod name; ``run`` gives each item to whichever pod is free."""

    routers: Mapping[str, TritonRouter]
    limit: TimeLimit = field(default_factory=lambda: TimeLimit(None, ""))
    lost: dict[str, str] = field(default_factory=dict)
    measured: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.routers:
            raise ValueError("a pod pool needs at least one pod's router")

    @property
    def pods(self) -> list[str]:
        """The pods still in the pool, in name order."""
        return sorted(pod for pod in self.routers if pod not in self.lost)

    def run(
        self,
        items: Sequence[Item],
        measure: Callable[[TritonRouter, Item], Result],
        finished: Callable[[int, str, Result], None],
    ) -> None:
        """Measure every item; a pod's RoutingError gives its item back, any other error (or no
        pod left) stops the workers and is raised."""
        if not self.pods:
            raise RoutingError(f"no pod left to measure on: {self._lost_text()}")
        pending = deque(range(len(items)))
        in_flight = 0
        turn = threading.Condition()
        errors: list[BaseException] = []

        def fail(error: BaseException) -> None:
            errors.append(error)
            turn.notify_all()

        def next_item() -> int | None:
            """The next item, or None (it waits while others measure: a lost pod's comes back)."""
            nonlocal in_flight
            with turn:
                while not errors and not pending and in_flight:
                    turn.wait()
                if errors or not pending:
                    return None
                if self.limit.passed():
                    fail(self.limit.error())
                    return None
                in_flight += 1
                return pending.popleft()

        def work(pod: str) -> None:
            nonlocal in_flight
            router = self.routers[pod]
            while (index := next_item()) is not None:
                try:
                    result = measure(router, items[index])
                except BaseException as error:
                    with turn:
                        in_flight -= 1
                        if not isinstance(error, RoutingError):
                            fail(error)  # raised again by run()
                            return
                        pending.appendleft(index)
                        self.lost[pod] = str(error)
                        if not self.pods:
                            fail(RoutingError(f"no pod left to measure on: {self._lost_text()}"))
                        turn.notify_all()
                    return
                with turn:
                    in_flight -= 1
                    self.measured[pod] = self.measured.get(pod, 0) + 1
                    try:
                        finished(index, pod, result)
                    except BaseException as error:  # raised again by run()
                        fail(error)
                    turn.notify_all()

        workers = [
            threading.Thread(target=work, args=(pod,), name=f"profile-{pod}", daemon=True)
            for pod in self.pods
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if errors:
            timed_out = any(isinstance(e, ProfilingTimeLimitError) for e in errors)
            raise self.limit.error() if timed_out else errors[0]

    def _lost_text(self) -> str:
        return "; ".join(f"{pod}: {why}" for pod, why in sorted(self.lost.items())) or "none"
