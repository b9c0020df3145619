"""Evaluators: replay from a ledger, run a command, and the checkpoint that makes search resumable."""

from compass.evaluators.command import CommandEvaluator
from compass.evaluators.ledger import (
    CheckpointedEvaluator,
    CheckpointLedger,
    Ledger,
    LedgerError,
    ReplayEvaluator,
    read_ledger,
)

__all__ = [
    "CheckpointLedger",
    "CheckpointedEvaluator",
    "CommandEvaluator",
    "Ledger",
    "LedgerError",
    "ReplayEvaluator",
    "read_ledger",
]
