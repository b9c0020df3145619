"""The metrics flag the rag-sim image starts Triton with makes it export the latency summaries
the dashboard's SLO panel reads (nv_inference_request_summary_us, quantile 0.95)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from ragsim import FASTEST, TIME_SCALE

from compass.dataplane.triton import TritonRouter
from compass_dev.scenarios import rag_sim_triton
from tiers import require_tritonserver

REPO = Path(__file__).resolve().parents[2]


def image_metrics_flags() -> list[str]:
    """The --metrics-config flags of the rag-sim image's CMD."""
    dockerfile = (REPO / "model-images" / "rag-sim" / "Dockerfile").read_text()
    command = json.loads(dockerfile.split("CMD ", 1)[1].replace("\\\n", " "))
    return [word for word in command if word.startswith("--metrics-config=")]


def summary_lines(metrics_url: str) -> list[str]:
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith("nv_inference_request_summary_us{") and 'model="router"' in line
    ]


def test_the_images_flag_exports_the_routers_p95(tmp_path: Path) -> None:
    """With the image's flag, a request through the router gives it a p95 series."""
    require_tritonserver()
    flags = image_metrics_flags()
    assert flags == ["--metrics-config=summary_latencies=true"]
    server = rag_sim_triton(tmp_path, TIME_SCALE, FASTEST)
    server.extra_args = flags
    server.start(tmp_path)
    try:
        router = TritonRouter(server.grpc_url, backoff_s=0.05)
        try:
            for sample in range(3):
                router.infer({"sample": sample})
        finally:
            router.close()
        lines = summary_lines(server.metrics_url)
        p95 = [line for line in lines if 'quantile="0.95"' in line]
        assert len(p95) == 1, lines
        assert float(re.split(r"\s+", p95[0])[-1]) > 0
    finally:
        server.stop()
