"""Kubernetes-style conditions, shared by every kind's status: the wire type and its schema.

Setting, finding and parsing them: compass.controllers.conditions.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from compass.api.meta import CamelModel, Timestamp

# A condition message is one line that fits a `kubectl describe` screen; a Job's error line is
# bounded the same, since the operator copies it into one.
MESSAGE_CHARS = 600
# One entry per type, merged by type on the server (server-side apply, kubectl): the list is a
# map keyed by type, as Kubernetes' own conditions are.
CONDITIONS_SCHEMA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}
MAX_CONDITIONS = 16


class Condition(CamelModel):
    """A Kubernetes-style condition: one aspect of the resource's state and why."""

    type: str = Field(description="What the condition is about, e.g. SearchSucceeded.")
    status: str = Field(description="True, False or Unknown.", pattern="^(True|False|Unknown)$")
    reason: str = Field(description="One CamelCase word for machines.")
    message: str = Field(default="", description="One line for people: what and what to do.")
    last_transition_time: Timestamp = Field(
        default=None, description="When the status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation the condition describes."
    )
