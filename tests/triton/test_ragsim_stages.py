"""rag-sim stage by stage on a real Triton: each component serves its own stage's time for its own
parameters, and its pipeline reads a stage's parameters just before that stage's call, so the
router binds the generator's model after the retriever and reranker have run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass.dataplane.triton import TritonRouter
from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS
from compass.domain.space import config_key
from compass_dev.scenarios import rag_sim_triton
from tiers import require_tritonserver

# Two configurations that share their retriever and reranker (the slowest of them, so the early
# stages take long enough to measure) and differ in the generator alone.
EARLY = {"retriever_k": 20, "reranker_k": 10, "reranker_model": "bge-v2"}
QUICK = {**EARLY, "generator_model": "llama3.2:3b"}
SLOW = {**EARLY, "generator_model": "gemma3:12b"}
# Served at twice the paper's times: the early stages take ~130 ms, far above the router's and
# gRPC's few ms, so a binding made before them and one made after them part clearly.
SCALE = 2.0
QUANTILE = 0.5
# SLOW's generator is predicted to take this long (real ms): it fits a deadline only while the
# early stages have not yet spent their time.
SLOW_GENERATOR_MS = 400.0
# What the router, gRPC and BLS add to a component call at most on a loaded 2-core machine, ms.
OVERHEAD_MS = 15.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonRouter]:
    """rag-sim at SCALE, QUICK active, and a client of its router."""
    require_tritonserver()
    workdir: Path = tmp_path_factory.mktemp("ragsim-stages")
    triton = rag_sim_triton(workdir, SCALE, QUICK).start(workdir)
    client = TritonRouter(triton.grpc_url, backoff_s=0.05)
    try:
        # A model's first requests run cold (Python's imports, the first BLS calls).
        for sample in range(3):
            client.infer({"sample": sample, "quantile": 0.0}, config=SLOW)
        yield client
    finally:
        client.close()
        triton.stop()


def _stage_ms(data: dict[str, Any], component: str, config: dict[str, object]) -> float:
    """rag-sim's time for a stage at QUANTILE, real ms (the last stage: the configuration's rest)."""
    grid = np.asarray(data["quantile_grid"])
    stages = {stage["component"]: stage for stage in data["stages"]}

    def at(quantiles: list[float]) -> float:
        return SCALE * float(np.interp(QUANTILE, grid, quantiles))

    stage = stages[component]
    if not stage.get("rest"):
        own = {name: config[name] for name in stage["parameters"]}
        return at(stage["quantiles_ms"][config_key(own)])
    whole = at(data["configs"][config_key(config)]["latency_quantiles_ms"])
    return whole - sum(_stage_ms(data, c, config) for c in stages if c != component)


def _least_ms(server: TritonRouter, config: dict[str, object]) -> dict[str, float]:
    """Each component's least time over three requests at QUANTILE: a busy machine only adds."""
    least: dict[str, float] = {}
    for _ in range(3):
        measured = server.infer(
            {"sample": 0, "quantile": QUANTILE}, config=config, component_times=True
        ).component_ms
        assert measured is not None
        least = {c: min(measured[c], least.get(c, measured[c])) for c in RAG_SIM_COMPONENTS}
    return least


def test_each_component_serves_its_own_stages_time_whatever_the_later_stages_are(
    server: TritonRouter, rag_sim_data: dict[str, Any]
) -> None:
    times = {name: _least_ms(server, config) for name, config in (("quick", QUICK), ("slow", SLOW))}
    for name, config in (("quick", QUICK), ("slow", SLOW)):
        measured = times[name]
        for component in RAG_SIM_COMPONENTS:
            expected = _stage_ms(rag_sim_data, component, config)
            assert expected <= measured[component] <= expected + OVERHEAD_MS, (name, component)
    # The generator's model changes the generator's time alone: the stages before it take what
    # they take for their own parameters (a share of the whole would differ by ~25 ms here).
    for component in ("retriever", "reranker"):
        assert abs(times["quick"][component] - times["slow"][component]) < OVERHEAD_MS / 2
    assert times["slow"]["generator"] - times["quick"]["generator"] > 300


def _table(stages: list[list[str]], components: list[Any], slow_ms: list[float]) -> dict[str, Any]:
    return {
        "stages": stages,
        "components": components,
        "configs": [
            {"config": config_key(QUICK), "accuracy": 0.80, "stage_ms": [0.0] * len(stages)},
            {"config": config_key(SLOW), "accuracy": 0.86, "stage_ms": slow_ms},
        ],
        "refuse": False,
    }


PER_STAGE = _table(
    [list(names) for names in RAG_SIM_STAGE_PARAMS],
    list(RAG_SIM_COMPONENTS),
    [0.0, 0.0, SLOW_GENERATOR_MS],
)
# The whole configuration one stage, bound at take-up.
AT_TAKE_UP = _table(
    [[name for names in RAG_SIM_STAGE_PARAMS for name in names]], [[]], [SLOW_GENERATOR_MS]
)


def test_the_generators_model_is_bound_after_the_stages_before_it_have_run(
    server: TritonRouter, rag_sim_data: dict[str, Any]
) -> None:
    """A deadline with SLOW's generator time to spare at take-up, but not once the retriever
    and reranker have run: bound at take-up SLOW serves (it fitted then); bound at the generator
    the quick one does (what is left then)."""
    early_ms = sum(_stage_ms(rag_sim_data, c, QUICK) for c in ("retriever", "reranker"))
    assert early_ms > 4 * OVERHEAD_MS  # the margins below are wide
    payload = {"sample": 1, "quantile": QUANTILE}
    served = {}
    try:
        for name, table in (("take-up", AT_TAKE_UP), ("per-stage", PER_STAGE)):
            server.binding = table
            server.switch(QUICK)
            deadline = time.time_ns() + round((SLOW_GENERATOR_MS + early_ms / 2) * 1e6)
            served[name] = json.loads(server.infer(payload, deadline_ns=deadline).config)
    finally:
        server.binding = None
        server.switch(QUICK)
    assert served == {"take-up": SLOW, "per-stage": QUICK}
