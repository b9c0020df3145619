"""The CRD reference (docs/crd-reference.md), rendered from the same schemas as the CRD YAML
by `compass crds --reference FILE` (hack/gen-crds.sh); tests/repo/test_crd_reference.py fails
while the checked-in copy is stale."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from compass.api.crds import CATEGORIES, RESOURCES, Resource, build_crd
from compass.api.meta import GROUP, VERSION
from compass.api.rules import VALIDATIONS

REFERENCE_PATH = "docs/crd-reference.md"


@dataclass(frozen=True)
class Section:
    """One object level: its path from the resource root and its schema node."""

    path: str
    node: dict[str, Any]


def object_sections(path: str, node: dict[str, Any]) -> list[Section]:
    """Every object level under ``node`` (itself first), depth first in field order; a list's
    items are ``path[]``, a map's values ``path{}``."""
    found = [Section(path, node)] if "properties" in node else []
    for name, child in node.get("properties", {}).items():
        found += object_sections(f"{path}.{name}", child)
    if isinstance(node.get("items"), dict):
        found += object_sections(f"{path}[]", node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        found += object_sections(f"{path}{{}}", node["additionalProperties"])
    return found


def anchor(kind: str, path: str) -> str:
    """A stable HTML anchor for one section (paths hold characters headings would mangle)."""
    cleaned = path.replace("[]", "-items").replace("{}", "-values").replace(".", "-")
    return f"{kind.lower()}-{cleaned}"


def type_of(node: dict[str, Any], kind: str, path: str) -> str:
    """The field's type in words, linking to the section of an object with fields."""
    if node.get("x-kubernetes-int-or-string"):
        text = "integer or string"
    elif node.get("x-kubernetes-preserve-unknown-fields") and "type" not in node:
        text = "any"
    elif "properties" in node:
        text = f"[object](#{anchor(kind, path)})"
    elif node.get("type") == "array" and isinstance(node.get("items"), dict):
        text = f"list of {type_of(node['items'], kind, f'{path}[]')}"
    elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        text = f"map of string to {type_of(node['additionalProperties'], kind, f'{path}{{}}')}"
    else:
        text = str(node.get("type", "any"))
        if node.get("format"):
            text += f" ({node['format']})"
    return text + (", nullable" if node.get("nullable") and "properties" not in node else "")


def _code(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return f"`{text}`"


def constraints_of(node: dict[str, Any]) -> str:
    """Bounds, lengths, sizes, pattern and enum of one field, in words."""
    parts = []
    if "enum" in node:
        parts.append("one of " + ", ".join(_code(v) for v in node["enum"]))
    if "minimum" in node:
        parts.append(f"{'>' if node.get('exclusiveMinimum') else '>='} {node['minimum']:g}")
    if "maximum" in node:
        parts.append(f"{'<' if node.get('exclusiveMaximum') else '<='} {node['maximum']:g}")
    for key, words in (
        ("minLength", "length >= {}"),
        ("maxLength", "length <= {}"),
        ("minItems", "items >= {}"),
        ("maxItems", "items <= {}"),
        ("minProperties", "entries >= {}"),
        ("maxProperties", "entries <= {}"),
    ):
        if key in node:
            parts.append(words.format(node[key]))
    if "pattern" in node:
        parts.append(f"matches {_code(node['pattern'])}")
    return "; ".join(parts)


def _row(*cells: str) -> str:
    """A markdown table row, each cell made one line with its pipes escaped."""
    return "| " + " | ".join(" ".join(cell.split()).replace("|", "\\|") for cell in cells) + " |"


def _rules(node: dict[str, Any]) -> list[str]:
    return [
        f"- {rule['message']}"
        + (f" (reported at `{rule['fieldPath']}` from 1.28)" if rule.get("fieldPath") else "")
        + (f" ({rule['reason']})" if rule.get("reason") else "")
        + f": `{rule['rule']}`"
        for rule in node.get(VALIDATIONS, [])
    ]


def render_section(kind: str, section: Section) -> list[str]:
    """The heading, description, field table and CEL rules of one object level."""
    node = section.node
    required = set(node.get("required", []))
    lines = [
        f'<a id="{anchor(kind, section.path)}"></a>',
        "",
        f"### {kind} `{section.path}`",
        "",
    ]
    if node.get("description"):
        lines += [" ".join(str(node["description"]).split()), ""]
    lines += [
        "| field | type | required | default | bounds / enum | description |",
        "|---|---|---|---|---|---|",
    ]
    rules_below: list[str] = []
    for name, child in node["properties"].items():
        path = f"{section.path}.{name}"
        default = _code(child["default"]) if "default" in child else ""
        lines.append(
            _row(
                f"`{name}`",
                type_of(child, kind, path),
                "yes" if name in required else "",
                default,
                constraints_of(child),
                str(child.get("description", "")),
            )
        )
        if "properties" not in child and child.get(VALIDATIONS):
            rules_below += [f"- on `{name}`: {line[2:]}" for line in _rules(child)]
    rules = _rules(node) + rules_below
    if rules:
        lines += [
            "",
            "Rules (CEL, checked at admission by Kubernetes >= 1.25 and by the operator):",
        ]
        lines += ["", *rules]
    return [*lines, ""]


def render_resource(resource: Resource) -> list[str]:
    """One resource's part of the reference."""
    crd = build_crd(resource)
    version = crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    names = crd["spec"]["names"]
    kind = resource.kind
    lines = [
        f"## {kind}",
        "",
        " ".join(str(root["description"]).split()),
        "",
        "| | |",
        "|---|---|",
        f"| apiVersion | `{GROUP}/{VERSION}` |",
        f"| kind | `{kind}` |",
        f"| scope | {crd['spec']['scope']} |",
        f"| plural | `{names['plural']}` |",
        f"| short names | {', '.join(f'`{n}`' for n in names['shortNames'])} |",
        f"| categories | {', '.join(f'`{c}`' for c in CATEGORIES)} |",
        f"| CRD | `{resource.name}` |",
        "",
        f"Printer columns (`kubectl get {names['shortNames'][0]}`; priority 1 with `-o wide`):",
        "",
        "| column | JSON path | type | priority | description |",
        "|---|---|---|---|---|",
    ]
    for column in version["additionalPrinterColumns"]:
        lines.append(
            _row(
                column["name"],
                f"`{column['jsonPath']}`",
                column["type"],
                str(column.get("priority", 0)),
                column.get("description", ""),
            )
        )
    lines.append("")
    for part in ("spec", "status"):
        for section in object_sections(part, root["properties"][part]):
            lines += render_section(kind, section)
    return lines


def render_reference() -> str:
    """The whole reference as markdown."""
    # Named from the models themselves, so the note follows them if they move.
    modules = ", ".join(dict.fromkeys(m.__module__ for r in RESOURCES for m in (r.spec, r.status)))
    lines = [
        f"# `{GROUP}/{VERSION}` custom resources: reference",
        "",
        f"<!-- Generated from the pydantic models ({modules}) by `compass crds --reference "
        f"{REFERENCE_PATH}` (hack/gen-crds.sh); do not edit by hand. -->",
        "",
        "Generated from the same pydantic models as the CRDs in `crds/`: every field with its "
        "type, default, bounds and description, the CEL rules each object carries (Kubernetes "
        ">= 1.25 enforces them at admission, and reports an error at the rule's field from 1.28; "
        "older servers drop them and the operator reports the same error as a condition), the "
        'printer columns and short names. A field whose default is empty (`""` or none) shows '
        "no default.",
        "",
    ]
    lines += [f"- [{r.kind}](#{r.kind.lower()}) (`{r.short_names[0]}`)" for r in RESOURCES]
    lines.append("")
    for resource in RESOURCES:
        lines += render_resource(resource)
    return "\n".join(lines).rstrip("\n") + "\n"
