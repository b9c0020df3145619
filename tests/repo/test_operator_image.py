"""The operator image's Dockerfile agrees with the chart (no Docker engine here to build it)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "model-images" / "operator" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_base_image_is_python_311_slim_pinned_by_tag() -> None:
    """One stage, from python:3.11.<patch>-slim-<debian>: never a floating tag."""
    bases = [args for word, args in instructions() if word == "FROM"]
    assert len(bases) == 1
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", bases[0])


def test_installs_the_project_not_editable_and_runs_as_the_charts_user() -> None:
    """pip install of the copied project; USER is the chart's runAsUser; entry point compass."""
    steps = instructions()
    runs = [args for word, args in steps if word == "RUN"]
    assert any(re.fullmatch(r"pip install /src", run) for run in runs)
    assert not any("-e " in run or "--editable" in run for run in runs)
    users = [args for word, args in steps if word == "USER"]
    assert users == ["10001:10001"]
    values = yaml.safe_load((REPO / "charts/compass-operator/values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 10001
    assert values["podSecurityContext"]["runAsGroup"] == 10001
    assert ("ENTRYPOINT", '["compass"]') in steps
    chart_deployment = (REPO / "charts/compass-operator/templates/deployment.yaml").read_text()
    assert 'command: ["compass", "operator"]' in chart_deployment


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    """The root .dockerignore excludes everything but the COPY sources."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = [args.split()[:-1] for word, args in instructions() if word == "COPY"]
    sources = [source.rstrip("/") for sources in copies for source in sources]
    assert sources == ["pyproject.toml", "README.md", "operator"]
    for source in sources:
        assert (REPO / source).exists(), source
        included = False
        for pattern in patterns:
            negated = pattern.startswith("!")
            if fnmatch.fnmatch(source, pattern.removeprefix("!").rstrip("/")):
                included = negated
        assert included, f"{source} is excluded from the build context"
