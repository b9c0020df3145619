"""The operator image's Dockerfile agrees with the chart (no Docker engine here to build it), and
the package it installs holds no development tools (dev/compass_dev)."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "model-images" / "operator" / "Dockerfile"
DEV_TOOLS = REPO / "dev" / "compass_dev"


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


def copy_sources() -> list[str]:
    """What the Dockerfile's COPY instructions take from the build context."""
    copies = [args.split()[:-1] for word, args in instructions() if word == "COPY"]
    return [source.rstrip("/") for sources in copies for source in sources]


def in_build_context(path: str) -> bool:
    """Whether the root .dockerignore lets a repository path into the build context."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    included = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        if fnmatch.fnmatch(path, pattern.removeprefix("!").rstrip("/")):
            included = negated
    return included


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    """The root .dockerignore excludes everything but the COPY sources."""
    sources = copy_sources()
    assert sources == ["pyproject.toml", "README.md", "operator"]
    for source in sources:
        assert (REPO / source).exists(), source
        assert in_build_context(source), f"{source} is excluded from the build context"


def test_the_build_context_leaves_the_development_tools_out() -> None:
    """dev/ (the local control plane, node helper and cluster demo) never reaches the image."""
    assert DEV_TOOLS.is_dir()
    assert not in_build_context("dev")
    assert not in_build_context("dev/compass_dev/devnode.py")


def test_the_images_package_holds_no_development_tools(tmp_path: Path) -> None:
    """The wheel built from the COPY sources (what `pip install /src` installs) is compass alone."""
    source = tmp_path / "src"
    source.mkdir()
    for name in copy_sources():
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        else:
            shutil.copy(REPO / name, source / name)
    # No build isolation: the dev extra's setuptools builds it, offline.
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*argv, "--quiet", "--wheel-dir", str(tmp_path / "wheel"), str(source)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"compass"}
    assert {"compass/commands/demo.py", "compass/lab/demo.py"} <= set(names)
    dev_modules = {path.stem for path in DEV_TOOLS.glob("*.py")} - {"__init__"}
    assert {"devnode", "devcluster", "podenv", "podnetwork", "probes", "clusterdemo"} <= dev_modules
    shipped_modules = {Path(name).stem for name in names if name.endswith(".py")}
    assert not dev_modules & shipped_modules
