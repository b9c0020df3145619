"""CI runs exactly the test command the README documents, so the two cannot drift; and that
command cannot go green by skipping a tier or by collecting nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CI_RUN = REPO_ROOT / ".ci" / "run"


def _section(markdown: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}[ \t]*\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def _first_fenced_block(text: str) -> list[str]:
    match = re.search(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    assert match, "section has no fenced code block"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


def _readme_test_commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    commands = _first_fenced_block(_section(readme, "Test"))
    assert commands, "the README's Test block is empty"
    return commands


def _ci_command_lines() -> list[str]:
    lines = CI_RUN.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_readme_test_command_is_what_ci_runs() -> None:
    """Every command in the README's Test block is a command line of .ci/run."""
    ci_lines = _ci_command_lines()
    for command in _readme_test_commands():
        assert command in ci_lines, (
            f"{command!r} (README 'Test') is not run by .ci/run:\n{ci_lines}"
        )


def test_readme_quick_start_mentions_the_test_command() -> None:
    """The Quick start shows the same test command as the Test section."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    quick = "\n".join(_first_fenced_block(_section(readme, "Quick start")))
    for command in _readme_test_commands():
        assert command in quick, f"{command!r} missing from the README's Quick start"


def test_ci_run_is_executable() -> None:
    """CI invokes .ci/run directly."""
    assert os.access(CI_RUN, os.X_OK), ".ci/run is not executable"


def test_ci_makes_every_tier_mandatory() -> None:
    """.ci/run sets COMPASS_REQUIRE_TIERS=1 before the test command: no tier skips in CI."""
    ci_lines = _ci_command_lines()
    export = "export COMPASS_REQUIRE_TIERS=1"
    assert export in ci_lines, f".ci/run does not {export}:\n{ci_lines}"
    for command in _readme_test_commands():
        assert ci_lines.index(export) < ci_lines.index(command), (
            f"{export} comes after {command!r} in .ci/run"
        )
    assert not any("COMPASS_REQUIRE_TIERS" in line for line in ci_lines if line != export)


def _fake_checkout(root: Path, build_rc: int, pytest_rc: int) -> Path:
    """.ci/run and hack/test.sh as they are, over stand-in venv, system packages and build."""
    # The stand-in python records its environment and exits pytest_rc; build.sh exits build_rc.
    (root / ".ci").mkdir()
    (root / "hack" / "lib").mkdir(parents=True)
    (root / "hack" / "k8s").mkdir()
    (root / ".venv" / "bin").mkdir(parents=True)
    shutil.copy2(CI_RUN, root / ".ci" / "run")
    shutil.copy2(REPO_ROOT / "hack" / "test.sh", root / "hack" / "test.sh")
    (root / "hack" / "lib" / "venv.sh").write_text(
        'REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"\n'
        'VENV="${REPO_ROOT}/.venv"\nensure_venv() { :; }\n'
    )
    (root / "hack" / "lib" / "system.sh").write_text("ensure_system_packages() { :; }\n")
    scripts = {
        "hack/k8s/build.sh": f'echo "progress" >&2\necho "the reason, last" >&2\nexit {build_rc}\n',
        ".venv/bin/python": f'env > "$(dirname "$0")/../pytest.env"\nexit {pytest_rc}\n',
    }
    for path, body in scripts.items():
        (root / path).write_text(f"#!/usr/bin/env bash\n{body}")
        (root / path).chmod(0o755)
    return root / ".venv" / "pytest.env"


def _run(script: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPASS_")}
    return subprocess.run(
        [str(script)], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_ci_hands_the_rule_and_the_build_reason_to_pytest(tmp_path: Path) -> None:
    """Where no control plane can be built, CI's pytest gets the rule, the status, the reason."""
    seen = _fake_checkout(tmp_path, build_rc=3, pytest_rc=0)
    done = _run(tmp_path / ".ci" / "run")
    assert done.returncode == 0, done.stderr
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert env["COMPASS_REQUIRE_TIERS"] == "1"
    assert env["COMPASS_K8S_BUILD_RC"] == "3"
    assert env["COMPASS_K8S_BUILD_REASON"] == "the reason, last"
    assert "progress" in done.stderr  # the build's progress still shows


@pytest.mark.parametrize("pytest_rc", [0, 1, 5])
def test_test_command_exits_with_pytest_status_and_never_0_for_no_tests(
    tmp_path: Path, pytest_rc: int
) -> None:
    """hack/test.sh passes pytest's status on; "no tests collected" (5) is not a success."""
    _fake_checkout(tmp_path, build_rc=0, pytest_rc=pytest_rc)
    done = _run(tmp_path / "hack" / "test.sh")
    assert done.returncode == pytest_rc, done.stderr
    if pytest_rc == 5:
        assert "collected no tests" in done.stderr


def _tier_test(root: Path) -> Path:
    """A test of the k8s tier whose server is missing: it asks tests/tiers.py what to do."""
    test = root / "tests" / "k8s" / "test_needs_a_server.py"
    test.parent.mkdir(parents=True)
    test.write_text(
        "from tiers import unavailable\n\n\n"
        "def test_needs_a_server() -> None:\n"
        '    unavailable("no such server here: install it")\n'
    )
    return test


@pytest.mark.parametrize(
    ("require", "rc", "outcome"),
    [(None, 0, "SKIPPED"), ("1", 1, "FAILED")],
)
def test_a_missing_server_skips_on_a_workstation_and_fails_where_tiers_are_required(
    tmp_path: Path, require: str | None, rc: int, outcome: str
) -> None:
    """tests/tiers.py: skip with the reason, or under COMPASS_REQUIRE_TIERS=1 fail with it."""
    test = _tier_test(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPASS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "tests"), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "400"
    if require is not None:
        env["COMPASS_REQUIRE_TIERS"] = require
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == rc, done.stdout
    # -ra's summary line (wide enough not to be cut) names the tier and the reason.
    summary = [line for line in done.stdout.splitlines() if line.startswith(outcome)]
    assert len(summary) == 1, done.stdout
    assert "k8s tier: no such server here: install it" in summary[0]
    if require is not None:
        assert "(COMPASS_REQUIRE_TIERS=1: every tier must run)" in summary[0]


def test_every_test_module_has_its_own_name_across_the_tiers() -> None:
    """The tiers have no __init__.py, so pytest imports test modules by basename: two tiers'
    test_x.py break the whole suite's collection, which no single tier's run shows."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((REPO_ROOT / "tests").rglob("*.py")):
        if path.name == "conftest.py":
            continue
        if path.name in seen:
            clashes.append(
                f"{seen[path.name].relative_to(REPO_ROOT)} and {path.relative_to(REPO_ROOT)}"
            )
        seen[path.name] = path
    assert not clashes, f"rename one of each pair: {clashes}"
