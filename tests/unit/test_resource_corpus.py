"""The custom resources' bad-input corpus: every field of both examples made wrong in every way
(and, with hypothesis, several at once), then put through what a cluster would do with it: the
API server's structural schema and CEL rules (apiserver_checks.py), then the operator's own
checks (validate_spec and authorize_* for a CompoundWorkflow, compile_policy and
authorize_policy_targets for a ParetoPolicy), which run on every case, even one the server
refuses (an older server without CEL lets more through).

Each case must end in a clear refusal or in acceptance: no exception but the operator's own
error, the field named (a path that exists in the CRD's schema) in one bounded line, the server
and the operator agreeing where both speak (a spec the operator accepts is never refused by a
CEL rule), and nothing lost (a Ready workflow's results stay in its status when an edit is
refused).
"""

from __future__ import annotations

import copy
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from apiserver_checks import cel_rejections, defaulted, schema_errors, spec_schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compass.api.compoundworkflow import CompoundWorkflowStatus, Phase
from compass.api.crds import COMPOUND_WORKFLOW, PARETO_POLICY
from compass.controllers import policy_compile
from compass.controllers.conditions import one_line
from compass.controllers.targets import TargetAccess
from compass.controllers.workflow_spec import (
    InvalidSpecError,
    authorize_images,
    authorize_workflow_targets,
    validate_spec,
)
from compass.controllers.workflow_status import invalid_status

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "team-a"
OWN_IMAGE = "ghcr.io/compass-operator/compass-operator:0.1.0"
# One of each way a value can be wrong: type, sign, size, precision, encoding, emptiness.
BAD_VALUES: dict[str, Any] = {
    "text": "fast",
    "negative": -1,
    "zero": 0,
    "fraction": 0.5,
    "int64+1": 2**63,
    "400 digits": 10**400,
    "nan": math.nan,
    "infinity": math.inf,
    "empty": "",
    "5000 chars": "x" * 5000,
    "emoji": "\U0001f680",
    "null": None,
    "true": True,
    "list": [1],
    "object": {"a": 1},
}


@dataclass(frozen=True)
class Kind:
    """One custom resource kind: its example spec, its CRD schema, the operator's checks."""

    name: str
    example: str
    schema: dict[str, Any]
    check: Callable[[dict[str, Any]], None]

    def base(self) -> dict[str, Any]:
        text = (REPO / "examples" / self.example).read_text(encoding="utf-8")
        return dict(yaml.safe_load(text)["spec"])


def _check_workflow(spec: dict[str, Any]) -> None:
    """What the workflow handlers do with a spec before any Job (InvalidSpecError if bad)."""
    parsed, _ = validate_spec(spec)
    authorize_workflow_targets(parsed, NAMESPACE, TargetAccess())
    authorize_images(parsed, OWN_IMAGE, ())


# The settings the policy example asks for: its Prometheus is the cluster's, in monitoring.
EXAMPLE_ACCESS = TargetAccess(metrics_namespaces=("monitoring",))


def _check_policy(spec: dict[str, Any]) -> None:
    """What the policy timer does with a spec before it decides (SpecError if bad)."""
    policy_compile.authorize_policy_targets(
        policy_compile.compile_policy(spec, 1), NAMESPACE, EXAMPLE_ACCESS
    )


KINDS = {
    "CompoundWorkflow": Kind(
        "CompoundWorkflow",
        "rag-sim-workflow.yaml",
        spec_schema(COMPOUND_WORKFLOW),
        _check_workflow,
    ),
    "ParetoPolicy": Kind(
        "ParetoPolicy", "pareto-policy-gitops.yaml", spec_schema(PARETO_POLICY), _check_policy
    ),
}


# ---------------------------------------------------------------------------- the cases


Path_ = tuple[str | int, ...]


def paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every node below the root of a spec: object fields and list items, depth first."""
    children: Any = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in children:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def _parent(spec: Any, path: Path_) -> Any:
    for part in path[:-1]:
        spec = spec[part]
    return spec


def replaced(spec: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    """A copy of the spec with the node at ``path`` replaced."""
    changed = copy.deepcopy(spec)
    _parent(changed, path)[path[-1]] = copy.deepcopy(value)
    return changed


def deleted(spec: dict[str, Any], path: Path_) -> dict[str, Any]:
    """A copy of the spec without the node at ``path``."""
    changed = copy.deepcopy(spec)
    del _parent(changed, path)[path[-1]]
    return changed


def cases(kind: Kind) -> Iterator[tuple[str, dict[str, Any]]]:
    """(label, spec): every node of the example replaced by every bad value, and deleted."""
    base = kind.base()
    for path in paths(base):
        where = _dotted(path)
        for label, value in BAD_VALUES.items():
            yield f"{where} = {label}", replaced(base, path, value)
        yield f"{where} deleted", deleted(base, path)


def _dotted(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


# ---------------------------------------------------------------------------- the verdicts


@dataclass(frozen=True)
class Verdict:
    """What became of one bad spec."""

    outcome: str  # "accepted", "refused by the server", "refused by the operator", "traceback"
    field: str = ""
    message: str = ""
    problem: str = ""  # empty when the case ends as it should


def _named(field: str, schema: dict[str, Any], spec: Any) -> bool:
    """Whether a spec path ("evaluation.budgets[1]", "spec.front[0].accuracy") names a node the
    schema describes or the spec holds (an unknown field the error names); the rest of the path
    is a map's key once it reaches a map (keys may hold dots: nvidia.com/gpu)."""
    node: Any = schema
    held: Any = spec
    for part in re.findall(r"[^.\[\]]+", field.removeprefix("spec.")):
        step: str | int = int(part) if part.isdigit() else part
        inside = isinstance(held, (dict, list)) and (
            step in held if isinstance(held, dict) else isinstance(step, int) and step < len(held)
        )
        held = held[step] if inside else None
        if node is None:
            if not inside:
                return False
        elif isinstance(step, int) and isinstance(node.get("items"), dict):
            node = node["items"]
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), dict):
            return True
        elif inside:
            node = None  # a field the spec has and the schema does not describe
        else:
            return False
    return True


def judge(kind: Kind, spec: dict[str, Any]) -> Verdict:
    """The server's answer, then the operator's, and whether they are what they must be."""
    try:
        kind.check(spec)
    except (InvalidSpecError, policy_compile.SpecError) as error:
        operator: tuple[str, str] | None = (error.field, str(error))
    except Exception as error:  # what the corpus exists to find
        return Verdict("traceback", problem=f"{type(error).__name__}: {error}")
    else:
        operator = None
    if operator is not None:
        field, message = operator
        if not _named(field, kind.schema, spec):
            return Verdict("refused by the operator", field, message, "names no field of the spec")
        # What a condition or Event says: one line, cut to MESSAGE_CHARS, the field first.
        if not one_line(message).removeprefix("spec.").startswith(field.removeprefix("spec.")):
            return Verdict("refused by the operator", field, message, "the line does not name it")
    structural = list(schema_errors(spec, kind.schema))
    if structural:
        first = structural[0]
        named = "" if _named(first.field, kind.schema, spec) else "names no field of the spec"
        return Verdict("refused by the server", first.field, first.message, named)
    rejections = list(cel_rejections(defaulted(spec, kind.schema), kind.schema))
    if rejections:
        first_rule = rejections[0]
        named = "" if _named(first_rule.field, kind.schema, spec) else "names no field of the spec"
        return Verdict("refused by the server", first_rule.field, first_rule.message, named)
    if operator is not None:
        return Verdict("refused by the operator", *operator)
    return Verdict("accepted")


def _nothing_lost(spec: dict[str, Any]) -> str:
    """A Ready workflow edited into this spec keeps its results if the edit is refused."""
    try:
        validate_spec(spec)
    except InvalidSpecError as error:
        ready = CompoundWorkflowStatus.model_validate(
            {
                "phase": Phase.READY.value,
                "observedGeneration": 1,
                "feasibleFound": 7,
                "bestAccuracy": 0.87,
                "policy": "rag-sim",
                "samplesUsed": 1234,
            }
        )
        after = invalid_status(ready, 2, error, "2026-11-25T00:00:00Z")
        kept = (after.feasible_found, after.best_accuracy, after.policy, after.samples_used)
        if kept != (7, 0.87, "rag-sim", 1234):
            return f"the refused edit dropped the results: {kept}"
    return ""


# ---------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("name", KINDS)
def test_every_field_made_wrong_every_way_is_refused_clearly(name: str) -> None:
    kind = KINDS[name]
    counts: Counter[str] = Counter()
    problems = []
    for label, spec in cases(kind):
        verdict = judge(kind, spec)
        counts[verdict.outcome] += 1
        problem = verdict.problem or (_nothing_lost(spec) if name == "CompoundWorkflow" else "")
        if problem:
            problems.append(f"{label}: {problem} ({verdict.field}: {verdict.message})")
    tried = sum(counts.values())
    print(f"{name}: {tried} tried, " + ", ".join(f"{n} {o}" for o, n in counts.most_common()))
    assert tried >= 100
    assert counts["refused by the server"] + counts["refused by the operator"] >= tried // 2
    assert problems == [], "\n".join(problems[:20])


def _mutation(base: dict[str, Any]) -> st.SearchStrategy[tuple[Path_, Any]]:
    """One node of the example and what it becomes (None in the value's place: deleted)."""
    values = st.one_of(
        st.sampled_from(list(BAD_VALUES.values())),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=80),
        st.lists(st.integers(), max_size=3),
        st.just(deleted),
    )
    return st.tuples(st.sampled_from(list(paths(base))), values)


@pytest.mark.parametrize("name", KINDS)
def test_several_wrong_fields_at_once_are_refused_clearly(name: str) -> None:
    kind = KINDS[name]
    base = kind.base()

    @settings(
        max_examples=150,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.lists(_mutation(base), min_size=1, max_size=3))
    def check(mutations: list[tuple[Path_, Any]]) -> None:
        spec = base
        for path, value in mutations:
            try:
                spec = deleted(spec, path) if value is deleted else replaced(spec, path, value)
            except (KeyError, IndexError, TypeError):
                continue  # an earlier mutation removed or replaced the node's parent
        verdict = judge(kind, spec)
        assert not verdict.problem, (verdict, mutations)
        if name == "CompoundWorkflow":
            assert not _nothing_lost(spec), mutations

    check()


def test_the_judge_sees_a_traceback_and_an_unnamed_field() -> None:
    """The corpus would catch what it looks for: an unexpected exception, a field not named."""

    def crashes(spec: dict[str, Any]) -> None:
        raise KeyError("front")

    def unnamed(spec: dict[str, Any]) -> None:
        raise InvalidSpecError("spec.nowhere", "bad")

    kind = KINDS["ParetoPolicy"]
    assert judge(Kind("x", kind.example, kind.schema, crashes), kind.base()).outcome == "traceback"
    assert judge(Kind("x", kind.example, kind.schema, unnamed), kind.base()).problem
    assert judge(kind, kind.base()) == Verdict("accepted")
