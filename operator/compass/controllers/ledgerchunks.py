"""The search ledger as gzip chunks in ConfigMaps (docs/operations.md, "The search ledger")."""

from __future__ import annotations

import base64
import gzip
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compass.api.meta import GROUP

LEDGER_KEY = "ledger.jsonl"
CHUNK_OF_LABEL = f"{GROUP}/ledger-of"
# The API server refuses a ConfigMap whose data and binaryData (decoded) pass 1 MiB: a chunk
# ConfigMap rolls over before that, with room to spare for its metadata.
BUDGET = 900 * 1024
# The state's own chunks, merged out with the next write's lines once they would pass this: the
# state is rewritten in etcd at every write, so its size is what a write really costs.
HOT_BUDGET = 32 * 1024
# The most chunk ConfigMaps one state may have (the Jobs' Role names each): 256 of at least
# HOT_BUDGET hold 8 MiB of gzip or more, some 30 times a 1,000-sample search of the RAG grid.
MAX_CHUNKS = 256
# The search Job writes its new ledger lines at most once per FLUSH_INTERVAL_S, or once
# PENDING_TEXT bytes wait: a killed pod evaluates again at most that interval's batches.
FLUSH_INTERVAL_S = 5.0
# A write's new lines: their gzip must fit a chunk ConfigMap with HOT_BUDGET (gzip never grows
# text by more than a few bytes per 16 KiB), and a PATCH stays a fraction of the request limit.
PENDING_TEXT = 512 * 1024
# The most text one chunk of a seeded ledger holds: its gzip then fits any budget.
PIECE_TEXT = 256 * 1024

# How much ledger text a workflow can have recorded (some 30 bytes a sample evaluation, doubled,
# and a config object a batch line), within [MIN_LEDGER_TEXT, MAX_LEDGER_TEXT]: past it a chunk is
# a gzip bomb, refused, never inflated whole.
TEXT_PER_SAMPLE = 64
TEXT_PER_CONFIGURATION = 16 * 1024
MIN_LEDGER_TEXT = 1024 * 1024
MAX_LEDGER_TEXT = 256 * 1024 * 1024

_KEY = re.compile(r"^ledger\.(\d+)(?:-(\d+))?\.jsonl\.gz$")


def chunk_key(first: int, last: int | None = None) -> str:
    """The binaryData key of the chunk holding the batches first..last (one: first)."""
    if last is None or last == first:
        return f"ledger.{first:08d}.jsonl.gz"
    return f"ledger.{first:08d}-{last:08d}.jsonl.gz"


def chunk_range(key: str) -> tuple[int, int] | None:
    """The (first, last) batch of a ledger chunk key; None for any other key."""
    match = _KEY.match(key)
    if not match:
        return None
    first = int(match.group(1))
    return first, int(match.group(2) or first)


def chunk_name(state: str, index: int) -> str:
    """The name of the state's index-th chunk ConfigMap (index >= 1; 0 is the state itself)."""
    return f"{state}-c{index}"


def state_names(state: str) -> list[str]:
    """Every ConfigMap a state may span: itself, then its chunk ConfigMaps 1..MAX_CHUNKS."""
    return [state, *(chunk_name(state, index) for index in range(1, MAX_CHUNKS + 1))]


def encode(text: str) -> str:
    """Text as a binaryData value: gzip (no timestamp, so equal texts encode equally), base64."""
    return base64.b64encode(gzip.compress(text.encode("utf-8"), mtime=0)).decode("ascii")


class LedgerTooLargeError(ValueError):
    """A ledger whose text passes the bound its workflow allows (``text_limit``)."""


def text_limit(configurations: int, samples: int) -> int:
    """The most ledger text a workflow of ``configurations`` and ``samples`` can record."""
    needed = configurations * (samples * TEXT_PER_SAMPLE + TEXT_PER_CONFIGURATION)
    return min(MAX_LEDGER_TEXT, max(MIN_LEDGER_TEXT, needed))


def decode(value: str, limit: int | None = None) -> str:
    """A binaryData value ``encode`` wrote, as text; LedgerTooLargeError past ``limit``."""
    data = base64.b64decode(value)
    if limit is None:
        return gzip.decompress(data).decode("utf-8")
    return inflate(data, limit).decode("utf-8")


def inflate(data: bytes, limit: int) -> bytes:
    """gzip ``data`` inflated a piece at a time, refused past ``limit`` bytes."""
    out = bytearray()
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        # max_length bounds each call's output: never more than limit + 1 in memory (it is
        # always >= 1 here; 0 would mean no bound).
        out += inflater.decompress(data, limit + 1 - len(out))
        while inflater.unconsumed_tail and len(out) <= limit:
            out += inflater.decompress(inflater.unconsumed_tail, limit + 1 - len(out))
        if len(out) > limit:
            raise LedgerTooLargeError(f"its text passes {limit:,} bytes")
        if not inflater.eof:
            raise EOFError("the gzip stream ends before its end-of-stream marker")
        data = inflater.unused_data
    return bytes(out)


def stored_size(value: str) -> int:
    """The bytes a binaryData value counts towards the 1 MiB limit (decoded)."""
    return len(value) * 3 // 4 - value[-2:].count("=")


def config_map_size(obj: Mapping[str, Any]) -> int:
    """What the API server limits: the data values' bytes and the binaryData's decoded bytes."""
    data = sum(len(v.encode("utf-8")) for v in (obj.get("data") or {}).values())
    binary = sum(stored_size(v) for v in (obj.get("binaryData") or {}).values())
    return data + binary


def ledger_chunks(obj: Mapping[str, Any]) -> list[tuple[int, int, str, str]]:
    """The ConfigMap's ledger chunks as (first, last, key as spelled, value), unordered."""
    binary: Mapping[str, str] = obj.get("binaryData") or {}
    found = ((chunk_range(key), key, value) for key, value in binary.items())
    return [(span[0], span[1], key, value) for span, key, value in found if span]


def ledger_text(config_maps: Iterable[Mapping[str, Any]], limit: int | None = None) -> str:
    """A state's and its chunks' ledger (any order) as text; LedgerTooLargeError past ``limit``."""
    objects = list(config_maps)
    plain = "".join(str((o.get("data") or {}).get(LEDGER_KEY) or "") for o in objects)
    if plain and not plain.endswith("\n"):
        plain += "\n"
    size = len(plain.encode("utf-8"))
    if limit is not None and size > limit:
        raise LedgerTooLargeError(f"the plain {LEDGER_KEY} keys pass {limit:,} bytes")
    chunks = sorted(
        ((*chunk, _name(obj)) for obj in objects for chunk in ledger_chunks(obj)),
        key=lambda c: (c[0], -c[1]),
    )
    texts = []
    covered = -1
    for _first, last, key, value, name in chunks:
        if last > covered:
            try:
                text = decode(value, None if limit is None else limit - size)
            except LedgerTooLargeError:
                raise LedgerTooLargeError(
                    f"{name}/{key}: the ledger's text passes {limit:,} bytes"
                ) from None
            size += len(text.encode("utf-8"))
            texts.append(text)
            covered = last
    return plain + "".join(texts)


def _name(obj: Mapping[str, Any]) -> str:
    """A ConfigMap's name, for an error ("?" if it has none)."""
    return str((obj.get("metadata") or {}).get("name") or "?")


def pieces(text: str, limit: int = PIECE_TEXT) -> list[str]:
    """Whole lines grouped into pieces of at most ``limit`` characters (or one longer line)."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        if current and size + len(line) > limit:
            out.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        out.append("".join(current))
    return out


def place(values: Sequence[str], room: int = BUDGET) -> list[dict[str, str]]:
    """Encoded chunks (batches 0, 1...) spread in order over ConfigMaps' binaryData of ``room``."""
    placed: list[dict[str, str]] = []
    free = 0
    for sequence, value in enumerate(values):
        size = stored_size(value)
        if not placed or size > free:
            placed.append({})
            free = room
        placed[-1][chunk_key(sequence)] = value
        free -= size
    return placed


@dataclass
class FlushClock:
    """When the search Job writes its evaluated batches: the first at once, then each
    ``interval_s`` or ``pending_limit`` bytes (a kill loses at most the last interval's)."""

    interval_s: float = FLUSH_INTERVAL_S
    pending_limit: int = PENDING_TEXT
    last: float | None = None  # when the last write was made; None: never
    pending: int = 0  # bytes of new lines waiting
    batches: int = 0  # batches waiting

    def add(self, size: int) -> None:
        """One more evaluated batch of ``size`` bytes of new lines waits."""
        self.pending += size
        self.batches += 1

    def due(self, now: float) -> bool:
        """Whether what waits should be written at ``now``."""
        if not self.batches:
            return False
        return (
            self.last is None
            or now - self.last >= self.interval_s
            or self.pending >= self.pending_limit
        )

    def written(self, now: float) -> None:
        """What waited was written at ``now``."""
        self.last = now
        self.pending = 0
        self.batches = 0
