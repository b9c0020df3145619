"""The search Job's mirror of its checkpoint ledger into the state ConfigMap is rate-limited."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from compass.commands.job import LEDGER_KEY, MIRROR_INTERVAL_S, MirroredEvaluator, StateStore
from compass.domain.evaluation import Config
from compass.evaluators import CheckpointedEvaluator, CheckpointLedger


class Ones:
    """Scores every sample 1."""

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """One score per sample."""
        return [1.0] * len(sample_indices)


class RecordingStore:
    """Stands in for the ConfigMap (the k8s tier writes the real one): what each write held."""

    def __init__(self) -> None:
        self.writes: list[dict[str, str]] = []

    def write(self, data: dict[str, str]) -> None:
        """Record one PATCH."""
        self.writes.append(data)


def test_ledger_is_mirrored_at_most_once_per_interval(tmp_path: Path) -> None:
    """Batches closer than the interval share one write; a batch after it writes everything."""
    now = [100.0]
    store = RecordingStore()
    ledger = tmp_path / "ledger.jsonl"
    checkpoint = CheckpointLedger(ledger)
    mirrored = MirroredEvaluator(
        CheckpointedEvaluator(Ones(), checkpoint),
        cast(StateStore, store),
        ledger,
        clock=lambda: now[0],
    )
    config: dict[str, Any] = {"k": 1}
    mirrored.evaluate(config, [0, 1])  # the first batch is always mirrored
    now[0] += MIRROR_INTERVAL_S / 2
    mirrored.evaluate(config, [2, 3])  # too soon: on disk only
    mirrored.evaluate(config, [0, 1])  # nothing new: never a write
    assert len(store.writes) == 1
    now[0] += MIRROR_INTERVAL_S / 2
    mirrored.evaluate(config, [4])
    assert len(store.writes) == 2
    # The second write carries both batches since the first: nothing on disk is left behind.
    assert store.writes[-1][LEDGER_KEY] == ledger.read_text(encoding="utf-8")
    assert store.writes[-1][LEDGER_KEY].count("\n") == 3
