"""docs/crd-reference.md is generated from the same models as the CRDs, complete and current."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from compass.api.crds import RESOURCES, Resource, build_crd
from compass.api.reference import (
    REFERENCE_PATH,
    anchor,
    constraints_of,
    object_sections,
    render_reference,
)
from compass.api.rules import VALIDATIONS
from compass.commands.main import main

REPO = Path(__file__).resolve().parents[2]
REGENERATE = f"hack/gen-crds.sh (or `compass crds --reference {REFERENCE_PATH}`)"


def _root(resource: Resource) -> dict[str, Any]:
    schema = build_crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(schema)


def _section(text: str, resource: Resource, path: str) -> str:
    """The markdown of one object level: from its anchor to the next one."""
    start = text.index(f'<a id="{anchor(resource.kind, path)}"></a>')
    end = text.find("<a id=", start + 1)
    following = text.find("\n## ", start)
    ends = [i for i in (end, following) if i != -1]
    return text[start : min(ends) if ends else len(text)]


def _row(section: str, field: str) -> list[str]:
    [line] = [line for line in section.splitlines() if line.startswith(f"| `{field}` |")]
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_checked_in_reference_is_current() -> None:
    path = REPO / REFERENCE_PATH
    assert path.exists(), f"{REFERENCE_PATH} is missing; run {REGENERATE}"
    assert path.read_text(encoding="utf-8") == render_reference(), (
        f"{REFERENCE_PATH} is stale (the models changed); run {REGENERATE} and commit it"
    )


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_every_field_has_a_row_with_its_type_default_bounds_and_description(
    resource: Resource,
) -> None:
    text = render_reference()
    root = _root(resource)
    fields = 0
    for part in ("spec", "status"):
        for section in object_sections(part, root["properties"][part]):
            markdown = _section(text, resource, section.path)
            assert f"### {resource.kind} `{section.path}`" in markdown
            required = set(section.node.get("required", []))
            for name, node in section.node["properties"].items():
                cells = _row(markdown, name)
                fields += 1
                assert cells[2] == ("yes" if name in required else ""), (section.path, name)
                if "default" in node:
                    assert str(node["default"]).lower() in cells[3].lower(), (name, cells)
                for value in node.get("enum", []):
                    assert f"`{value}`" in cells[4], (name, cells)
                for bound in ("minimum", "maximum"):
                    if bound in node:
                        assert f"{node[bound]:g}" in cells[4], (name, bound, cells)
                assert cells[4] == constraints_of(node).replace("|", "\\|")
                description = " ".join(node["description"].split()).replace("|", "\\|")
                assert cells[5] == description
                if "properties" in node:
                    assert f"(#{anchor(resource.kind, f'{section.path}.{name}')})" in cells[1]
    assert fields > 20


def test_bounds_read_as_comparisons() -> None:
    tau = _root(RESOURCES[0])["properties"]["spec"]["properties"]["evaluation"]["properties"]["tau"]
    assert tau["exclusiveMinimum"] is True
    assert constraints_of(tau) == f"> {tau['minimum']:g}; <= {tau['maximum']:g}"


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_every_cel_rule_is_listed_under_its_object_with_its_message(resource: Resource) -> None:
    text = render_reference()
    root = _root(resource)
    rules = 0
    for part in ("spec", "status"):
        for section in object_sections(part, root["properties"][part]):
            markdown = _section(text, resource, section.path)
            for rule in section.node.get(VALIDATIONS, []):
                rules += 1
                [line] = [line for line in markdown.splitlines() if f"`{rule['rule']}`" in line]
                assert line.startswith(f"- {rule['message']}")
                if "fieldPath" in rule:
                    assert f"reported at `{rule['fieldPath']}` from 1.28" in line
    if resource.kind == "CompoundWorkflow":
        assert rules >= 5  # evaluation (2), dataset (1), evaluator (2)


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_names_and_printer_columns_are_listed(resource: Resource) -> None:
    text = render_reference()
    part = text[text.index(f"\n## {resource.kind}\n") :]
    part = part[: part.find("\n## ", 1) if "\n## " in part[1:] else len(part)]
    for short in resource.short_names:
        assert f"`{short}`" in part
    assert f"`{resource.plural}`" in part
    columns = build_crd(resource)["spec"]["versions"][0]["additionalPrinterColumns"]
    for column in columns:
        assert f"| {column['name']} | `{column['jsonPath']}` | {column['type']} |" in part


def test_check_reports_a_stale_reference_with_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = tmp_path / "reference.md"
    crds = tmp_path / "crds"
    crds.mkdir()
    assert main(["crds", "--output-dir", str(crds), "--reference", str(reference)]) == 0
    assert reference.read_text(encoding="utf-8") == render_reference()
    args = ["crds", "--check", "--output-dir", str(crds), "--reference", str(reference)]
    assert main(args) == 0
    reference.write_text("stale\n", encoding="utf-8")
    capsys.readouterr()
    assert main(args) == 1
    error = capsys.readouterr().err
    assert f"stale: {reference}" in error
    assert f"compass crds --reference {reference}" in error
    assert reference.read_text(encoding="utf-8") == "stale\n"  # --check writes nothing


def test_the_chart_readme_links_the_reference() -> None:
    chart = REPO / "charts" / "compass-operator"
    links = re.findall(r"\]\(([^)]*crd-reference\.md)\)", (chart / "README.md").read_text())
    assert links
    assert all((chart / link).resolve() == (REPO / REFERENCE_PATH).resolve() for link in links)


def test_gen_crds_writes_the_reference() -> None:
    script = (REPO / "hack" / "gen-crds.sh").read_text()
    assert f"--reference {REFERENCE_PATH}" in script
