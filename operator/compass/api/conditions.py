"""Kubernetes-style conditions, shared by every kind's status."""

from __future__ import annotations

from pydantic import Field

from compass.api.meta import CamelModel


class Condition(CamelModel):
    """A Kubernetes-style condition: one aspect of the resource's state and why."""

    type: str = Field(description="What the condition is about, e.g. SearchSucceeded.")
    status: str = Field(description="True, False or Unknown.", pattern="^(True|False|Unknown)$")
    reason: str = Field(description="One CamelCase word for machines.")
    message: str = Field(default="", description="One line for people: what and what to do.")
    last_transition_time: str | None = Field(
        default=None, description="When the status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation the condition describes."
    )
