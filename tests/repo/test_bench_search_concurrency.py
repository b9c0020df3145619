"""bench/search_concurrency.py runs end to end on one RAG threshold, and its live space."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from bench_runner import BENCH_DIR, run_bench


@pytest.fixture(autouse=True)
def _bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script imports its sibling search_paper.py, as it does when run from bench/."""
    monkeypatch.syspath_prepend(str(BENCH_DIR))


def walls(out: str) -> dict[int, float]:
    """Each K's wall time as a multiple of the sequential time / K, from the floor lines."""
    found = re.findall(r"rag K=(\d+): wall .*: ([\d.]+)x", out)
    return {int(k): float(ratio) for k, ratio in found}


def test_scoring_ahead_keeps_64_in_flight_busy_with_the_same_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--only", "rag", "--taus", "0.85", "--concurrency", "1,64", "--jobs", "1"]
    assert run_bench("search_concurrency.py", [*argv, "--ahead", "0"]) == 0
    rounds_alone = capsys.readouterr().out
    assert run_bench("search_concurrency.py", argv) == 0
    ahead = capsys.readouterr().out
    for out in (rounds_alone, ahead):
        assert "PASS same feasible set, verdicts and samples at every K" in out
    # Nothing scored ahead at K = 1 (no idle server), so K = 1 is the same either way.
    assert walls(ahead)[1] == walls(rounds_alone)[1]
    assert walls(ahead)[64] < 0.75 * walls(rounds_alone)[64]
    sent = re.search(r"rag K=64: ([\d,]+) sample requests vs ([\d,]+) sequential", ahead)
    assert sent is not None
    assert int(sent[1].replace(",", "")) > int(sent[2].replace(",", ""))


def test_the_live_space_is_the_demos_narrowed_to_the_generators_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = importlib.util.spec_from_file_location("bench_live", BENCH_DIR / "search_concurrency.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up by name.
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert module.live_space(None).size == 234
    narrowed = module.live_space("gemma3:1b,llama3.2:3b")
    assert narrowed.size == 78
    assert {narrowed.config(i)["generator_model"] for i in range(narrowed.size)} == {
        "gemma3:1b",
        "llama3.2:3b",
    }
    with pytest.raises(SystemExit, match=r"--generators: .*'gpt'"):
        module.live_space("gpt")
