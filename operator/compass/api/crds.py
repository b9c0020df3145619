"""The CustomResourceDefinitions, built from the pydantic models (the single source of truth)."""

from __future__ import annotations

from collections.abc import Iterator
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
from compass.api.paretopolicy import ParetoPolicySpec
from compass.api.paretopolicy_status import ParetoPolicyStatus
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
        PrinterColumn(
            "Served",
            ".status.served.accuracy",
            "number",
            "Mean accuracy the routers served, last minute.",
        ),
        PrinterColumn("Switches", ".status.switches", "integer", "Switches so far."),
        PrinterColumn(
            "Ready", '.status.conditions[?(@.type=="Ready")].status', description="In control."
        ),
    ),
)

RESOURCES = (COMPOUND_WORKFLOW, PARETO_POLICY)


# The API server versions that know the parts of a CEL rule, for the chart's CRD templates:
# x-kubernetes-validations is enforced by default from 1.25 (beta; alpha and off before), and a
# rule's reason and fieldPath exist from 1.28. Server-side apply (Helm 4 installs with it)
# refuses a field the server's own CRD schema lacks, so each part is sent only where it is known.
CEL_MIN_KUBE_VERSION = "1.25.0"
CEL_FIELDS_MIN_KUBE_VERSION = "1.28.0"
# The fields of a rule that CEL_FIELDS_MIN_KUBE_VERSION introduced.
_CEL_FIELDS = ("fieldPath", "reason")
_WIDTH = 100


def render_crds() -> dict[str, str]:
    """File name -> YAML text of every CRD, as checked in under crds/ (with the CEL rules)."""
    header = "# Generated from compass.api by `compass crds`; do not edit by hand.\n"
    return {
        f"{resource.name}.yaml": header
        + yaml.safe_dump(build_crd(resource), sort_keys=False, width=_WIDTH)
        for resource in RESOURCES
    }


def render_crd_templates() -> dict[str, str]:
    """File name -> Helm template of every CRD, as checked in under the chart's templates/crds/
    (templates, since Helm never upgrades a chart's crds/; _TEMPLATE_HEADER says what they add)."""
    return {f"{resource.name}.yaml": crd_template(build_crd(resource)) for resource in RESOURCES}


def crd_template(crd: dict[str, Any]) -> str:
    """One CRD as a Helm template: the YAML with Helm guards around what depends on values."""
    if any("{{" in text or "}}" in text for text in _strings(crd)):
        raise ValueError(
            f"{crd['metadata']['name']}: a description or rule contains '{{{{' or '}}}}', which "
            "Helm would read as a template action; reword it"
        )
    rules: list[list[dict[str, str]]] = []
    body = _with_rule_placeholders(crd, rules)
    del body["metadata"]["labels"]  # the chart's own labels, from its helper
    text = yaml.safe_dump(body, sort_keys=False, width=_WIDTH)
    lines = []
    for line in text.splitlines():
        key, _, value = line.strip().partition(": ")
        if key == VALIDATIONS and value.startswith(_PLACEHOLDER):
            indent = line[: len(line) - len(line.lstrip())]
            lines += _validations_template(rules[int(value.removeprefix(_PLACEHOLDER))], indent)
        else:
            lines.append(line)
            if line.startswith("  name: ") and lines[-2] == "metadata:":
                lines += _METADATA_TEMPLATE
    return "\n".join([*_TEMPLATE_HEADER, *lines, "{{- end }}", ""])


_PLACEHOLDER = "compass-cel-rules-"
_TEMPLATE_HEADER = (
    "{{- /* Generated from compass.api by `compass crds --helm-template`; do not edit by hand.",
    f"CEL rules only where the API server enforces them (>= {CEL_MIN_KUBE_VERSION}), their "
    f"{' and '.join(_CEL_FIELDS)} only",
    f"where it knows them (>= {CEL_FIELDS_MIN_KUBE_VERSION}): server-side apply refuses a field "
    "the server does not know. */}}",
    "{{- if .Values.crds.install }}",
    f'{{{{- $cel := semverCompare ">={CEL_MIN_KUBE_VERSION}-0" '
    ".Capabilities.KubeVersion.Version }}",
    f'{{{{- $celFields := semverCompare ">={CEL_FIELDS_MIN_KUBE_VERSION}-0" '
    ".Capabilities.KubeVersion.Version }}",
)
_METADATA_TEMPLATE = (
    "  labels:",
    '    {{- include "compass-operator.labels" . | nindent 4 }}',
    "  {{- if .Values.crds.keep }}",
    "  annotations:",
    "    # helm uninstall (or an upgrade with crds.install off) leaves the CRD and its resources.",
    "    helm.sh/resource-policy: keep",
    "  {{- end }}",
)


def _with_rule_placeholders(value: Any, rules: list[list[dict[str, str]]]) -> Any:
    """A copy of the CRD with each rule list replaced by a numbered placeholder (kept in rules)."""
    if isinstance(value, dict):
        copy = {}
        for key, item in value.items():
            if key == VALIDATIONS:
                copy[key] = f"{_PLACEHOLDER}{len(rules)}"
                rules.append(item)
            else:
                copy[key] = _with_rule_placeholders(item, rules)
        return copy
    if isinstance(value, list):
        return [_with_rule_placeholders(item, rules) for item in value]
    return value


def _validations_template(rules: list[dict[str, str]], indent: str) -> list[str]:
    """The lines of one x-kubernetes-validations list, each part behind its version guard."""
    # A guard's own indentation is trimmed away ({{-); it is there for whoever reads the file.
    lines = [f"{indent}{{{{- if $cel }}}}", f"{indent}{VALIDATIONS}:"]
    for rule in rules:
        base = {k: v for k, v in rule.items() if k not in _CEL_FIELDS}
        extra = {k: v for k, v in rule.items() if k in _CEL_FIELDS}
        lines += _indented(yaml.safe_dump([base], sort_keys=False, width=_WIDTH), indent)
        if extra:
            lines.append(f"{indent}  {{{{- if $celFields }}}}")
            lines += _indented(yaml.safe_dump(extra, sort_keys=False, width=_WIDTH), indent + "  ")
            lines.append(f"{indent}  {{{{- end }}}}")
    lines.append(f"{indent}{{{{- end }}}}")
    return lines


def _strings(value: Any) -> Iterator[str]:
    """Every string in value (a CRD or part of it): keys, descriptions, patterns, rules."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _indented(text: str, indent: str) -> list[str]:
    """The lines of a YAML dump, each moved right by indent."""
    return [indent + line for line in text.splitlines()]
