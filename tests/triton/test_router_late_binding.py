"""Late binding on a real Triton: with a binding table, a request that carries its deadline gets
the most accurate allowed configuration whose per-stage times fit what is left of it, the
fastest when none does, or a retryable refusal where the table refuses; rag-sim's pipeline runs
unchanged on the lazy config."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from ragsim import ACCURATE, FASTEST

from compass.dataplane.triton import LATE_MESSAGE, RoutingError, TritonRouter
from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS
from compass.domain.space import config_key

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


def test_a_bad_table_changes_nothing(router: TritonRouter) -> None:
    router.binding = {**_table(), "components": ["retriever"]}
    with pytest.raises(RoutingError, match="one model per stage"):
        router.switch(ACCURATE)
    router.binding = None
    assert router.infer({"sample": 0}, deadline_ns=_in(60.0)).config == config_key(FASTEST)
