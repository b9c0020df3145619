"""The API group, its version and kinds, and the wire convention every kind's models share."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
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

# Bounds on what a resource may ask the operator to hold and read every interval: far above
# what a workflow needs, low enough that one resource cannot cost the others their period.
MAX_NAME_LENGTH = 253  # a Kubernetes object name (DNS subdomain)
MAX_NAMESPACE_LENGTH = 63  # a DNS label
# Kubernetes names: a DNS subdomain (most objects, Secrets) and a DNS label (a namespace).
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
MAX_IMAGE_LENGTH = 512
MAX_QUERY_LENGTH = 4096
MAX_ENDPOINT_LENGTH = 512
MAX_ARGS = 128
MAX_ARG_LENGTH = 4096
MAX_MAP_ENTRIES = 64  # node selectors, resource maps
MAX_TOLERATIONS = 32
# A name, key, label value, taint or quantity: a short string.
ShortText = Annotated[str, Field(max_length=MAX_NAME_LENGTH)]
# A Kubernetes object's name, or a host name: a DNS subdomain.
DnsSubdomain = Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)]
# A time as RFC 3339 text, where one may be unset.
Timestamp = Annotated[str | None, Field(json_schema_extra={"format": "date-time"})]


class CamelModel(BaseModel):
    """camelCase on the wire (Kubernetes convention), snake_case in Python; unknown keys rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
