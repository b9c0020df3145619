"""The CustomResourceDefinitions, built from the pydantic models (the single source of truth)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from compass.api.compoundworkflow import CompoundWorkflowSpec, CompoundWorkflowStatus
from compass.api.meta import (
    GROUP,
    POLICY_KIND,
    POLICY_PLURAL,
    VERSION,
    WORKFLOW_KIND,
    WORKFLOW_PLURAL,
)
from compass.api.paretopolicy import ParetoPolicySpec, ParetoPolicyStatus
from compass.api.rules import VALIDATIONS
from compass.api.schema import structural_schema

CATEGORIES = ["compass", "all-compass"]


@dataclass(frozen=True)
class PrinterColumn:
    """One column of `kubectl get`."""

    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class Resource:
    """One custom resource kind and the models behind it."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    spec: type[BaseModel]
    status: type[BaseModel]
    description: str
    columns: tuple[PrinterColumn, ...]

    @property
    def name(self) -> str:
        """The CRD's metadata.name."""
        return f"{self.plural}.{GROUP}"


def build_crd(resource: Resource) -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of one resource."""
    columns = [
        {
            "name": c.name,
            "type": c.type,
            "jsonPath": c.json_path,
            **({"description": c.description} if c.description else {}),
            **({"priority": c.priority} if c.priority else {}),
        }
        for c in resource.columns
    ] + [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": resource.name,
            "labels": {"app.kubernetes.io/part-of": "compass-operator"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.kind.lower(),
                "shortNames": list(resource.short_names),
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": resource.description,
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version."},
                                "kind": {"type": "string", "description": "Kind."},
                                "metadata": {"type": "object"},
                                "spec": structural_schema(resource.spec),
                                "status": structural_schema(resource.status),
                            },
                        }
                    },
                }
            ],
        },
    }


COMPOUND_WORKFLOW = Resource(
    kind=WORKFLOW_KIND,
    plural=WORKFLOW_PLURAL,
    short_names=("cwf",),
    spec=CompoundWorkflowSpec,
    status=CompoundWorkflowStatus,
    description="A compound-AI workflow whose configurations compass searches, profiles and "
    "plans into a ParetoPolicy.",
    columns=(
        PrinterColumn("Phase", ".status.phase", description="Where the workflow is."),
        PrinterColumn("Tau", ".spec.evaluation.tau", "number", "Accuracy target."),
        PrinterColumn("Feasible", ".status.feasibleFound", "integer", "Configurations >= tau."),
        PrinterColumn("Evaluated", ".status.configurationsEvaluated", "integer", priority=1),
        PrinterColumn("Samples", ".status.samplesUsed", "integer", priority=1),
        PrinterColumn("SLO-ms", ".spec.slo.latencyMs", "number", "Latency target."),
        PrinterColumn("Policy", ".status.policy", description="Generated ParetoPolicy."),
    ),
)

PARETO_POLICY = Resource(
    kind=POLICY_KIND,
    plural=POLICY_PLURAL,
    short_names=("pp",),
    spec=ParetoPolicySpec,
    status=ParetoPolicyStatus,
    description="A Pareto front of configurations of a workflow and the rules Elastico uses to "
    "switch the Triton router between them as the load changes.",
    columns=(
        PrinterColumn("Active", ".status.active.name", description="Configuration served now."),
        PrinterColumn("Queue", ".status.lastQueueDepth", "number", "Last queue depth seen."),
        PrinterColumn("Accuracy", ".status.active.accuracy", "number", "Active's accuracy."),
        PrinterColumn("P95", ".status.active.latencyP95Ms", "number", "Active's p95 (ms)."),
        PrinterColumn("SLO", ".spec.slo.latencyMs", "number", "Latency target (ms)."),
        PrinterColumn("Switches", ".status.switches", "integer", "Switches so far."),
        PrinterColumn(
            "Ready", '.status.conditions[?(@.type=="Ready")].status', description="In control."
        ),
    ),
)

RESOURCES = (COMPOUND_WORKFLOW, PARETO_POLICY)


def without_cel(value: Any) -> Any:
    """The CRD (or any part of it) without its CEL rules (x-kubernetes-validations)."""
    if isinstance(value, dict):
        return {k: without_cel(v) for k, v in value.items() if k != VALIDATIONS}
    if isinstance(value, list):
        return [without_cel(item) for item in value]
    return value


def render_crds(*, cel: bool = True) -> dict[str, str]:
    """File name -> YAML text of every CRD, as checked in under crds/.

    cel=False leaves the CEL rules out, for clients that check a CRD against a pre-1.25
    CustomResourceDefinition schema and refuse the unknown keyword: Helm 4 installs a chart's
    crds/ with server-side apply, which a 1.20 API server rejects ("field not declared in
    schema"), where a plain create (kubectl --validate=false, the kubernetes client) just
    drops it. The operator checks the same rules either way.
    """
    command = "compass crds" if cel else "compass crds --without-cel"
    header = f"# Generated from compass.api by `{command}`; do not edit by hand.\n"
    return {
        f"{resource.name}.yaml": header
        + yaml.safe_dump(
            build_crd(resource) if cel else without_cel(build_crd(resource)),
            sort_keys=False,
            width=100,
        )
        for resource in RESOURCES
    }
