"""bench/encoder_batching.py: the batch-cost fit, qa-real's pipeline run in process, and a short
run on this CPU with the real encoder."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from bench_runner import BENCH_DIR

from tiers import require_qa_real

FASTEST = {"retriever": "bm25", "top_k": 1, "rerank": "none", "reader": "lexical"}


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """bench/encoder_batching.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "bench_encoder", BENCH_DIR / "encoder_batching.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_the_fitted_batch_cost_is_the_one_that_made_the_times(bench: ModuleType) -> None:
    times = [bench.BatchTime(n, 31 * n, 10.0 * (1 + 0.3 * (n - 1)), 0.0, 5) for n in (1, 2, 4, 8)]
    assert bench.fit_batch_cost(times) == pytest.approx(0.3)
    # No gain from batching: n requests take n times one.
    linear = [bench.BatchTime(n, 31 * n, 7.0 * n, 0.0, 5) for n in (1, 4)]
    assert bench.fit_batch_cost(linear) == pytest.approx(1.0)


def test_a_batch_cost_needs_a_batch_of_more_than_one(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="more than one request"):
        bench.fit_batch_cost([bench.BatchTime(1, 31, 10.0, 10.0, 5)])


def test_the_pipeline_in_process_scores_as_the_readme_says(bench: ModuleType) -> None:
    """The fastest configuration needs no encoder: 104 of 149 questions right, as in Triton."""
    common = bench.load_module("qa_common", bench.MODELS / "qa_common.py")
    pipeline = bench.load_module("qa_real_pipeline", bench.MODELS / "router/1/pipeline.py")

    def no_encoder(texts: object) -> object:
        raise AssertionError("the fastest configuration must not embed anything")

    data = common.load_data(str(bench.MODELS))
    scores = bench.accuracies(pipeline, common, data, no_encoder, [FASTEST])
    assert scores == {"bm25/1/none/lexical": pytest.approx(104 / 149)}


def test_a_short_run_times_every_batch_size_on_this_cpu(tmp_path: Path) -> None:
    require_qa_real()
    out = tmp_path / "figures.json"
    # Its own process, as it is run: under pytest, tests/triton would shadow the triton package
    # that torch imports.
    run = subprocess.run(
        [
            sys.executable,
            str(BENCH_DIR / "encoder_batching.py"),
            *("--sizes", "1,2", "--seconds", "0", "--no-accuracy", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    (variant,) = json.loads(out.read_text())
    assert (variant["device"], variant["precision"]) == ("cpu", "float32")
    assert [b["requests"] for b in variant["batches"]] == [1, 2]
    # Two requests carry about twice the texts; each size is timed (which takes longer is the
    # bench's figure, not a test's: on a shared machine a loaded moment can reorder them).
    one, two = variant["batches"]
    assert two["texts"] > 1.5 * one["texts"]
    assert all(0 < b["median_ms"] < float("inf") for b in (one, two))
    assert math.isfinite(variant["batch_cost"])
    assert "batch_cost" in run.stdout


def test_an_unknown_precision_is_refused_naming_it(bench: ModuleType) -> None:
    common = bench.load_module("qa_common", bench.MODELS / "qa_common.py")
    with pytest.raises(ValueError, match="precision 'float64' is not one of float32, float16"):
        common.load_encoder(1, "cpu", "float64")
