"""Late binding on a real Triton: with a binding table, a request that carries its deadline gets
the most accurate allowed configuration whose per-stage times fit what is left of it, the
fastest when none does, or a retryable refusal where the table refuses; rag-sim's pipeline runs
unchanged on the lazy config."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from ragsim import ACCURATE, FASTEST, TIME_SCALE

from compass.api.paretopolicy import ParetoPolicySpec
from compass.conversion import binding_table, policy_plan, runtime_policy
from compass.dataplane.metrics import TritonQueueDepth
from compass.dataplane.triton import LATE_MESSAGE, RoutingError, TritonRouter
from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS
from compass.domain.space import config_key
from compass_dev.experiment import BINDING_RUN, serve_each
from compass_dev.local_triton import LocalTriton

# ACCURATE's stages are predicted to take 10 s in all: it fits only a request with more left.
ACCURATE_MS = (0.0, 0.0, 10_000.0)


def _table(refuse: bool = False, fastest_ms: float = 0.0) -> dict[str, Any]:
    return {
        "stages": [list(names) for names in RAG_SIM_STAGE_PARAMS],
        "components": list(RAG_SIM_COMPONENTS),
        "configs": [
            {
                "config": config_key(FASTEST),
                "accuracy": 0.80,
                "stage_ms": [0.0, 0.0, fastest_ms],
            },
            {"config": config_key(ACCURATE), "accuracy": 0.86, "stage_ms": list(ACCURATE_MS)},
        ],
        "refuse": refuse,
    }


def _in(seconds: float) -> int:
    return time.time_ns() + round(seconds * 1e9)


@pytest.fixture
def binding(router: TritonRouter) -> Iterator[TritonRouter]:
    """The router on FASTEST with late binding between FASTEST and ACCURATE."""
    router.binding = _table()
    router.switch(FASTEST)
    yield router
    router.binding = None
    router.switch(FASTEST)


def test_a_request_binds_the_most_accurate_configuration_that_fits_its_deadline(
    binding: TritonRouter,
) -> None:
    assert binding.infer({"sample": 0}, deadline_ns=_in(60.0)).config == config_key(ACCURATE)
    assert binding.infer({"sample": 1}, deadline_ns=_in(1.0)).config == config_key(FASTEST)
    # Without a deadline the active configuration serves, as before; an override still rules.
    assert binding.infer({"sample": 2}).config == config_key(FASTEST)
    override = binding.infer({"sample": 3}, config=FASTEST, deadline_ns=_in(60.0))
    assert override.config == config_key(FASTEST)


def test_concurrent_requests_each_bind_from_their_own_deadline(binding: TritonRouter) -> None:
    deadlines = [60.0 if i % 2 else 1.0 for i in range(16)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(
            pool.map(
                lambda item: binding.infer({"sample": item[0]}, deadline_ns=_in(item[1])),
                enumerate(deadlines),
            )
        )
    for seconds, reply in zip(deadlines, replies, strict=True):
        expected = ACCURATE if seconds > 10 else FASTEST
        assert reply.config == config_key(expected)


def test_a_request_that_waited_long_binds_the_fastest_and_counts_at_its_arrival(
    router: TritonRouter,
) -> None:
    # With the SLO in the table a deadline tells when the request arrived: 60 s left of a
    # 120 s SLO means it waited 60 s, over a quarter of the SLO, so a queue stood behind it.
    router.binding = {**_table(), "slo_ms": 120_000.0, "degrade_after": 0.25}
    router.switch(FASTEST)
    try:
        assert router.infer({"sample": 0}, deadline_ns=_in(60.0)).config == config_key(FASTEST)
        fresh = router.infer({"sample": 1}, deadline_ns=_in(119.5))
        assert fresh.config == config_key(ACCURATE)
    finally:
        router.binding = None
        router.switch(FASTEST)


def test_a_late_request_is_refused_only_where_the_table_refuses(router: TritonRouter) -> None:
    router.binding = _table(refuse=True, fastest_ms=5_000.0)
    router.switch(FASTEST)
    try:
        with pytest.raises(RoutingError, match=LATE_MESSAGE):
            router.infer({"sample": 0}, deadline_ns=_in(1.0))
        router.binding = _table(refuse=False, fastest_ms=5_000.0)
        router.switch(FASTEST)
        assert router.infer({"sample": 1}, deadline_ns=_in(1.0)).config == config_key(FASTEST)
    finally:
        router.binding = None
        router.switch(FASTEST)


def test_a_one_stage_table_without_components_binds_each_request_at_take_up(
    router: TritonRouter,
) -> None:
    """``components: [[]]``: the whole configuration is one stage, bound when the request is
    taken up, whatever models the pipeline calls: the most accurate whose time fits."""
    whole = _table()
    whole["stages"] = [[name for names in RAG_SIM_STAGE_PARAMS for name in names]]
    whole["components"] = [[]]
    for entry in whole["configs"]:
        entry["stage_ms"] = [sum(entry["stage_ms"])]
    router.binding = whole
    router.switch(FASTEST)
    try:
        assert router.infer({"sample": 0}, deadline_ns=_in(60.0)).config == config_key(ACCURATE)
        assert router.infer({"sample": 1}, deadline_ns=_in(1.0)).config == config_key(FASTEST)
        assert router.infer({"sample": 2}).config == config_key(FASTEST)
        # More than one stage may not leave one without a model.
        router.binding = {**_table(), "components": [[], "reranker", "generator"]}
        with pytest.raises(RoutingError, match="one stage"):
            router.switch(FASTEST)
    finally:
        router.binding = None
        router.switch(FASTEST)


def test_a_bad_table_changes_nothing(router: TritonRouter) -> None:
    router.binding = {**_table(), "components": ["retriever"]}
    with pytest.raises(RoutingError, match="one model per stage"):
        router.switch(ACCURATE)
    router.binding = None
    assert router.infer({"sample": 0}, deadline_ns=_in(60.0)).config == config_key(FASTEST)


def test_the_binding_run_sends_the_table_and_deadlines_then_takes_the_table_back(
    router: TritonRouter, triton: LocalTriton, rag_sim_data: dict[str, object]
) -> None:
    # bench/serving_triton.py's binding run: the operator's table for a per-stage policy, every
    # request with the SLO as its deadline. The SLO leaves ACCURATE ample time at idle, so a
    # request served on what the run starts from (FASTEST) means the table or the deadlines
    # never reached the router.
    slo_ms = 60_000 * TIME_SCALE
    spec = ParetoPolicySpec.model_validate(
        {
            "front": [_front_entry(rag_sim_data, FASTEST), _front_entry(rag_sim_data, ACCURATE)],
            "slo": {"latencyMs": slo_ms, "percentile": 95},
            "admission": {"enabled": True},
            "binding": {
                "mode": "per-stage",
                "stages": [
                    {"component": model, "parameters": list(names)}
                    for model, names in zip(RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS, strict=True)
                ],
            },
        }
    )
    plan = policy_plan(spec)
    table = binding_table(spec, plan)
    assert table is not None
    runs = dict(
        serve_each(
            router,
            plan,
            runtime_policy(spec, plan),
            TritonQueueDepth(triton.metrics_url),
            [0.05 * i for i in range(6)],
            lambda i: {"sample": i},
            slo_ms / TIME_SCALE,
            interval_s=TIME_SCALE,
            time_scale=TIME_SCALE,
            labels={BINDING_RUN},
            binding=table,
        )
    )
    run = runs[BINDING_RUN]
    assert run.failed == 0
    assert run.refused == 0
    assert {r.config for r in run.answered} == {config_key(ACCURATE)}
    assert router.binding is None
    # Without the table a request with a deadline is served as routed again.
    router.switch(FASTEST)
    assert router.infer({"sample": 0}, deadline_ns=_in(60.0)).config == config_key(FASTEST)


def _front_entry(data: dict[str, object], config: Mapping[str, object]) -> dict[str, object]:
    """A front entry with rag-sim's recorded latencies at the tier's scale and its accuracy."""
    configs = data["configs"]
    assert isinstance(configs, dict)
    entry = configs[json.dumps(config, sort_keys=True)]
    quantiles = [q * TIME_SCALE for q in entry["latency_quantiles_ms"]]
    grid = list(data["quantile_grid"])  # type: ignore[call-overload]

    def at(p: float) -> float:
        return float(np.interp(p, grid, quantiles))

    return {
        "config": config,
        "accuracy": float(np.mean(entry["scores"])),
        "latencyMeanMs": float(np.mean(quantiles)),
        "latencyP50Ms": at(0.5),
        "latencyP95Ms": at(0.95),
        "latencyP99Ms": at(0.99),
    }


def test_a_request_spares_the_requests_its_router_polls_waiting_behind_it(
    router: TritonRouter,
) -> None:
    # 12 s left: ACCURATE (10 s predicted) fits alone. With FASTEST predicted at 5 s, one
    # request waiting behind (counted by the router's poller of Triton's pending count) would
    # be late if this one took ACCURATE's 5 s more: it takes FASTEST then.
    router.binding = _table(fastest_ms=5_000.0)
    router.switch(FASTEST)
    try:
        assert router.infer({"sample": 0}, deadline_ns=_in(12.0)).config == config_key(ACCURATE)
        with ThreadPoolExecutor(max_workers=24) as pool:
            replies = list(
                pool.map(lambda i: router.infer({"sample": i}, deadline_ns=_in(12.0)), range(48))
            )
        served = [reply.config for reply in replies]
        # Some were taken up with followers counted (the router's single instance queues the
        # burst in Triton, where only the poller sees it), and bound FASTEST.
        assert served.count(config_key(FASTEST)) >= 1, served
        # Alone again (the burst drained, the poller's count back to 0): ACCURATE.
        time.sleep(0.3)
        assert router.infer({"sample": 0}, deadline_ns=_in(12.0)).config == config_key(ACCURATE)
    finally:
        router.binding = None
        router.switch(FASTEST)
