"""What one resource may make the operator hold and compute is bounded: every list, map and
free-form string of both specs has a limit in the CRD schema (the API server refuses beyond it),
pydantic names the same field, and a workflow's spec is parsed once per generation by the poll."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from compass.api.crds import COMPOUND_WORKFLOW, PARETO_POLICY, Resource, build_crd
from compass.api.meta import MAX_ARGS, MAX_IMAGE_LENGTH, MAX_MAP_ENTRIES
from compass.controllers import workflow_handlers
from compass.controllers.workflow_spec import InvalidSpecError, validate_spec
from compass.domain.space import (
    MAX_CONSTRAINT_LENGTH,
    MAX_CONSTRAINTS,
    MAX_PARAMETERS,
    MAX_VALUES,
)


def _spec_nodes(resource: Resource) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, schema node) of every node under the CRD's spec."""
    crd = build_crd(resource)
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pending: list[tuple[str, dict[str, Any]]] = [("spec", root)]
    while pending:
        path, node = pending.pop()
        yield path, node
        for name, child in (node.get("properties") or {}).items():
            pending.append((f"{path}.{name}", child))
        if isinstance(node.get("items"), dict):
            pending.append((f"{path}[]", node["items"]))
        if isinstance(node.get("additionalProperties"), dict):
            pending.append((f"{path}{{}}", node["additionalProperties"]))


@pytest.mark.parametrize("resource", [COMPOUND_WORKFLOW, PARETO_POLICY], ids=lambda r: r.kind)
def test_every_list_map_and_free_string_of_the_spec_is_bounded(resource: Resource) -> None:
    """A list without maxItems, a map without maxProperties or a string that is neither an
    enum, a pattern nor length-bounded would let one resource grow without limit."""
    unbounded = []
    for path, node in _spec_nodes(resource):
        kind = node.get("type")
        if kind == "array" and "maxItems" not in node:
            unbounded.append(f"{path}: array without maxItems")
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(f"{path}: map without maxProperties")
        if kind == "string" and not {"maxLength", "enum", "pattern"} & set(node):
            unbounded.append(f"{path}: string without maxLength")
    assert unbounded == []


def _workflow(**space: Any) -> dict[str, Any]:
    return {
        "space": {
            "parameters": [{"name": "k", "type": "integer", "values": [1, 2]}],
            **space,
        },
        "evaluation": {"dataset": {"size": 10}, "tau": 0.8},
        "slo": {"latencyMs": 300},
        "triton": {"service": "triton"},
    }


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (
            _workflow(
                parameters=[{"name": f"p{i}", "values": [0, 1]} for i in range(MAX_PARAMETERS + 1)]
            ),
            "spec.space.parameters",
        ),
        (
            _workflow(parameters=[{"name": "k", "values": list(range(MAX_VALUES + 1))}]),
            "spec.space.parameters[0].values",
        ),
        (_workflow(constraints=["k <= 2"] * (MAX_CONSTRAINTS + 1)), "spec.space.constraints"),
        (
            _workflow(constraints=["k <= 2" + " " * MAX_CONSTRAINT_LENGTH]),
            "spec.space.constraints[0]",
        ),
    ],
    ids=["parameters", "values", "constraints", "constraint-length"],
)
def test_a_space_beyond_a_list_bound_is_invalid_naming_the_list(
    raw: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(raw)
    assert error.value.field == field
    assert "at most" in str(error.value)


@pytest.mark.parametrize(
    ("section", "value", "field"),
    [
        (
            "evaluation",
            {
                "dataset": {"size": 10},
                "tau": 0.8,
                "evaluator": {"type": "command", "command": ["x"] * (MAX_ARGS + 1)},
            },
            "spec.evaluation.evaluator.command",
        ),
        (
            "profiling",
            {"nodeSelector": {f"k{i}": "v" for i in range(MAX_MAP_ENTRIES + 1)}},
            "spec.profiling.nodeSelector",
        ),
        ("search", {"image": "x" * (MAX_IMAGE_LENGTH + 1)}, "spec.search.image"),
    ],
    ids=["command", "node-selector", "image"],
)
def test_other_bounds_name_their_field(section: str, value: Any, field: str) -> None:
    with pytest.raises(InvalidSpecError) as error:
        validate_spec({**_workflow(), section: value})
    assert error.value.field == field


def test_the_poll_parses_a_generation_once_and_a_new_generation_again() -> None:
    """The spec cached for generation 1 is reused (the raw is not read again); generation 2
    is parsed, and a bad generation 3 is reported, not served from the cache."""
    memo: dict[str, Any] = {}
    first = workflow_handlers._spec_of(memo, 1, _workflow())
    assert workflow_handlers._spec_of(memo, 1, {"not": "a spec"}) is first
    second = workflow_handlers._spec_of(memo, 2, _workflow(constraints=["k <= 1"]))
    assert second.space.constraints == ["k <= 1"]
    with pytest.raises(InvalidSpecError):
        workflow_handlers._spec_of(memo, 3, {"not": "a spec"})
