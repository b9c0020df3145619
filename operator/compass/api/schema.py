"""Pydantic models -> structural OpenAPI v3 schemas, as Kubernetes CRDs require them.

Kubernetes accepts a subset of OpenAPI v3 and insists on a "structural" schema: every node has
a type (or says it preserves unknown fields), no $ref, no anyOf/oneOf carrying types, no
``const``, no ``title``. Pydantic emits JSON Schema with $defs, ``anyOf: [X, null]`` for optional
fields and ``const`` for single-value literals; this module rewrites that into what both
Kubernetes 1.20 and current servers accept. CEL rules (``x-kubernetes-validations``, declared
by the models through compass.api.rules) pass through: current servers enforce them, 1.20
drops the keyword.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

# Keywords a CRD schema may carry (apiextensions.k8s.io/v1 JSONSchemaProps), minus $ref/$schema.
_ALLOWED = {
    "type",
    "format",
    "description",
    "default",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "enum",
    "maxProperties",
    "minProperties",
    "required",
    "items",
    "properties",
    "additionalProperties",
    "nullable",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
}


class SchemaError(ValueError):
    """A model cannot be expressed as a structural schema; the message names the field."""


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's structural OpenAPI v3 schema, aliases (camelCase) as property names."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    return _convert(raw, definitions, path=model.__name__)


def _resolve(node: Mapping[str, Any], definitions: Mapping[str, Any]) -> dict[str, Any]:
    """Inline a $ref, keeping the referring node's own description and default."""
    if "$ref" not in node:
        return dict(node)
    name = node["$ref"].rsplit("/", 1)[-1]
    merged = dict(definitions[name])
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged


def _convert(node: Mapping[str, Any], definitions: Mapping[str, Any], path: str) -> dict[str, Any]:
    node = _resolve(node, definitions)
    variants = node.pop("anyOf", None) or node.pop("oneOf", None)
    if variants is not None:
        node = _merge_variants(node, variants, definitions, path)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = _resolve(node.pop("allOf")[0], definitions)
        node = {**inner, **node}
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        # JSON Schema's numeric exclusive bounds are OpenAPI v3's boolean modifiers.
        if isinstance(node.get(exclusive), int | float) and not isinstance(node[exclusive], bool):
            node[bound] = node.pop(exclusive)
            node[exclusive] = True
    # "No value" is expressed by leaving the field out; so is "": kube-apiserver 1.20 reads an
    # empty-string default as null and rejects the whole CRD ("default: Invalid value: null:
    # must be of type string"; tests/k8s/test_chart.py), and the models read an absent string
    # as their "" default anyway.
    if node.get("default", 0) in (None, ""):
        del node["default"]
    if "enum" in node and "type" not in node:
        kinds = {type(v) for v in node["enum"]}
        if kinds == {str}:
            node["type"] = "string"
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            result[key] = {
                name: _convert(child, definitions, f"{path}.{name}")
                for name, child in value.items()
            }
        elif key == "items":
            result[key] = _convert(value, definitions, f"{path}[]")
        elif key == "additionalProperties":
            if isinstance(value, Mapping):
                result[key] = _convert(value, definitions, f"{path}{{}}")
            elif value is True:
                result["x-kubernetes-preserve-unknown-fields"] = True
            # False is the default for a structural schema with properties: drop it.
        elif key in _ALLOWED:
            result[key] = value
    for entry in result.get("x-kubernetes-validations", []):
        # Current servers reject a CRD whose rule reports at a field the object does not have.
        field = entry.get("fieldPath")
        if field is not None and field.lstrip(".").split(".")[0] not in result.get(
            "properties", {}
        ):
            raise SchemaError(f"{path}: rule fieldPath {field!r} names no field of the object")
    untyped_allowed = ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")
    if "type" not in result and not any(result.get(k) for k in untyped_allowed):
        raise SchemaError(f"{path}: no type; give the field a concrete type")
    if (
        result.get("type") == "object"
        and "properties" not in result
        and ("additionalProperties" not in result)
    ):
        result["x-kubernetes-preserve-unknown-fields"] = True
    return result


def _merge_variants(
    node: dict[str, Any],
    variants: list[Mapping[str, Any]],
    definitions: Mapping[str, Any],
    path: str,
) -> dict[str, Any]:
    """``X | None`` becomes nullable X; a union of scalars becomes a free-form scalar."""
    concrete = [_resolve(v, definitions) for v in variants if v.get("type") != "null"]
    nullable = len(concrete) < len(variants)
    if len(concrete) == 1:
        merged = {**concrete[0], **node}
        if nullable:
            merged["nullable"] = True
        return merged
    kinds = {v.get("type") for v in concrete}
    if not kinds <= {"string", "integer", "number", "boolean"}:
        raise SchemaError(f"{path}: a union of {sorted(str(k) for k in kinds)} is not structural")
    merged = {k: v for k, v in node.items() if k in ("description", "default")}
    if kinds == {"string", "integer"}:
        # A port (number or name): Kubernetes' own int-or-string, which servers validate.
        merged["x-kubernetes-int-or-string"] = True
        if nullable:
            merged["nullable"] = True
    else:
        # A parameter value may be a string, a number or a boolean; structural schemas cannot
        # say "one of these scalars", so the node keeps whatever it is given and the operator
        # validates it with the same pydantic model.
        merged["x-kubernetes-preserve-unknown-fields"] = True
    return merged


def without_empty_strings(value: Any) -> Any:
    """The value without empty-string fields, at any depth, for writing to the API server."""
    # The quirk of empty-string defaults above: kube-apiserver 1.20 (Go 1.19) decodes "" inside
    # an object as null; the models read an absent string back as "", so nothing is lost.
    if isinstance(value, Mapping):
        return {k: without_empty_strings(v) for k, v in value.items() if v != ""}
    if isinstance(value, list):
        return [without_empty_strings(item) for item in value]
    return value
