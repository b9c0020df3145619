"""The workflows' Triton images lay the router out as compass_dev.local_triton lays it out for
the tests: model.py, the compass_router package beside it and compass_rules in the router's and its control
model's version folders, and rag-sim's streaming variant beside its models (no Docker engine
here to build them)."""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

import pytest

from compass_dev.scenarios import rag_sim_stream_triton

REPO = Path(__file__).resolve().parents[2]
ROUTER_FILES = "model-images/router"
RULES = "operator/compass_rules"


@pytest.mark.parametrize("workflow", ["rag-sim", "qa-real"])
def test_the_image_copies_the_router_its_modules_and_the_rules(workflow: str) -> None:
    dockerfile = REPO / "model-images" / workflow / "Dockerfile"
    copies = {
        tuple(line.split()[1:])
        for line in dockerfile.read_text().splitlines()
        if line.startswith("COPY ")
    }
    for model in ("router", "router_control"):
        assert (ROUTER_FILES, f"/models/{model}/1") in copies
        assert (RULES, f"/models/{model}/1/compass_rules") in copies
    assert (REPO / ROUTER_FILES / "compass_router" / "__init__.py").is_file()
    assert (REPO / RULES / "__init__.py").is_file()
    # Built from the repository root: its own ignore file lets in what it copies, no more.
    patterns = [
        line.strip()
        for line in (dockerfile.parent / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for source in [source for source, _ in copies]:
        included = False
        for pattern in patterns:
            # A folder's pattern holds what is under it too (as .dockerignore reads it).
            bare = pattern.removeprefix("!").rstrip("/")
            if fnmatch.fnmatch(source, bare) or source.startswith(bare + "/"):
                included = pattern.startswith("!")
        assert included, f"{source} is excluded from {workflow}'s build context"
    assert "*" in patterns


def _image_models(workflow: str, root: Path) -> set[str]:
    """The files the image's COPY lines put under /models, laid out under ``root``."""
    dockerfile = REPO / "model-images" / workflow / "Dockerfile"
    for line in dockerfile.read_text().splitlines():
        if not line.startswith("COPY "):
            continue
        source, destination = line.split()[1:]
        target = root / destination.lstrip("/")
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, target, dirs_exist_ok=True, ignore=_SKIP)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / source, target)
    return _files(root / "models")


_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


def _files(root: Path) -> set[str]:
    return {
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_the_rag_sim_image_serves_what_the_streaming_tests_serve(tmp_path: Path) -> None:
    # The streaming variant's repository as the tests assemble it (rag-sim's models, then the
    # variant's beside them, the router's code in each router's version folder) ...
    assembled = rag_sim_stream_triton(tmp_path / "tests", 1.0).repository
    image = _image_models("rag-sim", tmp_path / "image")
    assert "router_stream/1/model.py" in image
    assert "router_stream/1/pipeline.py" in image
    assert "router_stream_control/1/compass_router/stream.py" in image
    assert "generator_stream/1/model.py" in image
    # ... is the image's, file for file (the tests set parameters in the configs' text only).
    assert image == _files(assembled)
