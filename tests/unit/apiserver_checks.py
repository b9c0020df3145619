"""What a kube-apiserver checks on a custom resource's spec before any controller sees it: the
structural schema (types, enums, bounds, patterns, required fields) and the CEL rules
(x-kubernetes-validations), evaluated with a real CEL implementation (cel-python, module celpy)
the way a current kube-apiserver does: defaults applied first, each rule run on every present
object its schema node describes with ``self`` typed by the schema (``number`` fields are
doubles even when written as 1, fields without a schema type are not visible), an evaluation
error counts as a rejection. Shared by test_crd_rules.py and test_resource_corpus.py.
"""

from __future__ import annotations

import copy
import functools
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

from compass.api.crds import Resource, build_crd

VALIDATIONS = "x-kubernetes-validations"
INT64 = (-(2**63), 2**63 - 1)
ENV = celpy.Environment()


def spec_schema(resource: Resource) -> dict[str, Any]:
    crd = build_crd(resource)
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]  # type: ignore[no-any-return]


# ---------------------------------------------------------------- a kube-apiserver's CEL pass


def defaulted(value: Any, schema: dict[str, Any]) -> Any:
    """The value with the schema's defaults filled in, as the server does before validating."""
    if isinstance(value, dict):
        result = dict(value)
        for name, child in schema.get("properties", {}).items():
            if name not in result and "default" in child:
                result[name] = copy.deepcopy(child["default"])
            if name in result:
                result[name] = defaulted(result[name], child)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            result = {k: defaulted(v, extra) for k, v in result.items()}
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [defaulted(item, schema["items"]) for item in value]
    return value


def _exposed(schema: dict[str, Any]) -> bool:
    """Whether Kubernetes declares the node in CEL (untyped preserved values are hidden)."""
    kind = schema.get("type")
    if kind == "array":
        return _exposed(schema["items"])
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return _exposed(schema["additionalProperties"])
    return kind in {"object", "string", "integer", "number", "boolean"}


def to_cel(value: Any, schema: dict[str, Any]) -> Any:
    """The value as the CEL type the schema declares (Kubernetes' UnstructuredToVal)."""
    kind = schema.get("type")
    if value is None:
        return None
    if kind == "number":
        return celtypes.DoubleType(float(value))
    if kind == "integer":
        return celtypes.IntType(value)
    if kind == "string":
        return celtypes.StringType(value)
    if kind == "boolean":
        return celtypes.BoolType(value)
    if kind == "array":
        return celtypes.ListType([to_cel(v, schema["items"]) for v in value])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return celtypes.MapType(
            {celtypes.StringType(k): to_cel(v, extra) for k, v in value.items()}
        )
    fields = schema.get("properties", {})
    return celtypes.MapType(
        {
            celtypes.StringType(k): to_cel(v, fields[k])
            for k, v in value.items()
            if k in fields and _exposed(fields[k])
        }
    )


@dataclass(frozen=True)
class Rejection:
    """One failed rule: where the server reports it and what it says."""

    node: str  # the object the rule ran on, relative to spec: "evaluation", "front[1]"
    field: str  # node + fieldPath: the path the server's error names
    message: str
    rule: str


@functools.cache
def _program(rule: str) -> Any:
    return ENV.program(ENV.compile(rule))


def _run(rule: str, value: Any) -> bool:
    program = _program(rule)
    try:
        return bool(program.evaluate({"self": value}))
    except celpy.CELEvalError:
        return False  # the server reports an evaluation error as an invalid value


def join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part


def cel_rejections(data: Any, schema: dict[str, Any], path: str = "") -> Iterator[Rejection]:
    """Every rule of the schema that the (defaulted) data fails, depth first."""
    if data is None:
        return
    for entry in schema.get(VALIDATIONS, []):
        if not _run(entry["rule"], to_cel(data, schema)):
            field = path + entry.get("fieldPath", "")
            yield Rejection(path, field, entry["message"], entry["rule"])
    if isinstance(data, dict):
        for name, child in schema.get("properties", {}).items():
            if name in data:
                yield from cel_rejections(data[name], child, join(path, name))
    if isinstance(data, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(data):
            yield from cel_rejections(item, schema["items"], f"{path}[{index}]")


def rules_of(schema: dict[str, Any]) -> Iterator[str]:
    yield from (entry["rule"] for entry in schema.get(VALIDATIONS, []))
    for child in schema.get("properties", {}).values():
        yield from rules_of(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from rules_of(schema[key])


@dataclass(frozen=True)
class SchemaError:
    """One structural-schema failure: the field the server names and what it says."""

    field: str
    message: str


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def schema_errors(data: Any, schema: dict[str, Any], path: str = "") -> Iterator[SchemaError]:
    """What the OpenAPI v3 structural schema refuses in the data (the subset the CRDs use)."""
    if data is None:
        return  # nullable, or pruned before validation (what the server does with a null)
    kind = schema.get("type")
    if isinstance(data, int) and not isinstance(data, bool):
        if abs(data) > sys.float_info.max:
            yield SchemaError(path, "is a number out of range (the JSON decoder refuses it)")
            return
        if not INT64[0] <= data <= INT64[1]:
            data = float(data)  # what the decoder makes of an integer past int64
    wanted = _TYPES.get(kind or "")
    if wanted is not None and (
        not isinstance(data, wanted) or (isinstance(data, bool) and kind != "boolean")
    ):
        yield SchemaError(path, f"must be of type {kind}")
        return
    if isinstance(data, float) and not math.isfinite(data):
        yield SchemaError(path, "must be a finite number (JSON has no NaN or Infinity)")
        return
    if "enum" in schema and data not in schema["enum"]:
        yield SchemaError(path, f"must be one of {schema['enum']}")
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        if "minimum" in schema and (
            data < schema["minimum"]
            or (schema.get("exclusiveMinimum") and data == schema["minimum"])
        ):
            yield SchemaError(path, f"must be >= {schema['minimum']}")
        if "maximum" in schema and (
            data > schema["maximum"]
            or (schema.get("exclusiveMaximum") and data == schema["maximum"])
        ):
            yield SchemaError(path, f"must be <= {schema['maximum']}")
    if isinstance(data, str):
        if len(data) > schema.get("maxLength", math.inf):
            yield SchemaError(path, f"may have at most {schema['maxLength']} characters")
        if len(data) < schema.get("minLength", 0):
            yield SchemaError(path, f"must have at least {schema['minLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], data):
            yield SchemaError(path, f"must match {schema['pattern']}")
    if isinstance(data, list):
        if len(data) > schema.get("maxItems", math.inf):
            yield SchemaError(path, f"may have at most {schema['maxItems']} items")
        if len(data) < schema.get("minItems", 0):
            yield SchemaError(path, f"must have at least {schema['minItems']} items")
        if isinstance(schema.get("items"), dict):
            for index, item in enumerate(data):
                yield from schema_errors(item, schema["items"], f"{path}[{index}]")
    if isinstance(data, dict):
        if len(data) > schema.get("maxProperties", math.inf):
            yield SchemaError(path, f"may have at most {schema['maxProperties']} entries")
        for name in schema.get("required", []):
            if name not in data:
                yield SchemaError(join(path, name), "Required value")
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for name, value in data.items():
            if name in properties:
                yield from schema_errors(value, properties[name], join(path, name))
            elif isinstance(extra, dict):
                yield from schema_errors(value, extra, f"{path}[{name}]")
            # Unknown fields are pruned by the server, not refused.
