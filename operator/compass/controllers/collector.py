"""The GC of a process of long-lived policy data: the old frozen, all collected every ``thaw_s``."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field

FREEZE_EVERY_S = 10.0
THAW_EVERY_S = 900.0


@dataclass
class Collector:
    """When to freeze the survivors and when to collect everything once (``step`` each tick)."""

    freeze_s: float = FREEZE_EVERY_S
    thaw_s: float = THAW_EVERY_S
    collect: Callable[[int], int] = field(default=gc.collect, repr=False)
    freeze: Callable[[], None] = field(default=gc.freeze, repr=False)
    unfreeze: Callable[[], None] = field(default=gc.unfreeze, repr=False)
    frozen_at: float | None = None
    thawed_at: float | None = None

    def release(self) -> None:
        """Thaw everything (the scheduler stopped: a process that goes on keeps no cycle frozen)."""
        self.unfreeze()
        self.frozen_at = self.thawed_at = None

    def step(self, now: float) -> str | None:
        """Freeze or thaw if one is due at ``now`` (monotonic s): what was done, else None."""
        if self.frozen_at is None or self.thawed_at is None:
            # The first step only starts the clocks: startup's objects are frozen a period on.
            self.frozen_at = self.thawed_at = now
            return None
        if now - self.thawed_at >= self.thaw_s:
            self.unfreeze()
            self.collect(2)
            self.freeze()
            self.frozen_at = self.thawed_at = now
            return "thawed"
        if now - self.frozen_at >= self.freeze_s:
            # Young garbage cycles collected first, so that they are not frozen with the rest.
            self.collect(1)
            self.freeze()
            self.frozen_at = now
            return "frozen"
        return None
