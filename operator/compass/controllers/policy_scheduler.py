"""One scheduler for every ParetoPolicy of the process: one clock and pool, not a timer each."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from compass.controllers.collector import Collector
from compass.dataplane.metrics import SharedReads

LOG = logging.getLogger(__name__)
# A tick that raised something unexpected (a bug) is due again after this.
ERROR_DELAY_S = 5.0

PolicyKey = tuple[str, str, str]  # namespace, name, uid
# One policy's tick at a wall-clock time: how long until it is due again (s).
TickFn = Callable[[float], float]


@dataclass
class Scheduled:
    """One policy on the scheduler."""

    key: PolicyKey
    tick: TickFn
    due: float = 0.0  # on the scheduler's monotonic clock
    running: bool = False


@dataclass
class TickStats:
    """What the last tick of the scheduler found: ticks still running, and how late it was."""

    skipped_running: int = 0
    lag_s: float = 0.0


@dataclass
class PolicyScheduler:
    """The due policies' ticks, every ``tick_s``, on ``workers`` threads."""

    tick_s: float
    workers: int = 16
    reads: SharedReads = field(default_factory=SharedReads)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    stats: TickStats = field(default_factory=TickStats)
    # Stepped once a tick by the scheduler's own thread (None: the collector left as it is).
    collector: Collector | None = None
    _entries: dict[PolicyKey, Scheduled] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pool: ThreadPoolExecutor | None = None

    def add(self, key: PolicyKey, tick: TickFn) -> None:
        """Tick this policy from the next tick on (replacing an entry of the same key)."""
        with self._lock:
            self._entries[key] = Scheduled(key, tick, due=self.clock())

    def start(self) -> PolicyScheduler:
        """Tick in a thread of its own until stopped (without it: tick_once, as tests do)."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="compass-policy-scheduler", daemon=True
                )
                self._thread.start()
        return self

    def remove(self, key: PolicyKey, tick: TickFn | None = None) -> None:
        """Tick it no more; with ``tick``, only that entry (not a successor added meanwhile)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (tick is None or entry.tick is tick):
                del self._entries[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def keys(self) -> set[PolicyKey]:
        """The policies on the scheduler now."""
        with self._lock:
            return set(self._entries)

    def tick_once(self, wait: bool = False) -> list[Future[None]]:
        """One round: new shared reads, every due policy's tick started (``wait``: and done)."""
        now, wall = self.clock(), self.wall()
        self.reads.next_round()
        with self._lock:
            due = [e for e in self._entries.values() if e.due <= now + self.tick_s / 2]
            skipped = sum(1 for e in due if e.running)
            due = [e for e in due if not e.running]
            for entry in due:
                entry.running = True
        self.stats = TickStats(skipped, self.stats.lag_s)
        # The due ticks in order, taken one at a time by up to ``workers`` drains: as a future
        # per tick would run them, without a thousand futures (and their locks) a second.
        queue = deque(due)
        pool = self._executor()
        drains = min(self.workers, len(due))
        futures = [pool.submit(self._drain, queue, now, wall) for _ in range(drains)]
        if wait:
            for future in futures:
                future.result()
        return futures

    def stop(self) -> None:
        """Stop ticking (ticks in flight finish on their own)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self.collector is not None:
            self.collector.release()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="compass-policy")
        return self._pool

    def _drain(self, queue: deque[Scheduled], now: float, wall: float) -> None:
        """Run the round's due ticks until none is left (or the scheduler stops)."""
        while not self._stop.is_set():
            try:
                entry = queue.popleft()
            except IndexError:
                return
            self._tick(entry, now, wall)

    def _tick(self, entry: Scheduled, now: float, wall: float) -> None:
        """One policy's tick; its next due time from what it returns (a bug: a delay)."""
        try:
            delay = entry.tick(wall)
        except Exception:
            LOG.exception("ParetoPolicy %s/%s: tick failed", entry.key[0], entry.key[1])
            delay = ERROR_DELAY_S
        finally:
            entry.running = False
        entry.due = now + delay

    def _run(self) -> None:
        """Tick on a fixed grid; a late tick starts at once, never two at a time."""
        next_at = self.clock()
        while not self._stop.is_set():
            late = self.clock() - next_at
            self.stats.lag_s = max(late, 0.0)
            try:
                self.tick_once()
            except RuntimeError:  # the pool shut down while stopping
                if self._stop.is_set():
                    return
                raise
            if self.collector is not None:
                self.collector.step(self.clock())
            next_at += self.tick_s
            if next_at < self.clock():
                next_at = self.clock()
            self._stop.wait(max(0.0, next_at - self.clock()))
