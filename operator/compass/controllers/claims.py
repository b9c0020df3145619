"""The oldest claim on each routing target, worked out once while kopf's claims index holds."""

from __future__ import annotations

import threading
from collections.abc import Collection, Hashable

from compass.controllers.policy_decisions import Claim


class OldestClaims:
    """Each target key's oldest claim, cached while the key's claims and the count of index
    changes (``noted``: kopf's index tells no version) are the same."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changes = 0
        self._seen: dict[Hashable, tuple[Hashable, Claim | None]] = {}
        self._oldest: dict[Hashable, tuple[int, int, Claim | None]] = {}

    def noted(self, policy: Hashable, key: Hashable, claim: Claim | None) -> None:
        """The index function's answer for ``policy`` (namespace, name): its key and claim."""
        with self._lock:
            if self._seen.get(policy) != (key, claim):
                self._seen[policy] = (key, claim)
                self._changes += 1

    def __len__(self) -> int:
        """How many policies' answers it holds."""
        with self._lock:
            return len(self._seen)

    def forget(self, policy: Hashable) -> None:
        """A deleted policy: its last answer goes (its claim went from kopf's index with it)."""
        with self._lock:
            if self._seen.pop(policy, None) is not None:
                self._changes += 1

    def oldest(self, key: Hashable, claims: Collection[Claim]) -> Claim | None:
        """The oldest of ``claims``, kopf's store under ``key`` (None: none)."""
        with self._lock:
            changes = self._changes
            cached = self._oldest.get(key)
        size = len(claims)
        if cached is not None and cached[:2] == (changes, size):
            return cached[2]
        # Counted before the scan: a change during it leaves the next read to scan again.
        first = min(list(claims), default=None)
        with self._lock:
            self._oldest[key] = (changes, size, first)
        return first
