"""What a policy's decisions are written to: the Triton routers or the llm-d gateway."""

from __future__ import annotations

from typing import Protocol

from compass.dataplane.triton import SwitchReport
from compass.domain.evaluation import Config


class Actuator(Protocol):
    """Where a policy's routing takes effect."""

    # Why the last write was refused as someone else's to make (None: it was not): never fought.
    conflict: str | None

    def active_config(self, expected: str | None = None) -> str:
        """The routing key served now (``expected`` wins a split vote), or RoutingError."""
        ...

    def switch(
        self, config: Config, blend: Config | None = None, weight: float = 0.0
    ) -> SwitchReport:
        """Serve ``config`` (``blend`` taking ``weight``), idempotently, or RoutingError."""
        ...
