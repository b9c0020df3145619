"""The command-line tests' shared inputs: a small synthetic space with its replay ledger, and
latency profiles with one dominated entry (imported by several test modules, so not in one)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from compass.examples import build_replay_ledger

SPACE_YAML = """\
parameters:
  - name: model
    type: categorical
    values: [large, medium, small]
  - name: k
    type: integer
    values: [1, 2, 4, 8]
  - name: rerank
    type: integer
    values: [1, 2, 4]
constraints:
  - rerank <= k
"""
N = 40
MODEL_ACCURACY = {"large": 0.85, "medium": 0.7, "small": 0.45}


def accuracy(config: dict[str, Any]) -> float:
    """The synthetic ground truth: the model dominates, more retrieval helps a little."""
    quality = MODEL_ACCURACY[config["model"]]
    return float(quality + 0.02 * math.log2(config["k"]) - 0.01 * config["rerank"])


def space_configs() -> list[dict[str, Any]]:
    """Every configuration of SPACE_YAML (27)."""
    return [
        {"model": m, "k": k, "rerank": r}
        for m in MODEL_ACCURACY
        for k in (1, 2, 4, 8)
        for r in (1, 2, 4)
        if r <= k
    ]


def ledger_lines(n: int = N, seed: int = 0) -> list[dict[str, Any]]:
    """A replay ledger of the synthetic space, n samples a configuration."""
    rows = [{"config": c, "accuracy": accuracy(c)} for c in space_configs()]
    return build_replay_ledger(rows, n, seed)


def write_jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def measured(name: str, accuracy: float, mean: float, spread: float) -> dict[str, Any]:
    """One profiler entry with normal-looking statistics."""
    return {
        "config": {"model": name, "k": 3},
        "accuracy": accuracy,
        "latency_mean_ms": mean,
        "latency_p50_ms": mean,
        "latency_p95_ms": mean + 1.645 * spread,
        "latency_p99_ms": mean + 2.326 * spread,
        "latency_std_ms": spread,
    }


PROFILES = [
    measured("fast", 0.70, 100, 15),
    measured("dominated", 0.68, 160, 20),
    measured("mid", 0.80, 150, 20),
    measured("slow", 0.90, 250, 30),
]
