"""The search ledger as gzip chunks in ConfigMaps: pure encoding, ordering and sizing, no I/O.

Every evaluated batch adds one gzip key to the state ConfigMap; past ``HOT_BUDGET`` the chunks
are merged into chunk ConfigMaps (``chunk_name``, labelled ``CHUNK_OF_LABEL``, each under
``BUDGET``), so etcd never rewrites a growing ledger per batch. The ledger is every chunk in
sequence order, a chunk an earlier one covers skipped; a plain ``ledger.jsonl`` key comes first.
Why and how: docs/operations.md, "The search ledger in ConfigMaps".
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
# The API server refuses a ConfigMap whose data and binaryData (decoded) pass 1 MiB: a chunk
# ConfigMap rolls over before that, with room to spare for its metadata.
BUDGET = 900 * 1024
# The state's own chunks, merged out once past this: the state is rewritten in etcd at every
# batch, so its size is what a batch really costs (about 60 batches of the RAG grid).
HOT_BUDGET = 8 * 1024
# The most chunk ConfigMaps one state may have: the Jobs' Role names each of them (RBAC narrows
# get and patch by name only), and 64 of BUDGET hold about 56 MiB of gzip, some 80 times the
# ledger of a 1,000-sample search of the RAG grid.
MAX_CHUNKS = 64
# The most text one chunk of a seeded ledger holds: its gzip then fits any budget.
PIECE_TEXT = 256 * 1024

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


def ledger_chunks(obj: Mapping[str, Any]) -> list[tuple[int, int, str]]:
    """The ConfigMap's ledger chunks as (first, last, binaryData value), unordered."""
    binary: Mapping[str, str] = obj.get("binaryData") or {}
    found = ((chunk_range(key), value) for key, value in binary.items())
    return [(span[0], span[1], value) for span, value in found if span is not None]


def ledger_text(config_maps: Iterable[Mapping[str, Any]]) -> str:
    """The ledger held by a state ConfigMap and its chunk ConfigMaps (any order), as text."""
    objects = list(config_maps)
    plain = "".join(str((o.get("data") or {}).get(LEDGER_KEY) or "") for o in objects)
    if plain and not plain.endswith("\n"):
        plain += "\n"
    chunks = sorted(
        (chunk for obj in objects for chunk in ledger_chunks(obj)), key=lambda c: (c[0], -c[1])
    )
    texts = []
    covered = -1
    for _first, last, value in chunks:
        if last > covered:
            texts.append(decode(value))
            covered = last
    return plain + "".join(texts)


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
