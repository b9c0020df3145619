"""rag-sim as the triton tier serves it: compass.lab.scenarios' facts, at the tier's time scale."""

from __future__ import annotations

import json

from compass.lab.scenarios import ACCURATE, COMPONENTS, FASTEST
from compass.lab.scenarios import TEST_TIME_SCALE as TIME_SCALE

__all__ = ["ACCURATE", "COMPONENTS", "FASTEST", "TIME_SCALE", "scores_of"]


def scores_of(data: dict[str, object], config: dict[str, object]) -> list[float]:
    """rag-sim's recorded per-question scores of a configuration."""
    configs = data["configs"]
    assert isinstance(configs, dict)
    return list(configs[json.dumps(config, sort_keys=True)]["scores"])
