"""The CRDs are generated from the pydantic models, structural, documented and current."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import Field, ValidationError

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.crds import (
    RESOURCES,
    build_crd,
    crd_template,
    render_crd_templates,
    render_crds,
)
from compass.api.meta import CamelModel
from compass.api.rules import CelRule, cel_rules
from compass.api.schema import SchemaError, structural_schema
from compass.commands.main import main

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "const", "title", "not"}


def _nodes(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, child in schema.get("properties", {}).items():
        found += _nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += _nodes(schema["additionalProperties"], f"{path}{{}}")
    return found


# The same models render the plain CRDs in crds/ (`compass crds --output-dir crds`) and the Helm
# chart's CRD templates (`compass crds --helm-template`, with the Helm guards: what they render
# is tests/repo/test_chart_render.py); hack/gen-crds.sh writes both.
CRD_DIRS = ("crds", "charts/compass-operator/templates/crds")
FLAGS = {"crds": [], "charts/compass-operator/templates/crds": ["--helm-template"]}


@pytest.mark.parametrize("directory", CRD_DIRS)
def test_checked_in_crds_are_current(directory: str) -> None:
    assert main(["crds", "--check", *FLAGS[directory], "--output-dir", str(REPO / directory)]) == 0


@pytest.mark.parametrize("directory", CRD_DIRS)
def test_no_crd_is_left_over(directory: str) -> None:
    """Every CRD file there is one the models render (a removed resource leaves no YAML)."""
    assert {p.name for p in (REPO / directory).glob("*.yaml")} == set(render_crds())
    assert set(render_crd_templates()) == set(render_crds())


def test_the_charts_crds_folder_holds_only_kopfs_peering_crds() -> None:
    """Helm never upgrades crds/: the compass.io CRDs are templates, kopf's (fixed) stay there."""
    assert [p.name for p in (REPO / "charts/compass-operator/crds").iterdir()] == [
        "kopf-peerings.yml"
    ]


def test_a_stale_template_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--helm-template", "--output-dir", str(tmp_path)]) == 0
    name = next(iter(render_crd_templates()))
    (tmp_path / name).write_text(render_crds()[name])  # the plain CRD is not the template
    assert main(["crds", "--check", "--helm-template", "--output-dir", str(tmp_path)]) == 1
    assert f"stale in {tmp_path}: {name}; run `compass crds --helm-template" in (
        capsys.readouterr().err
    )


class _BracesInDescription(CamelModel):
    """A spec whose field description holds {{ .Values }}."""

    size: int = Field(default=1, description="Size, e.g. {{ .Values.size }}.")


class _BracesInRule(CamelModel):
    """A spec whose CEL rule holds }}."""

    size: int = 1
    model_config = cel_rules(CelRule("self.size > 0 || '}}' == ''", "size: not positive"))


@pytest.mark.parametrize("spec", [_BracesInDescription, _BracesInRule])
def test_text_helm_would_read_as_a_template_action_is_refused(spec: type[CamelModel]) -> None:
    """{{ or }} in the CRD would break the chart (or run as Helm code): the generator says so."""
    resource = replace(RESOURCES[0], spec=spec)
    with pytest.raises(ValueError, match=r"compoundworkflows\.compass\.io: .*'\{\{' or '\}\}'"):
        crd_template(build_crd(resource))


def test_no_empty_string_default() -> None:
    """kube-apiserver 1.20 reads `default: ""` as null and rejects the CRD (tests/k8s saw it)."""
    for text in render_crds().values():
        assert "default: ''" not in text


def test_check_reports_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--output-dir", str(tmp_path)]) == 0
    name = next(iter(render_crds()))
    (tmp_path / name).write_text("stale\n")
    assert main(["crds", "--check", "--output-dir", str(tmp_path)]) == 1
    assert name in capsys.readouterr().err


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_schema_is_structural_and_documented(resource: Any) -> None:
    crd = build_crd(resource)
    version = crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    for part in ("spec", "status"):
        for path, node in _nodes(root["properties"][part], part):
            assert not FORBIDDEN & set(node), f"{path}: {FORBIDDEN & set(node)}"
            untyped = ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")
            assert "type" in node or any(node.get(k) for k in untyped), path
            for bound in ("exclusiveMinimum", "exclusiveMaximum"):
                assert node.get(bound, True) is True, f"{path}: {bound} must be a boolean"
            if not path.endswith(("[]", "{}")):
                assert node.get("description"), f"{path} has no description"
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["names"]["shortNames"]
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Age"}


def test_example_workflow_is_valid() -> None:
    document = yaml.safe_load((REPO / "examples" / "rag-sim-workflow.yaml").read_text())
    spec = CompoundWorkflowSpec.model_validate(document["spec"])
    assert spec.evaluation.tau == 0.8
    # The profiling Job is a client of the Triton pods, which hold the GPUs: it asks for none.
    assert "nvidia.com/gpu" not in spec.profiling.resources.as_container().get("limits", {})
    assert spec.profiling.resources.requests == {"cpu": "500m", "memory": "256Mi"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s["evaluation"].update(tau=1.5), "evaluation.tau"),
        (lambda s: s["evaluation"].update(budgets=[50, 10]), "evaluation.budgets"),
        (lambda s: s["evaluation"].update(budgets=[10, 200]), "evaluation.budgets"),
        (lambda s: s["space"].update(constraints=["reranker_k <= nope"]), "nope"),
        (lambda s: s["slo"].update(latencyMs=0), "slo.latencyMs"),
        (lambda s: s.update(unknownField=1), "unknownField"),
    ],
)
def test_invalid_workflow_names_the_field(change: Any, field: str) -> None:
    spec = yaml.safe_load((REPO / "examples" / "rag-sim-workflow.yaml").read_text())["spec"]
    change(spec)
    with pytest.raises(ValidationError) as error:
        CompoundWorkflowSpec.model_validate(spec)
    assert field in str(error.value)


def test_cel_rules_reach_the_schema_of_their_model() -> None:
    crd = build_crd(RESOURCES[0])
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    evaluation = spec["properties"]["evaluation"]
    assert {r["fieldPath"] for r in evaluation["x-kubernetes-validations"]} == {
        ".budgets",
        ".dataset.configMap",
        ".dataset.volume",
    }
    dataset = evaluation["properties"]["dataset"]
    assert len(dataset["x-kubernetes-validations"]) == 1
    # Only the models that declare rules carry them.
    assert "x-kubernetes-validations" not in spec["properties"]["slo"]


def test_a_rule_reporting_at_an_unknown_field_is_refused() -> None:
    """Current API servers reject such a CRD; the generator says which model is wrong."""

    class Broken(CamelModel):
        """A model whose rule reports at a field it does not have."""

        low: int = 0
        model_config = cel_rules(CelRule("self.low >= 0", "low: negative", ".lowest"))

    with pytest.raises(SchemaError, match=r"Broken: rule fieldPath '\.lowest'"):
        structural_schema(Broken)


@pytest.mark.parametrize("field", ["latencyMeanMs", "latencyP95Ms"])
@pytest.mark.parametrize("value", [1e-300, 1e-6, 1e12])
def test_a_front_latency_outside_a_microsecond_to_an_hour_is_refused(
    field: str, value: float
) -> None:
    """A front entry of 1e-300 ms once hung the policy's planner: the schema keeps times in a
    range the planner's arithmetic holds in, and the message names the field."""
    from compass.api.paretopolicy import FrontEntry

    entry = {"config": {"k": 1}, "accuracy": 0.5, "latencyMeanMs": 10.0, "latencyP95Ms": 20.0}
    entry[field] = value
    with pytest.raises(ValidationError, match=field):
        FrontEntry.model_validate(entry)
    front = FrontEntry.model_json_schema(by_alias=True)["properties"][field]
    assert front["minimum"] == 0.001
