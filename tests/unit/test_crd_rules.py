"""The CRDs' CEL rules (x-kubernetes-validations) agree with the pydantic validators.

Every rule in the generated CRDs is evaluated with a real CEL implementation the way a current
kube-apiserver does it (apiserver_checks.py). For valid and invalid specs, the CEL verdict must
equal the pydantic verdict, and a rejection must name the same field on both sides.

celpy lacks two things Kubernetes' cel-go has, so the rules avoid them: heterogeneous equality
(``1 == 1.0`` is an error in celpy, true in cel-go) and Kubernetes' list library (isSorted()).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from apiserver_checks import (
    ENV,
    cel_rejections,
    defaulted,
    join,
    rules_of,
    spec_schema,
    to_cel,
)
from celpy import celtypes
from pydantic import BaseModel, ValidationError

from compass.api.compoundworkflow import MAX_BUDGETS, CompoundWorkflowSpec
from compass.api.crds import COMPOUND_WORKFLOW, PARETO_POLICY
from compass.api.paretopolicy import MAX_FRONT, ParetoPolicySpec
from compass.controllers.workflow_spec import InvalidSpecError, validate_spec

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the specs


def _workflow() -> dict[str, Any]:
    text = (REPO / "examples" / "rag-sim-workflow.yaml").read_text()
    return yaml.safe_load(text)["spec"]  # type: ignore[no-any-return]


def _policy() -> dict[str, Any]:
    text = (REPO / "examples" / "pareto-policy-gitops.yaml").read_text()
    return yaml.safe_load(text)["spec"]  # type: ignore[no-any-return]


Change = Callable[[dict[str, Any]], None]


def _evaluation(**fields: Any) -> Change:
    return lambda spec: spec["evaluation"].update(fields)


def _dataset(**fields: Any) -> Change:
    return lambda spec: spec["evaluation"]["dataset"].update(fields)


def _metrics_url(url: str) -> Change:
    return lambda spec: spec.update(metrics={"type": "prometheus", "url": url})


def _metrics_auth(url: str = "https://prometheus.monitoring.svc:9090", **auth: Any) -> Change:
    return lambda spec: spec.update(
        metrics={"type": "prometheus", "url": url, "authentication": auth}
    )


def _entry(index: int, **fields: Any) -> Change:
    def change(spec: dict[str, Any]) -> None:
        for name, value in fields.items():
            if value is None:
                spec["front"][index].pop(name)
            else:
                spec["front"][index][name] = value

    return change


CONFIG_MAP = {"name": "qa", "key": "samples.jsonl"}
VOLUME = {"claimName": "data", "path": "/qa.jsonl"}
# The evaluator that reads a mounted dataset (the triton evaluator refuses one).
COMMAND = {"type": "command", "command": ["score"]}

# (model, spec change, valid?): each invalid one breaks exactly one cross-field rule and is
# otherwise schema-valid, so the server would reject it for the CEL rule alone.
# qa-real's retrieval: one stage that may call any of three models.
_STAGE_OF_MODELS = {"components": ["bm25", "dense", "reranker"], "parameters": ["retriever_k"]}

CASES: dict[str, tuple[type[BaseModel], Change, bool]] = {
    "workflow as given": (CompoundWorkflowSpec, lambda s: None, True),
    "one budget": (CompoundWorkflowSpec, _evaluation(budgets=[7]), True),
    "last budget is the dataset": (CompoundWorkflowSpec, _evaluation(budgets=[50, 100]), True),
    "budgets at the limit": (
        CompoundWorkflowSpec,
        _evaluation(budgets=list(range(1, MAX_BUDGETS + 1))),
        True,
    ),
    "budgets default": (
        CompoundWorkflowSpec,
        lambda s: s["evaluation"].pop("budgets", None),
        True,
    ),
    "budgets the reference's": (
        CompoundWorkflowSpec,
        _evaluation(budgets=[10, 25, 50, 100]),
        True,
    ),
    "no dataset source": (
        CompoundWorkflowSpec,
        lambda s: s["evaluation"]["dataset"].pop("imagePath"),
        True,
    ),
    "configMap and an empty imagePath": (
        CompoundWorkflowSpec,
        _evaluation(
            dataset={"size": 100, "configMap": CONFIG_MAP, "imagePath": ""}, evaluator=COMMAND
        ),
        True,
    ),
    "volume alone": (
        CompoundWorkflowSpec,
        _evaluation(dataset={"size": 100, "volume": VOLUME}, evaluator=COMMAND),
        True,
    ),
    "configMap with the triton evaluator": (
        CompoundWorkflowSpec,
        _evaluation(dataset={"size": 100, "configMap": CONFIG_MAP}),
        False,
    ),
    "configMap with the triton evaluator by default": (
        CompoundWorkflowSpec,
        lambda s: (
            s["evaluation"].pop("evaluator"),
            s["evaluation"].update(dataset={"size": 100, "configMap": CONFIG_MAP}),
        ),
        False,
    ),
    "volume with the triton evaluator": (
        CompoundWorkflowSpec,
        _evaluation(dataset={"size": 100, "volume": VOLUME}),
        False,
    ),
    "command evaluator": (
        CompoundWorkflowSpec,
        _evaluation(evaluator={"type": "command", "command": ["score"]}),
        True,
    ),
    "replay evaluator": (
        CompoundWorkflowSpec,
        _evaluation(evaluator={"type": "replay", "replayConfigMap": "ledger"}),
        True,
    ),
    "evaluator type defaulted": (CompoundWorkflowSpec, _evaluation(evaluator={}), True),
    "budgets decrease": (CompoundWorkflowSpec, _evaluation(budgets=[50, 10]), False),
    "budgets repeat": (CompoundWorkflowSpec, _evaluation(budgets=[10, 25, 25, 100]), False),
    "a late budget decreases": (
        CompoundWorkflowSpec,
        _evaluation(budgets=[*range(1, MAX_BUDGETS), 2]),
        False,
    ),
    "last budget above the dataset": (
        CompoundWorkflowSpec,
        _evaluation(budgets=[10, 200]),
        False,
    ),
    "imagePath and configMap": (
        CompoundWorkflowSpec,
        lambda s: (_dataset(configMap=CONFIG_MAP)(s), _evaluation(evaluator=COMMAND)(s)),
        False,
    ),
    "volume path leaves the volume": (
        CompoundWorkflowSpec,
        lambda s: s["evaluation"].update(
            dataset={"size": 100, "volume": {"claimName": "data", "path": "a/../../etc"}},
            evaluator=COMMAND,
        ),
        False,
    ),
    "configMap and volume": (
        CompoundWorkflowSpec,
        lambda s: s["evaluation"].update(
            dataset={"size": 100, "configMap": CONFIG_MAP, "volume": VOLUME}, evaluator=COMMAND
        ),
        False,
    ),
    "command evaluator without a command": (
        CompoundWorkflowSpec,
        _evaluation(evaluator={"type": "command"}),
        False,
    ),
    "command evaluator with an empty command": (
        CompoundWorkflowSpec,
        _evaluation(evaluator={"type": "command", "command": []}),
        False,
    ),
    "replay evaluator without a ledger": (
        CompoundWorkflowSpec,
        _evaluation(evaluator={"type": "replay"}),
        False,
    ),
    "replay evaluator with an empty ledger name": (
        CompoundWorkflowSpec,
        _evaluation(evaluator={"type": "replay", "replayConfigMap": ""}),
        False,
    ),
    "workflow metrics url with a query": (
        CompoundWorkflowSpec,
        lambda s: s.update(serving={"metrics": {"url": "http://prom:9090/?q=up"}}),
        False,
    ),
    "policy as given": (ParetoPolicySpec, lambda s: None, True),
    "metrics url with a port and a path": (
        ParetoPolicySpec,
        _metrics_url("https://prometheus.monitoring.svc:9090/prometheus"),
        True,
    ),
    "metrics url read from a file": (ParetoPolicySpec, _metrics_url("file:///etc/passwd"), False),
    "metrics url with a query": (ParetoPolicySpec, _metrics_url("http://prom:9090/?x="), False),
    "metrics url with a fragment": (ParetoPolicySpec, _metrics_url("http://prom:9090#x"), False),
    "metrics url with credentials": (
        ParetoPolicySpec,
        _metrics_url("http://user:secret@prom:9090"),
        False,
    ),
    "metrics url without a host": (ParetoPolicySpec, _metrics_url("http:///metrics"), False),
    "metrics with basic auth, a CA and a header": (
        ParetoPolicySpec,
        _metrics_auth(
            secretRef={"name": "prom-auth"},
            basic={},
            tls={"certKey": "tls.crt", "keyKey": "tls.key"},
            headers=[{"name": "X-Scope-OrgID", "value": "team-a"}],
        ),
        True,
    ),
    "metrics with bearer and basic auth": (
        ParetoPolicySpec,
        _metrics_auth(secretRef={"name": "prom-auth"}, bearer={}, basic={}),
        False,
    ),
    "metrics with bearer auth and no Secret": (ParetoPolicySpec, _metrics_auth(bearer={}), False),
    "metrics with a Secret nothing reads": (
        ParetoPolicySpec,
        _metrics_auth(secretRef={"name": "prom-auth"}),
        False,
    ),
    "metrics skipping TLS verification without a Secret": (
        ParetoPolicySpec,
        _metrics_auth(tls={"insecureSkipVerify": True}),
        True,
    ),
    "metrics with a client certificate and no key": (
        ParetoPolicySpec,
        _metrics_auth(secretRef={"name": "prom-auth"}, tls={"certKey": "tls.crt"}),
        False,
    ),
    "metrics with an Authorization header": (
        ParetoPolicySpec,
        _metrics_auth(headers=[{"name": "authorization", "value": "Bearer x"}]),
        False,
    ),
    "metrics with TLS over http": (
        ParetoPolicySpec,
        _metrics_auth("http://prometheus.monitoring.svc:9090", secretRef={"name": "a"}, tls={}),
        False,
    ),
    "only p95": (
        ParetoPolicySpec,
        _entry(0, latencyP50Ms=None, latencyP99Ms=None, latencyMeanMs=155.96),
        True,
    ),
    "equal percentiles": (
        ParetoPolicySpec,
        _entry(1, latencyP50Ms=234.02, latencyP99Ms=234.02, latencyMeanMs=234.02),
        True,
    ),
    "whole-number latencies": (
        ParetoPolicySpec,
        _entry(2, latencyMeanMs=250, latencyP50Ms=260, latencyP95Ms=301, latencyP99Ms=315),
        True,
    ),
    "p50 above p95": (ParetoPolicySpec, _entry(1, latencyP50Ms=240.0), False),
    "first token within the request": (
        ParetoPolicySpec,
        _entry(0, ttftMeanMs=30.0, ttftP50Ms=25.0, ttftP95Ms=60.0),
        True,
    ),
    "mean first token after the mean": (ParetoPolicySpec, _entry(0, ttftMeanMs=1e5), False),
    "p95 first token after the p95": (ParetoPolicySpec, _entry(1, ttftP95Ms=1e5), False),
    "first token p50 above p95": (
        ParetoPolicySpec,
        _entry(2, ttftP50Ms=40.0, ttftP95Ms=30.0),
        False,
    ),
    "p99 below p95": (ParetoPolicySpec, _entry(0, latencyP99Ms=150.5), False),
    "mean above p99": (ParetoPolicySpec, _entry(2, latencyMeanMs=320), False),
    "mean above p95 without p99": (
        ParetoPolicySpec,
        _entry(0, latencyP99Ms=None, latencyMeanMs=160.0),
        False,
    ),
    "mean above p95 with p50 only": (
        ParetoPolicySpec,
        _entry(1, latencyP99Ms=None, latencyMeanMs=240.0),
        False,
    ),
    "routing to a Service's pods": (
        ParetoPolicySpec,
        lambda s: s.update(routing={"service": "triton", "grpcPort": 8001}),
        True,
    ),
    "routing to a Service and an address": (
        ParetoPolicySpec,
        lambda s: s.update(routing={"service": "triton", "grpcEndpoint": "triton:8001"}),
        False,
    ),
    "routing to an address": (
        ParetoPolicySpec,
        lambda s: s.update(routing={"grpcEndpoint": "triton.example.com:65535"}),
        True,
    ),
    "routing to an address whose port wraps": (
        ParetoPolicySpec,
        lambda s: s.update(routing={"grpcEndpoint": "triton:104569"}),
        False,
    ),
    "routing to an address without a port": (
        ParetoPolicySpec,
        lambda s: s.update(routing={"grpcEndpoint": "triton"}),
        False,
    ),
    "a binding stage of several models": (
        ParetoPolicySpec,
        lambda s: s.update(binding={"stages": [_STAGE_OF_MODELS]}),
        True,
    ),
    "a binding stage naming its model both ways": (
        ParetoPolicySpec,
        lambda s: s.update(binding={"stages": [dict(_STAGE_OF_MODELS, component="bm25")]}),
        False,
    ),
    "a binding stage naming no model": (
        ParetoPolicySpec,
        lambda s: s.update(binding={"stages": [{"parameters": ["retriever"]}]}),
        False,
    ),
    "a binding lag cap": (
        ParetoPolicySpec,
        lambda s: s.update(
            binding={"stages": [_STAGE_OF_MODELS], "lagShare": 0.3, "lagReserve": 2}
        ),
        True,
    ),
}

# Rules that CEL cannot state on these schemas stay with the operator (pydantic): the server
# accepts these specs and the operator reports them (SpecValid=False / a PermanentError).
OPERATOR_ONLY: dict[str, tuple[type[BaseModel], Change, str]] = {
    # front[].config is a map of untyped scalars (string, number or boolean): Kubernetes does
    # not expose such values to CEL, so configurations cannot be compared on the server.
    "two entries with one configuration": (
        ParetoPolicySpec,
        lambda s: s["front"][1].update(config=dict(s["front"][0]["config"])),
        "front[1].config",
    ),
    # A constraint is an expression over parameters: parsing it is beyond CEL.
    "constraint naming an unknown parameter": (
        CompoundWorkflowSpec,
        lambda s: s["space"].update(constraints=["reranker_k <= retriver_k"]),
        "retriver_k",
    ),
}


def _schema_for(model: type[BaseModel]) -> dict[str, Any]:
    return spec_schema(COMPOUND_WORKFLOW if model is CompoundWorkflowSpec else PARETO_POLICY)


def _base(model: type[BaseModel]) -> dict[str, Any]:
    return _workflow() if model is CompoundWorkflowSpec else _policy()


def _pydantic_errors(model: type[BaseModel], spec: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        model.model_validate(spec)
    except ValidationError as error:
        return [dict(e) for e in error.errors()]
    return []


def _k8s_path(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text = f"{text}[{part}]" if isinstance(part, int) else join(text, part)
    return text


def _leaf(path: str) -> str:
    """The field a path ends at: "front[1].latencyP95Ms" -> "latencyP95Ms"."""
    return re.sub(r"\[\d+\]$", "", path).rsplit(".", 1)[-1]


# ---------------------------------------------------------------- the tests


def test_every_rule_compiles_in_cel() -> None:
    for model in (CompoundWorkflowSpec, ParetoPolicySpec):
        rules = list(rules_of(_schema_for(model)))
        assert rules, f"{model.__name__} has no CEL rules"
        for rule in rules:
            ENV.compile(rule)


@pytest.mark.parametrize("name", CASES)
def test_cel_and_pydantic_agree(name: str) -> None:
    model, change, valid = CASES[name]
    spec = _base(model)
    change(spec)
    schema = _schema_for(model)
    rejections = list(cel_rejections(defaulted(spec, schema), schema))
    errors = _pydantic_errors(model, spec)
    assert (not rejections) is valid, rejections
    assert (not errors) is valid, errors
    if valid:
        return
    # The first pydantic error and every failed rule name the same object and field.
    where = _k8s_path(tuple(errors[0]["loc"]))
    message = str(errors[0]["msg"])
    for rejection in rejections:
        assert rejection.node == where, (rejection, errors[0])
        leaf = _leaf(rejection.field)
        assert leaf in rejection.message, rejection
        assert leaf in message, (leaf, message)


@pytest.mark.parametrize(
    "name", [n for n, (m, _, valid) in CASES.items() if m is CompoundWorkflowSpec and not valid]
)
def test_operator_condition_names_the_field_the_server_names(name: str) -> None:
    """validate_spec's field (SpecValid=False's message) is the path the server's error names."""
    _, change, _ = CASES[name]
    spec = _workflow()
    change(spec)
    schema = _schema_for(CompoundWorkflowSpec)
    fields = {f"spec.{r.field}" for r in cel_rejections(defaulted(spec, schema), schema)}
    with pytest.raises(InvalidSpecError) as error:
        validate_spec(spec)
    assert error.value.field in fields


def test_every_rule_rejects_some_case() -> None:
    """No rule is dead: each one is the reason at least one invalid case is rejected."""
    failed: set[str] = set()
    for model, change, _ in CASES.values():
        spec = _base(model)
        change(spec)
        schema = _schema_for(model)
        failed |= {r.rule for r in cel_rejections(defaulted(spec, schema), schema)}
    every = {r for m in (CompoundWorkflowSpec, ParetoPolicySpec) for r in rules_of(_schema_for(m))}
    assert every - failed == set()


@pytest.mark.parametrize("name", OPERATOR_ONLY)
def test_rules_cel_cannot_state_are_left_to_the_operator(name: str) -> None:
    model, change, field = OPERATOR_ONLY[name]
    spec = _base(model)
    change(spec)
    schema = _schema_for(model)
    assert list(cel_rejections(defaulted(spec, schema), schema)) == []
    errors = _pydantic_errors(model, spec)
    assert errors
    assert field in f"{_k8s_path(tuple(errors[0]['loc']))}: {errors[0]['msg']}"


def test_rules_that_iterate_have_bounded_input() -> None:
    """The bounds the cost estimate needs are in the schema and enforced by pydantic alike."""
    workflow = _schema_for(CompoundWorkflowSpec)
    budgets = workflow["properties"]["evaluation"]["properties"]["budgets"]
    assert budgets["maxItems"] == MAX_BUDGETS
    assert str(MAX_BUDGETS) in budgets["description"]
    front = _schema_for(ParetoPolicySpec)["properties"]["front"]
    assert front["maxItems"] == MAX_FRONT
    assert str(MAX_FRONT) in front["description"]
    too_many = _workflow()
    too_many["evaluation"]["budgets"] = list(range(1, MAX_BUDGETS + 2))
    too_many["evaluation"]["dataset"]["size"] = MAX_BUDGETS + 1
    assert _pydantic_errors(CompoundWorkflowSpec, too_many)
    policy = _policy()
    policy["front"] = [dict(policy["front"][0], config={"k": i}) for i in range(MAX_FRONT + 1)]
    assert _pydantic_errors(ParetoPolicySpec, policy)


def test_number_fields_are_doubles_in_cel() -> None:
    """A whole number in a `number` field is a double to the server's CEL (no int/double mix)."""
    schema = _schema_for(ParetoPolicySpec)["properties"]["front"]["items"]
    value = to_cel({"latencyMeanMs": 5, "latencyP95Ms": 5.5}, schema)
    assert isinstance(value[celtypes.StringType("latencyMeanMs")], celtypes.DoubleType)
