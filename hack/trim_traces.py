#!/usr/bin/env python3
"""Trims public production arrival traces to what the benches read: one arrival offset a line.

Usage: hack/trim_traces.py SOURCE_DIR [OUT_DIR]

SOURCE_DIR holds the original files under their published names (see
operator/compass/examples/traces/README.md for where each comes from, at which commit, and its
SHA-256). OUT_DIR defaults to operator/compass/examples/traces/. For each trace it writes
``<name>.txt.gz`` and prints one JSON line of statistics (the numbers the README quotes).

The transformation, per trace, is exact and byte-reproducible:

1. Read each request's arrival time from the original, keeping every row (none are dropped):
   - Azure LLM inference 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``): ``TIMESTAMP`` is
     ``YYYY-MM-DD HH:MM:SS.fffffff`` (100 ns ticks); it is parsed to integer ticks, no float.
   - Mooncake FAST'25 (JSONL): ``timestamp`` is integer milliseconds from the trace's start.
2. Sort (stable; the originals are already in order, so this changes nothing today).
3. Subtract the first arrival: offsets start at 0.
4. Write each offset in seconds as an exact decimal (7 digits for Azure's 100 ns ticks, 3 for
   Mooncake's milliseconds), one a line, ``\\n`` line ends, no header: the plain
   ``compass simulate --pattern trace --trace FILE`` format once decompressed.
5. Gzip at level 9 with mtime 0 and no file name in the header, so the bytes (and their
   SHA-256) are the same on every run.

Token counts, hash ids and everything else in the originals are dropped.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "operator" / "compass" / "examples" / "traces"

AZURE_TICKS_PER_S = 10_000_000  # the 2023 Azure timestamps carry 7 fractional digits
MOONCAKE_TICKS_PER_S = 1_000  # Mooncake's timestamps are milliseconds


def azure_ticks(text: str) -> list[int]:
    """Each row's TIMESTAMP as integer 100 ns ticks since the epoch (the CSV's first column)."""
    lines = text.splitlines()
    if not lines or lines[0].split(",")[0] != "TIMESTAMP":
        raise SystemExit("not an Azure LLM inference trace: the header is not TIMESTAMP,...")
    ticks = []
    for line in lines[1:]:
        stamp = line.split(",")[0]
        whole, _, fraction = stamp.partition(".")
        if len(fraction) != 7 or not fraction.isdigit():
            raise SystemExit(f"unexpected timestamp {stamp!r}: want 7 fractional digits")
        # Read as UTC: only differences matter, and no local clock change may enter them.
        moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        seconds = int(moment.timestamp())
        ticks.append(seconds * AZURE_TICKS_PER_S + int(fraction))
    return ticks


def mooncake_ticks(text: str) -> list[int]:
    """Each line's integer ``timestamp`` (milliseconds)."""
    ticks = []
    for line in text.splitlines():
        if line.strip():
            value = json.loads(line)["timestamp"]
            if not isinstance(value, int):
                raise SystemExit(f"unexpected timestamp {value!r}: want integer milliseconds")
            ticks.append(value)
    return ticks


# name -> (original file name, parser, ticks per second, decimals written)
TRACES: dict[str, tuple[str, Callable[[str], list[int]], int, int]] = {
    "azure-llm-code-2023": ("AzureLLMInferenceTrace_code.csv", azure_ticks, AZURE_TICKS_PER_S, 7),
    "azure-llm-conv-2023": ("AzureLLMInferenceTrace_conv.csv", azure_ticks, AZURE_TICKS_PER_S, 7),
    "mooncake-conversation": (
        "conversation_trace.jsonl",
        mooncake_ticks,
        MOONCAKE_TICKS_PER_S,
        3,
    ),
}


def offsets_text(ticks: list[int], per_s: int, decimals: int) -> str:
    """Offsets from the first arrival, in seconds, exact decimals, one a line."""
    ordered = sorted(ticks)
    first = ordered[0]
    return "".join(f"{(t - first) // per_s}.{(t - first) % per_s:0{decimals}d}\n" for t in ordered)


def gzip_bytes(text: str) -> bytes:
    """Deterministic gzip: level 9, mtime 0, no file name."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buffer, mtime=0) as out:
        out.write(text.encode("ascii"))
    return buffer.getvalue()


def statistics(text: str) -> dict[str, float | int]:
    """Rows, span, mean rate and peak rates (busiest 1 s and 60 s bins from the start)."""
    offsets = np.array([float(word) for word in text.split()])
    span = float(offsets[-1])
    per_second = np.bincount(np.floor(offsets).astype(np.int64))
    per_minute = np.bincount(np.floor(offsets / 60).astype(np.int64))
    return {
        "rows": len(offsets),
        "span_s": round(span, 3),
        "mean_rps": round(len(offsets) / span, 3),
        "peak_1s_rps": int(per_second.max()),
        "peak_60s_rps": round(float(per_minute.max()) / 60, 3),
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    source = Path(argv[1])
    out = Path(argv[2]) if len(argv) == 3 else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    for name, (original, parse, per_s, decimals) in TRACES.items():
        raw = (source / original).read_bytes()
        text = offsets_text(parse(raw.decode("utf-8-sig")), per_s, decimals)
        packed = gzip_bytes(text)
        target = out / f"{name}.txt.gz"
        target.write_bytes(packed)
        print(
            json.dumps(
                {
                    "name": name,
                    "original": original,
                    "original_sha256": hashlib.sha256(raw).hexdigest(),
                    "file": target.name,
                    "file_sha256": hashlib.sha256(packed).hexdigest(),
                    "file_bytes": len(packed),
                    **statistics(text),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
