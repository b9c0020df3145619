"""The search ledger as gzip chunks in ConfigMaps: pure encoding, ordering and sizing, no I/O.

The ledger is append-only, so it is stored as it grows: every evaluated batch adds one binaryData
key ``ledger.NNNNNNNN.jsonl.gz`` (its new lines, gzip) to the state ConfigMap, and the ledger is
the keys' texts in sequence order. A PATCH then carries only the new lines, not the ledger so far.
Per-batch gzip barely compresses a line or two, so once a ConfigMap's per-batch keys hold
``COMPACT_AT`` bytes of text, the next append replaces them by one gzip of all of them (one
merge patch: atomic). When a ConfigMap would pass ``BUDGET``, the next chunk goes into a new
ConfigMap ``STATE-cN`` (``chunk_name``), labelled ``CHUNK_OF_LABEL: STATE`` and owned like the
state, so its garbage is collected with it. Sequence numbers are global across the ConfigMaps,
so reading is: every ledger key of the state and of its chunk ConfigMaps, in sequence order.
A plain ``ledger.jsonl`` data key (a hand-made replay ConfigMap, or a state written before
chunks) comes first.
"""

from __future__ import annotations

import base64
import gzip
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compass.api.meta import GROUP

LEDGER_KEY = "ledger.jsonl"
CHUNK_OF_LABEL = f"{GROUP}/ledger-of"
# The API server refuses a ConfigMap whose data and binaryData (decoded) pass 1 MiB; roll over
# before that with room to spare for the metadata and a last progress write.
BUDGET = 900 * 1024
# What the state ConfigMap keeps free of ledger for what comes after the search: the result,
# the profiles and the curve progress (each a few to tens of KB for the grids we know).
RESERVE = 256 * 1024
# Per-batch keys are merged into one gzip once their text reaches this: small enough that the
# merging patch stays small, large enough that gzip finds the repeated configurations.
COMPACT_AT = 64 * 1024
# The most text one chunk of a seeded ledger holds: its gzip then fits any budget.
PIECE_TEXT = 256 * 1024

_KEY = re.compile(r"^ledger\.(\d+)\.jsonl\.gz$")


def chunk_key(sequence: int) -> str:
    """The binaryData key of the ledger chunk with this sequence number."""
    return f"ledger.{sequence:08d}.jsonl.gz"


def chunk_sequence(key: str) -> int | None:
    """The sequence number of a ledger chunk key; None for any other key."""
    match = _KEY.match(key)
    return int(match.group(1)) if match else None


def chunk_name(state: str, index: int) -> str:
    """The name of the state's index-th chunk ConfigMap (index >= 1; 0 is the state itself)."""
    return f"{state}-c{index}"


def encode(text: str) -> str:
    """Text as a binaryData value: gzip (no timestamp, so equal texts encode equally), base64."""
    return base64.b64encode(gzip.compress(text.encode("utf-8"), mtime=0)).decode("ascii")


def decode(value: str) -> str:
    """A binaryData value written by ``encode``, as text."""
    return gzip.decompress(base64.b64decode(value)).decode("utf-8")


def stored_size(value: str) -> int:
    """The bytes a binaryData value counts towards the 1 MiB limit (decoded)."""
    return len(value) * 3 // 4 - value[-2:].count("=")


def config_map_size(obj: Mapping[str, Any]) -> int:
    """What the API server limits: the data values' bytes and the binaryData's decoded bytes."""
    data = sum(len(v.encode("utf-8")) for v in (obj.get("data") or {}).values())
    binary = sum(stored_size(v) for v in (obj.get("binaryData") or {}).values())
    return data + binary


def ledger_chunks(obj: Mapping[str, Any]) -> list[tuple[int, str]]:
    """The ConfigMap's ledger chunks as (sequence, binaryData value), unordered."""
    binary: Mapping[str, str] = obj.get("binaryData") or {}
    found = ((chunk_sequence(key), value) for key, value in binary.items())
    return [(sequence, value) for sequence, value in found if sequence is not None]


def ledger_text(config_maps: Iterable[Mapping[str, Any]]) -> str:
    """The ledger held by a state ConfigMap and its chunk ConfigMaps (any order), as text."""
    objects = list(config_maps)
    plain = "".join(str((o.get("data") or {}).get(LEDGER_KEY) or "") for o in objects)
    if plain and not plain.endswith("\n"):
        plain += "\n"
    chunks = sorted(chunk for obj in objects for chunk in ledger_chunks(obj))
    return plain + "".join(decode(value) for _, value in chunks)


def pieces(text: str, limit: int = PIECE_TEXT) -> list[str]:
    """Whole lines of text, grouped into pieces of at most ``limit`` characters where a line
    allows (a longer line is a piece by itself)."""
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


def place(
    values: Sequence[str], first_room: int, room: int = BUDGET
) -> list[list[tuple[str, str]]]:
    """Encoded chunks (sequence numbers from 0) spread over ConfigMaps in order: the first
    takes what fits in ``first_room`` bytes, each next one what fits in ``room``. Each list is
    one ConfigMap's binaryData items; the first may be empty."""
    placed: list[list[tuple[str, str]]] = [[]]
    free = first_room
    for sequence, value in enumerate(values):
        size = stored_size(value)
        # A chunk ConfigMap takes at least one chunk, however large; the state may take none.
        if size > free and (placed[-1] or len(placed) == 1):
            placed.append([])
            free = room
        placed[-1].append((chunk_key(sequence), value))
        free -= size
    return placed
