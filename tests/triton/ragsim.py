"""rag-sim constants and helpers shared by the triton tier's tests."""

from __future__ import annotations

import json

# rag-sim's measured latencies (130-330 ms) scaled down 10x: the same queueing shape, 10x faster.
TIME_SCALE = 0.1
COMPONENTS = ("retriever", "reranker", "generator")
FASTEST = {
    "generator_model": "llama3.2:3b",
    "retriever_k": 20,
    "reranker_k": 1,
    "reranker_model": "ms-marco",
}
ACCURATE = {
    "generator_model": "gemma3:12b",
    "retriever_k": 20,
    "reranker_k": 1,
    "reranker_model": "ms-marco",
}


def scores_of(data: dict[str, object], config: dict[str, object]) -> list[float]:
    """rag-sim's recorded per-question scores of a configuration."""
    configs = data["configs"]
    assert isinstance(configs, dict)
    return list(configs[json.dumps(config, sort_keys=True)]["scores"])
