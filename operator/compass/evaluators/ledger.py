"""The ledger: recorded per-sample scores, read for replay and appended as a search checkpoint."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import operator
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from compass.domain.evaluation import Config, EvaluationError, Evaluator, ParamValue
from compass.domain.search import MAX_DATASET_SIZE
from compass.domain.space import config_key, value_problem
from compass.evaluators.files import MiB, UnsafeFileError, read_regular

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]

_LINE_SHAPE = 'each line must be one JSON object like {"config": {...}, "scores": [...]}'
_SCORE_RULE = "every score must be a number in [0, 1]"
_INDEX_RULE = "every sample index must be an integer >= 0"
# The largest ledger read whole: tens of millions of scores (the paper's grid takes a few MiB).
MAX_LEDGER_BYTES = 1024 * MiB


class LedgerError(ValueError):
    """A ledger file or fact is invalid; the message names the file, the line and the fix."""


class LedgerBusyError(LedgerError):
    """Another search holds the checkpoint ledger's lock."""


class TruncatedLineError(LedgerError):
    """The last line lacks its newline and is not valid JSON: a write cut short."""


def _kind(value: object) -> str:
    """The JSON type of a value, as a user would name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _show(value: object) -> str:
    return json.dumps(value) if isinstance(value, str | bool) or value is None else repr(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Ledger:
    """Per-sample scores by configuration, merged from any number of lines or batches."""

    def __init__(self, source: str = "ledger") -> None:
        """Start empty; `source` names the ledger in error messages."""
        self.source = source
        self._configs: dict[str, dict[str, ParamValue]] = {}
        # One array per configuration, NaN where unknown: a batch lookup is one fancy-index.
        self._scores: dict[str, FloatArray] = {}
        self._facts = 0

    def __len__(self) -> int:
        """The number of configurations."""
        return len(self._configs)

    def __contains__(self, config: Config) -> bool:
        """Whether the ledger holds any score for this configuration."""
        return config_key(config) in self._configs

    @property
    def fact_count(self) -> int:
        """The number of (configuration, sample) scores held."""
        return self._facts

    def configs(self) -> list[dict[str, ParamValue]]:
        """Configurations in first-seen order, as first written."""
        return [dict(c) for c in self._configs.values()]

    def add(self, config: Config, indices: Sequence[int], scores: Sequence[float]) -> None:
        """Record scores; a known (config, index) with a different score raises LedgerError."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        new = np.asarray(scores, dtype=np.float64).reshape(-1)
        if idx.size != new.size:
            raise LedgerError(f"{idx.size} sample indices but {new.size} scores")
        if idx.size and int(idx.min()) < 0:
            raise LedgerError(f"negative sample index {int(idx.min())}; {_INDEX_RULE}")
        if np.unique(idx).size != idx.size:
            raise LedgerError("a sample index is listed twice in one batch")
        key = config_key(config)
        row = self._scores.get(key, np.full(0, np.nan))
        if idx.size and int(idx.max()) >= row.size:
            # Grow geometrically so batch-by-batch appends stay linear overall.
            grown = np.full(max(int(idx.max()) + 1, 2 * row.size), np.nan)
            grown[: row.size] = row
            row = grown
        old = row[idx]
        seen = ~np.isnan(old)
        clash = np.flatnonzero(seen & (old != new))
        if clash.size:
            i = int(clash[0])
            raise LedgerError(
                f"sample {int(idx[i])} of configuration {key} has score {new[i]!r} here "
                f"but {old[i]!r} earlier; a sample's score must not change, remove the stale one"
            )
        row[idx] = new
        self._facts += int(idx.size - np.count_nonzero(seen))
        self._scores[key] = row
        self._configs.setdefault(key, dict(config))

    def lookup(self, config: Config, indices: Sequence[int]) -> FloatArray:
        """Scores for the given indices, in order, NaN where unknown."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        out = np.full(idx.size, np.nan)
        row = self._scores.get(config_key(config))
        if row is not None:
            inside = (idx >= 0) & (idx < row.size)
            out[inside] = row[idx[inside]]
        return out

    def scores(self, config: Config) -> dict[int, float]:
        """All known scores of a configuration by sample index (empty if unknown)."""
        row = self._scores.get(config_key(config))
        if row is None:
            return {}
        where = np.flatnonzero(~np.isnan(row))
        return dict(zip(where.tolist(), row[where].tolist(), strict=True))

    def complete_length(self, config: Config) -> int:
        """n such that samples 0..n-1 are all known for this configuration."""
        row = self._scores.get(config_key(config))
        if row is None:
            return 0
        gaps = np.flatnonzero(np.isnan(row))
        return int(gaps[0]) if gaps.size else int(row.size)


def _parse_fact(obj: Any) -> tuple[dict[str, ParamValue], list[int], list[float]]:
    """Validate one decoded line; raise LedgerError with the field and the fix (no location)."""
    if not isinstance(obj, dict):
        raise LedgerError(f"expected a JSON object, got {_kind(obj)}; {_LINE_SHAPE}")
    if "config" not in obj:
        raise LedgerError(f'"config" is missing; {_LINE_SHAPE}')
    config = obj["config"]
    if not isinstance(config, dict):
        raise LedgerError(
            f'"config" is {_kind(config)}, not an object; write it as {{"param": value, ...}}'
        )
    for name, value in config.items():
        problem = value_problem(value)
        if not isinstance(value, str | int | float) or problem is not None:
            raise LedgerError(
                f'"config" value of "{name}" is {problem or _kind(value)}; '
                "every parameter value must be a string, a finite number or a boolean"
            )
    if "scores" not in obj:
        raise LedgerError(f'"scores" is missing; {_LINE_SHAPE}')
    scores = obj["scores"]
    if not isinstance(scores, list):
        raise LedgerError(f'"scores" is {_kind(scores)}, not a list; {_SCORE_RULE}')
    for position, score in enumerate(scores):
        if not _is_number(score):
            raise LedgerError(f'"scores" has a non-numeric value {_show(score)}; {_SCORE_RULE}')
        if not 0.0 <= score <= 1.0:  # NaN fails both comparisons
            what = "NaN" if score != score else _show(score)
            raise LedgerError(
                f'"scores" has {what} at position {position}, outside [0, 1]; {_SCORE_RULE}'
            )
    if "samples" not in obj:
        return config, list(range(len(scores))), [float(s) for s in scores]
    samples = obj["samples"]
    if not isinstance(samples, list):
        raise LedgerError(
            f'"samples" is {_kind(samples)}, not a list; {_INDEX_RULE} '
            '(or leave "samples" out to mean 0..len-1)'
        )
    seen: set[int] = set()
    for index in samples:
        if not isinstance(index, int) or isinstance(index, bool):
            raise LedgerError(f'"samples" has a non-integer value {_show(index)}; {_INDEX_RULE}')
        if index < 0:
            raise LedgerError(f'"samples" has a negative index {index}; {_INDEX_RULE}')
        if index >= MAX_DATASET_SIZE:
            # The scores are held in an array as long as the largest index: bound it.
            what = f"index {index}" if index < 10**15 else f"an index of {len(str(index))} digits"
            raise LedgerError(
                f'"samples" has {what}, beyond the largest dataset compass searches '
                f"({MAX_DATASET_SIZE:,} samples); {_INDEX_RULE} and below that"
            )
        if index in seen:
            raise LedgerError(f'"samples" lists index {index} twice; list each sample once a line')
        seen.add(index)
    if len(samples) != len(scores):
        raise LedgerError(
            f'"samples" has {len(samples)} indices but "scores" has {len(scores)} values; '
            "give exactly one score per sample index"
        )
    return config, samples, [float(s) for s in scores]


def read_ledger_bytes(path: Path) -> bytes:
    """A ledger file's bytes: a regular file of at most MAX_LEDGER_BYTES, or UnsafeFileError."""
    return read_regular(path, MAX_LEDGER_BYTES)


def _read(path: Path, allow_truncated: bool) -> tuple[Ledger, bytes, int]:
    """Read a ledger; also its bytes and the length of its intact part (a torn tail excluded)."""
    try:
        data = read_ledger_bytes(path)
    except UnsafeFileError as exc:
        raise LedgerError(str(exc)) from None
    ledger, intact = _parse(data, str(path), allow_truncated)
    return ledger, data, intact


def _parse(data: bytes, source: str, allow_truncated: bool) -> tuple[Ledger, int]:
    """Parse a ledger's bytes; also the intact length (``allow_truncated``: a torn tail skipped)."""
    ledger = Ledger(source)
    lines = data.split(b"\n")
    intact = len(data)
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        last = number == len(lines)  # only the final piece can lack its newline
        try:
            obj = json.loads(raw.decode("utf-8"))
        except RecursionError:
            raise LedgerError(
                f"{source} line {number}: nested too deeply to read; {_LINE_SHAPE}"
            ) from None
        except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            if not isinstance(exc, UnicodeDecodeError | json.JSONDecodeError):
                # int() past Python's digit limit: the line is JSON, but no ledger's.
                raise LedgerError(
                    f"{source} line {number}: a number of more than 4,300 digits; "
                    "every score must be a number in [0, 1] and every index below "
                    f"{MAX_DATASET_SIZE:,}"
                ) from None
            if last and allow_truncated:
                log.warning(
                    "%s line %d: skipping an incomplete final line (%d bytes), "
                    "left by an interrupted write",
                    source,
                    number,
                    len(raw),
                )
                intact = len(data) - len(raw)
                break
            if last:
                raise TruncatedLineError(
                    f"{source} line {number}: the last line is cut short (no newline, not "
                    f"valid JSON: {len(raw)} bytes); complete it or remove it"
                ) from None
            detail = (
                f"{exc.msg} at column {exc.colno}"
                if isinstance(exc, json.JSONDecodeError)
                else "not UTF-8"
            )
            raise LedgerError(
                f"{source} line {number}: not valid JSON ({detail}); {_LINE_SHAPE}"
            ) from None
        try:
            ledger.add(*_parse_fact(obj))
        except LedgerError as exc:
            raise LedgerError(f"{source} line {number}: {exc}") from None
    return ledger, intact


def read_ledger(path: str | os.PathLike[str], *, allow_truncated: bool = False) -> Ledger:
    """Read and validate a ledger file (replay or checkpoint format)."""
    return _read(Path(path), allow_truncated)[0]


def parse_ledger(text: str, source: str) -> Ledger:
    """Validate a ledger held in memory (e.g. a ConfigMap key); ``source`` names it in errors."""
    return _parse(text.encode("utf-8"), source, allow_truncated=False)[0]


def partial_path(path: Path) -> Path:
    """Where a checkpoint's cut-short last line is set aside."""
    return path.with_name(path.name + ".partial")


class ReplayEvaluator:
    """Serves recorded scores; asking for anything not recorded is an error."""

    def __init__(self, ledger: Ledger) -> None:
        """Replay from an already-read ledger."""
        self.ledger = ledger

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Recorded scores for these samples, in the order given."""
        if config not in self.ledger:
            raise EvaluationError(
                f"replay ledger {self.ledger.source} has no scores for configuration "
                f"{config_key(config)}; record it, or remove it from the space"
            )
        values = self.ledger.lookup(config, sample_indices)
        missing = [i for i, v in zip(sample_indices, values.tolist(), strict=True) if v != v]
        if missing:
            shown = ", ".join(map(str, missing[:5]))
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            held = self.ledger.complete_length(config)
            holds = f"samples 0..{held - 1} are all recorded" if held else "sample 0 is missing"
            raise EvaluationError(
                f"replay ledger {self.ledger.source} has no score for sample(s) {shown}{more} "
                f"of configuration {config_key(config)} ({holds}); "
                "record those samples, or lower the budget to what the ledger holds"
            )
        return cast(list[float], values.tolist())


class CheckpointLedger:
    """An append-only ledger file: each batch is one line, on disk before append returns."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Open (or create) the checkpoint, load its facts, set any torn final line aside."""
        self.path = Path(path)
        self.set_aside = 0  # bytes of a cut-short last line moved to partial_path(path)
        if self.path.exists():
            self.ledger, data, intact = _read(self.path, allow_truncated=True)
            if intact < len(data):
                # Keep every byte: the cut line goes beside the ledger, durably, before it is cut.
                with partial_path(self.path).open("ab") as aside:
                    aside.write(data[intact:] + b"\n")
                    aside.flush()
                    os.fsync(aside.fileno())
                self.set_aside = len(data) - intact
            with self.path.open("r+b") as f:
                f.truncate(intact)
                # A hand-written last line may lack its newline: the next must not glue on.
                if intact and data[intact - 1 : intact] != b"\n":
                    f.seek(intact)
                    f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            self.ledger = Ledger(str(self.path))
            # The new directory entry must survive a crash too, not only the file's contents.
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self.facts_at_open = self.ledger.fact_count

    def append(self, config: Config, indices: Sequence[int], scores: Sequence[float]) -> None:
        """Record one batch in memory and durably on disk."""
        # Checked as a resumed run will read it, before writing: a bad line stops every resume.
        try:
            line = json.dumps(
                {
                    "config": dict(config),
                    "samples": [operator.index(i) for i in indices],
                    "scores": list(scores),
                },
                allow_nan=False,
            )
            self.ledger.add(*_parse_fact(json.loads(line)))
        except (TypeError, ValueError) as exc:  # LedgerError is a ValueError
            raise LedgerError(f"{self.path}: cannot record this batch: {exc}") from None
        # One write of a whole line to an O_APPEND file: a crash leaves at most a torn tail.
        with self.path.open("ab") as f:
            f.write(line.encode("utf-8") + b"\n")
            f.flush()
            os.fsync(f.fileno())


class LedgerLock:
    """One search's hold on a checkpoint: flock on ``<ledger>.lock`` and on the ledger itself."""

    def __init__(self, ledger: Path) -> None:
        """Nothing is locked until acquire()."""
        self.ledger = ledger
        real = Path(os.path.realpath(ledger))
        self.path = real.with_name(real.name + ".lock")
        self._fd: int | None = None
        self._file_fd: int | None = None

    def _busy(self, holder: str = "") -> LedgerBusyError:
        pid = f" (pid {holder})" if holder.isdigit() else ""
        return LedgerBusyError(
            f"{self.ledger} is in use by another search{pid}; wait for it to end or stop it "
            "(a stale lock is released when its process exits)"
        )

    def acquire(self) -> None:
        """Take the lock, or raise LedgerBusyError naming the holder's pid if it says."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode("ascii", errors="replace").strip()
                os.close(fd)
                raise self._busy(holder) from None
            # The last holder unlinks it on release: after our open, ours is a file no one sees.
            try:
                current = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self._fd = fd
        try:
            self.hold_ledger()
        except BaseException:
            self.release()
            raise

    def hold_ledger(self) -> None:
        """Lock the ledger file itself if it exists (call again once created); LedgerBusyError."""
        if self._file_fd is not None:
            return
        try:
            fd = os.open(self.ledger, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._busy() from None
        self._file_fd = fd

    def release(self) -> None:
        """Drop the locks and the lock file."""
        if self._file_fd is not None:
            os.close(self._file_fd)
            self._file_fd = None
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def _checked_scores(values: Iterable[object], expected: int) -> list[float]:
    """The inner evaluator's scores, or EvaluationError if they could not be replayed later."""
    scores: list[float] = []
    for score in values:
        if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
            raise EvaluationError(f"evaluator returned score {score!r}; {_SCORE_RULE}")
        scores.append(float(score))
    if len(scores) != expected:
        raise EvaluationError(f"evaluator returned {len(scores)} scores for {expected} samples")
    return scores


class CheckpointedEvaluator:
    """Serves facts from the checkpoint and evaluates (then records) only what is missing."""

    def __init__(self, inner: Evaluator, checkpoint: CheckpointLedger) -> None:
        """Wrap `inner`; counters start at zero."""
        self.inner = inner
        self.checkpoint = checkpoint
        self.reused = 0  # sample evaluations answered from the checkpoint
        self.computed = 0  # sample evaluations asked of `inner`
        # Ledger and counters under it, the inner evaluator outside (one chunk a config at a time).
        self.lock = threading.Lock()

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Per-sample scores in order, each missing one evaluated and recorded once."""
        scores = self.evaluate_unrecorded(config, sample_indices)
        self.record(config, sample_indices, scores)
        return scores

    def evaluate_unrecorded(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Per-sample scores in order, the missing ones evaluated but not recorded yet."""
        with self.lock:
            values = self.checkpoint.ledger.lookup(config, sample_indices)
        unknown = np.isnan(values)
        if unknown.any():
            asked = np.asarray(sample_indices, dtype=np.int64)[unknown].tolist()
            # dict.fromkeys: first-seen order, each index once even if requested twice.
            missing = list(dict.fromkeys(asked))
            scores = _checked_scores(self.inner.evaluate(config, missing), len(missing))
            fresh = dict(zip(missing, scores, strict=True))
            values[unknown] = [fresh[index] for index in asked]
        with self.lock:
            self.reused += int(np.count_nonzero(~unknown))
        return cast(list[float], values.tolist())

    def record(
        self, config: Config, sample_indices: Sequence[int], scores: Sequence[float]
    ) -> None:
        """Record the scores of the samples the checkpoint does not hold yet."""
        with self.lock:
            known = self.checkpoint.ledger.lookup(config, sample_indices)
            new = {
                int(i): float(s)
                for i, s, k in zip(sample_indices, scores, known, strict=True)
                if k != k  # NaN: not recorded yet
            }
            if new:
                self.checkpoint.append(config, list(new), list(new.values()))
                self.computed += len(new)
