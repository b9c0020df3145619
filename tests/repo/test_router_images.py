"""The workflows' Triton images lay the router out as compass_dev.local_triton lays it out for
the tests: model.py, the compass_router package beside it and compass_rules in the router's and its control
model's version folders (no Docker engine here to build them)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

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
