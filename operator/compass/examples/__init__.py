"""Embedded examples: the paper's RAG grid (replayable as per-sample scores) and public traces."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt

RAG_PAPER_FILE = "rag_paper.json"
RAG_PAPER_SAMPLES = 100
TRACES_DIR = "traces"
TRACE_SUFFIX = ".txt.gz"


def replay_scores(accuracy: float, n: int, rng: np.random.Generator) -> list[float]:
    """Per-sample scores in [0, 1] whose mean over all n is the given accuracy."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy}")
    total = accuracy * n
    ones = min(math.floor(total), n)
    scores = np.zeros(n)
    scores[:ones] = 1.0
    if ones < n:
        # total - ones is exact (Sterbenz), so the scores sum to exactly accuracy * n.
        scores[ones] = total - ones
    # Gather through one permutation: the same seed gives the same ledger everywhere it is built.
    return [float(s) for s in scores[rng.permutation(n)]]


def build_replay_ledger(
    rows: Sequence[Mapping[str, Any]], n: int, seed: int
) -> list[dict[str, Any]]:
    """Ledger lines {"config", "scores"} replaying each row's accuracy over n samples."""
    rng = np.random.default_rng(seed)
    return [
        {"config": dict(row["config"]), "scores": replay_scores(float(row["accuracy"]), n, rng)}
        for row in rows
    ]


def load_rag_paper() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The paper's RAG space spec and its 234 recorded {config, accuracy} rows."""
    text = resources.files(__name__).joinpath(RAG_PAPER_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    return dict(data["space"]), [dict(row) for row in data["rows"]]


def shipped_traces() -> tuple[str, ...]:
    """The names of the production arrival traces in traces/ (README.md there says whose)."""
    folder = resources.files(__name__).joinpath(TRACES_DIR)
    names = (
        e.name[: -len(TRACE_SUFFIX)] for e in folder.iterdir() if e.name.endswith(TRACE_SUFFIX)
    )
    return tuple(sorted(names))


def load_trace(name: str) -> npt.NDArray[np.float64]:
    """A shipped trace's arrival offsets (s from its first arrival, sorted, float64): gzip text,
    one offset a line, what ``compass simulate --pattern trace --trace FILE`` reads unpacked."""
    known = shipped_traces()
    if name not in known:
        raise ValueError(f"trace: no shipped trace named {name!r}; use one of: {', '.join(known)}")
    packed = (
        resources.files(__name__).joinpath(TRACES_DIR).joinpath(name + TRACE_SUFFIX).read_bytes()
    )
    return np.array(gzip.decompress(packed).decode("ascii").split(), dtype=np.float64)
