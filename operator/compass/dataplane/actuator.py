"""The serving seam: what a policy's decisions are written to, behind one small interface.

An actuator reads back what it serves and applies a decision (a front member, or a mix of two);
the Triton routers (compass.dataplane.fleet.RouterFleet) are the first, the llm-d gateway's
InferenceModelRewrite (compass.controllers.gateway) the second. The policy controller picks one
by the spec's routing.actuator, as KEDA picks a scaler by its trigger's type.
"""

from __future__ import annotations

from typing import Protocol

from compass.dataplane.triton import SwitchReport
from compass.domain.evaluation import Config


class Actuator(Protocol):
    """Where a policy's routing takes effect."""

    # Why the last write was refused because someone else holds what it writes (None: it was
    # not): reported as a condition, never fought over.
    conflict: str | None

    def active_config(self, expected: str | None = None) -> str:
        """The routing key served now (``expected`` wins a split vote); RoutingError if it
        cannot be read."""
        ...

    def switch(
        self, config: Config, blend: Config | None = None, weight: float = 0.0
    ) -> SwitchReport:
        """Serve ``config`` (with ``blend`` taking the share ``weight``), idempotently;
        RoutingError if it could not."""
        ...
