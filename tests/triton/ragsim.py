"""rag-sim as the triton tier serves it: compass_dev.scenarios' facts, at the tier's time scale.

Also the servers the triton, k8s and e2e tiers start around it (each tier its own: the triton
tier's tests switch theirs), as context managers their fixtures wrap.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from compass.dataplane.metrics import MetricsUnavailableError, QueueDepthSource
from compass_dev.local_triton import LocalPrometheus, LocalTriton
from compass_dev.scenarios import ACCURATE, COMPONENTS, FASTEST, rag_sim_triton
from compass_dev.scenarios import TEST_TIME_SCALE as TIME_SCALE
from tiers import require_prometheus, require_tritonserver

__all__ = [
    "ACCURATE",
    "COMPONENTS",
    "FASTEST",
    "TIME_SCALE",
    "depth_or_none",
    "rag_sim_server",
    "scores_of",
    "scraping",
]


def scores_of(data: dict[str, object], config: dict[str, object]) -> list[float]:
    """rag-sim's recorded per-question scores of a configuration."""
    configs = data["configs"]
    assert isinstance(configs, dict)
    return list(configs[json.dumps(config, sort_keys=True)]["scores"])


@contextlib.contextmanager
def rag_sim_server(workdir: Path) -> Iterator[LocalTriton]:
    """tritonserver with rag-sim (router + three components) at TIME_SCALE, FASTEST active,
    stopped on exit; unavailable (tests/tiers.py) where there is no tritonserver."""
    require_tritonserver()
    server = rag_sim_triton(workdir, TIME_SCALE, FASTEST).start(workdir)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def scraping(triton: LocalTriton, workdir: Path) -> Iterator[LocalPrometheus]:
    """Prometheus scraping Triton's metrics port every 0.5 s, stopped on exit; unavailable
    (tests/tiers.py) where there is no prometheus."""
    require_prometheus()
    server = LocalPrometheus(targets=[f"127.0.0.1:{triton.metrics_port}"], interval_s=0.5)
    server.start(workdir)
    try:
        yield server
    finally:
        server.stop()


def depth_or_none(source: QueueDepthSource) -> float | None:
    """The queue depth, or None before the source has the series (Prometheus' first scrape)."""
    try:
        return source.read().queue_depth
    except MetricsUnavailableError:
        return None
