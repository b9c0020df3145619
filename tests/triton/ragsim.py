"""rag-sim as the triton tier serves it: compass.lab.scenarios' facts, at the tier's time scale."""

from __future__ import annotations

import json

from compass.lab.scenarios import ACCURATE, COMPONENTS, FASTEST

__all__ = ["ACCURATE", "COMPONENTS", "FASTEST", "TIME_SCALE", "scores_of"]

# rag-sim's measured latencies (130-330 ms) scaled down 10x: the same queueing shape, 10x faster.
TIME_SCALE = 0.1


def scores_of(data: dict[str, object], config: dict[str, object]) -> list[float]:
    """rag-sim's recorded per-question scores of a configuration."""
    configs = data["configs"]
    assert isinstance(configs, dict)
    return list(configs[json.dumps(config, sort_keys=True)]["scores"])
