"""The API group, its version and kinds, and the wire convention every kind's models share."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

GROUP = "compass.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
WORKFLOW_KIND = "CompoundWorkflow"
WORKFLOW_PLURAL = "compoundworkflows"
POLICY_KIND = "ParetoPolicy"
POLICY_PLURAL = "paretopolicies"
# The Triton model that runs the workflow and applies the active configuration.
DEFAULT_ROUTER_MODEL = "router"


class CamelModel(BaseModel):
    """camelCase on the wire (Kubernetes convention), snake_case in Python; unknown keys rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
