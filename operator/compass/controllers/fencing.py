"""Fencing: act only while no standby can have taken over (docs/operations.md, "One actor")."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Share of the lifetime kept back, and how often a keep-alive is sent: at 60 s, one every 15 s,
# and a fence closing 45 s after the last accepted one, 15 s before a standby may resume.
MARGIN_SHARE = 0.25
RENEWALS_PER_LIFETIME = 4
# The peering object of a cluster-wide operator (a ClusterKopfPeering) has no namespace.
CLUSTER_SCOPE = ""


@dataclass
class Fence:
    """When each peering scope (a watched namespace, or the cluster) was last renewed."""

    lifetime_s: float
    clusterwide: bool
    renewed_at: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def margin_s(self) -> float:
        """What is kept back at the end: skew between the peers' clocks, a decision in flight."""
        return self.lifetime_s * MARGIN_SHARE

    @property
    def renew_every_s(self) -> float:
        """How often the keep-alive loop renews every scope."""
        return self.lifetime_s / RENEWALS_PER_LIFETIME

    def renewed(self, scope: str, sent_at: float) -> None:
        """The API server accepted a keep-alive for ``scope`` sent at ``sent_at`` (monotonic)."""
        with self._lock:
            self.renewed_at[scope] = max(sent_at, self.renewed_at.get(scope, sent_at))

    def scope(self, namespace: str) -> str:
        """The peering scope a resource in ``namespace`` belongs to."""
        return CLUSTER_SCOPE if self.clusterwide else namespace

    def renewed_ago(self, namespace: str, now: float) -> float | None:
        """Seconds since the last accepted keep-alive for ``namespace`` was sent; None: never."""
        with self._lock:
            sent_at = self.renewed_at.get(self.scope(namespace))
        return None if sent_at is None else now - sent_at

    def holds(self, namespace: str, now: float) -> bool:
        """Whether this process may still act in ``namespace`` at (monotonic) ``now``."""
        ago = self.renewed_ago(namespace, now)
        return ago is not None and ago < self.lifetime_s - self.margin_s


def keepalive_patch(identity: str, priority: int, lastseen: datetime) -> list[dict[str, Any]]:
    """A JSON patch renewing this peer's entry in a peering object's status, as kopf writes it;
    the entry tested first, so none is created (a departed peer's standby would wait a lifetime)."""
    # One JSON-pointer step (RFC 6901; kopf's user@host/time/random identity has /).
    entry = f"/status/{identity.replace('~', '~0').replace('/', '~1')}"
    return [
        {"op": "test", "path": f"{entry}/priority", "value": priority},
        {"op": "replace", "path": f"{entry}/lastseen", "value": lastseen.isoformat()},
    ]
