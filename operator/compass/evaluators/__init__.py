"""Evaluators (replay, command, Triton, and the factory that picks one) and the search checkpoint."""

from compass.evaluators.command import CommandEvaluator
from compass.evaluators.factory import ScoreSource, make_evaluator
from compass.evaluators.ledger import (
    CheckpointedEvaluator,
    CheckpointLedger,
    Ledger,
    LedgerBusyError,
    LedgerError,
    LedgerLock,
    ReplayEvaluator,
    TruncatedLineError,
    parse_ledger,
    partial_path,
    read_ledger,
)

__all__ = [
    "CheckpointLedger",
    "CheckpointedEvaluator",
    "CommandEvaluator",
    "Ledger",
    "LedgerBusyError",
    "LedgerError",
    "LedgerLock",
    "ReplayEvaluator",
    "ScoreSource",
    "TruncatedLineError",
    "make_evaluator",
    "parse_ledger",
    "partial_path",
    "read_ledger",
]
