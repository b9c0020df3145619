"""How much ledger text the operator holds inflated at once, across all workflows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

MIB = 1024 * 1024


class LedgerBudgetBusyError(RuntimeError):
    """The budget has no room for this reservation now (others hold it): try again later."""


class LedgerBudget:
    """Bytes of ledger text reserved across the workflows' starts (threads of one process)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes reserved now."""
        with self._lock:
            return self._held

    @contextmanager
    def reserve(self, size: int) -> Iterator[None]:
        """Hold ``size`` bytes for the block; LedgerBudgetBusyError at once if they do not fit."""
        size = min(size, self.total)  # one workflow's bound always fits an idle budget
        with self._lock:
            if self._held + size > self.total:
                raise LedgerBudgetBusyError(
                    f"{self._held:,} of the {self.total:,}-byte ledger budget are held by other "
                    f"workflows' starts; {size:,} more do not fit"
                )
            self._held += size
        try:
            yield
        finally:
            with self._lock:
                self._held -= size
