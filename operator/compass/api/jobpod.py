"""The pod of a workflow's search and profiling Jobs: placement, pull secrets and resources as
Kubernetes quantities (part of a CompoundWorkflow's spec)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import (
    Field,
    PlainValidator,
    WithJsonSchema,
    field_validator,
)

from compass.api.meta import (
    MAX_MAP_ENTRIES,
    MAX_TOLERATIONS,
    CamelModel,
    DnsSubdomain,
    ShortText,
)

# A Job pod's affinity: the pod spec's three kinds, bounded in size (the API server checks the
# rest, and the operator keeps every spec in memory).
AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
MAX_AFFINITY_CHARS = 16384
MAX_PULL_SECRETS = 16
# Kubernetes' quantity grammar (a non-negative number, then a binary suffix Ki..Ei, a decimal
# suffix n, u, m, k, M..E, or an exponent), for the schema and for the pydantic check alike.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
MAX_QUANTITY_LENGTH = 64
# The API server decodes a larger whole number as a float, which an int-or-string refuses.
MAX_QUANTITY_INT = 2**63 - 1
# 2GB, 512 MiB, 1gb: a byte unit where Kubernetes wants its suffix alone.
_BYTE_UNIT = re.compile(r"^([0-9.]+)\s*([kKmMgGtTpPeE])i?[bB]$")


class Toleration(CamelModel):
    """A Kubernetes toleration of a Job's pod."""

    key: ShortText | None = Field(default=None, description="Taint key.")
    operator: str | None = Field(
        default=None, description="Equal or Exists.", pattern="^(Equal|Exists)$"
    )
    value: ShortText | None = Field(default=None, description="Taint value.")
    effect: str | None = Field(
        default=None,
        description="NoSchedule, PreferNoSchedule or NoExecute.",
        pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$",
    )
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the pod stays bound."
    )


def _quantity_fix(text: str) -> str:
    """How to write a value that is no Kubernetes quantity: 2GB is 2G or 2Gi."""
    unit = _BYTE_UNIT.match(text)
    if unit is not None:
        number, prefix = unit.group(1), unit.group(2).upper()
        decimal = "k" if prefix == "K" else prefix
        return f"write {number}{decimal} or {number}{prefix}i"
    return "write a number with an optional suffix, e.g. 500m, 2, 1.5G or 2Gi"


def _quantity(value: object) -> int | str:
    """A Kubernetes quantity as a resource map holds it: a whole number, or its text form."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= MAX_QUANTITY_INT:
            raise ValueError(
                f"{value} is out of range; a resource quantity is 0 or more, and a whole number "
                f"at most {MAX_QUANTITY_INT} (write larger ones with a suffix: 8Ei)"
            )
        return value
    if isinstance(value, str):
        # fullmatch: re's $ also matches before a final newline, which RE2's (the server's) does not.
        if len(value) > MAX_QUANTITY_LENGTH or not re.fullmatch(QUANTITY_PATTERN, value):
            raise ValueError(
                f"{value[:MAX_QUANTITY_LENGTH]!r} is not a Kubernetes quantity; "
                f"{_quantity_fix(value)}"
            )
        return value
    shown = repr(value) if isinstance(value, float | bool) else f"a {type(value).__name__}"
    raise ValueError(
        f"{shown} is not a Kubernetes quantity; write a whole number or a string "
        "(quote a fraction: '0.5', or write 500m)"
    )


# An int (nvidia.com/gpu: 1, unquoted as most manifests write it) or a quantity's text: the
# API server checks the pattern on a string, the minimum on a number.
Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "maxLength": MAX_QUANTITY_LENGTH,
            "minimum": 0,
        }
    ),
]


class Resources(CamelModel):
    """Container resources as Kubernetes quantities, e.g. limits {nvidia.com/gpu: 1}."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=MAX_MAP_ENTRIES,
        description="Requested resources: a whole number or a quantity (500m, 2Gi; not 2GB).",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=MAX_MAP_ENTRIES,
        description="Resource limits: a whole number or a quantity (500m, 2Gi; not 2GB).",
    )

    def as_container(self) -> dict[str, dict[str, str]]:
        """The container's resources field: every quantity a string, empty maps left out."""
        return {
            name: {key: str(value) for key, value in values.items()}
            for name, values in (("requests", self.requests), ("limits", self.limits))
            if values
        }


class LocalObjectReference(CamelModel):
    """An object of the workflow's namespace, by name."""

    name: DnsSubdomain = Field(min_length=1, description="Name of the object.")


class JobPod(CamelModel):
    """Where a Job's pod runs and what it pulls: the search and profiling sections' pod fields."""

    node_selector: dict[str, ShortText] = Field(
        default_factory=dict,
        max_length=MAX_MAP_ENTRIES,
        description="Node labels the pod's node must have.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Tolerations of the pod for node taints.",
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        max_length=len(AFFINITY_KINDS),
        description="The pod's affinity, as a pod spec writes it (nodeAffinity, podAffinity, "
        "podAntiAffinity); the API server checks the rest when it creates the Job (at most "
        f"{MAX_AFFINITY_CHARS:,} characters as JSON).",
    )
    priority_class_name: DnsSubdomain | None = Field(
        default=None, description="PriorityClass of the pod."
    )
    runtime_class_name: DnsSubdomain | None = Field(
        default=None, description="RuntimeClass of the pod."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=MAX_PULL_SECRETS,
        description="Secrets of the workflow's namespace to pull the Job's image with, added to "
        "the operator's own (the chart's imagePullSecrets).",
    )
    resources: Resources = Field(default_factory=Resources, description="The pod's resources.")

    @field_validator("affinity")
    @classmethod
    def _affinity_bounded(cls, affinity: dict[str, Any] | None) -> dict[str, Any] | None:
        if affinity is None:
            return None
        unknown = sorted(set(affinity) - set(AFFINITY_KINDS))
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)} is no kind of affinity; give {', '.join(AFFINITY_KINDS)}"
            )
        size = len(json.dumps(affinity, separators=(",", ":")))
        if size > MAX_AFFINITY_CHARS:
            raise ValueError(
                f"{size:,} characters as JSON, over {MAX_AFFINITY_CHARS:,}; use fewer terms, or "
                "node labels and nodeSelector"
            )
        return affinity
