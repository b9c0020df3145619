"""The operator image's Dockerfile agrees with the chart (no Docker engine here to build it), and
the package it installs holds no development tools (dev/compass_dev)."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "model-images" / "operator" / "Dockerfile"
LOCK = REPO / "model-images" / "operator" / "requirements.lock"
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


def test_installs_the_lock_then_the_project_not_editable_and_runs_as_the_charts_user() -> None:
    """The lock with hashes, then the copied project without dependencies; USER is the chart's
    runAsUser; entry point compass."""
    steps = instructions()
    runs = [args for word, args in steps if word == "RUN"]
    installs = [run for run in runs if run.startswith("pip install")]
    assert installs == [
        "pip install --require-hashes --no-deps -r requirements.lock",
        "pip install --no-deps /src",
    ]
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


def locked_pins() -> dict[str, str]:
    """{canonical name: version} of the lock, each entry checked to carry its hashes."""
    entries = re.sub(r"\\\n\s*", " ", LOCK.read_text())
    pins = {}
    for line in entries.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement, *options = line.split()
        name, _, version = requirement.partition("==")
        assert version, f"{requirement}: not pinned with =="
        assert options, f"{requirement}: no --hash (pip --require-hashes refuses it)"
        assert all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", o) for o in options), line
        pins[canonicalize_name(name)] = version
    return pins


def test_the_lock_pins_every_runtime_dependency_within_its_range() -> None:
    """Every [project] dependency of pyproject.toml is locked at a version its range admits:
    regenerate the lock (its header says how) after changing them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = locked_pins()
    for line in project["dependencies"]:
        wanted = Requirement(line)
        name = canonicalize_name(wanted.name)
        assert name in pins, f"{wanted.name} is not in {LOCK.name}: regenerate it"
        assert wanted.specifier.contains(pins[name], prereleases=True), (
            f"{LOCK.name} pins {name}=={pins[name]}, outside pyproject's {wanted}: regenerate it"
        )
    assert "matplotlib" not in pins, "plotting is the `plot` extra, not the operator image's"


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    """The root .dockerignore excludes everything but the COPY sources."""
    sources = copy_sources()
    assert sources == [
        "model-images/operator/requirements.lock",
        "pyproject.toml",
        "README.md",
        "operator",
    ]
    for source in sources:
        assert (REPO / source).exists(), source
        assert in_build_context(source), f"{source} is excluded from the build context"


def test_the_build_context_leaves_the_development_tools_out() -> None:
    """dev/ (the local control plane, node helper and cluster demo) never reaches the image."""
    assert DEV_TOOLS.is_dir()
    assert not in_build_context("dev")
    assert not in_build_context("dev/compass_dev/devnode.py")


def test_the_images_package_holds_no_development_tools(tmp_path: Path) -> None:
    """The wheel built from the COPY sources (what `pip install /src` installs) is compass and
    the serving rules it shares with the routers, alone."""
    source = tmp_path / "src"
    source.mkdir()
    for name in copy_sources():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
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
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {
        "compass",
        "compass_rules",
    }
    # The command (which finds the live demo by name) and plan's figures, not the live demo.
    assert {"compass/commands/demo.py", "compass/commands/plots.py"} <= set(names)
    dev_modules = {path.stem for path in DEV_TOOLS.glob("*.py")} - {"__init__"}
    assert {"devnode", "devcluster", "podenv", "podnetwork", "probes", "clusterdemo"} <= dev_modules
    assert {"localdemo", "experiment", "local_triton", "processes", "scenarios"} <= dev_modules
    shipped_modules = {Path(name).stem for name in names if name.endswith(".py")}
    assert not dev_modules & shipped_modules
